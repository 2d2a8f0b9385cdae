//! Which transformers class builds a model pipetrain describes with a [`LlamaConfig`], and
//! why none does where none does: `LlamaForCausalLM` and its kin (Qwen2's biases on q, k
//! and v, Qwen3's QK-norm), `NemotronForCausalLM`, `StableLmForCausalLM` and
//! `GemmaForCausalLM`; what no class builds is written as pipetrain's own model_type.

use kernels::RopeFrequencies;
use stages::{Activation, Architecture, LinearBiases, Norm, Positions};

use super::LlamaConfig;

/// Gemma's embedding multiplier for a width of `hidden`: sqrt(hidden_size), as the f32
/// tensor transformers' GemmaModel holds.
pub fn gemma_multiplier(hidden: usize) -> f32 {
    (hidden as f64).sqrt() as f32
}

impl LlamaConfig {
    /// Rotary positions that every class here builds: no Llama 3.1 scaling.
    fn unscaled_rope(&self) -> bool {
        matches!(self.arch.positions, Positions::Rotary(RopeFrequencies { llama3_factor: None, .. }))
    }

    /// Whether transformers' `NemotronForCausalLM` builds this model: LayerNorm1P (a
    /// LayerNorm scaling by 1 + weight), squared ReLU, unscaled rope, no QK-norm, and biases
    /// on every linear layer or on none.
    fn is_nemotron(&self) -> bool {
        let a = &self.arch;
        a.norm == Norm::LayerNorm
            && a.zero_centered_gamma
            && a.activation == Activation::SquaredRelu
            && self.unscaled_rope()
            && !a.qk_norm
            && a.biases != LinearBiases::QkvOnly
            && a.embedding_multiplier.is_none()
    }

    /// Whether transformers' `StableLmForCausalLM` builds this model (StableLM 2): a plain
    /// LayerNorm, SwiGLU, unscaled rope, no QK-norm, biases on q, k and v or on none, and
    /// heads of hidden_size / num_attention_heads (the class reads no head_dim).
    fn is_stablelm(&self) -> bool {
        let a = &self.arch;
        a.norm == Norm::LayerNorm
            && !a.zero_centered_gamma
            && a.activation == Activation::SwiGlu
            && self.unscaled_rope()
            && !a.qk_norm
            && a.biases != LinearBiases::All
            && self.head_dim * self.num_attention_heads == self.hidden_size
            && a.embedding_multiplier.is_none()
    }

    /// Whether transformers' `GemmaForCausalLM` builds this model (Gemma 1): RMSNorm scaling
    /// by 1 + weight, GeGLU, rope over every channel unscaled, no QK-norm, no biases, and
    /// the embedding multiplied by sqrt(hidden_size).
    fn is_gemma(&self) -> bool {
        let a = &self.arch;
        a.norm == Norm::RmsNorm
            && a.zero_centered_gamma
            && a.activation == Activation::GeGlu
            && matches!(
                a.positions,
                Positions::Rotary(RopeFrequencies { llama3_factor: None, rotary_dims: None, .. })
            )
            && !a.qk_norm
            && a.biases == LinearBiases::NoBiases
            && a.embedding_multiplier == Some(gemma_multiplier(self.hidden_size))
    }

    pub(super) fn with_biases(&self, biases: LinearBiases) -> LlamaConfig {
        LlamaConfig { arch: Architecture { biases, ..self.arch }, ..self.clone() }
    }

    /// Why `transformers` has no class for this model, where it has none: its
    /// `LlamaForCausalLM`, `Qwen2ForCausalLM` and `Qwen3ForCausalLM` need RMSNorm, rotary
    /// positions over the whole head and a SwiGLU MLP, and Qwen3's QK-norm comes without
    /// biases; the other classes take what [`LlamaConfig::is_nemotron`],
    /// [`LlamaConfig::is_stablelm`] and [`LlamaConfig::is_gemma`] say.
    pub fn missing_in_transformers(&self) -> Option<&'static str> {
        let a = &self.arch;
        if self.is_nemotron() || self.is_stablelm() || self.is_gemma() {
            return None;
        }
        if a.embedding_multiplier.is_some() {
            return Some(
                "only GemmaForCausalLM multiplies its embeddings, by sqrt(hidden_size), beside RMSNorm, \
                 apply_layernorm_1p, rope over every channel, geglu and no biases",
            );
        }
        if self.with_biases(LinearBiases::NoBiases).is_nemotron() {
            return Some(
                "NemotronForCausalLM puts biases on every linear layer or none (attention_bias, mlp_bias), not on q, \
                 k and v alone",
            );
        }
        if a.zero_centered_gamma {
            return Some(
                "only NemotronForCausalLM's and GemmaForCausalLM's norms scale by 1 + weight (apply_layernorm_1p): \
                 Nemotron's beside LayerNorm, rope and squared_relu, Gemma's beside RMSNorm, rope, geglu and \
                 embeddings multiplied by sqrt(hidden_size)",
            );
        }
        if self.with_biases(LinearBiases::NoBiases).is_stablelm() {
            return Some(
                "StableLmForCausalLM puts biases on q, k and v or nowhere, not on every linear layer",
            );
        }
        let narrow = LlamaConfig { head_dim: self.hidden_size / self.num_attention_heads, ..self.clone() };
        if narrow.is_stablelm() {
            return Some(
                "StableLmForCausalLM's heads are hidden_size / num_attention_heads wide, not kv_channels",
            );
        }
        if a.norm != Norm::RmsNorm || a.positions == Positions::Learned || a.activation != Activation::SwiGlu
        {
            return Some(
                "LlamaForCausalLM needs normalization RMSNorm, position_embedding_type rope and swiglu together, \
                 StableLmForCausalLM LayerNorm, rope and swiglu, NemotronForCausalLM LayerNorm, \
                 apply_layernorm_1p, rope and squared_relu",
            );
        }
        if a.qk_norm && a.biases != LinearBiases::NoBiases {
            return Some("Qwen3ForCausalLM's QK-norm comes without linear biases");
        }
        if matches!(a.positions, Positions::Rotary(RopeFrequencies { rotary_dims: Some(_), .. })) {
            return Some(
                "LlamaForCausalLM's rotary embedding turns every channel of a head, not rotary_percent of it",
            );
        }
        None
    }

    /// config.json's model_type: "nemotron", "stablelm" and "gemma" for theirs, "qwen3" for
    /// QK-norm, "qwen2" for biases on q, k and v alone (LlamaConfig's `attention_bias` would
    /// put one on the output projection too), "llama" for what else LlamaForCausalLM builds,
    /// "pipetrain" for the rest.
    pub(super) fn model_type(&self) -> &'static str {
        if self.is_nemotron() {
            return "nemotron";
        }
        if self.is_stablelm() {
            return "stablelm";
        }
        if self.is_gemma() {
            return "gemma";
        }
        match (self.missing_in_transformers().is_none(), self.arch.qk_norm, self.arch.biases) {
            (false, ..) => "pipetrain",
            (true, true, _) => "qwen3",
            (true, false, LinearBiases::QkvOnly) => "qwen2",
            (true, false, LinearBiases::All | LinearBiases::NoBiases) => "llama",
        }
    }
}
