//! `config.json` in Hugging Face's LlamaConfig format, for every model that is not GPT-2's
//! architecture: written so that `transformers.LlamaForCausalLM.from_pretrained(dir)`
//! builds the same model, and read back (from pipetrain or from Hugging Face). A Llama with
//! biases on q, k and v alone is Qwen2's architecture, and its config.json is Qwen2Config's
//! (`Qwen2ForCausalLM`), which names the same tensors the same way; a Llama with QK-norm and
//! no biases is Qwen3's (`Qwen3ForCausalLM`). MistralForCausalLM's and Phi3ForCausalLM's
//! config.json are read too, each as a Llama; a Llama that rotates part of each head is
//! written as the Phi-3 it is. Phi-3's checkpoints hold q, k, v and gate, up fused, under
//! pipetrain's own fused names (`shapes::split_fused`). A sliding window reads and writes
//! as `hf_window.rs` says. Which class takes which model, and the keys each reads, is
//! `hf_class.rs`.
//!
//! A model no class builds (a LayerNorm, learned positions or a GELU MLP beside the Llama
//! family's other choices) is written with `model_type: "pipetrain"` and Megatron's keys
//! for what differs, so that transformers refuses it instead of building another model.

use std::path::Path;

use kernels::rope_frequencies::{
    is_llama3_factor, rotary_dims_of, rotary_percent_of, RopeFrequencies, LLAMA3_HIGH_FREQ_FACTOR,
    LLAMA3_LOW_FREQ_FACTOR, LLAMA3_ORIGINAL_POSITIONS,
};
use serde_json::{json, Map, Value};
use stages::{Activation, Architecture, LinearBiases, Norm, NormPlacement, Positions, QkNormSpan};

use super::hf_class::{gemma_multiplier, BiasKeys, HfClass, LLAMA};
use super::hf_window;
use crate::config::Named;
use crate::error::user_error;

/// A decoder's sizes and architecture, in Hugging Face's LlamaConfig terms.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub arch: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    /// Megatron's hidden_dropout (Llama has none; kept for a pipetrain run's record).
    pub hidden_dropout: f32,
    pub attention_dropout: f32,
}

/// The largest head size read (real ones are at most 256), so that the fused projection's
/// width, (NH + 2 KV) x hs, fits a usize whatever the head counts.
const MAX_HEAD_DIM: usize = 1 << 16;

impl LlamaConfig {
    pub fn to_json(&self) -> Value {
        let a = &self.arch;
        let (rope_theta, rope_scaling) = match a.positions {
            Positions::Rotary(f) => (decimal(f.base), f.llama3_factor.map_or(Value::Null, llama3_scaling)),
            Positions::Learned => (Value::Null, Value::Null),
        };
        // pipetrain's own model_type writes Llama's keys, Megatron's beside them.
        let class = self.hf_class();
        let row = class.unwrap_or(&LLAMA);
        let mut j = json!({
            "model_type": class.map_or("pipetrain", |c| c.model_type),
            "architectures": [row.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": row.hidden_act[0],
            row.eps_key: decimal(a.norm_eps),
            "rope_theta": rope_theta,
            "rope_scaling": rope_scaling,
            "attention_dropout": decimal(self.attention_dropout),
            "tie_word_embeddings": a.tied_output,
            "initializer_range": decimal(a.init_std),
            // No embedding row is padding: Phi3Config's default would name row 32000,
            // GemmaConfig's row 0.
            "pad_token_id": null,
            // The text's first and last tokens are the tokenizer's, which the model does not
            // know (an export names them where it knows the tokenizer): a class's default
            // would stop generate at a token of another vocabulary (LlamaConfig's 2,
            // Olmo2Config's 50279).
            "bos_token_id": null,
            "eos_token_id": null,
            "torch_dtype": "float32",
            "use_cache": true,
        });
        let extra = j.as_object_mut().expect("an object");
        if row.rotary_share.is_some() {
            // The class's rotation defaults to part of a head (Nemotron's half, StableLM's
            // quarter), so it is always written.
            let rot = match a.positions {
                Positions::Rotary(f) => f.rotated(self.head_dim),
                Positions::Learned => unreachable!("{} has rotary positions", row.model_type),
            };
            extra.insert("partial_rotary_factor".into(), json!(rotary_percent_of(rot, self.head_dim)));
        }
        match row.biases {
            BiasKeys::AttentionAndMlp => {
                extra.insert("attention_bias".into(), json!(a.biases == LinearBiases::All));
                extra.insert("mlp_bias".into(), json!(a.biases == LinearBiases::All));
            }
            BiasKeys::UseQkvBias => {
                extra.insert("use_qkv_bias".into(), json!(a.biases == LinearBiases::QkvOnly));
            }
            BiasKeys::Fixed(_) => {}
            BiasKeys::NoneWithoutAttentionBias => {
                extra.insert("attention_bias".into(), json!(false));
            }
        }
        for (key, _) in row.refused {
            extra.insert((*key).into(), json!(false));
        }
        hf_window::write(extra, row.window, class.is_none(), a.sliding_window, self.num_hidden_layers);
        if class.is_none() {
            extra.insert("normalization".into(), json!(a.norm.name()));
            extra.insert("norm_placement".into(), json!(a.norm_placement.name()));
            extra.insert("norm_epsilon".into(), decimal(a.norm_eps));
            extra.insert("apply_layernorm_1p".into(), json!(a.zero_centered_gamma));
            let positions = match a.positions {
                Positions::Learned => "learned_absolute",
                Positions::Rotary(_) => "rope",
            };
            extra.insert("position_embedding_type".into(), json!(positions));
            if let Positions::Rotary(RopeFrequencies { rotary_dims: Some(rot), .. }) = a.positions {
                extra.insert("rotary_percent".into(), json!(rotary_percent_of(rot, self.head_dim)));
            }
            extra.insert("swiglu".into(), json!(a.activation == Activation::SwiGlu));
            extra.insert("squared_relu".into(), json!(a.activation == Activation::SquaredRelu));
            extra.insert("geglu".into(), json!(a.activation == Activation::GeGlu));
            if let Some(m) = a.embedding_multiplier {
                extra.insert("embedding_multiplier".into(), decimal(m));
            }
            extra.insert("add_qkv_bias".into(), json!(a.biases == LinearBiases::QkvOnly));
            extra.insert("qk_layernorm".into(), json!(a.qk_norm));
            extra.insert("qk_norm_span".into(), json!(a.qk_norm_span.name()));
            extra.insert("hidden_dropout".into(), decimal(self.hidden_dropout));
        }
        j
    }

    /// Parses a config.json of model_type "llama" (Hugging Face's or pipetrain's), "qwen2",
    /// "qwen3", "mistral" or "phi3" (each a Llama, and written back as one), "nemotron",
    /// "stablelm", "gemma" or "pipetrain";
    /// `path` names the file in errors. Settings that would make another model than the one
    /// pipetrain runs (a rope scaling other than Llama 3.1's, another activation, a partial
    /// rotation) are refused.
    pub fn from_json(path: &Path, obj: &Map<String, Value>) -> anyhow::Result<LlamaConfig> {
        let bad = |what: String| user_error(format!("{}: {what}", path.display()));
        let int = |key: &str| -> anyhow::Result<usize> {
            match obj.get(key) {
                // Bounded, as GPT-2's are, so that no width derived from it overflows.
                Some(v) => (v.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as usize))
                    .ok_or_else(|| bad(format!("{key} is {v}, not a count"))),
                None => Err(bad(format!("missing {key}"))),
            }
        };
        let float = |key: &str, default: f64| -> anyhow::Result<f32> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default as f32),
                Some(v) => {
                    v.as_f64().map(|x| x as f32).ok_or_else(|| bad(format!("{key} is {v}, not a number")))
                }
            }
        };
        let flag = |key: &str, default: bool| -> anyhow::Result<bool> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_bool().ok_or_else(|| bad(format!("{key} is {v}, not true or false"))),
            }
        };
        // pipetrain's own model_type reads Llama's keys, and Megatron's for what differs.
        let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("missing");
        let pipetrain = model_type == "pipetrain";
        let class = match HfClass::named(model_type) {
            Some(class) => class,
            None if pipetrain => &LLAMA,
            None => return Err(bad(format!("model_type {model_type:?} is not a Llama pipetrain reads"))),
        };
        for (key, why) in class.refused {
            if flag(key, false)? {
                return Err(bad(format!("{key} is true: {why}")));
            }
        }
        // transformers 5 nests the base and the scaling in rope_parameters (OLMo 3's, once for
        // each kind of layer); earlier ones and most published checkpoints write rope_theta and
        // rope_scaling beside the other keys.
        let freqs = match rope_parameters(obj).map_err(bad)? {
            Some(params) => RopeFrequencies {
                base: params
                    .get("rope_theta")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| bad("rope_parameters has no rope_theta".into()))?
                    as f32,
                llama3_factor: llama3_factor(params).map_err(|e| bad(format!("rope_parameters {e}")))?,
                rotary_dims: None,
            },
            None => RopeFrequencies {
                base: float("rope_theta", 10000.0)?,
                llama3_factor: match obj.get("rope_scaling").filter(|v| !v.is_null()) {
                    Some(scaling) => llama3_factor(scaling).map_err(|e| bad(format!("rope_scaling {e}")))?,
                    None => None,
                },
                rotary_dims: None,
            },
        };
        let acts = class.hidden_act;
        if let Some(v) = obj.get("hidden_act").filter(|v| !v.as_str().is_some_and(|a| acts.contains(&a))) {
            return Err(bad(format!("hidden_act is {v}, pipetrain's {} needs {:?}", class.family, acts[0])));
        }
        let heads = int("num_attention_heads")?;
        let hidden = int("hidden_size")?;
        if heads == 0 {
            return Err(bad("num_attention_heads is 0".into()));
        }
        // transformers' default where the key is absent or null (GemmaConfig's: 256).
        let head_dim = match (obj.get("head_dim"), class.head_dim) {
            (None | Some(Value::Null), Some(default)) => default,
            (None | Some(Value::Null), None) if hidden.is_multiple_of(heads) => hidden / heads,
            (None | Some(Value::Null), None) => {
                return Err(bad(format!(
                    "hidden_size {hidden} is not a multiple of num_attention_heads {heads}, and no head_dim"
                )));
            }
            (Some(_), _) => int("head_dim")?,
        };
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return Err(bad(format!("a head size of {head_dim}; pipetrain takes 1 to {MAX_HEAD_DIM}")));
        }
        if class.heads_fill_hidden && head_dim * heads != hidden {
            return Err(bad(format!(
                "head_dim is {head_dim}; {}'s heads are hidden_size / num_attention_heads wide",
                class.architecture.unwrap_or(class.model_type)
            )));
        }
        let kv = match obj.get("num_key_value_heads") {
            None | Some(Value::Null) => heads,
            Some(_) => int("num_key_value_heads")?,
        };
        if kv == 0 || !heads.is_multiple_of(kv) {
            return Err(bad(format!("num_key_value_heads {kv} does not divide num_attention_heads {heads}")));
        }
        let window = hf_window::read(obj, class.window, pipetrain, int("num_hidden_layers")?).map_err(bad)?;
        let biases = match class.biases {
            BiasKeys::Fixed(biases) => biases,
            BiasKeys::NoneWithoutAttentionBias if flag("attention_bias", false)? => {
                return Err(bad(format!(
                    "attention_bias is true: {}'s puts a bias on q, k, v and o but not the MLP, which pipetrain's \
                     disable_bias_linear and add_qkv_bias cannot express",
                    class.family
                )));
            }
            BiasKeys::NoneWithoutAttentionBias => LinearBiases::NoBiases,
            BiasKeys::UseQkvBias if flag("use_qkv_bias", false)? => LinearBiases::QkvOnly,
            BiasKeys::UseQkvBias => LinearBiases::NoBiases,
            BiasKeys::AttentionAndMlp => {
                let attention_bias = flag("attention_bias", false)?;
                if flag("mlp_bias", false)? != attention_bias {
                    return Err(bad(
                        "attention_bias and mlp_bias differ; pipetrain's disable_bias_linear sets both"
                            .into(),
                    ));
                }
                match (attention_bias, pipetrain && flag("add_qkv_bias", false)?) {
                    (true, _) => LinearBiases::All,
                    (false, true) => LinearBiases::QkvOnly,
                    (false, false) => LinearBiases::NoBiases,
                }
            }
        };
        let norm = match obj.get("normalization").and_then(Value::as_str) {
            Some(name) if pipetrain => {
                <Norm as Named>::parse(name).map_err(|e| bad(format!("normalization: {e}")))?
            }
            _ => class.norm,
        };
        let learned = pipetrain
            && obj.get("position_embedding_type").and_then(Value::as_str) == Some("learned_absolute");
        let activation = if !pipetrain {
            class.activation
        } else {
            let chosen = [
                ("swiglu", flag("swiglu", true)?, Activation::SwiGlu),
                ("squared_relu", flag("squared_relu", false)?, Activation::SquaredRelu),
                ("geglu", flag("geglu", false)?, Activation::GeGlu),
            ];
            let on: Vec<_> = chosen.iter().filter(|(_, on, _)| *on).collect();
            match on[..] {
                [] => Activation::Gelu,
                [(_, _, activation)] => *activation,
                _ => {
                    let keys: Vec<&str> = on.iter().map(|(key, ..)| *key).collect();
                    let all = if keys.len() == 2 { "both" } else { "all" };
                    return Err(bad(format!(
                        "{} are {all} true: one MLP, one activation",
                        keys.join(" and ")
                    )));
                }
            }
        };
        // Gemma multiplies its embeddings by sqrt(hidden_size); pipetrain's own says by what.
        let embedding_multiplier = match obj.get("embedding_multiplier") {
            _ if class.multiplies_embeddings => Some(gemma_multiplier(hidden)),
            Some(v) if pipetrain && !v.is_null() => Some(
                v.as_f64()
                    .map(|m| m as f32)
                    .filter(|m| m.is_finite() && *m > 0.0)
                    .ok_or_else(|| bad(format!("embedding_multiplier is {v}, not a finite number > 0")))?,
            ),
            _ => None,
        };
        let rotary_dims = rotary_dims(obj, class, pipetrain, head_dim).map_err(bad)?;
        let qk_norm_span = match obj.get("qk_norm_span").and_then(Value::as_str) {
            Some(name) if pipetrain => {
                <QkNormSpan as Named>::parse(name).map_err(|e| bad(format!("qk_norm_span: {e}")))?
            }
            _ => class.qk_norm_span,
        };
        let norm_placement = match obj.get("norm_placement").and_then(Value::as_str) {
            Some(name) if pipetrain => {
                <NormPlacement as Named>::parse(name).map_err(|e| bad(format!("norm_placement: {e}")))?
            }
            _ => class.norm_placement,
        };
        let arch = Architecture {
            norm,
            norm_eps: float(class.eps_key, class.eps_default)?,
            norm_placement,
            zero_centered_gamma: class.zero_centered_gamma
                || (pipetrain && flag("apply_layernorm_1p", false)?),
            positions: if learned {
                Positions::Learned
            } else {
                Positions::Rotary(RopeFrequencies { rotary_dims, ..freqs })
            },
            activation,
            biases,
            qk_norm: class.qk_norm || (pipetrain && flag("qk_layernorm", false)?),
            qk_norm_span,
            sliding_window: window.window(),
            tied_output: flag("tie_word_embeddings", class.tied_by_default)?,
            embedding_multiplier,
            init_std: float("initializer_range", 0.02)?,
        };
        if arch.qk_norm_span == QkNormSpan::Projection && !arch.qk_norm {
            return Err(bad(
                "qk_norm_span is projection and qk_layernorm false: no QK-norm to span it".into()
            ));
        }
        if arch.qk_norm && arch.zero_centered_gamma {
            return Err(bad(
                "qk_layernorm and apply_layernorm_1p are both true: pipetrain's QK-norm weights are plain, not \
                 zero-centred"
                    .into(),
            ));
        }
        Ok(LlamaConfig {
            arch,
            vocab_size: int("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: int("intermediate_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            max_position_embeddings: window.positions(int("max_position_embeddings")?),
            hidden_dropout: float("hidden_dropout", 0.0)?,
            attention_dropout: float("attention_dropout", 0.0)?,
        })
    }
}

/// transformers 5's rope_parameters, where config.json has them: Olmo3Config's hold one set
/// for the windowed layers and one for the others, which pipetrain turns alike (the long
/// releases' YaRN scales the others alone).
fn rope_parameters(obj: &Map<String, Value>) -> Result<Option<&Value>, String> {
    let Some(params) = obj.get("rope_parameters").filter(|v| !v.is_null()) else { return Ok(None) };
    match (params.get("full_attention"), params.get("sliding_attention")) {
        (None, None) => Ok(Some(params)),
        (Some(full), Some(sliding)) if full == sliding => Ok(Some(full)),
        _ => Err(format!(
            "rope_parameters is {params}: the windowed and the full layers turn alike in pipetrain, so both need \
             the same parameters"
        )),
    }
}

/// The leading channels of each head of `hs` that the rotary embedding turns, None for all
/// of them: `int(hs x share)` for the class's `partial_rotary_factor` (top level, or from
/// transformers 5 in rope_parameters; Phi-4 mini's 0.75; absent, the class's
/// [`HfClass::rotary_share`]) or pipetrain's `rotary_percent`. A class that reads no share
/// turns the whole head (transformers would build its frequencies for part of it and fail
/// to apply them), so a share there is refused.
fn rotary_dims(
    obj: &Map<String, Value>,
    class: &HfClass,
    pipetrain: bool,
    hs: usize,
) -> Result<Option<usize>, String> {
    let (key, share) = if pipetrain {
        ("rotary_percent", obj.get("rotary_percent"))
    } else {
        let nested = obj.get("rope_parameters").and_then(|p| p.get("partial_rotary_factor"));
        ("partial_rotary_factor", nested.or_else(|| obj.get("partial_rotary_factor")))
    };
    let share = match share {
        None | Some(Value::Null) => match class.rotary_share {
            Some(default) => default,
            None => return Ok(None),
        },
        Some(v) => v
            .as_f64()
            .filter(|s| *s > 0.0 && *s <= 1.0)
            .ok_or_else(|| format!("{key} is {v}, not a share above 0 and at most 1"))?,
    };
    let rot = rotary_dims_of(share, hs);
    if rot == hs {
        return Ok(None);
    }
    if !pipetrain && class.rotary_share.is_none() {
        return Err(format!(
            "{key} is {share}; model_type {:?} turns every channel of a head",
            class.model_type
        ));
    }
    if rot == 0 || !rot.is_multiple_of(2) {
        return Err(format!(
            "{key} is {share}: it turns {rot} channels of a head of {hs}, not an even number"
        ));
    }
    Ok(Some(rot))
}

/// config.json's `rope_scaling` for Llama 3.1's scaling by `factor`.
fn llama3_scaling(factor: f32) -> Value {
    json!({
        "rope_type": "llama3",
        "factor": decimal(factor),
        "low_freq_factor": decimal(LLAMA3_LOW_FREQ_FACTOR),
        "high_freq_factor": decimal(LLAMA3_HIGH_FREQ_FACTOR),
        "original_max_position_embeddings": LLAMA3_ORIGINAL_POSITIONS as u64,
    })
}

/// The Llama 3.1 factor of a `rope_parameters` or `rope_scaling` object: None for rope_type
/// "default", the factor for "llama3" with the frequency factors and original positions
/// Megatron fixes. Anything else is an error, worded to follow the object's key.
fn llama3_factor(params: &Value) -> Result<Option<f32>, String> {
    let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str);
    let kind = kind.unwrap_or("default");
    if kind == "default" {
        return Ok(None);
    }
    if kind != "llama3" {
        let known = "pipetrain's rotary embedding is \"default\" or Llama 3.1's \"llama3\"";
        return Err(format!("has rope_type {kind:?}; {known}"));
    }
    let number = |key: &str| {
        params
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("has rope_type \"llama3\" and no number {key}"))
    };
    let factor = number("factor")?;
    if !is_llama3_factor(factor) {
        return Err(format!("has factor {factor}; it must be a finite number >= 1"));
    }
    for (key, fixed) in [
        ("low_freq_factor", LLAMA3_LOW_FREQ_FACTOR),
        ("high_freq_factor", LLAMA3_HIGH_FREQ_FACTOR),
        ("original_max_position_embeddings", LLAMA3_ORIGINAL_POSITIONS),
    ] {
        let value = number(key)?;
        if value != fixed as f64 {
            return Err(format!(
                "has {key} {value}; pipetrain's Llama 3.1 scaling (Megatron's use_rope_scaling) fixes it at {fixed}"
            ));
        }
    }
    Ok(Some(factor as f32))
}

/// `x` as the shortest decimal that reads back as the same f32 (0.1, not 0.10000000149011612).
pub fn decimal(x: f32) -> Value {
    json!(x.to_string().parse::<f64>().expect("an f32 prints as a number"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::hf_class::CLASSES;
    use crate::checkpoint::{expected_shapes, ModelConfig};
    use stages::SlidingWindow;

    fn llama() -> LlamaConfig {
        LlamaConfig {
            arch: Architecture { tied_output: false, ..Architecture::llama(500000.0, 1e-5) },
            vocab_size: 128256,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 8192,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        }
    }

    /// The config.json that tests/hf's scripts had transformers write into
    /// tests/fixtures/`name`.
    fn written_by_transformers(name: &str) -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        fixture["config"].clone()
    }

    fn parse(j: &Value) -> anyhow::Result<LlamaConfig> {
        LlamaConfig::from_json(Path::new("d/config.json"), j.as_object().unwrap())
    }

    #[test]
    fn round_trips_llama_and_the_mixtures_llama_cannot_name() {
        assert_eq!(parse(&llama().to_json()).unwrap(), llama());
        assert_eq!(llama().to_json()["model_type"], "llama");
        let mixed = LlamaConfig {
            arch: Architecture { norm: Norm::LayerNorm, positions: Positions::Learned, ..llama().arch },
            hidden_dropout: 0.1,
            ..llama()
        };
        assert_eq!(mixed.to_json()["model_type"], "pipetrain");
        assert_eq!(parse(&mixed.to_json()).unwrap(), mixed);
        for activation in [Activation::Gelu, Activation::SquaredRelu] {
            let other = LlamaConfig { arch: Architecture { activation, ..llama().arch }, ..llama() };
            assert_eq!(other.to_json()["model_type"], "pipetrain");
            assert_eq!(parse(&other.to_json()).unwrap(), other, "{activation:?}");
        }
        // OLMo 2's block order without its QK-norm over the whole projections: no class.
        let olmo = LlamaConfig {
            arch: Architecture { norm_placement: NormPlacement::Output, ..llama().arch },
            ..llama()
        };
        assert_eq!(
            olmo.missing_in_transformers(),
            Some(
                "only Olmo2ForCausalLM puts the norms on the attention's and MLP's outputs or normalises q and k \
                 over the whole projections, and it does both, beside RMSNorm, rope over every channel, SwiGLU and \
                 no biases"
            )
        );
        let written = olmo.to_json();
        assert_eq!(
            (&written["model_type"], &written["norm_placement"]),
            (&json!("pipetrain"), &json!("output"))
        );
        assert_eq!(parse(&written).unwrap(), olmo);
        let mut misplaced = written;
        misplaced["norm_placement"] = json!("after");
        assert_eq!(
            parse(&misplaced).unwrap_err().to_string(),
            "d/config.json: norm_placement: `after` is not one of input, output"
        );
        let mut both = LlamaConfig {
            arch: Architecture { activation: Activation::SquaredRelu, ..llama().arch },
            ..llama()
        }
        .to_json();
        both["swiglu"] = json!(true);
        assert_eq!(
            parse(&both).unwrap_err().to_string(),
            "d/config.json: swiglu and squared_relu are both true: one MLP, one activation"
        );
    }

    #[test]
    fn reads_meta_llama_3_8b() {
        // The config.json of meta-llama/Meta-Llama-3-8B on the Hugging Face hub.
        let hub: Value = serde_json::from_str(
            r#"{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
            "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
            "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
            "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256}"#,
        )
        .unwrap();
        assert_eq!(parse(&hub).unwrap(), llama());
    }

    fn scaled(factor: f32) -> Positions {
        Positions::Rotary(RopeFrequencies { llama3_factor: Some(factor), ..RopeFrequencies::plain(500000.0) })
    }

    #[test]
    fn reads_llama_3_1_8b_and_3_2_1b_with_their_rope_scaling() {
        // The config.json of meta-llama/Llama-3.1-8B on the Hugging Face hub.
        let llama31: Value = serde_json::from_str(
            r#"{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
            "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
            "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0",
            "use_cache": true, "vocab_size": 128256}"#,
        )
        .unwrap();
        let want = LlamaConfig {
            arch: Architecture { positions: scaled(8.0), ..llama().arch },
            max_position_embeddings: 131072,
            ..llama()
        };
        assert_eq!(parse(&llama31).unwrap(), want);
        // meta-llama/Llama-3.2-1B's: scaled by 32, its output layer tied to the embedding.
        let llama32: Value = serde_json::from_str(
            r#"{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
            "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
            "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
            "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0,
            "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
            "rope_type": "llama3"}, "rope_theta": 500000.0, "tie_word_embeddings": true,
            "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0", "use_cache": true,
            "vocab_size": 128256}"#,
        )
        .unwrap();
        let got = parse(&llama32).unwrap();
        assert_eq!((got.arch.positions, got.arch.tied_output), (scaled(32.0), true));
        assert_eq!((got.hidden_size, got.num_hidden_layers, got.intermediate_size), (2048, 16, 8192));
        // Written back as it was read, and read back the same.
        assert_eq!(got.to_json()["rope_scaling"], llama32["rope_scaling"]);
        assert_eq!(parse(&got.to_json()).unwrap(), got);
        // transformers 5 writes the same under rope_parameters, the base beside it.
        let mut nested = llama32.clone();
        let o = nested.as_object_mut().unwrap();
        let mut params = o.remove("rope_scaling").unwrap();
        params["rope_theta"] = o.remove("rope_theta").unwrap();
        o.insert("rope_parameters".into(), params);
        assert_eq!(parse(&nested).unwrap(), got);
    }

    #[test]
    fn reads_qwen2_5_0_5b_and_writes_it_back_as_qwen2() {
        // The config.json of Qwen/Qwen2.5-0.5B on the Hugging Face hub (revision 060db64).
        let hub: Value = serde_json::from_str(
            r#"{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
            "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
            "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
            "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
            "use_cache": true, "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936}"#,
        )
        .unwrap();
        let want = LlamaConfig {
            arch: Architecture {
                biases: LinearBiases::QkvOnly,
                tied_output: true,
                ..Architecture::llama(1e6, 1e-6)
            },
            vocab_size: 151936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            head_dim: 64,
            max_position_embeddings: 32768,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        assert_eq!(parse(&hub).unwrap(), want);
        let written = want.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"][0], &written["use_sliding_window"]),
            (&json!("qwen2"), &json!("Qwen2ForCausalLM"), &json!(false))
        );
        // LlamaConfig's bias keys would mean other biases; Qwen2Config has none.
        assert_eq!((written.get("attention_bias"), written.get("mlp_bias")), (None, None));
        assert_eq!(parse(&written).unwrap(), want);
        // What transformers 5 writes for it: the window's outcome as layer_types.
        let mut v5 = written.clone();
        v5["layer_types"] = json!(vec!["full_attention"; 24]);
        assert_eq!(parse(&v5).unwrap(), want);
    }

    #[test]
    fn reads_mistral_7b_v0_3_as_a_llama_and_v0_1_as_one_of_its_windows_length() {
        // The keys of mistralai/Mistral-7B-v0.3's config.json: no sliding window.
        let hub: Value = serde_json::from_str(
            r#"{"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
            "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
            "use_cache": true, "vocab_size": 32768}"#,
        )
        .unwrap();
        let want = LlamaConfig {
            arch: Architecture::llama(1e6, 1e-5),
            vocab_size: 32768,
            max_position_embeddings: 32768,
            ..llama()
        };
        let got = parse(&hub).unwrap();
        assert_eq!(got, want);
        assert_eq!(got.to_json()["model_type"], "llama");
        let with = |window: Option<Value>| {
            let mut j = hub.clone();
            match window {
                Some(v) => j["sliding_window"] = v,
                None => drop(j.as_object_mut().unwrap().remove("sliding_window")),
            }
            parse(&j)
        };
        // Mistral 7B v0.1's window of 4096 (absent: transformers' default) on every layer,
        // at 32768 positions, written back as Mistral's.
        let windowed = |keys| LlamaConfig {
            arch: Architecture {
                sliding_window: Some(SlidingWindow { keys, full_every: None }),
                ..want.arch
            },
            ..want.clone()
        };
        let v01 = windowed(4096);
        assert_eq!(with(Some(json!(4096))).unwrap(), v01);
        assert_eq!(with(None).unwrap(), v01);
        let written = v01.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"][0], &written["sliding_window"]),
            (&json!("mistral"), &json!("MistralForCausalLM"), &json!(4096))
        );
        assert_eq!(parse(&written).unwrap(), v01);
        // A window wider than the positions is kept: at every length the model runs it is
        // the whole sequence (`CausalMask::over`).
        assert_eq!(with(Some(json!(65536))).unwrap(), windowed(65536));
        for bad in [json!(0), json!(-1), json!("4096")] {
            assert_eq!(
                with(Some(bad.clone())).unwrap_err().to_string(),
                format!("d/config.json: sliding_window is {bad}, not a count of positions")
            );
        }
    }

    #[test]
    fn reads_mistral_nemos_heads_wider_than_the_width_over_the_heads() {
        // The keys of mistralai/Mistral-Nemo-Base-2407's config.json: 32 heads of 128 at 5120.
        let hub: Value = serde_json::from_str(
            r#"{"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
            "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 1024000,
            "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 131072}"#,
        )
        .unwrap();
        let got = parse(&hub).unwrap();
        assert_eq!((got.hidden_size, got.num_attention_heads, got.head_dim), (5120, 32, 128));
        assert_eq!(got.to_json()["head_dim"], 128);
        assert_eq!(parse(&got.to_json()).unwrap(), got);
    }

    #[test]
    fn reads_qwen3_8b_and_writes_it_back_as_qwen3() {
        // The config.json of Qwen/Qwen3-8B-Base on the Hugging Face hub.
        let hub: Value = serde_json::from_str(
            r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151643, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
            "max_position_embeddings": 32768, "max_window_layers": 36, "model_type": "qwen3",
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
            "use_sliding_window": false, "vocab_size": 151936}"#,
        )
        .unwrap();
        let want = LlamaConfig {
            arch: Architecture { qk_norm: true, ..Architecture::llama(1e6, 1e-6) },
            vocab_size: 151936,
            hidden_size: 4096,
            intermediate_size: 12288,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 32768,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        assert_eq!(parse(&hub).unwrap(), want);
        let written = want.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"][0], &written["attention_bias"]),
            (&json!("qwen3"), &json!("Qwen3ForCausalLM"), &json!(false))
        );
        assert_eq!(parse(&written).unwrap(), want);
        // Qwen3's attention_bias is on q, k, v and o, but not the MLP: no pipetrain model.
        let mut biased = hub.clone();
        biased["attention_bias"] = json!(true);
        assert_eq!(
            parse(&biased).unwrap_err().to_string(),
            "d/config.json: attention_bias is true: Qwen3's puts a bias on q, k, v and o but not the MLP, which \
             pipetrain's disable_bias_linear and add_qkv_bias cannot express"
        );
        // Its window turned on: a Llama of at most its length.
        let mut windowed = hub.clone();
        windowed["use_sliding_window"] = json!(true);
        windowed["sliding_window"] = json!(4096);
        assert_eq!(parse(&windowed).unwrap(), LlamaConfig { max_position_embeddings: 4096, ..want.clone() });
        // QK-norm beside biases no transformers class builds: pipetrain's own, read back.
        let mixed = LlamaConfig { arch: Architecture { biases: LinearBiases::QkvOnly, ..want.arch }, ..want };
        let j = mixed.to_json();
        assert_eq!((&j["model_type"], &j["qk_layernorm"]), (&json!("pipetrain"), &json!(true)));
        assert_eq!(parse(&j).unwrap(), mixed);
    }

    #[test]
    fn reads_phi_4_phi_3_mini_and_phi_4_minis_partial_rotation_as_llamas() {
        // The config.json of microsoft/phi-4 on the Hugging Face hub.
        let hub: Value = serde_json::from_str(
            r#"{"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
            "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu",
            "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17920,
            "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
            "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
            "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
            "rope_theta": 250000, "sliding_window": null, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "transformers_version": "4.47.0", "use_cache": true,
            "vocab_size": 100352}"#,
        )
        .unwrap();
        let want = LlamaConfig {
            arch: Architecture::llama(250000.0, 1e-5),
            vocab_size: 100352,
            hidden_size: 5120,
            intermediate_size: 17920,
            num_hidden_layers: 40,
            num_attention_heads: 40,
            num_key_value_heads: 10,
            head_dim: 128,
            max_position_embeddings: 16384,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        let got = parse(&hub).unwrap();
        assert_eq!(got, want);
        assert_eq!(got.to_json()["model_type"], "llama");
        let err = |key: &str, value: Value| {
            let mut j = hub.clone();
            j[key] = value;
            parse(&j).unwrap_err().to_string()
        };
        // Phi-3 mini's and medium's window, on every layer: written back as Mistral's, a Llama
        // with a window, and with a share of each head turning as Phi-3's.
        let mut mini = hub.clone();
        mini["sliding_window"] = json!(2047);
        let window = Some(SlidingWindow { keys: 2047, full_every: None });
        let windowed =
            LlamaConfig { arch: Architecture { sliding_window: window, ..want.arch }, ..want.clone() };
        assert_eq!(parse(&mini).unwrap(), windowed);
        assert_eq!(windowed.to_json()["model_type"], "mistral");
        mini["partial_rotary_factor"] = json!(0.75);
        let written = parse(&mini).unwrap().to_json();
        assert_eq!((&written["model_type"], &written["sliding_window"]), (&json!("phi3"), &json!(2047)));
        // Phi-4 mini turns three quarters of each head, in transformers 4's place or 5's.
        let three_quarters = |j: &Value| parse(j).map(|c| c.arch.positions);
        let turning =
            |rot| Positions::Rotary(RopeFrequencies { rotary_dims: rot, ..RopeFrequencies::plain(250000.0) });
        let with = |key: &str, value: Value| {
            let mut j = hub.clone();
            j[key] = value;
            j
        };
        assert_eq!(three_quarters(&with("partial_rotary_factor", json!(0.75))).unwrap(), turning(Some(96)));
        let nested = json!({"rope_type": "default", "rope_theta": 250000.0, "partial_rotary_factor": 0.75});
        assert_eq!(three_quarters(&with("rope_parameters", nested.clone())).unwrap(), turning(Some(96)));
        let mut whole = nested;
        whole["partial_rotary_factor"] = json!(1.0);
        assert_eq!(parse(&with("rope_parameters", whole)).unwrap(), want);
        // A Llama that turns part of its heads is Phi-3's, and writes back as one, its share
        // beside; with biases, or as a Qwen3, no class builds it, and it exports as
        // pipetrain's own, its share in Megatron's key, and reads back.
        let partial = parse(&with("partial_rotary_factor", json!(0.75))).unwrap();
        assert_eq!(partial.missing_in_transformers(), None);
        let written = partial.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"][0], &written["partial_rotary_factor"]),
            (&json!("phi3"), &json!("Phi3ForCausalLM"), &json!(0.75))
        );
        assert_eq!(parse(&written).unwrap(), partial);
        for arch in [
            Architecture { biases: LinearBiases::QkvOnly, ..partial.arch },
            Architecture { qk_norm: true, ..partial.arch },
        ] {
            let other = LlamaConfig { arch, ..partial.clone() };
            assert_eq!(
                other.missing_in_transformers(),
                Some(
                    "LlamaForCausalLM's rotary embedding turns every channel of a head, not rotary_percent of it, \
                     and Phi3ForCausalLM's, which turns part, comes without biases, QK-norm or Llama 3.1's scaling"
                )
            );
            let written = other.to_json();
            assert_eq!(
                (&written["model_type"], &written["rotary_percent"]),
                (&json!("pipetrain"), &json!(0.75))
            );
            assert_eq!(parse(&written).unwrap(), other);
        }
        // Shares that turn no even number of channels, or are no share; and a Llama's.
        assert_eq!(
            err("partial_rotary_factor", json!(0.7)),
            "d/config.json: partial_rotary_factor is 0.7: it turns 89 channels of a head of 128, not an even number"
        );
        for bad in [json!(0), json!(1.5), json!("half")] {
            assert_eq!(
                err("partial_rotary_factor", bad.clone()),
                format!("d/config.json: partial_rotary_factor is {bad}, not a share above 0 and at most 1")
            );
        }
        let mut llama = with("partial_rotary_factor", json!(0.5));
        llama["model_type"] = json!("llama");
        assert_eq!(
            parse(&llama).unwrap_err().to_string(),
            "d/config.json: partial_rotary_factor is 0.5; model_type \"llama\" turns every channel of a head"
        );
        // Phi-3.5's long-context rope.
        assert_eq!(
            err("rope_scaling", json!({"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]})),
            "d/config.json: rope_scaling has rope_type \"longrope\"; pipetrain's rotary embedding is \"default\" or \
             Llama 3.1's \"llama3\""
        );
    }

    /// transformers' NemotronConfig defaults (Nemotron-4 15B's shape) with Nemotron-4's 8
    /// key/value groups, as transformers 5.25 writes them (tests/fixtures/nemotron_config.json,
    /// from tests/hf/make_nemotron_fixture.py): LayerNorm1P, squared ReLU, half of each head
    /// turning; written back as NemotronForCausalLM's; the mixtures it cannot name refused.
    /// OLMo 2 1B's geometry (OLMo-2-0425-1B: 16 layers of 2048, 16 heads and as many
    /// key/value heads, an MLP of 8192), in Olmo2Config's keys: the norms on the branches'
    /// outputs and QK-norm over the whole projections, written back as itself; and its 32B's
    /// (OLMo-2-0325-32B: 64 layers of 5120, 40 heads on 8 key/value heads, an MLP of 27648),
    /// whose q and k norms are 5120 and 1024 wide. A bias on q, k, v and o is one line.
    #[test]
    fn reads_olmo_2_and_writes_it_back() {
        let hub = json!({
            "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "attention_bias": false,
            "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16,
            "num_hidden_layers": 16, "num_key_value_heads": 16, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-06, "rope_theta": 500000, "tie_word_embeddings": false, "vocab_size": 100352
        });
        let want = LlamaConfig {
            arch: Architecture {
                norm_placement: NormPlacement::Output,
                qk_norm: true,
                qk_norm_span: QkNormSpan::Projection,
                ..Architecture::llama(500000.0, 1e-6)
            },
            vocab_size: 100352,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 16,
            num_key_value_heads: 16,
            head_dim: 128,
            max_position_embeddings: 4096,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        let got = parse(&hub).unwrap();
        assert_eq!(got, want);
        let written = got.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"][0], &written["rms_norm_eps"]),
            (&json!("olmo2"), &json!("Olmo2ForCausalLM"), &json!(1e-6))
        );
        assert_eq!(parse(&written).unwrap(), got);
        let err = |key: &str, value: Value| {
            let mut j = hub.clone();
            j[key] = value;
            parse(&j).unwrap_err().to_string()
        };
        let mut hub_32b = hub.clone();
        for (key, value) in [
            ("hidden_size", 5120),
            ("intermediate_size", 27648),
            ("num_attention_heads", 40),
            ("num_hidden_layers", 64),
            ("num_key_value_heads", 8),
        ] {
            hub_32b[key] = json!(value);
        }
        let want_32b = LlamaConfig {
            hidden_size: 5120,
            intermediate_size: 27648,
            num_hidden_layers: 64,
            num_attention_heads: 40,
            num_key_value_heads: 8,
            ..want.clone()
        };
        let got_32b = parse(&hub_32b).unwrap();
        assert_eq!(got_32b, want_32b);
        let written = got_32b.to_json();
        assert_eq!((&written["model_type"], &written["num_key_value_heads"]), (&json!("olmo2"), &json!(8)));
        assert_eq!(parse(&written).unwrap(), got_32b);
        let norms: Vec<_> = expected_shapes(&ModelConfig::Llama(got_32b))
            .into_iter()
            .filter(|(name, _)| name.starts_with("model.layers.0.self_attn.") && name.contains("_norm"))
            .collect();
        assert_eq!(
            norms,
            [
                ("model.layers.0.self_attn.q_norm.weight".to_string(), vec![5120]),
                ("model.layers.0.self_attn.k_norm.weight".to_string(), vec![1024])
            ]
        );
        assert_eq!(
            err("attention_bias", json!(true)),
            "d/config.json: attention_bias is true: OLMo 2's puts a bias on q, k, v and o but not the MLP, which \
             pipetrain's disable_bias_linear and add_qkv_bias cannot express"
        );
        // Pipetrain's own: QK-norm over the projections without the norms on the outputs,
        // and the span without a QK-norm to span.
        let qk_only =
            LlamaConfig { arch: Architecture { norm_placement: NormPlacement::Input, ..want.arch }, ..want };
        let written = qk_only.to_json();
        assert_eq!(
            (&written["model_type"], &written["qk_norm_span"]),
            (&json!("pipetrain"), &json!("projection"))
        );
        assert_eq!(parse(&written).unwrap(), qk_only);
        let mut spanless = written;
        spanless["qk_layernorm"] = json!(false);
        assert_eq!(
            parse(&spanless).unwrap_err().to_string(),
            "d/config.json: qk_norm_span is projection and qk_layernorm false: no QK-norm to span it"
        );
    }

    #[test]
    fn reads_nemotron_4_and_writes_it_back() {
        let hub = &written_by_transformers("nemotron_config.json");
        let half = RopeFrequencies { rotary_dims: Some(64), ..RopeFrequencies::plain(10000.0) };
        let want = LlamaConfig {
            arch: Architecture {
                norm: Norm::LayerNorm,
                norm_eps: 1e-5,
                norm_placement: NormPlacement::Input,
                zero_centered_gamma: true,
                positions: Positions::Rotary(half),
                activation: Activation::SquaredRelu,
                biases: LinearBiases::NoBiases,
                qk_norm: false,
                qk_norm_span: QkNormSpan::Head,
                sliding_window: None,
                tied_output: false,
                embedding_multiplier: None,
                init_std: 0.0134,
            },
            vocab_size: 256000,
            hidden_size: 6144,
            intermediate_size: 24576,
            num_hidden_layers: 32,
            num_attention_heads: 48,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 4096,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        assert_eq!(parse(hub).unwrap(), want);
        let written = want.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"], &written["partial_rotary_factor"]),
            (&json!("nemotron"), &json!(["NemotronForCausalLM"]), &json!(0.5))
        );
        assert_eq!((&written["hidden_act"], &written["norm_eps"]), (&json!("relu2"), &json!(1e-5)));
        assert_eq!(parse(&written).unwrap(), want);
        // NemotronConfig turns half of each head where it says nothing.
        let mut unsaid = hub.clone();
        unsaid.as_object_mut().unwrap().remove("rope_parameters");
        assert_eq!(parse(&unsaid).unwrap(), want);
        let mut gelu = hub.clone();
        gelu["hidden_act"] = json!("gelu");
        assert_eq!(
            parse(&gelu).unwrap_err().to_string(),
            "d/config.json: hidden_act is \"gelu\", pipetrain's Nemotron needs \"relu2\""
        );
        // What NemotronForCausalLM cannot build is pipetrain's own, and says why.
        let swiglu = LlamaConfig {
            arch: Architecture { activation: Activation::SwiGlu, ..want.arch },
            ..want.clone()
        };
        assert_eq!(swiglu.to_json()["model_type"], "pipetrain");
        let one_plus = Some(
            "only NemotronForCausalLM's and GemmaForCausalLM's norms scale by 1 + weight (apply_layernorm_1p): \
             Nemotron's beside LayerNorm, rope and squared_relu, Gemma's beside RMSNorm, rope, geglu and embeddings \
             multiplied by sqrt(hidden_size)",
        );
        assert_eq!(swiglu.missing_in_transformers(), one_plus);
        assert_eq!(parse(&swiglu.to_json()).unwrap(), swiglu);
        let mut qk = swiglu.to_json();
        qk["qk_layernorm"] = json!(true);
        assert_eq!(
            parse(&qk).unwrap_err().to_string(),
            "d/config.json: qk_layernorm and apply_layernorm_1p are both true: pipetrain's QK-norm weights are \
             plain, not zero-centred"
        );
        let rms = Architecture { zero_centered_gamma: true, ..Architecture::llama(500000.0, 1e-5) };
        assert_eq!(LlamaConfig { arch: rms, ..llama() }.missing_in_transformers(), one_plus);
        let qkv = want.with_biases(LinearBiases::QkvOnly);
        assert_eq!(qkv.to_json()["model_type"], "pipetrain");
        assert_eq!(
            qkv.missing_in_transformers(),
            Some(
                "NemotronForCausalLM puts biases on every linear layer or none (attention_bias, mlp_bias), not on \
                 q, k and v alone"
            )
        );
        let biased = want.with_biases(LinearBiases::All);
        assert_eq!(
            (&biased.to_json()["attention_bias"], &biased.to_json()["mlp_bias"]),
            (&json!(true), &json!(true))
        );
        assert_eq!(parse(&biased.to_json()).unwrap(), biased);
        assert_eq!(parse(&qkv.to_json()).unwrap(), qkv);
    }

    /// StableLM 2 1.6B's shape as transformers 5.25 writes StableLmConfig
    /// (tests/fixtures/stablelm_config.json, from tests/hf/make_stablelm_fixture.py): a
    /// Llama with LayerNorms, biases on q, k and v and a quarter of each head turning; written
    /// back as StableLmForCausalLM's, its per-head LayerNorm and parallel residual refused.
    #[test]
    fn reads_stablelm_2_and_writes_it_back() {
        let hub = &written_by_transformers("stablelm_config.json");
        let quarter = RopeFrequencies { rotary_dims: Some(16), ..RopeFrequencies::plain(10000.0) };
        let want = LlamaConfig {
            arch: Architecture {
                norm: Norm::LayerNorm,
                norm_eps: 1e-5,
                positions: Positions::Rotary(quarter),
                biases: LinearBiases::QkvOnly,
                ..Architecture::llama(10000.0, 1e-5)
            },
            vocab_size: 100352,
            hidden_size: 2048,
            intermediate_size: 5632,
            num_hidden_layers: 24,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            head_dim: 64,
            max_position_embeddings: 4096,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        assert_eq!(parse(hub).unwrap(), want);
        let written = want.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"], &written["partial_rotary_factor"]),
            (&json!("stablelm"), &json!(["StableLmForCausalLM"]), &json!(0.25))
        );
        assert_eq!((&written["use_qkv_bias"], &written["layer_norm_eps"]), (&json!(true), &json!(1e-5)));
        assert_eq!(parse(&written).unwrap(), want);
        // StableLmConfig turns a quarter of each head where it says nothing.
        let mut unsaid = hub.clone();
        unsaid.as_object_mut().unwrap().remove("rope_parameters");
        assert_eq!(parse(&unsaid).unwrap(), want);
        for (key, what) in [
            (
                "qk_layernorm",
                "a LayerNorm over each head of q and k, where pipetrain's QK-norm is an RMSNorm",
            ),
            ("use_parallel_residual", "attention and MLP side by side on one norm's output"),
        ] {
            let mut j = hub.clone();
            j[key] = json!(true);
            assert_eq!(
                parse(&j).unwrap_err().to_string(),
                format!("d/config.json: {key} is true: {what}, which pipetrain does not build")
            );
        }
        // Without q, k and v biases it is still StableLM; with every bias, nothing transformers
        // builds.
        let plain = want.with_biases(LinearBiases::NoBiases);
        assert_eq!(plain.to_json()["model_type"], "stablelm");
        assert_eq!(parse(&plain.to_json()).unwrap(), plain);
        let all = want.with_biases(LinearBiases::All);
        assert_eq!(
            all.missing_in_transformers(),
            Some("StableLmForCausalLM puts biases on q, k and v or nowhere, not on every linear layer")
        );
        assert_eq!(parse(&all.to_json()).unwrap(), all);
        // Its heads are the width over the heads, whatever head_dim says.
        let wide = LlamaConfig { head_dim: 128, ..want.clone() };
        assert_eq!(
            wide.missing_in_transformers(),
            Some("StableLmForCausalLM's heads are hidden_size / num_attention_heads wide, not kv_channels")
        );
        assert_eq!(parse(&wide.to_json()).unwrap(), wide);
        let mut j = hub.clone();
        j["head_dim"] = json!(128);
        assert_eq!(
            parse(&j).unwrap_err().to_string(),
            "d/config.json: head_dim is 128; StableLmForCausalLM's heads are hidden_size / num_attention_heads wide"
        );
    }

    /// GemmaConfig's defaults (Gemma 7B's shape) as transformers 5.25 writes them
    /// (tests/fixtures/gemma_config.json, from tests/hf/make_gemma_fixture.py): RMSNorm
    /// scaling by 1 + weight, GeGLU, heads of 256 wider than 3072 / 16, the embeddings
    /// multiplied by sqrt(3072) and tied; written back as GemmaForCausalLM's.
    #[test]
    fn reads_gemma_and_writes_it_back() {
        let hub = &written_by_transformers("gemma_config.json");
        let want = LlamaConfig {
            arch: Architecture {
                zero_centered_gamma: true,
                activation: Activation::GeGlu,
                tied_output: true,
                embedding_multiplier: Some(55.425_625),
                ..Architecture::llama(10000.0, 1e-6)
            },
            vocab_size: 256000,
            hidden_size: 3072,
            intermediate_size: 24576,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 16,
            head_dim: 256,
            max_position_embeddings: 8192,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        };
        assert_eq!(gemma_multiplier(3072), 55.425_625);
        assert_eq!(parse(hub).unwrap(), want);
        let written = want.to_json();
        assert_eq!(
            (&written["model_type"], &written["architectures"], &written["hidden_act"]),
            (&json!("gemma"), &json!(["GemmaForCausalLM"]), &json!("gelu_pytorch_tanh"))
        );
        assert_eq!(parse(&written).unwrap(), want);
        // Its releases' "gelu" is the tanh approximation; GemmaConfig's defaults fill in the
        // heads of 256 and the tied output layer.
        let mut release = hub.clone();
        release["hidden_act"] = json!("gelu");
        let fields = release.as_object_mut().unwrap();
        fields.remove("head_dim");
        fields.remove("tie_word_embeddings");
        assert_eq!(parse(&release).unwrap(), want);
        for (key, value, why) in [
            (
                "attention_bias",
                json!(true),
                "attention_bias is true: Gemma's puts a bias on q, k, v and o but not the MLP, which pipetrain's \
                 disable_bias_linear and add_qkv_bias cannot express",
            ),
            (
                "use_bidirectional_attention",
                json!(true),
                "use_bidirectional_attention is true: every query sees every key, where pipetrain's attention is \
                 causal",
            ),
            ("hidden_act", json!("silu"), "hidden_act is \"silu\", pipetrain's Gemma needs \"gelu_pytorch_tanh\""),
        ] {
            let mut j = hub.clone();
            j[key] = value;
            assert_eq!(parse(&j).unwrap_err().to_string(), format!("d/config.json: {why}"), "{key}");
        }
        // A multiplier other than sqrt(hidden_size), or beside another model, is pipetrain's own.
        let other = LlamaConfig {
            arch: Architecture { embedding_multiplier: Some(12.0), ..want.arch },
            ..want.clone()
        };
        assert_eq!(
            other.missing_in_transformers(),
            Some(
                "only GemmaForCausalLM multiplies its embeddings, by sqrt(hidden_size), beside RMSNorm, \
                 apply_layernorm_1p, rope over every channel, geglu and no biases"
            )
        );
        assert_eq!(parse(&other.to_json()).unwrap(), other);
        for bad in [json!(0.0), json!(1e300), json!("8")] {
            let mut j = other.to_json();
            j["embedding_multiplier"] = bad.clone();
            assert_eq!(
                parse(&j).unwrap_err().to_string(),
                format!("d/config.json: embedding_multiplier is {bad}, not a finite number > 0")
            );
        }
        let mut both = other.to_json();
        both["squared_relu"] = json!(true);
        assert_eq!(
            parse(&both).unwrap_err().to_string(),
            "d/config.json: squared_relu and geglu are both true: one MLP, one activation"
        );
    }

    #[test]
    fn reads_a_qwen_sliding_window_as_a_llama_of_its_length() {
        let qwen2 =
            LlamaConfig { arch: Architecture { biases: LinearBiases::QkvOnly, ..llama().arch }, ..llama() };
        let with = |edits: &[(&str, Value)]| {
            let mut j = qwen2.to_json();
            for (key, value) in edits {
                j[*key] = value.clone();
            }
            parse(&j)
        };
        let of = |positions| LlamaConfig { max_position_embeddings: positions, ..qwen2.clone() };
        // On, at transformers' default window and at a given one; on at some layers alone.
        assert_eq!(with(&[("use_sliding_window", json!(true))]).unwrap(), of(4096));
        let on = [("use_sliding_window", json!(true)), ("sliding_window", json!(2048))];
        assert_eq!(with(&on).unwrap(), of(2048));
        let some_layers = [
            ("layer_types", json!(["full_attention", "sliding_attention"])),
            ("sliding_window", json!(1024)),
        ];
        assert_eq!(with(&some_layers).unwrap(), of(1024));
        // Off (Qwen2.5's), a window means nothing; a null one is none.
        assert_eq!(with(&[("sliding_window", json!(1024))]).unwrap(), qwen2);
        assert_eq!(
            with(&[("use_sliding_window", json!(true)), ("sliding_window", Value::Null)]).unwrap(),
            qwen2
        );
        let err = |edits: &[(&str, Value)]| with(edits).unwrap_err().to_string();
        assert_eq!(
            err(&[("layer_types", json!("full"))]),
            "d/config.json: layer_types is \"full\", not a list"
        );
        assert_eq!(
            err(&[("layer_types", json!(["chunked_attention"]))]),
            "d/config.json: layer_types[0] is \"chunked_attention\", not \"full_attention\" or \"sliding_attention\""
        );
        assert_eq!(
            err(&[("use_sliding_window", json!("yes"))]),
            "d/config.json: use_sliding_window is \"yes\", not true or false"
        );
    }

    #[test]
    fn writes_qkv_biases_beside_a_layernorm_and_learned_positions_as_pipetrains_own() {
        // (Beside rotary positions, StableLM 2's.)
        let arch = Architecture {
            norm: Norm::LayerNorm,
            positions: Positions::Learned,
            biases: LinearBiases::QkvOnly,
            ..llama().arch
        };
        let mixed = LlamaConfig { arch, ..llama() };
        let j = mixed.to_json();
        assert_eq!(
            (&j["model_type"], &j["add_qkv_bias"], &j["attention_bias"]),
            (&json!("pipetrain"), &json!(true), &json!(false))
        );
        assert_eq!(parse(&j).unwrap(), mixed);
        // A Llama with every bias stays a Llama: LlamaConfig's attention_bias and mlp_bias.
        let biased =
            LlamaConfig { arch: Architecture { biases: LinearBiases::All, ..llama().arch }, ..llama() };
        let j = biased.to_json();
        assert_eq!(
            (&j["model_type"], &j["attention_bias"], &j["mlp_bias"]),
            (&json!("llama"), &json!(true), &json!(true))
        );
        assert_eq!(parse(&j).unwrap(), biased);
    }

    #[test]
    fn reads_the_rope_base_where_transformers_5_nests_it() {
        let mut j = llama().to_json();
        let o = j.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.insert("rope_parameters".into(), json!({"rope_theta": 500000.0, "rope_type": "default"}));
        assert_eq!(parse(&j).unwrap(), llama());
        j["rope_parameters"]["rope_type"] = json!("yarn");
        assert_eq!(
            parse(&j).unwrap_err().to_string(),
            "d/config.json: rope_parameters has rope_type \"yarn\"; pipetrain's rotary embedding is \"default\" or \
             Llama 3.1's \"llama3\""
        );
    }

    #[test]
    fn refuses_what_pipetrain_does_not_run() {
        let err = |edit: &dyn Fn(&mut Value)| {
            let mut j = llama().to_json();
            edit(&mut j);
            parse(&j).unwrap_err().to_string()
        };
        let llama3_with = |key: &str, value: f64| {
            let mut scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
            scaling[key] = json!(value);
            scaling
        };
        assert_eq!(
            err(&|j| j["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0})),
            "d/config.json: rope_scaling has rope_type \"llama3\" and no number low_freq_factor"
        );
        assert_eq!(
            err(&|j| j["rope_scaling"] = json!({"type": "linear", "factor": 2.0})),
            "d/config.json: rope_scaling has rope_type \"linear\"; pipetrain's rotary embedding is \"default\" or \
             Llama 3.1's \"llama3\""
        );
        assert_eq!(
            err(&|j| j["rope_scaling"] = llama3_with("original_max_position_embeddings", 4096.0)),
            "d/config.json: rope_scaling has original_max_position_embeddings 4096; pipetrain's Llama 3.1 scaling \
             (Megatron's use_rope_scaling) fixes it at 8192"
        );
        assert_eq!(
            err(&|j| j["rope_scaling"] = llama3_with("factor", 0.5)),
            "d/config.json: rope_scaling has factor 0.5; it must be a finite number >= 1"
        );
        assert_eq!(
            err(&|j| j["hidden_act"] = json!("gelu")),
            "d/config.json: hidden_act is \"gelu\", pipetrain's Llama needs \"silu\""
        );
        assert_eq!(
            err(&|j| j["num_key_value_heads"] = json!(5)),
            "d/config.json: num_key_value_heads 5 does not divide num_attention_heads 32"
        );
        assert_eq!(
            err(&|j| j["head_dim"] = json!(0)),
            "d/config.json: a head size of 0; pipetrain takes 1 to 65536"
        );
        assert_eq!(
            err(&|j| {
                j["hidden_size"] = json!(1u64 << 31);
                j["num_attention_heads"] = json!(1);
                j["num_key_value_heads"] = json!(1);
                j["head_dim"] = json!(null);
            }),
            "d/config.json: a head size of 2147483648; pipetrain takes 1 to 65536"
        );
        assert_eq!(
            err(&|j| j["hidden_size"] = json!(1u64 << 40)),
            "d/config.json: hidden_size is 1099511627776, not a count"
        );
        assert_eq!(
            err(&|j| {
                j["hidden_size"] = json!(4001);
                j["head_dim"] = json!(null);
            }),
            "d/config.json: hidden_size 4001 is not a multiple of num_attention_heads 32, and no head_dim"
        );
        assert_eq!(
            err(&|j| j.as_object_mut().unwrap().remove("vocab_size").map(drop).unwrap()),
            "d/config.json: missing vocab_size"
        );
    }

    #[test]
    fn the_first_class_that_builds_a_model_names_it_and_only_mistral_phi3_and_olmo3_overlap() {
        let mut named: Vec<&str> = Vec::new();
        let every = SlidingWindow { keys: 64, full_every: None };
        let three_in_four = SlidingWindow { full_every: Some(4), ..every };
        let whole = Positions::Rotary(RopeFrequencies::plain(500000.0));
        let half =
            Positions::Rotary(RopeFrequencies { rotary_dims: Some(64), ..RopeFrequencies::plain(500000.0) });
        for norm in [Norm::LayerNorm, Norm::RmsNorm] {
            for activation in
                [Activation::Gelu, Activation::SwiGlu, Activation::SquaredRelu, Activation::GeGlu]
            {
                for biases in [LinearBiases::All, LinearBiases::QkvOnly, LinearBiases::NoBiases] {
                    for (zero_centered_gamma, qk_norm) in [(false, false), (true, false), (false, true)] {
                        for ((positions, olmo), sliding_window) in
                            [(whole, false), (half, false), (whole, true)]
                                .into_iter()
                                .flat_map(|p| [None, Some(every), Some(three_in_four)].map(|w| (p, w)))
                        {
                            let (norm_placement, qk_norm_span) = match olmo {
                                true => (NormPlacement::Output, QkNormSpan::Projection),
                                false => (NormPlacement::Input, QkNormSpan::Head),
                            };
                            let mut m = LlamaConfig {
                                arch: Architecture {
                                    norm,
                                    norm_placement,
                                    zero_centered_gamma,
                                    activation,
                                    qk_norm,
                                    qk_norm_span,
                                    biases,
                                    positions,
                                    sliding_window,
                                    ..llama().arch
                                },
                                ..llama()
                            };
                            if activation == Activation::GeGlu {
                                m.arch.embedding_multiplier = Some(gemma_multiplier(m.hidden_size));
                            }
                            let builders: Vec<&str> = CLASSES
                                .into_iter()
                                .filter(|c| c.architecture.is_some() && c.builds(&m))
                                .map(|c| c.model_type)
                                .collect();
                            // A Llama is Mistral's and Phi-3's too, a windowed one both, and
                            // an OLMo 2 OLMo 3's.
                            let overlaps: [&[&str]; 3] =
                                [&["llama", "mistral", "phi3"], &["mistral", "phi3"], &["olmo2", "olmo3"]];
                            assert!(
                                builders.len() <= 1 || overlaps.contains(&&builders[..]),
                                "{builders:?} all build {:?}",
                                m.arch
                            );
                            assert_eq!(m.hf_class().map(|c| c.model_type), builders.first().copied());
                            assert_eq!(
                                m.missing_in_transformers().is_none(),
                                m.hf_class().is_some(),
                                "{:?}",
                                m.arch
                            );
                            named.extend(builders.first().copied());
                        }
                    }
                }
            }
        }
        // Without a window: Llama's two bias settings and Nemotron's and StableLM's at either
        // rotation; one each for the rest (OLMo 2 in its own order alone). With one on every
        // layer: Mistral, Phi-3 turning part of each head, and OLMo 3; with one on three
        // layers in four, OLMo 3 alone.
        named.sort();
        assert_eq!(
            named,
            [
                "gemma", "llama", "llama", "mistral", "nemotron", "nemotron", "nemotron", "nemotron",
                "olmo2", "olmo3", "olmo3", "phi3", "phi3", "qwen2", "qwen3", "stablelm", "stablelm",
                "stablelm", "stablelm"
            ]
        );
    }

    /// OLMo 3 7B's geometry as transformers 5 writes Olmo3Config (per-kind rope_parameters,
    /// layer_types three windowed in four): OLMo 2's layers with the window, written back as
    /// itself. The long-context releases' YaRN on the full layers, and a layer_types no period
    /// names (read as a model of the window's length), are not OLMo 3 at 8192.
    #[test]
    fn reads_olmo3_and_writes_it_back() {
        let types: Vec<&str> =
            (0..32).map(|i| if (i + 1) % 4 == 0 { "full_attention" } else { "sliding_attention" }).collect();
        let rope = json!({"rope_type": "default", "rope_theta": 500000.0});
        let hub = json!({
            "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "attention_bias": false,
            "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 32, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-06, "sliding_window": 4096, "layer_types": types,
            "rope_parameters": {"full_attention": rope, "sliding_attention": rope},
            "tie_word_embeddings": false, "vocab_size": 100352
        });
        let got = parse(&hub).unwrap();
        let a = got.arch;
        assert_eq!(
            (a.norm_placement, a.qk_norm, a.qk_norm_span, a.sliding_window),
            (
                NormPlacement::Output,
                true,
                QkNormSpan::Projection,
                Some(SlidingWindow { keys: 4096, full_every: Some(4) })
            )
        );
        assert_eq!(
            (a.positions, got.max_position_embeddings),
            (Positions::Rotary(RopeFrequencies::plain(5e5)), 8192)
        );
        let written = got.to_json();
        assert_eq!((&written["model_type"], &written["layer_types"]), (&json!("olmo3"), &hub["layer_types"]));
        assert_eq!(parse(&written).unwrap(), got);
        // Without layer_types, Olmo3Config's default: the same.
        let mut default = hub.clone();
        default.as_object_mut().unwrap().remove("layer_types");
        assert_eq!(parse(&default).unwrap(), got);
        // YaRN on the full layers alone, in transformers 5's place and in 4's.
        let mut yarn = hub.clone();
        yarn["rope_parameters"]["full_attention"] =
            json!({"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0});
        assert!(parse(&yarn).unwrap_err().to_string().starts_with(
            "d/config.json: rope_parameters is {\"full_attention\":{\"factor\":8.0,\"rope_theta\":500000.0,\"rope_type\":\"yarn\"}"
        ));
        let mut old = hub.clone();
        old.as_object_mut().unwrap().remove("rope_parameters");
        old["rope_theta"] = json!(500000.0);
        old["rope_scaling"] = json!({"rope_type": "yarn", "factor": 8.0});
        assert_eq!(
            parse(&old).unwrap_err().to_string(),
            "d/config.json: rope_scaling has rope_type \"yarn\"; pipetrain's rotary embedding is \"default\" or \
             Llama 3.1's \"llama3\""
        );
        // Full layers first, then windowed (no period): a model of the window's length.
        let mut qwen_like = hub.clone();
        qwen_like["layer_types"] = json!((0..32)
            .map(|i| if i < 4 { "full_attention" } else { "sliding_attention" })
            .collect::<Vec<_>>());
        let capped = parse(&qwen_like).unwrap();
        assert_eq!((capped.arch.sliding_window, capped.max_position_embeddings), (None, 4096));
        let mut short = hub;
        short["layer_types"] = json!(["full_attention"]);
        assert_eq!(
            parse(&short).unwrap_err().to_string(),
            "d/config.json: layer_types is 1 long, not num_hidden_layers 32"
        );
    }

    /// A window on some layers of a Llama is no class's (OLMo 3's is on OLMo 2's layers): it is
    /// written as pipetrain's own, Megatron's keys saying the window, and reads back.
    #[test]
    fn a_llama_windowed_on_some_layers_is_pipetrains_own() {
        let window = Some(SlidingWindow { keys: 64, full_every: Some(4) });
        let m = LlamaConfig { arch: Architecture { sliding_window: window, ..llama().arch }, ..llama() };
        assert_eq!(
            m.missing_in_transformers(),
            Some(
                "a sliding window on every layer is MistralForCausalLM's and Phi3ForCausalLM's, beside a Llama \
                 without biases or QK-norm, and one on some layers Olmo3ForCausalLM's alone, beside OLMo 2's norms"
            )
        );
        let written = m.to_json();
        assert_eq!(
            (&written["model_type"], &written["window_size"], &written["window_attn_skip_freq"]),
            (&json!("pipetrain"), &json!([63, 0]), &json!(4))
        );
        assert_eq!(parse(&written).unwrap(), m);
        let mut bad = written.clone();
        bad["window_size"] = json!([63, 1]);
        assert_eq!(
            parse(&bad).unwrap_err().to_string(),
            "d/config.json: window_size is [63,1], not [left, 0] with left a count of keys"
        );
    }

    #[test]
    fn each_model_type_names_its_class() {
        for class in CLASSES {
            assert_eq!(HfClass::named(class.model_type).map(|c| c.model_type), Some(class.model_type));
        }
        assert!(HfClass::named("pipetrain").is_none());
        assert!(HfClass::named("gpt2").is_none());
    }
}
