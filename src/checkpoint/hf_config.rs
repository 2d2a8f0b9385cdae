//! `config.json` in Hugging Face's GPT2Config format, written so that
//! `transformers.GPT2LMHeadModel.from_pretrained(dir)` builds the same model, and read back
//! (from pipetrain or from Hugging Face) to learn the model's shape.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::llama_config::decimal;
use crate::error::user_error;

/// The GPT-2 hyperparameters that a checkpoint carries. Megatron equivalents:
/// vocab_size, max_position_embeddings, hidden_size, num_layers, num_attention_heads,
/// ffn_hidden_size (`n_inner`, None = 4 * n_embd), hidden_dropout (`resid_pdrop` and
/// `embd_pdrop`), attention_dropout (`attn_pdrop`).
#[derive(Clone, Debug, PartialEq)]
pub struct HfGpt2Config {
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_inner: Option<usize>,
    pub resid_pdrop: f32,
    pub embd_pdrop: f32,
    pub attn_pdrop: f32,
    pub layer_norm_epsilon: f32,
    pub initializer_range: f32,
}

/// GPT-2's `<|endoftext|>`, its bos and eos token.
const EOT: usize = 50256;

impl HfGpt2Config {
    /// The full config.json, with the fields of Hugging Face's own GPT-2 configs.
    pub fn to_json(&self) -> Value {
        json!({
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": self.vocab_size,
            "n_positions": self.n_positions,
            "n_ctx": self.n_positions,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_inner": self.n_inner,
            "activation_function": "gelu_new",
            "resid_pdrop": decimal(self.resid_pdrop),
            "embd_pdrop": decimal(self.embd_pdrop),
            "attn_pdrop": decimal(self.attn_pdrop),
            "layer_norm_epsilon": decimal(self.layer_norm_epsilon),
            "initializer_range": decimal(self.initializer_range),
            "scale_attn_weights": true,
            "scale_attn_by_inverse_layer_idx": false,
            "reorder_and_upcast_attn": false,
            "tie_word_embeddings": true,
            "use_cache": true,
            "bos_token_id": EOT,
            "eos_token_id": EOT,
        })
    }

    /// Parses a config.json's object of model_type "gpt2"; `path` names the file in errors.
    /// Fields Hugging Face defaults are defaulted the same way; fields that would make a
    /// different model than pipetrain's GPT-2 are refused.
    pub fn from_object(path: &Path, obj: &Map<String, Value>) -> anyhow::Result<HfGpt2Config> {
        let bad = |what: String| user_error(format!("{}: {what}", path.display()));
        let int = |key: &str| -> anyhow::Result<usize> {
            match obj.get(key) {
                Some(v) => {
                    // Bounded so that no size derived from it (4 x n_embd, 3 x n_embd) overflows.
                    (v.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as usize))
                        .ok_or_else(|| bad(format!("{key} is {v}, not a count")))
                }
                None => Err(bad(format!("missing {key}"))),
            }
        };
        let prob = |key: &str| -> anyhow::Result<f32> {
            match obj.get(key) {
                None => Ok(0.1), // transformers' GPT2Config default
                Some(v) => match v.as_f64() {
                    Some(p) if (0.0..1.0).contains(&p) => Ok(p as f32),
                    _ => Err(bad(format!("{key} is {v}, not a probability in [0, 1)"))),
                },
            }
        };
        for (key, allowed) in [
            ("activation_function", &[json!("gelu_new"), json!("gelu_pytorch_tanh")][..]),
            ("tie_word_embeddings", &[json!(true)]),
            ("scale_attn_weights", &[json!(true)]),
            ("scale_attn_by_inverse_layer_idx", &[json!(false)]),
        ] {
            if obj.get(key).is_some_and(|v| !allowed.contains(v)) {
                return Err(bad(format!(
                    "{key} is {}, pipetrain's GPT-2 needs {}",
                    show(obj, key),
                    allowed[0]
                )));
            }
        }
        let float = |key: &str, default: f32| -> anyhow::Result<f32> {
            match obj.get(key) {
                None => Ok(default),
                Some(v) => match v.as_f64() {
                    Some(x) if x > 0.0 => Ok(x as f32),
                    _ => Err(bad(format!("{key} is {v}, not a number > 0"))),
                },
            }
        };
        let n_inner = match obj.get("n_inner") {
            None | Some(Value::Null) => None,
            Some(_) => Some(int("n_inner")?),
        };
        let cfg = HfGpt2Config {
            vocab_size: int("vocab_size")?,
            n_positions: int("n_positions")?,
            n_embd: int("n_embd")?,
            n_layer: int("n_layer")?,
            n_head: int("n_head")?,
            n_inner,
            resid_pdrop: prob("resid_pdrop")?,
            embd_pdrop: prob("embd_pdrop")?,
            attn_pdrop: prob("attn_pdrop")?,
            layer_norm_epsilon: float("layer_norm_epsilon", 1e-5)?,
            initializer_range: float("initializer_range", 0.02)?,
        };
        if cfg.n_head == 0 || !cfg.n_embd.is_multiple_of(cfg.n_head) {
            return Err(bad(format!("n_embd {} is not a multiple of n_head {}", cfg.n_embd, cfg.n_head)));
        }
        Ok(cfg)
    }
}

fn show(obj: &Map<String, Value>, key: &str) -> String {
    obj.get(key).map_or("missing".to_string(), Value::to_string)
}

#[cfg(test)]
mod tests {
    use super::super::ModelConfig;
    use super::*;

    fn cfg() -> HfGpt2Config {
        HfGpt2Config {
            vocab_size: 50257,
            n_positions: 256,
            n_embd: 128,
            n_layer: 4,
            n_head: 4,
            n_inner: Some(320),
            resid_pdrop: 0.1,
            embd_pdrop: 0.05,
            attn_pdrop: 0.0,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
        }
    }

    fn from_json(path: &Path, text: &str) -> anyhow::Result<HfGpt2Config> {
        match ModelConfig::from_json(path, text)? {
            ModelConfig::Gpt2(g) => Ok(g),
            other => panic!("not GPT-2: {other:?}"),
        }
    }

    #[test]
    fn round_trip() {
        let p = Path::new("c/config.json");
        for c in [cfg(), HfGpt2Config { n_inner: None, ..cfg() }] {
            let text = serde_json::to_string_pretty(&c.to_json()).unwrap();
            assert_eq!(from_json(p, &text).unwrap(), c);
        }
        assert_eq!(cfg().to_json()["n_inner"], json!(320));
        assert_eq!(HfGpt2Config { n_inner: None, ..cfg() }.to_json()["n_inner"], Value::Null);
        assert_eq!(cfg().to_json()["resid_pdrop"].to_string(), "0.1");
    }

    #[test]
    fn reads_huggingface_gpt2_config() {
        // The config.json of the `gpt2` model on the Hugging Face hub.
        let hub = r#"{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
            "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
            "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
            "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
            "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
            "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
            "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
            "vocab_size": 50257}"#;
        let c = from_json(Path::new("gpt2/config.json"), hub).unwrap();
        assert_eq!((c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head), (50257, 1024, 768, 12, 12));
        assert_eq!((c.n_inner, c.attn_pdrop), (None, 0.1));
    }

    #[test]
    fn clear_errors() {
        let p = Path::new("d/config.json");
        let err = |text: &str| from_json(p, text).unwrap_err().to_string();
        let mut j = cfg().to_json();
        j["model_type"] = json!("llama2");
        assert_eq!(
            err(&j.to_string()),
            "d/config.json: model_type is \"llama2\", pipetrain reads \"gpt2\", \"llama\", \"qwen2\", \"qwen3\", \
             \"mistral\", \"phi3\", \"nemotron\", \"stablelm\", \"gemma\", \"olmo2\" and \"olmo3\""
        );
        let mut j = cfg().to_json();
        j.as_object_mut().unwrap().remove("n_embd");
        assert_eq!(err(&j.to_string()), "d/config.json: missing n_embd");
        let mut j = cfg().to_json();
        j["n_head"] = json!(3);
        assert_eq!(err(&j.to_string()), "d/config.json: n_embd 128 is not a multiple of n_head 3");
        let mut j = cfg().to_json();
        j["activation_function"] = json!("relu");
        assert_eq!(
            err(&j.to_string()),
            "d/config.json: activation_function is \"relu\", pipetrain's GPT-2 needs \"gelu_new\""
        );
        let mut j = cfg().to_json();
        j["attn_pdrop"] = json!(1.5);
        assert_eq!(err(&j.to_string()), "d/config.json: attn_pdrop is 1.5, not a probability in [0, 1)");
        assert!(err("{").starts_with("d/config.json: not valid JSON: "));
    }
}
