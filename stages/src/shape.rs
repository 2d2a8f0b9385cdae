//! The model's shape: everything the layers, the memory model and the FLOP counts derive from.

use kernels::{AttentionSaves, DType};

/// GPT-2-style decoder shape for one microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptShape {
    /// Transformer blocks in the whole model.
    pub num_layers: usize,
    /// C, the residual width.
    pub hidden: usize,
    /// NH, attention heads.
    pub heads: usize,
    /// The MLP's inner width (4C for GPT-2).
    pub ffn: usize,
    /// T, tokens per sequence.
    pub seq_len: usize,
    /// Rows of the position embedding.
    pub max_positions: usize,
    /// V, vocabulary size (the LM head is tied to the token embedding).
    pub vocab: usize,
    /// B, sequences per microbatch.
    pub micro_batch: usize,
    /// Training drops attention probabilities (attention_dropout > 0): where the attention
    /// core keeps probabilities, each block then keeps the dropped ones beside them.
    pub attention_dropout: bool,
    /// What the device's attention core keeps for backward: the probabilities (CPU) or the
    /// per-row log-sum-exp (the CUDA backend's fused kernels).
    pub attention: AttentionSaves,
    /// The element type the device stores activations and their gradients in
    /// (`Device::activation_dtype`): bf16 on a CUDA device under `precision: bf16`, f32
    /// otherwise. The memory model reads it (`saved::BlockTensor::element_bytes`).
    pub activations: DType,
}

impl GptShape {
    /// GPT-2 small (124M) at T = 1024, one sequence per microbatch: the shape tests check
    /// figures against.
    pub const GPT2_SMALL: GptShape = GptShape {
        num_layers: 12,
        hidden: 768,
        heads: 12,
        ffn: 3072,
        seq_len: 1024,
        max_positions: 1024,
        vocab: 50257,
        micro_batch: 1,
        attention_dropout: false,
        attention: AttentionSaves::Probabilities,
        activations: DType::F32,
    };

    /// N = B*T, rows of every activation matrix.
    pub fn tokens(&self) -> usize {
        self.micro_batch * self.seq_len
    }

    pub fn head_size(&self) -> usize {
        self.hidden / self.heads
    }

    /// Parameters of one transformer block.
    pub fn block_params(&self) -> usize {
        let (c, f) = (self.hidden, self.ffn);
        2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * f + f) + (f * c + c)
    }

    /// Parameters of the whole model (the tied LM head counted once).
    pub fn total_params(&self) -> usize {
        self.vocab * self.hidden
            + self.max_positions * self.hidden
            + self.num_layers * self.block_params()
            + 2 * self.hidden
    }
}

/// Dropout probabilities (GPT-2: embd/resid = hidden, attn = attention).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct DropoutProbs {
    pub hidden: f32,
    pub attention: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_small_has_124m_parameters() {
        let s = GptShape::GPT2_SMALL;
        assert_eq!(s.total_params(), 124_439_808);
    }
}
