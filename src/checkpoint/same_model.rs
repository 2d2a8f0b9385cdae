//! The check that a run config describes the model a checkpoint holds, before a run resumes
//! it or starts from it (`load`). The tensors' shapes catch most differences; these are the
//! ones they cannot: the head count of a model without grouped-query attention, the norm's
//! epsilon, rotary positions' base and scaling. A run that took the config's value would
//! train another model on these weights without a word.

use std::path::Path;

use super::ModelConfig;
use crate::config::{Config, Named};
use stages::Positions;

/// Errors, naming the key and where its value came from, where `cfg` and the model `held`
/// (the checkpoint at `dir`) differ in anything that defines the function the model
/// computes. Dropout and init std do not: training may change the one, and loaded weights
/// make the other moot.
pub fn check_same_model(cfg: &Config, held: &ModelConfig, dir: &Path) -> anyhow::Result<()> {
    let theirs = held.run_config(cfg.seq_length, cfg.micro_batch_size);
    for ((key, ours), (_, held)) in defining_values(cfg).into_iter().zip(defining_values(&theirs)) {
        if ours != held {
            return Err(
                cfg.key_error(key, format!("{} holds a model with {key} {held}, not {ours}", dir.display()))
            );
        }
    }
    Ok(())
}

/// The config keys that define the model, each with its value as the config resolves it
/// (an unset `ffn_hidden_size` is 4 x hidden, an unset `num_query_groups` the head count).
/// `add_qkv_bias` counts only under `disable_bias_linear` (beside the other biases it adds
/// none). The rotary keys (`rotary_percent` among them) count only with rotary positions, `rope_scaling_factor` (its
/// default resolved, "none" unscaled) only where both use the scaling, and
/// `max_position_embeddings` only with learned positions: a rotary model runs at any length
/// up to it.
fn defining_values(c: &Config) -> Vec<(&'static str, String)> {
    let mut values = vec![
        ("num_layers", c.num_layers.to_string()),
        ("hidden_size", c.hidden_size.to_string()),
        ("num_attention_heads", c.num_attention_heads.to_string()),
        ("num_query_groups", c.kv_heads().to_string()),
        ("kv_channels", c.head_size().to_string()),
        ("ffn_hidden_size", c.ffn_size().to_string()),
        ("vocab_size", c.vocab_size.to_string()),
        ("normalization", c.normalization.name().to_string()),
        ("norm_epsilon", c.norm_epsilon.to_string()),
        ("apply_layernorm_1p", c.apply_layernorm_1p.to_string()),
        ("norm_placement", c.norm_placement.name().to_string()),
        ("position_embedding_type", c.position_embedding_type.name().to_string()),
        ("swiglu", c.swiglu.to_string()),
        ("squared_relu", c.squared_relu.to_string()),
        ("geglu", c.geglu.to_string()),
        ("embedding_multiplier", c.embedding_multiplier.map_or("none".into(), |m| m.to_string())),
        ("disable_bias_linear", c.disable_bias_linear.to_string()),
        ("qk_layernorm", c.qk_layernorm.to_string()),
        ("qk_norm_span", c.qk_norm_span.name().to_string()),
        ("window_size", c.window_size.map_or("none".into(), |[left, right]| format!("[{left}, {right}]"))),
        // A period past the last layer leaves every layer windowed, as none does.
        (
            "window_attn_skip_freq",
            c.window_attn_skip_freq.filter(|&n| n <= c.num_layers).map_or("none".into(), |n| n.to_string()),
        ),
        ("untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights.to_string()),
    ];
    if c.disable_bias_linear {
        values.push(("add_qkv_bias", c.add_qkv_bias.to_string()));
    }
    match c.architecture().positions {
        Positions::Rotary(freqs) => values.extend([
            ("rotary_base", freqs.base.to_string()),
            ("use_rope_scaling", c.use_rope_scaling.to_string()),
            ("rope_scaling_factor", freqs.llama3_factor.map_or("none".into(), |f| f.to_string())),
            ("rotary_percent", c.rotary_percent.to_string()),
        ]),
        Positions::Learned => values.push(("max_position_embeddings", c.max_position_embeddings.to_string())),
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PositionEmbeddingType;
    use stages::Norm;

    fn refusal(cfg: &Config, held: &Config) -> String {
        match check_same_model(cfg, &ModelConfig::of(held), Path::new("ck")) {
            Ok(()) => "the same model".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn names_what_the_shapes_cannot_tell_apart() {
        let gpt2 = Config {
            num_layers: 2,
            hidden_size: 8,
            num_attention_heads: 2,
            vocab_size: 64,
            ..Config::default()
        };
        let llama = Config {
            normalization: Norm::RmsNorm,
            position_embedding_type: PositionEmbeddingType::Rope,
            swiglu: true,
            disable_bias_linear: true,
            untie_embeddings_and_output_weights: true,
            ..gpt2.clone()
        };
        for model in [&gpt2, &llama] {
            assert_eq!(refusal(model, model), "the same model");
            // Dropout and init are the run's, not the model's.
            let run = Config { hidden_dropout: 0.3, init_method_std: 0.5, ..model.clone() };
            assert_eq!(refusal(&run, model), "the same model");
        }
        let heads = Config { num_attention_heads: 4, ..gpt2.clone() };
        assert_eq!(
            refusal(&heads, &gpt2),
            "key `num_attention_heads`: ck holds a model with num_attention_heads 2, not 4"
        );
        let longer = Config { max_position_embeddings: 2 * gpt2.max_position_embeddings, ..gpt2.clone() };
        assert!(refusal(&longer, &gpt2).starts_with("key `max_position_embeddings`: "));
        // A rotary model runs at any length up to its limit: raising it is the same model.
        let longer = Config { max_position_embeddings: 2 * llama.max_position_embeddings, ..llama.clone() };
        assert_eq!(refusal(&longer, &llama), "the same model");
        let eps = Config { norm_epsilon: 1e-3, ..llama.clone() };
        assert_eq!(
            refusal(&eps, &llama),
            "key `norm_epsilon`: ck holds a model with norm_epsilon 0.00001, not 0.001"
        );
        let base = Config { rotary_base: 500000.0, ..llama.clone() };
        assert_eq!(
            refusal(&base, &llama),
            "key `rotary_base`: ck holds a model with rotary_base 10000, not 500000"
        );
        // Llama 3.1's scaling, its factor resolved: Megatron's default is 8.
        let llama31 = Config { use_rope_scaling: true, ..base.clone() };
        assert_eq!(
            refusal(&base, &llama31),
            "key `use_rope_scaling`: ck holds a model with use_rope_scaling true, not false"
        );
        let eight = Config { rope_scaling_factor: Some(8.0), ..llama31.clone() };
        assert_eq!(refusal(&eight, &llama31), "the same model");
        let llama32 = Config { rope_scaling_factor: Some(32.0), ..llama31.clone() };
        assert_eq!(
            refusal(&llama31, &llama32),
            "key `rope_scaling_factor`: ck holds a model with rope_scaling_factor 32, not 8"
        );
        // Qwen2's biases on q, k and v count without the other biases; beside them they add none.
        let qwen2 = Config { add_qkv_bias: true, ..llama.clone() };
        assert_eq!(
            refusal(&llama, &qwen2),
            "key `add_qkv_bias`: ck holds a model with add_qkv_bias true, not false"
        );
        let biased = Config { add_qkv_bias: true, ..gpt2.clone() };
        assert_eq!(refusal(&biased, &gpt2), "the same model");
        // The head size, resolved: kv_channels 4 is the width over the heads.
        let wide = Config { kv_channels: Some(8), ..llama.clone() };
        assert_eq!(refusal(&wide, &llama), "key `kv_channels`: ck holds a model with kv_channels 4, not 8");
        assert_eq!(refusal(&Config { kv_channels: Some(4), ..llama.clone() }, &llama), "the same model");
        // A sliding window, and its period where it reaches a layer (of 2 here).
        let windowed = Config { window_size: Some([3, 0]), ..llama.clone() };
        assert_eq!(
            refusal(&windowed, &llama),
            "key `window_size`: ck holds a model with window_size none, not [3, 0]"
        );
        let every_fourth = Config { window_attn_skip_freq: Some(4), ..windowed.clone() };
        assert_eq!(refusal(&every_fourth, &windowed), "the same model");
        let every_second = Config { window_attn_skip_freq: Some(2), ..windowed.clone() };
        assert_eq!(
            refusal(&every_second, &windowed),
            "key `window_attn_skip_freq`: ck holds a model with window_attn_skip_freq none, not 2"
        );
        // Qwen3's QK-norm: the same parameters but two per block.
        let qwen3 = Config { qk_layernorm: true, ..llama.clone() };
        assert_eq!(
            refusal(&qwen3, &llama),
            "key `qk_layernorm`: ck holds a model with qk_layernorm false, not true"
        );
        // Nemotron's half-turned heads: the same parameters, other positions.
        let nemotron = Config { rotary_percent: 0.5, ..llama.clone() };
        assert_eq!(
            refusal(&nemotron, &llama),
            "key `rotary_percent`: ck holds a model with rotary_percent 1, not 0.5"
        );
        assert_eq!(refusal(&nemotron, &nemotron), "the same model");
        // Nemotron's squared ReLU and zero-centred norms: GELU's and plain norms' shapes.
        let relu2 = Config { swiglu: false, squared_relu: true, ..llama.clone() };
        let gelu = Config { swiglu: false, ..llama.clone() };
        assert_eq!(
            refusal(&relu2, &gelu),
            "key `squared_relu`: ck holds a model with squared_relu false, not true"
        );
        let geglu = Config { swiglu: false, geglu: true, ..llama.clone() };
        assert_eq!(refusal(&geglu, &llama), "key `swiglu`: ck holds a model with swiglu true, not false");
        let scaled = Config { embedding_multiplier: Some(2.0), ..llama.clone() };
        assert_eq!(
            refusal(&scaled, &llama),
            "key `embedding_multiplier`: ck holds a model with embedding_multiplier none, not 2"
        );
        let one_plus = Config { apply_layernorm_1p: true, ..llama.clone() };
        assert_eq!(
            refusal(&one_plus, &llama),
            "key `apply_layernorm_1p`: ck holds a model with apply_layernorm_1p false, not true"
        );
    }
}
