//! The model a checkpoint holds, as its `config.json` says it in Hugging Face's terms:
//! GPT2Config for GPT-2's architecture, LlamaConfig for the rest (see llama_config.rs).
//! The run config it implies, and from that the model's shape and parameters, come from
//! the same functions a training run uses.

use std::path::Path;

use kernels::rope_frequencies::rotary_percent_of;
use serde_json::Value;
use stages::{Architecture, LinearBiases, Naming};

use super::hf_class::{HfClass, CLASSES};
use super::{HfGpt2Config, LlamaConfig};
use crate::config::{Config, PositionEmbeddingType};
use crate::error::user_error;

#[derive(Clone, Debug, PartialEq)]
pub enum ModelConfig {
    Gpt2(HfGpt2Config),
    Llama(LlamaConfig),
}

impl ModelConfig {
    /// The model a run config describes.
    pub fn of(c: &Config) -> ModelConfig {
        if crate::plan::shape(c).naming() == Naming::Gpt2 {
            return ModelConfig::Gpt2(HfGpt2Config {
                vocab_size: c.vocab_size,
                n_positions: c.max_position_embeddings,
                n_embd: c.hidden_size,
                n_layer: c.num_layers,
                n_head: c.num_attention_heads,
                n_inner: c.ffn_hidden_size,
                resid_pdrop: c.hidden_dropout,
                embd_pdrop: c.hidden_dropout,
                attn_pdrop: c.attention_dropout,
                layer_norm_epsilon: c.norm_epsilon,
                initializer_range: c.init_method_std,
            });
        }
        ModelConfig::Llama(LlamaConfig {
            arch: c.architecture(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.ffn_size(),
            num_hidden_layers: c.num_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads: c.kv_heads(),
            head_dim: c.head_size(),
            max_position_embeddings: c.max_position_embeddings,
            hidden_dropout: c.hidden_dropout,
            attention_dropout: c.attention_dropout,
        })
    }

    pub fn to_json(&self) -> Value {
        match self {
            ModelConfig::Gpt2(g) => g.to_json(),
            ModelConfig::Llama(l) => l.to_json(),
        }
    }

    /// Parses a config.json by its model_type; `path` names the file in errors.
    pub fn from_json(path: &Path, text: &str) -> anyhow::Result<ModelConfig> {
        let bad = |what: String| user_error(format!("{}: {what}", path.display()));
        let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let obj = value.as_object().ok_or_else(|| bad("not a JSON object".into()))?;
        match obj.get("model_type").and_then(Value::as_str) {
            Some("gpt2") => Ok(ModelConfig::Gpt2(HfGpt2Config::from_object(path, obj)?)),
            Some(t) if t == "pipetrain" || HfClass::named(t).is_some() => {
                Ok(ModelConfig::Llama(LlamaConfig::from_json(path, obj)?))
            }
            _ => {
                let read: Vec<String> = CLASSES.iter().map(|c| format!("{:?}", c.model_type)).collect();
                let (last, rest) = read.split_last().expect("classes are read");
                Err(bad(format!(
                    "model_type is {}, pipetrain reads \"gpt2\", {} and {last}",
                    obj.get("model_type").map_or("missing".to_string(), Value::to_string),
                    rest.join(", ")
                )))
            }
        }
    }

    /// A run config for this model at sequence length `seq_length` and micro batch
    /// `micro_batch_size`, dropout off (evaluation, generation, a check of its tensors).
    pub fn run_config(&self, seq_length: usize, micro_batch_size: usize) -> Config {
        let run = Config {
            seq_length,
            micro_batch_size,
            global_batch_size: micro_batch_size,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
            ..Config::default()
        };
        match self {
            ModelConfig::Gpt2(h) => Config {
                num_layers: h.n_layer,
                hidden_size: h.n_embd,
                num_attention_heads: h.n_head,
                ffn_hidden_size: h.n_inner,
                max_position_embeddings: h.n_positions,
                vocab_size: h.vocab_size,
                norm_epsilon: h.layer_norm_epsilon,
                init_method_std: h.initializer_range,
                ..run
            },
            ModelConfig::Llama(l) => {
                let a: &Architecture = &l.arch;
                let (position_embedding_type, rotary_base, llama3_factor, rotary_percent) = match a.positions
                {
                    stages::Positions::Learned => {
                        (PositionEmbeddingType::LearnedAbsolute, run.rotary_base, None, 1.0)
                    }
                    stages::Positions::Rotary(f) => (
                        PositionEmbeddingType::Rope,
                        f.base,
                        f.llama3_factor,
                        f.rotary_dims.map_or(1.0, |rot| rotary_percent_of(rot, l.head_dim)),
                    ),
                };
                let gqa = l.num_key_value_heads != l.num_attention_heads;
                Config {
                    num_layers: l.num_hidden_layers,
                    hidden_size: l.hidden_size,
                    num_attention_heads: l.num_attention_heads,
                    kv_channels: (l.head_dim * l.num_attention_heads != l.hidden_size).then_some(l.head_dim),
                    ffn_hidden_size: Some(l.intermediate_size),
                    max_position_embeddings: l.max_position_embeddings,
                    vocab_size: l.vocab_size,
                    init_method_std: a.init_std,
                    normalization: a.norm,
                    norm_epsilon: a.norm_eps,
                    apply_layernorm_1p: a.zero_centered_gamma,
                    norm_placement: a.norm_placement,
                    position_embedding_type,
                    rotary_base,
                    use_rope_scaling: llama3_factor.is_some(),
                    rope_scaling_factor: llama3_factor,
                    rotary_percent,
                    swiglu: a.activation == stages::Activation::SwiGlu,
                    squared_relu: a.activation == stages::Activation::SquaredRelu,
                    geglu: a.activation == stages::Activation::GeGlu,
                    embedding_multiplier: a.embedding_multiplier,
                    group_query_attention: gqa,
                    num_query_groups: gqa.then_some(l.num_key_value_heads),
                    untie_embeddings_and_output_weights: !a.tied_output,
                    disable_bias_linear: a.biases != LinearBiases::All,
                    add_qkv_bias: a.biases == LinearBiases::QkvOnly,
                    qk_layernorm: a.qk_norm,
                    qk_norm_span: a.qk_norm_span,
                    window_size: a.sliding_window.map(|w| [w.keys - 1, 0]),
                    window_attn_skip_freq: a.sliding_window.and_then(|w| w.full_every),
                    ..run
                }
            }
        }
    }

    pub fn num_layers(&self) -> usize {
        match self {
            ModelConfig::Gpt2(h) => h.n_layer,
            ModelConfig::Llama(l) => l.num_hidden_layers,
        }
    }

    /// The name of the token embedding where the output layer is tied to it (a saved
    /// `lm_head.weight` must then equal it).
    pub fn tied_embedding(&self) -> Option<&'static str> {
        match self {
            ModelConfig::Gpt2(_) => Some("wte.weight"),
            ModelConfig::Llama(l) => l.arch.tied_output.then_some("model.embed_tokens.weight"),
        }
    }

    pub fn max_positions(&self) -> usize {
        match self {
            ModelConfig::Gpt2(h) => h.n_positions,
            ModelConfig::Llama(l) => l.max_position_embeddings,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Gpt2(h) => h.vocab_size,
            ModelConfig::Llama(l) => l.vocab_size,
        }
    }

    /// Why `transformers` has no class for this model, where it has none (GPT-2's it has).
    pub fn missing_in_transformers(&self) -> Option<&'static str> {
        match self {
            ModelConfig::Gpt2(_) => None,
            ModelConfig::Llama(l) => l.missing_in_transformers(),
        }
    }
}
