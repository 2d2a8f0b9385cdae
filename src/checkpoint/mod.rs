//! Checkpoints: safetensors weights in Hugging Face names and layout (so a checkpoint or an
//! export loads in `transformers.GPT2LMHeadModel`, `LlamaForCausalLM` or
//! `Qwen2ForCausalLM`), AdamW moments and trainer state beside them, written atomically.
//!
//! ```text
//! run/checkpoints/step_000100/config.json                HF GPT2Config, LlamaConfig or Qwen2Config
//!                            /model.safetensors          f32 weights, LM head tied (absent)
//!                            /trainer_state.safetensors  exp_avg.<p>, exp_avg_sq.<p>
//!                            /trainer_state.json         step, seed, data position, ...
//!                            /manifest.sha256            sha256 of each file above, last
//! run/checkpoints/latest                                 "step_000100"
//! ```

mod hf_class;
mod hf_config;
mod hf_window;
mod llama_config;
mod load;
mod manifest;
mod model_config;
mod same_model;
mod save;
mod shapes;
mod state;
mod tensors;

pub use hf_config::HfGpt2Config;
pub use llama_config::LlamaConfig;
#[cfg(test)]
pub(crate) use load::read_checkpoint;
pub use load::{export_hf, load_checkpoint, Checkpoint};
pub use model_config::ModelConfig;
pub use same_model::check_same_model;
pub use save::{
    save_checkpoint, write_atomic, SpecialTokens, TokenizerFiles, CONFIG_FILE, TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
};
pub use shapes::{check_shapes, expected_shapes};
pub use state::{exp_avg_name, exp_avg_sq_name, TrainerState};
pub use tensors::NamedTensor;

#[cfg(test)]
pub(crate) use tensors::write_safetensors;

/// Small models, optimizer states and comparisons shared by the tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::shapes::expected_shapes;
    use super::*;

    pub fn config() -> ModelConfig {
        ModelConfig::Gpt2(HfGpt2Config {
            vocab_size: 64,
            n_positions: 16,
            n_embd: 8,
            n_layer: 2,
            n_head: 2,
            n_inner: None,
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.0,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
        })
    }

    /// A Llama-family model of architecture `arch`: 2 layers of 16, 4 heads of 4 over 2
    /// key/value heads, a SwiGLU of 24, 64 tokens, 16 positions.
    pub fn llama(arch: stages::Architecture) -> ModelConfig {
        ModelConfig::Llama(LlamaConfig {
            arch,
            vocab_size: 64,
            hidden_size: 16,
            intermediate_size: 24,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 4,
            max_position_embeddings: 16,
            hidden_dropout: 0.0,
            attention_dropout: 0.0,
        })
    }

    /// Every value distinct and `scale` apart between models, negative zero and a subnormal
    /// included, so that a bitwise comparison means something.
    pub fn model(cfg: &ModelConfig, scale: f32) -> Vec<NamedTensor> {
        let mut next = 0u32;
        expected_shapes(cfg)
            .into_iter()
            .map(|(name, shape)| {
                let data = (0..shape.iter().product::<usize>())
                    .map(|_| {
                        next += 1;
                        match next {
                            1 => -0.0,
                            2 => 1e-40,
                            n => scale * (n as f32).sin(),
                        }
                    })
                    .collect();
                NamedTensor { name, shape, data }
            })
            .collect()
    }

    /// `tensors` with each fused parameter's parts stacked, as Phi-3's files hold them.
    pub fn fused(cfg: &ModelConfig, tensors: &[NamedTensor]) -> Vec<NamedTensor> {
        super::shapes::stack_fused(&super::shapes::specs(cfg), tensors)
    }

    pub fn optimizer(model: &[NamedTensor]) -> Vec<NamedTensor> {
        model
            .iter()
            .flat_map(|p| {
                let m = p.data.iter().map(|x| x * 0.5).collect();
                let v = p.data.iter().map(|x| x * x).collect();
                [
                    NamedTensor { name: exp_avg_name(&p.name), shape: p.shape.clone(), data: m },
                    NamedTensor { name: exp_avg_sq_name(&p.name), shape: p.shape.clone(), data: v },
                ]
            })
            .collect()
    }

    pub fn state(step: u64) -> TrainerState {
        TrainerState {
            step,
            seed: 1234,
            data_position: step,
            lr: 6e-4 * 0.1f64.sqrt(),
            config_yaml: "num_layers: 2\nhidden_size: 8\n".into(),
            tokenizer: Some(crate::data::TokenizerSpec {
                tokenizer: "cl100k_base".into(),
                eot_token: "<|endoftext|>".into(),
                special_tokens: false,
            }),
            train_losses: vec![(1, 10.987_654), (step, 0.1f32.sqrt())],
            val_losses: vec![(step, 3.25)],
        }
    }

    pub fn assert_bitwise_eq(a: &[NamedTensor], b: &[NamedTensor]) {
        let names =
            |v: &[NamedTensor]| v.iter().map(|t| (t.name.clone(), t.shape.clone())).collect::<Vec<_>>();
        assert_eq!(names(a), names(b));
        for (x, y) in a.iter().zip(b) {
            let bits = |t: &NamedTensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(bits(x) == bits(y), "{} differs", x.name);
        }
    }
}
