//! One call's products, C = alpha op(A) op(B) + beta C for each of `batch` matrices:
//! checked as cuBLAS checks them when called, computed later on a stream with the `gemm`
//! crate. Every matrix is column-major, as cuBLAS's are. cuBLASLt's matmul ([`crate::cublaslt`])
//! runs through the same products, its epilogue applied to the f32 result before it is stored.

use cudarc::cublas::sys::{cublasOperation_t, cublasStatus_t, cudaDataType_t};
use gemm::Parallelism;
use half::bf16;
use std::ffi::{c_int, c_longlong};

/// The element types the stand-in computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Element {
    F32,
    Bf16,
}

impl Element {
    pub(crate) fn of(ty: cudaDataType_t) -> Result<Element, cublasStatus_t> {
        match ty {
            cudaDataType_t::CUDA_R_32F => Ok(Element::F32),
            cudaDataType_t::CUDA_R_16BF => Ok(Element::Bf16),
            _ => Err(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED),
        }
    }

    /// The type a cudaDataType_t's value names (cuBLASLt passes types as plain integers, in
    /// attribute buffers and as an enum of its own).
    pub(crate) fn of_raw(raw: i32) -> Result<Element, cublasStatus_t> {
        let modelled = [cudaDataType_t::CUDA_R_32F, cudaDataType_t::CUDA_R_16BF];
        let ty = modelled.into_iter().find(|ty| *ty as i32 == raw);
        ty.map_or(Err(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED), Element::of)
    }

    /// Whether the stand-in models a product of these types under an f32 compute type:
    /// A and B of one type, C f32 or of their type (f32 operands into a bf16 C are refused).
    pub(crate) fn check_types(a: Element, b: Element, c: Element) -> Result<(), cublasStatus_t> {
        if a != b || (c != Element::F32 && c != a) {
            return Err(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED);
        }
        Ok(())
    }

    pub(crate) fn bytes(self) -> isize {
        match self {
            Element::F32 => 4,
            Element::Bf16 => 2,
        }
    }
}

/// An operand as the caller passed it: its address, element type, leading dimension and
/// (batched calls) the elements between one matrix and the next.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub addr: usize,
    pub ty: Element,
    pub ld: c_int,
    pub stride: c_longlong,
}

/// A stored matrix of one batch: `rows` x `cols`, `ld` elements between columns.
#[derive(Clone, Copy)]
pub(crate) struct Stored {
    pub addr: usize,
    pub ty: Element,
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

/// The products of one call, checked; the scalars were read when it was made (pointer
/// mode host), the matrices are read when it runs.
#[derive(Clone, Copy)]
pub(crate) struct Products {
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    a: Operand,
    b: Operand,
    c: Operand,
    batch: usize,
}

/// Whether an operation transposes; conjugation is the identity on real types, so C is T.
pub(crate) fn transposes(op: cublasOperation_t) -> Result<bool, cublasStatus_t> {
    match op {
        cublasOperation_t::CUBLAS_OP_N => Ok(false),
        cublasOperation_t::CUBLAS_OP_T | cublasOperation_t::CUBLAS_OP_C => Ok(true),
        cublasOperation_t::CUBLAS_OP_CONJG => Err(cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE),
    }
}

impl Products {
    /// The call's products, or the status cuBLAS returns for them: INVALID_VALUE for a
    /// negative size or batch count, a leading dimension below max(1, rows stored) or a
    /// null scalar. `alpha` and `beta` point to f32, as they do for every type and compute
    /// type the stand-in accepts.
    ///
    /// # Safety
    /// `alpha` and `beta` are null or point to an f32.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn check(
        (transa, transb): (cublasOperation_t, cublasOperation_t),
        (m, n, k): (c_int, c_int, c_int),
        alpha: *const f32,
        beta: *const f32,
        (a, b, c): (Operand, Operand, Operand),
        batch: c_int,
    ) -> Result<Products, cublasStatus_t> {
        let invalid = cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
        let (ta, tb) = (transposes(transa)?, transposes(transb)?);
        let size = |v: c_int| usize::try_from(v).map_err(|_| invalid);
        let (m, n, k, batch) = (size(m)?, size(n)?, size(k)?, size(batch)?);
        let a_rows = if ta { k } else { m };
        let b_rows = if tb { n } else { k };
        for (ld, rows) in [(a.ld, a_rows), (b.ld, b_rows), (c.ld, m)] {
            if size(ld)? < rows.max(1) {
                return Err(invalid);
            }
        }
        if alpha.is_null() || beta.is_null() {
            return Err(invalid);
        }
        // SAFETY: both are non-null and, per the contract, point to an f32.
        let (alpha, beta) = unsafe { (*alpha, *beta) };
        Ok(Products { ta, tb, m, n, k, alpha, beta, a, b, c, batch })
    }

    /// Whether there is anything to compute (cuBLAS returns at once when not).
    pub(crate) fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }

    /// Computes every product, in batch order.
    ///
    /// # Safety
    /// Every matrix the call names is readable (C writable) for the call's shapes, leading
    /// dimensions and strides, and C overlaps neither A nor B.
    pub(crate) unsafe fn run(&self) {
        // SAFETY: per the contract.
        unsafe { self.run_then(&|_, _| ()) }
    }

    /// As [`Products::run`], with `epilogue` applied to each product's f32 result (m x n,
    /// column-major, its pointer and leading dimension) before it is stored, so a bf16 C is
    /// still rounded once: cuBLASLt's epilogues.
    ///
    /// # Safety
    /// As [`Products::run`]; `epilogue` keeps to the m x n matrix it is given.
    pub(crate) unsafe fn run_then(&self, epilogue: &dyn Fn(*mut f32, usize)) {
        for i in 0..self.batch {
            let at = |o: Operand, rows, cols| Stored {
                addr: o.addr.wrapping_add_signed(i as isize * o.stride as isize * o.ty.bytes()),
                ty: o.ty,
                rows,
                cols,
                ld: o.ld as usize,
            };
            let a = if self.ta { at(self.a, self.k, self.m) } else { at(self.a, self.m, self.k) };
            let b = if self.tb { at(self.b, self.n, self.k) } else { at(self.b, self.k, self.n) };
            // SAFETY: per the contract, for this batch's matrices.
            unsafe { self.one(a, b, at(self.c, self.m, self.n), epilogue) };
        }
    }

    /// One product. bf16 operands are widened to f32 (exactly) and a bf16 C is computed in
    /// f32 and rounded once, to nearest even, as cuBLAS does under CUBLAS_COMPUTE_32F.
    /// Neither A nor B is read when alpha or k is 0 (as BLAS defines: they need not be set).
    unsafe fn one(&self, a: Stored, b: Stored, c: Stored, epilogue: &dyn Fn(*mut f32, usize)) {
        // SAFETY (all three blocks): per `run`'s contract.
        let operands = (self.alpha != 0.0 && self.k > 0).then(|| unsafe { (View::of(a), View::of(b)) });
        match c.ty {
            Element::F32 => unsafe {
                self.product(operands, c.addr as *mut f32, c.ld);
                epilogue(c.addr as *mut f32, c.ld);
            },
            Element::Bf16 => unsafe {
                // C is read only where beta scales it: with beta 0 it may hold NaN.
                let mut wide = if self.beta == 0.0 { vec![0.0; c.rows * c.cols] } else { widen(c) };
                self.product(operands, wide.as_mut_ptr(), c.rows);
                epilogue(wide.as_mut_ptr(), c.rows);
                narrow(&wide, c);
            },
        }
    }

    /// C = alpha op(A) op(B) + beta C on f32 matrices, or C = beta C without operands;
    /// C is never read when beta is 0.
    unsafe fn product(&self, operands: Option<(View, View)>, c: *mut f32, ldc: usize) {
        let (m, n) = (self.m, self.n);
        let Some((a, b)) = operands else {
            for j in 0..n {
                for i in 0..m {
                    // SAFETY: inside C, per `run`'s contract.
                    let e = unsafe { &mut *c.add(i + j * ldc) };
                    *e = if self.beta == 0.0 { 0.0 } else { self.beta * *e };
                }
            }
            return;
        };
        // Element (r, q) of op(X) is at r * rs + q * cs of the stored X.
        let strides = |transposed: bool, ld: usize| if transposed { (ld, 1) } else { (1, ld) };
        let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(self.ta, a.ld), strides(self.tb, b.ld));
        let s = |x: usize| x as isize;
        // SAFETY: the operands span what their strides say, per `run`'s contract. The gemm
        // crate computes dst = alpha dst + beta lhs rhs (the scalars named the reverse of
        // BLAS's) and reads dst only when told to.
        unsafe {
            gemm::gemm(
                m,
                n,
                self.k,
                c,
                s(ldc),
                1,
                self.beta != 0.0,
                a.ptr,
                s(a_cs),
                s(a_rs),
                b.ptr,
                s(b_cs),
                s(b_rs),
                self.beta,
                self.alpha,
                false,
                false,
                false,
                Parallelism::Rayon(0),
            )
        }
    }
}

/// A matrix as f32: in place, or a dense widened copy of a bf16 one (its leading dimension
/// then its row count).
pub(crate) struct View {
    pub ptr: *const f32,
    pub ld: usize,
    /// Owns what `ptr` points to for a widened copy.
    _copy: Vec<f32>,
}

impl View {
    /// # Safety
    /// `x` is readable for its shape and leading dimension (while the view is used, for f32).
    pub(crate) unsafe fn of(x: Stored) -> View {
        match x.ty {
            Element::F32 => View { ptr: x.addr as *const f32, ld: x.ld, _copy: Vec::new() },
            Element::Bf16 => {
                // SAFETY: per the caller's contract.
                let copy = unsafe { widen(x) };
                View { ptr: copy.as_ptr(), ld: x.rows, _copy: copy }
            }
        }
    }
}

/// A bf16 matrix's values as a dense column-major f32 matrix.
unsafe fn widen(x: Stored) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.rows * x.cols);
    for j in 0..x.cols {
        // SAFETY: column j lies inside the matrix, per the caller's contract.
        let column = unsafe { std::slice::from_raw_parts((x.addr as *const bf16).add(j * x.ld), x.rows) };
        out.extend(column.iter().map(|v| v.to_f32()));
    }
    out
}

/// Rounds a dense f32 matrix into the bf16 matrix `x`, leaving its padding untouched.
unsafe fn narrow(wide: &[f32], x: Stored) {
    for j in 0..x.cols {
        // SAFETY: column j lies inside the matrix, per the caller's contract.
        let column = unsafe { std::slice::from_raw_parts_mut((x.addr as *mut bf16).add(j * x.ld), x.rows) };
        for (out, v) in column.iter_mut().zip(&wide[j * x.rows..]) {
            *out = bf16::from_f32(*v);
        }
    }
}
