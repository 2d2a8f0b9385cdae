//! QK-norm (Megatron's `qk_layernorm`, Qwen3's `q_norm` and `k_norm`): an RMSNorm over each
//! query head and each key head, between the qkv projection and the rotary embedding, one
//! weight [hs] shared by the query heads and one by the key heads; or over the whole query
//! and key projections (OLMo 2's and OLMo 3's, [NH hs] and [KV hs]). It bounds the attention
//! logits, which otherwise grow with the weights' norms (Dehghani et al. 2023, Wortsman et
//! al. 2023).
//!
//! The norm runs in place on the fused qkv [B,T,QKV], leaving the values alone; its backward
//! reads the q, k, v from before it, which forward copies aside. Under tensor parallelism a
//! rank holds its heads' part of each projection, so the norm over a whole projection takes
//! the group's sum of each row's squares (forward) and of its dnorm * norm (backward): an
//! all-reduce of [B,T,2] each way, where Megatron's qk_layernorm, per head, needs none.

use crate::dist::TensorGroup;
use kernels::{Category, Device, QkNormHeads, QkNormSpan, Tensor};

/// What QK-norm's backward reads.
pub struct QkNormActs {
    /// q, k, v [B,T,QKV] before the norm.
    pub input: Tensor,
    /// [B,T,rows] (f32): the reciprocal root mean square of each query row, then each key
    /// row, of each token (its heads, or its two projections).
    pub rstd: Tensor,
}

/// A block's QK-norm over `heads` query heads and `kv_heads` key heads (a shard's, under
/// tensor parallelism), each or whole as `span` says. A row is 1/`parts` of the whole: a
/// whole projection cut across a tensor-parallel group of `parts` ranks, whose norm runs in
/// two halves with the group's sum between them (1 where rows are whole).
pub struct QkNorm<'a> {
    pub q_weight: &'a Tensor,
    pub k_weight: &'a Tensor,
    pub eps: f32,
    pub heads: usize,
    pub kv_heads: usize,
    pub span: QkNormSpan,
    pub parts: usize,
}

impl QkNorm<'_> {
    fn of_heads(&self) -> QkNormHeads {
        QkNormHeads { heads: self.heads, kv_heads: self.kv_heads, span: self.span }
    }

    fn weights(&self) -> [&Tensor; 2] {
        [self.q_weight, self.k_weight]
    }

    /// Normalises the query and key rows of qkv [B,T,QKV] in place; what the backward reads
    /// is allocated under `keep_as` (the copy of the input) and `stats_as` (the statistics).
    pub fn forward(
        &self,
        dev: &dyn Device,
        tp: &mut TensorGroup,
        qkv: &mut Tensor,
        keep_as: Category,
        stats_as: Category,
    ) -> QkNormActs {
        let mut input = dev.empty_of(qkv.dtype(), qkv.shape(), keep_as); // [B,T,QKV]
        dev.copy(&mut input, qkv);
        let rstd = self.normalize(dev, tp, qkv, stats_as);
        QkNormActs { input, rstd }
    }

    /// Normalises the query and key rows of qkv [B,T,QKV] in place, keeping no input for a
    /// backward (inference); returns the statistics [B,T,rows], allocated under `stats_as`.
    pub fn normalize(
        &self,
        dev: &dyn Device,
        tp: &mut TensorGroup,
        qkv: &mut Tensor,
        stats_as: Category,
    ) -> Tensor {
        let tokens = &qkv.shape()[..qkv.shape().len() - 1];
        let rows = self.span.rows(self.heads, self.kv_heads, 1).rows(); // as many whatever their width
        let mut rstd = dev.empty(&[tokens, &[rows]].concat(), stats_as); // [B,T,rows]
        let (h, w) = (self.of_heads(), self.weights());
        if self.parts == 1 {
            dev.qk_norm_forward(qkv, &mut rstd, w, h, self.eps);
        } else {
            // The whole row's sum of squares is the group's sum of its parts'.
            dev.qk_norm_sum_squares(qkv, &mut rstd, h);
            tp.all_reduce(&mut rstd, dev);
            dev.qk_norm_forward_summed(qkv, &mut rstd, w, h, self.parts, self.eps);
        }
        rstd
    }

    /// dqkv [B,T,QKV], the gradient of the norm's output, becomes its input's, in place;
    /// the weights' gradients dq, dk (as wide as the weights) accumulate.
    pub fn backward(
        &self,
        dev: &dyn Device,
        tp: &mut TensorGroup,
        dqkv: &mut Tensor,
        acts: QkNormActs,
        (dq, dk): (&mut Tensor, &mut Tensor),
    ) {
        let (h, w) = (self.of_heads(), self.weights());
        if self.parts == 1 {
            dev.qk_norm_backward(dqkv, [dq, dk], &acts.input, w, &acts.rstd, h);
            return;
        }
        // The whole row's sum of dnorm * norm is the group's sum of its parts'.
        let mut dots = dev.empty(acts.rstd.shape(), Category::Workspace); // [B,T,rows]
        dev.qk_norm_backward_dots(dqkv, &acts.input, w, &acts.rstd, &mut dots, h);
        tp.all_reduce(&mut dots, dev);
        dev.qk_norm_backward_summed(dqkv, [dq, dk], &acts.input, w, &acts.rstd, (&dots, self.parts), h);
    }
}
