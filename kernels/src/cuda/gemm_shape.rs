//! The shape of one cuBLAS or cuBLASLt product, as both take it.

/// One column-major product C = alpha * op(A) op(B) + beta * C, op(X) = X^T where `t*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct GemmShape {
    pub ta: bool,
    pub tb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}
