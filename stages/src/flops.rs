//! FLOP counts from the layer shapes, for MFU and the simulator's durations. A matmul of
//! [N,K] by [K,M] costs 2*N*K*M; the attention core counts its full T x T products (the
//! usual convention for MFU, e.g. PaLM's and Megatron's).

use crate::model::ModelShape;
use crate::tensor_parallel::TensorParallel;

/// FLOPs of one microbatch through one part of the model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Flops {
    pub forward: f64,
    /// Gradients of the inputs (and of the attention core, which has no weights).
    pub backward_input: f64,
    /// Gradients of the weights.
    pub backward_weight: f64,
}

impl Flops {
    pub fn total(&self) -> f64 {
        self.forward + self.backward_input + self.backward_weight
    }

    /// One tensor-parallel rank's share: Megatron splits every matmul (the LM head's by
    /// vocabulary) and the attention core (by heads) t ways.
    pub fn per_rank(self, tp: TensorParallel) -> Flops {
        let t = tp.size as f64;
        Flops {
            forward: self.forward / t,
            backward_input: self.backward_input / t,
            backward_weight: self.backward_weight / t,
        }
    }
}

/// One transformer block for one microbatch: its four matmuls (q, k and v with
/// grouped-query attention's narrower k and v; SwiGLU's fused gate and up) and the
/// attention core, whose products span every query head whatever the groups. Norms,
/// rotary embeddings and activations are elementwise and not counted.
pub fn block_flops(s: &ModelShape) -> Flops {
    let (n, c, f) = (s.tokens() as f64, s.hidden as f64, s.ffn as f64);
    let (qkv, fc1, a) = (s.qkv_width() as f64, s.fc1_width() as f64, s.attention_width() as f64);
    let matmul = 2.0 * n * (c * qkv + a * c + c * fc1 + f * c);
    let attention = 2.0 * 2.0 * s.micro_batch as f64 * s.seq_len as f64 * s.seq_len as f64 * a;
    Flops { forward: matmul + attention, backward_input: matmul + 2.0 * attention, backward_weight: matmul }
}

/// The head (the output layer's matmul) for one microbatch: all of it in
/// forward, which runs the head's backward too (see layers/head.rs).
pub fn head_flops(s: &ModelShape) -> Flops {
    let m = 2.0 * s.tokens() as f64 * s.hidden as f64 * s.vocab as f64;
    Flops { forward: 3.0 * m, backward_input: 0.0, backward_weight: 0.0 }
}

/// Model FLOPs of one training step over `microbatches` microbatches (no recompute counted:
/// MFU measures useful work).
pub fn train_step_flops(s: &ModelShape, microbatches: usize) -> f64 {
    (s.num_layers as f64 * block_flops(s).total() + head_flops(s).total()) * microbatches as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_six_n_plus_attention_for_gpt2_small() {
        let s = ModelShape::GPT2_SMALL;
        // 6 * (non-embedding matmul params + LM head) per token + 12 * L * T * C attention.
        let matmul_params = 12.0 * (768.0 * 2304.0 + 768.0 * 768.0 + 2.0 * 768.0 * 3072.0) + 768.0 * 50257.0;
        let expected = 1024.0 * (6.0 * matmul_params + 12.0 * 12.0 * 1024.0 * 768.0);
        assert_eq!(train_step_flops(&s, 1), expected);
    }
}
