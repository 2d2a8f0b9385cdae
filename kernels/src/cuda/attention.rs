//! The unfused causal self-attention core on a GPU, for head sizes above the fused
//! kernels' (see fused_attention.rs): heads split out of qkv into [B,NH,T,hs] query and
//! [B,KV,T,hs] key and value copies (grouped-query attention's shared heads are not
//! repeated), scores and products as cuBLAS batched gemms over the B*KV key/value groups
//! (see [`Product`]), and the causal softmax and dropout as kernels. Forward saves the
//! probabilities P and, under dropout, P' = dropout(P); backward reads both and
//! regenerates the mask for dP' from its key.
//!
//! Per head, with row-major q, k, v, dy [T,hs] and P, P' = dropout(P), dS [T,T] (k and v
//! its group's; dk and dv sum over the group), the six products and the [`Product`] that computes each (operands A, B):
//!   S   = q k^T * scale     Scores (k, q)
//!   y   = P' v              ProbsTimes (v, P')
//!   dP' = dy v^T            Scores (v, dy)
//!   dv  = P'^T dy           ProbsTransposedTimes (dy, P')
//!   dq  = dS k * scale      ProbsTimes (k, dS)
//!   dk  = dS^T q * scale    ProbsTransposedTimes (q, dS)

use super::device::{assert_same_len, CudaDevice};
use super::gemm_shape::GemmShape;
use super::launch::{per_item, per_row_warp};
use super::pointwise::DropoutMask;
use super::scratch::Scratch;
use super::views::{cu, cu_mut, int};
use crate::attention::CausalMask;
use crate::dropout::DropoutSpec;
use crate::shapes::QkvDims as Dims;
use crate::tensor::Tensor;
use cudarc::driver::CudaSlice;
use std::ops::Range;

/// The elements of the probabilities P (or P'), [B,NH,T,T].
fn att_len(d: Dims) -> usize {
    d.query_rows() * d.t
}

/// The runs of P [B,NH,T,T] that are runs of the layer's dropout mask too, each with the
/// mask that draws it: the whole tensor for a layer's own heads; for a tensor-parallel
/// rank's, each batch row's NH heads, consecutive among the layer's from `first` of `total`.
fn mask_runs(spec: &DropoutSpec, d: Dims) -> Vec<(Range<usize>, DropoutMask)> {
    let Some(heads) = spec.heads else { return vec![(0..att_len(d), DropoutMask::new(spec))] };
    let (head, row) = (d.t * d.t, d.nh * d.t * d.t);
    (0..d.b)
        .map(|b| {
            let first = (b * heads.total + heads.first) * head;
            (b * row..(b + 1) * row, DropoutMask::new(&DropoutSpec { first, heads: None, ..*spec }))
        })
        .collect()
}

/// The scores' scale, 1/sqrt(hs).
fn scale(d: Dims) -> f32 {
    1.0 / (d.hs as f32).sqrt()
}

/// The three kinds of product (see the module comment) over one key/value group: its G =
/// NH/KV query heads' rows stacked, x, y [T,hs] on the key/value side and [G*T,hs] on the
/// query side, P [G*T,T], all row-major. In the [B,NH,T,hs] and [B,NH,T,T] layouts a
/// group's query heads are contiguous, so one gemm takes a whole group, the shared k and v
/// read in place, and the key and value gradients contract over the group's G*T rows.
#[derive(Clone, Copy)]
enum Product {
    /// (A = x [T,hs], B = y [G*T,hs]) -> [G*T,T] = y x^T: the scores, and dP.
    Scores,
    /// (A = x [T,hs], B = P) -> [G*T,hs] = P x: y, and dq.
    ProbsTimes,
    /// (A = x [G*T,hs], B = P) -> [T,hs] = P^T x: dv, and dk.
    ProbsTransposedTimes,
}

impl Product {
    /// The column-major gemm of one group, and the element strides of A, B and C between
    /// consecutive groups.
    fn gemm(self, d: Dims) -> (GemmShape, (usize, usize, usize)) {
        let (t, hs, rows) = (d.t, d.hs, d.group() * d.t);
        let (kv, queries, square) = (t * hs, rows * hs, rows * t);
        match self {
            Product::Scores => (
                GemmShape { ta: true, tb: false, m: t, n: rows, k: hs, lda: hs, ldb: hs, ldc: t },
                (kv, queries, square),
            ),
            Product::ProbsTimes => (
                GemmShape { ta: false, tb: false, m: hs, n: rows, k: t, lda: hs, ldb: t, ldc: hs },
                (kv, square, queries),
            ),
            Product::ProbsTransposedTimes => (
                GemmShape { ta: false, tb: true, m: hs, n: t, k: rows, lda: hs, ldb: t, ldc: hs },
                (queries, square, kv),
            ),
        }
    }
}

impl CudaDevice {
    /// dst [B,heads,T,hs] = columns offset..offset+heads*hs of src rows `stride` wide.
    fn split_heads(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        d: Dims,
        heads: usize,
        at: [usize; 2],
    ) {
        let (b, t, nh, hs) = (int(d.b), int(d.t), int(heads), int(d.hs));
        let (stride, offset) = (int(at[0]), int(at[1]));
        let n = d.b * d.t * heads * d.hs;
        launch!(self, "split_heads", per_item(n), dst, src, &b, &t, &nh, &hs, &stride, &offset);
    }

    /// Columns offset..offset+heads*hs of dst rows `stride` wide = src [B,heads,T,hs].
    fn merge_heads(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        d: Dims,
        heads: usize,
        at: [usize; 2],
    ) {
        let (b, t, nh, hs) = (int(d.b), int(d.t), int(heads), int(d.hs));
        let (stride, offset) = (int(at[0]), int(at[1]));
        let n = d.b * d.t * heads * d.hs;
        launch!(self, "merge_heads", per_item(n), dst, src, &b, &t, &nh, &hs, &stride, &offset);
    }

    /// One product per key/value group over all B*KV groups: c = alpha * product(a, b).
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
        self.gemm_batched(shape, d.b * d.kv, strides, alpha, a, b, c);
    }

    /// The heads of q, k and v ([NH, KV, KV]) and their first columns in a row of qkv.
    fn qkv_heads(d: Dims) -> [(usize, usize); 3] {
        [(d.nh, 0), (d.kv, d.nh * d.hs), (d.kv, (d.nh + d.kv) * d.hs)]
    }

    /// q [B,NH,T,hs], k and v [B,KV,T,hs] as copies out of qkv.
    fn split_qkv(&self, qkv: &Tensor, d: Dims) -> [Scratch<f32>; 3] {
        Self::qkv_heads(d).map(|(heads, offset)| {
            let mut x = self.scratch::<f32>(d.b * d.t * heads * d.hs);
            self.split_heads(&mut x, cu(qkv), d, heads, [d.width(), offset]);
            x
        })
    }

    /// out [B,T,NH*hs] (unless None), P into att and, under dropout, P' into its tensor,
    /// all [B,NH,T,T], from qkv [B,T,(NH+2*KV)*hs].
    pub(super) fn attention_forward_op(
        &self,
        out: Option<&mut Tensor>,
        att: &mut Tensor,
        dropout: Option<(DropoutSpec, &mut Tensor)>,
        qkv: &Tensor,
        d: Dims,
        mask: CausalMask,
    ) {
        assert_eq!(att.len(), att_len(d), "attention: att {att:?} for {d:?}");
        if let Some((_, dropped)) = &dropout {
            assert_same_len(dropped, att);
        }
        if d.out_len() == 0 {
            return;
        }
        let [q, k, v] = self.split_qkv(qkv, d);
        // Scores straight into att, then the causal softmax in place.
        self.heads_gemm(d, Product::Scores, scale(d), &k, &q, cu_mut(att));
        let (rows, t, window) = (d.query_rows() as u64, int(d.t), int(mask.keys(d.t)));
        launch!(
            self,
            "causal_softmax_forward",
            per_row_warp(d.query_rows()),
            cu_mut(att),
            &rows,
            &t,
            &window
        );

        let probs = match dropout {
            Some((spec, dropped)) => {
                self.dropout_runs(cu_mut(dropped), cu(att), &mask_runs(&spec, d));
                &*dropped
            }
            None => &*att,
        };
        let Some(out) = out else { return };
        let mut y = self.scratch::<f32>(d.out_len());
        self.heads_gemm(d, Product::ProbsTimes, 1.0, &v, cu(probs), &mut y);
        self.merge_heads(cu_mut(out), &y, d, d.nh, [d.nh * d.hs, 0]);
    }

    /// dqkv [B,T,(NH+2*KV)*hs] (overwrite) from dout [B,T,NH*hs], qkv, and P and P' as
    /// forward saved them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_backward_op(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        qkv: &Tensor,
        att: &Tensor,
        dropout: Option<(DropoutSpec, &Tensor)>,
        d: Dims,
        mask: CausalMask,
    ) {
        assert_eq!(att.len(), att_len(d), "attention: att {att:?} for {d:?}");
        if let Some((_, dropped)) = &dropout {
            assert_same_len(dropped, att);
        }
        if d.out_len() == 0 {
            return;
        }
        let [q, k, v] = self.split_qkv(qkv, d);
        let mut dy = self.scratch::<f32>(d.out_len());
        self.split_heads(&mut dy, cu(dout), d, d.nh, [d.nh * d.hs, 0]);

        // Through y = P' v.
        let mut dp = self.scratch::<f32>(att_len(d));
        self.heads_gemm(d, Product::Scores, 1.0, &v, &dy, &mut dp);
        let mut dv = self.scratch::<f32>(d.kv_len());
        let probs = dropout.map_or(att, |(_, dropped)| dropped);
        self.heads_gemm(d, Product::ProbsTransposedTimes, 1.0, &dy, cu(probs), &mut dv);
        if let Some((spec, _)) = &dropout {
            self.dropout_runs_inplace(&mut dp, &mask_runs(spec, d));
        }

        // Through the softmax (in place: dP becomes dS), then S = scale * q k^T.
        let (rows, t, window) = (d.query_rows() as u64, int(d.t), int(mask.keys(d.t)));
        launch!(
            self,
            "causal_softmax_backward",
            per_row_warp(d.query_rows()),
            &mut *dp,
            cu(att),
            &rows,
            &t,
            &window
        );
        let mut dq = self.scratch::<f32>(d.out_len());
        self.heads_gemm(d, Product::ProbsTimes, scale(d), &k, &dp, &mut dq);
        let mut dk = self.scratch::<f32>(d.kv_len());
        self.heads_gemm(d, Product::ProbsTransposedTimes, scale(d), &q, &dp, &mut dk);

        for ((heads, offset), grad) in Self::qkv_heads(d).into_iter().zip([&dq, &dk, &dv]) {
            self.merge_heads(cu_mut(dqkv), grad, d, heads, [d.width(), offset]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::blas::tests::{host_gemm, row_major, values};

    /// One group of each product on the host, against its row-major definition: one head
    /// (B = NH = KV = 1), and a group of three query heads on one key/value head, whose
    /// stacked rows the scores and P x extend and P^T x contracts over.
    #[test]
    fn group_products_compute_their_definitions() {
        for group in [1, 3] {
            let (t, hs) = (4, 3);
            let d = Dims { b: 1, t, nh: group, kv: 1, hs };
            let rows = group * t;
            let (kv, queries, p) = (values(t * hs, 1), values(rows * hs, 2), values(rows * t, 3));
            let run = |product: Product, a: &[f32], b: &[f32], len: usize| {
                let mut c = vec![0.0; len];
                host_gemm(product.gemm(d).0, 1.0, 0.0, a, b, &mut c);
                c
            };
            // y x^T: the group's query rows against the shared keys
            assert_eq!(
                run(Product::Scores, &kv, &queries, rows * t),
                row_major(rows, hs, t, &queries, |k, j| kv[j * hs + k])
            );
            // P x: every query row of the group from the shared values
            assert_eq!(
                run(Product::ProbsTimes, &kv, &p, rows * hs),
                row_major(rows, t, hs, &p, |k, j| kv[k * hs + j])
            );
            // P^T x: summed over the group's rows
            let p_t: Vec<f32> = (0..t * rows).map(|i| p[i % rows * t + i / rows]).collect();
            assert_eq!(
                run(Product::ProbsTransposedTimes, &queries, &p, t * hs),
                row_major(t, rows, hs, &p_t, |k, j| queries[k * hs + j])
            );
        }
    }
}
