//! QK-norm (Megatron's `qk_layernorm`, Qwen3's `q_norm` and `k_norm`): an RMSNorm over each
//! query head and each key head, between the qkv projection and the rotary embedding, one
//! weight [hs] shared by the query heads and one by the key heads; or over the whole query
//! and key projections (OLMo 2's and OLMo 3's, [NH hs] and [KV hs]). It bounds the attention
//! logits, which otherwise grow with the weights' norms (Dehghani et al. 2023, Wortsman et
//! al. 2023).
//!
//! The norm runs in place on the fused qkv [B,T,QKV], leaving the values alone; its backward
//! reads the q, k, v from before it, which forward copies aside.

use kernels::{Category, Device, QkNormSpan, Tensor};

/// What QK-norm's backward reads.
pub struct QkNormActs {
    /// q, k, v [B,T,QKV] before the norm.
    pub input: Tensor,
    /// [B,T,rows] (f32): the reciprocal root mean square of each query row, then each key
    /// row, of each token (its heads, or its two projections).
    pub rstd: Tensor,
}

/// A block's QK-norm over `heads` query heads and `kv_heads` key heads (a shard's, under
/// tensor parallelism), each or whole as `span` says.
pub struct QkNorm<'a> {
    pub q_weight: &'a Tensor,
    pub k_weight: &'a Tensor,
    pub eps: f32,
    pub heads: usize,
    pub kv_heads: usize,
    pub span: QkNormSpan,
}

impl QkNorm<'_> {
    /// Normalises the query and key heads of qkv [B,T,QKV] in place; what the backward reads
    /// is allocated under `keep_as` (the copy of the input) and `stats_as` (the statistics).
    pub fn forward(
        &self,
        dev: &dyn Device,
        qkv: &mut Tensor,
        keep_as: Category,
        stats_as: Category,
    ) -> QkNormActs {
        let mut input = dev.empty_of(qkv.dtype(), qkv.shape(), keep_as); // [B,T,QKV]
        dev.copy(&mut input, qkv);
        let rstd = self.normalize(dev, qkv, stats_as);
        QkNormActs { input, rstd }
    }

    /// Normalises the query and key rows of qkv [B,T,QKV] in place, keeping no input for a
    /// backward (inference); returns the statistics [B,T,rows], allocated under `stats_as`.
    pub fn normalize(&self, dev: &dyn Device, qkv: &mut Tensor, stats_as: Category) -> Tensor {
        let tokens = &qkv.shape()[..qkv.shape().len() - 1];
        let rows = self.span.rows(self.heads, self.kv_heads, 1).rows(); // as many whatever their width
        let mut rstd = dev.empty(&[tokens, &[rows]].concat(), stats_as); // [B,T,rows]
        let (q, k, span) = (self.q_weight, self.k_weight, self.span);
        dev.qk_norm_forward(qkv, &mut rstd, q, k, self.heads, self.kv_heads, span, self.eps);
        rstd
    }

    /// dqkv [B,T,QKV], the gradient of the norm's output, becomes its input's, in place;
    /// the weights' gradients dq, dk (as wide as the weights) accumulate.
    pub fn backward(
        &self,
        dev: &dyn Device,
        dqkv: &mut Tensor,
        acts: QkNormActs,
        (dq, dk): (&mut Tensor, &mut Tensor),
    ) {
        let (q, k, span) = (self.q_weight, self.k_weight, self.span);
        dev.qk_norm_backward(dqkv, dq, dk, &acts.input, q, k, &acts.rstd, self.heads, self.kv_heads, span);
    }
}
