//! The unfused causal self-attention core on a GPU, for head sizes above the fused
//! kernels' (see fused_attention.rs): heads split out of qkv into [B,NH,T,hs] copies,
//! scores and products as cuBLAS batched gemms over the B*NH heads, and the causal softmax
//! and dropout as kernels. Forward saves the probabilities P and, under dropout,
//! P' = dropout(P); backward reads both and regenerates the mask for dP' from its key.
//!
//! Per head, with row-major q, k, v, dy [T,hs] and P, P' = dropout(P), dS [T,T], the six
//! products and the [`Product`] that computes each (operands A, B):
//!   S   = q k^T * scale     Scores (k, q)
//!   y   = P' v              ProbsTimes (v, P')
//!   dP' = dy v^T            Scores (v, dy)
//!   dv  = P'^T dy           ProbsTransposedTimes (dy, P')
//!   dq  = dS k * scale      ProbsTimes (k, dS)
//!   dk  = dS^T q * scale    ProbsTransposedTimes (q, dS)

use super::blas::GemmShape;
use super::device::{assert_same_len, cu, cu_mut, int, CudaDevice};
use super::launch::{per_item, per_row_warp};
use super::scratch::Scratch;
use crate::dropout::DropoutSpec;
use crate::tensor::Tensor;
use cudarc::driver::CudaSlice;

#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
}

impl Dims {
    fn from_qkv(qkv: &Tensor, n_head: usize) -> Dims {
        let &[b, t, c3] = qkv.shape() else { panic!("attention qkv must be [B,T,3C], got {qkv:?}") };
        assert!(
            c3.is_multiple_of(3) && n_head > 0 && (c3 / 3).is_multiple_of(n_head),
            "attention: qkv {qkv:?}, {n_head} heads"
        );
        Dims { b, t, c: c3 / 3, nh: n_head }
    }
    fn hs(&self) -> usize {
        self.c / self.nh
    }
    fn heads(&self) -> usize {
        self.b * self.nh
    }
    fn att_len(&self) -> usize {
        self.heads() * self.t * self.t
    }
    fn act_len(&self) -> usize {
        self.b * self.t * self.c
    }
    fn scale(&self) -> f32 {
        1.0 / (self.hs() as f32).sqrt()
    }
}

/// The three kinds of per-head product (see the module comment), with x, y [T,hs] and
/// P [T,T] row-major.
#[derive(Clone, Copy)]
enum Product {
    /// (A = x, B = y) -> [T,T] = y x^T: the scores, and dP.
    Scores,
    /// (A = x, B = P) -> [T,hs] = P x: y, and dq.
    ProbsTimes,
    /// (A = x, B = P) -> [T,hs] = P^T x: dv, and dk.
    ProbsTransposedTimes,
}

impl Product {
    /// The column-major gemm of one head, and the element strides of A, B and C between
    /// consecutive heads.
    fn gemm(self, d: Dims) -> (GemmShape, (usize, usize, usize)) {
        let (t, hs) = (d.t, d.hs());
        let (small, square) = (t * hs, t * t);
        let times = GemmShape { ta: false, tb: false, m: hs, n: t, k: t, lda: hs, ldb: t, ldc: hs };
        match self {
            Product::Scores => (
                GemmShape { ta: true, tb: false, m: t, n: t, k: hs, lda: hs, ldb: hs, ldc: t },
                (small, small, square),
            ),
            Product::ProbsTimes => (times, (small, square, small)),
            Product::ProbsTransposedTimes => (GemmShape { tb: true, ..times }, (small, square, small)),
        }
    }
}

impl CudaDevice {
    /// dst [B,NH,T,hs] = columns offset..offset+C of src rows `stride` wide.
    fn split_heads(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        d: Dims,
        stride: usize,
        offset: usize,
    ) {
        let (b, t, nh, hs) = (int(d.b), int(d.t), int(d.nh), int(d.hs()));
        let (stride, offset) = (int(stride), int(offset));
        launch!(self, "split_heads", per_item(d.act_len()), dst, src, &b, &t, &nh, &hs, &stride, &offset);
    }

    /// Columns offset..offset+C of dst rows `stride` wide = src [B,NH,T,hs].
    fn merge_heads(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        d: Dims,
        stride: usize,
        offset: usize,
    ) {
        let (b, t, nh, hs) = (int(d.b), int(d.t), int(d.nh), int(d.hs()));
        let (stride, offset) = (int(stride), int(offset));
        launch!(self, "merge_heads", per_item(d.act_len()), dst, src, &b, &t, &nh, &hs, &stride, &offset);
    }

    /// One product per head over all B*NH heads: c = alpha * product(a, b).
    fn heads_gemm(
        &self,
        d: Dims,
        product: Product,
        alpha: f32,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) {
        let (shape, strides) = product.gemm(d);
        self.gemm_batched(shape, d.heads(), strides, alpha, a, b, c);
    }

    /// q, k, v as [B,NH,T,hs] copies out of qkv [B,T,3C].
    fn split_qkv(&self, qkv: &Tensor, d: Dims) -> [Scratch<f32>; 3] {
        [0, 1, 2].map(|i| {
            let mut x = self.scratch::<f32>(d.act_len());
            self.split_heads(&mut x, cu(qkv), d, 3 * d.c, i * d.c);
            x
        })
    }

    /// out [B,T,C] (unless None), P into att and, under dropout, P' into its tensor, all
    /// [B,NH,T,T], from qkv [B,T,3C].
    pub(super) fn attention_forward_op(
        &self,
        out: Option<&mut Tensor>,
        att: &mut Tensor,
        dropout: Option<(DropoutSpec, &mut Tensor)>,
        qkv: &Tensor,
        n_head: usize,
    ) {
        let d = Dims::from_qkv(qkv, n_head);
        if let Some(out) = &out {
            assert_eq!(out.len(), d.act_len(), "attention: out {out:?} for qkv {qkv:?}");
        }
        assert_eq!(att.len(), d.att_len(), "attention: att {att:?} for {d:?}");
        if let Some((_, dropped)) = &dropout {
            assert_same_len(dropped, att);
        }
        if d.act_len() == 0 {
            return;
        }
        let [q, k, v] = self.split_qkv(qkv, d);
        // Scores straight into att, then the causal softmax in place.
        self.heads_gemm(d, Product::Scores, d.scale(), &k, &q, cu_mut(att));
        let (rows, t) = ((d.heads() * d.t) as u64, int(d.t));
        launch!(self, "causal_softmax_forward", per_row_warp(d.heads() * d.t), cu_mut(att), &rows, &t);

        let probs = match dropout {
            Some((spec, dropped)) => {
                self.dropout_slices(cu_mut(dropped), cu(att), d.att_len(), &spec);
                &*dropped
            }
            None => &*att,
        };
        let Some(out) = out else { return };
        let mut y = self.scratch::<f32>(d.act_len());
        self.heads_gemm(d, Product::ProbsTimes, 1.0, &v, cu(probs), &mut y);
        self.merge_heads(cu_mut(out), &y, d, d.c, 0);
    }

    /// dqkv [B,T,3C] (overwrite) from dout [B,T,C], qkv, and P and P' as forward saved them.
    pub(super) fn attention_backward_op(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        qkv: &Tensor,
        att: &Tensor,
        dropout: Option<(DropoutSpec, &Tensor)>,
        n_head: usize,
    ) {
        let d = Dims::from_qkv(qkv, n_head);
        assert_same_len(dqkv, qkv);
        assert_eq!(dout.len(), d.act_len(), "attention: dout {dout:?} for qkv {qkv:?}");
        assert_eq!(att.len(), d.att_len(), "attention: att {att:?} for {d:?}");
        if let Some((_, dropped)) = &dropout {
            assert_same_len(dropped, att);
        }
        if d.act_len() == 0 {
            return;
        }
        let [q, k, v] = self.split_qkv(qkv, d);
        let mut dy = self.scratch::<f32>(d.act_len());
        self.split_heads(&mut dy, cu(dout), d, d.c, 0);

        // Through y = P' v.
        let mut dp = self.scratch::<f32>(d.att_len());
        self.heads_gemm(d, Product::Scores, 1.0, &v, &dy, &mut dp);
        let mut dv = self.scratch::<f32>(d.act_len());
        let probs = dropout.map_or(att, |(_, dropped)| dropped);
        self.heads_gemm(d, Product::ProbsTransposedTimes, 1.0, &dy, cu(probs), &mut dv);
        if let Some((spec, _)) = &dropout {
            self.dropout_inplace(&mut dp, d.att_len(), spec);
        }

        // Through the softmax (in place: dP becomes dS), then S = scale * q k^T.
        let (rows, t) = ((d.heads() * d.t) as u64, int(d.t));
        launch!(self, "causal_softmax_backward", per_row_warp(d.heads() * d.t), &mut *dp, cu(att), &rows, &t);
        let mut dq = self.scratch::<f32>(d.act_len());
        self.heads_gemm(d, Product::ProbsTimes, d.scale(), &k, &dp, &mut dq);
        let mut dk = self.scratch::<f32>(d.act_len());
        self.heads_gemm(d, Product::ProbsTransposedTimes, d.scale(), &q, &dp, &mut dk);

        for (i, grad) in [&dq, &dk, &dv].into_iter().enumerate() {
            self.merge_heads(cu_mut(dqkv), grad, d, 3 * d.c, i * d.c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::blas::tests::{host_gemm, row_major, values};

    /// One head (B = NH = 1) of each product on the host, against its row-major definition.
    #[test]
    fn head_products_compute_their_definitions() {
        let (t, hs) = (4, 3);
        let d = Dims { b: 1, t, c: hs, nh: 1 };
        let (x, y, p) = (values(t * hs, 1), values(t * hs, 2), values(t * t, 3));
        let run = |product: Product, a: &[f32], b: &[f32], len: usize| {
            let mut c = vec![0.0; len];
            host_gemm(product.gemm(d).0, 1.0, 0.0, a, b, &mut c);
            c
        };
        // y x^T
        assert_eq!(run(Product::Scores, &x, &y, t * t), row_major(t, hs, t, &y, |k, j| x[j * hs + k]));
        // P x
        assert_eq!(run(Product::ProbsTimes, &x, &p, t * hs), row_major(t, t, hs, &p, |k, j| x[k * hs + j]));
        // P^T x
        let p_t: Vec<f32> = (0..t * t).map(|i| p[i % t * t + i / t]).collect();
        assert_eq!(
            run(Product::ProbsTransposedTimes, &x, &p, t * hs),
            row_major(t, t, hs, &p_t, |k, j| x[k * hs + j])
        );
    }
}
