//! QK-norm (Megatron's `qk_layernorm`, Qwen3's `q_norm` and `k_norm`): an RMSNorm over each
//! query head and each key head, between the qkv projection and the rotary embedding, one
//! weight [hs] shared by the query heads and one by the key heads; or over the whole query
//! and key projections (OLMo 2's). It bounds the attention
//! logits, which otherwise grow with the weights' norms (Dehghani et al. 2023, Wortsman et
//! al. 2023).
//!
//! The norm runs in place on the fused qkv [B,T,QKV], leaving the values alone; its backward
//! reads the q, k, v from before it, which forward copies aside.

use kernels::{Category, Device, Tensor};

/// What one QK-norm normalises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNormSpan {
    /// Each query and key head, one weight [hs] for the query heads and one for the key
    /// heads (Qwen3's, Megatron's `qk_layernorm`).
    Head,
    /// The whole query projection and the whole key projection of each token, one weight
    /// [NH hs] and one [KV hs] (OLMo 2's). Run as the per-head norm of one query and one key
    /// "head" NH hs wide, which it is where NH = KV: the fused qkv row is then three equal
    /// parts, as that kernel reads it.
    Projection,
}

impl QkNormSpan {
    pub const ALL: [QkNormSpan; 2] = [QkNormSpan::Head, QkNormSpan::Projection];

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            QkNormSpan::Head => "head",
            QkNormSpan::Projection => "projection",
        }
    }
}

/// What QK-norm's backward reads.
pub struct QkNormActs {
    /// q, k, v [B,T,QKV] before the norm.
    pub input: Tensor,
    /// [B,T,NH+KV] (f32): the reciprocal root mean square of each query head, then each key
    /// head, of each token.
    pub rstd: Tensor,
}

/// A block's QK-norm over `heads` query heads and `kv_heads` key heads (a shard's, under
/// tensor parallelism).
pub struct QkNorm<'a> {
    pub q_weight: &'a Tensor,
    pub k_weight: &'a Tensor,
    pub eps: f32,
    pub heads: usize,
    pub kv_heads: usize,
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

    /// Normalises the query and key heads of qkv [B,T,QKV] in place, keeping no input for a
    /// backward (inference); returns the statistics [B,T,NH+KV], allocated under `stats_as`.
    pub fn normalize(&self, dev: &dyn Device, qkv: &mut Tensor, stats_as: Category) -> Tensor {
        let tokens = &qkv.shape()[..qkv.shape().len() - 1];
        let mut rstd = dev.empty(&[tokens, &[self.heads + self.kv_heads]].concat(), stats_as); // [B,T,NH+KV]
        let (q, k) = (self.q_weight, self.k_weight);
        dev.qk_norm_forward(qkv, &mut rstd, q, k, self.heads, self.kv_heads, self.eps);
        rstd
    }

    /// dqkv [B,T,QKV], the gradient of the norm's output, becomes its input's, in place;
    /// the weights' gradients dq, dk [hs] accumulate.
    pub fn backward(
        &self,
        dev: &dyn Device,
        dqkv: &mut Tensor,
        acts: QkNormActs,
        (dq, dk): (&mut Tensor, &mut Tensor),
    ) {
        let (q, k) = (self.q_weight, self.k_weight);
        dev.qk_norm_backward(dqkv, dq, dk, &acts.input, q, k, &acts.rstd, self.heads, self.kv_heads);
    }
}
