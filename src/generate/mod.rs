//! `pipetrain generate`: text from a checkpoint, a run dir or a Hugging Face directory,
//! GPT-2 BPE in and out, one position's forward per new token (model.rs keeps a KV cache),
//! greedy or sampled (sample.rs), each token written to stdout as it comes.

mod model;
mod sample;

use crate::checkpoint::{self, ModelConfig, NamedTensor};
use crate::cli::GenerateArgs;
use crate::data::{bpe_decode, bpe_encode, EOT, TEXT_VOCAB};
use crate::error::user_error;
use model::Decoder;
use sample::Sampler;
use std::io::Write;

pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let sampler = sampler(args)?;
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    let model = Decoder::new(&ck.config, &ck.model);
    let prompt = prompt_tokens(args.prompt.as_deref(), &model)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bpe_decode(&prompt))?;
    out.flush()?;
    let generated = generate(&model, &prompt, args.max_new_tokens, sampler, !args.no_kv_cache, |token| {
        out.write_all(&bpe_decode(&[token]))?;
        out.flush()
    })?;
    writeln!(out)?;
    if generated < args.max_new_tokens {
        eprintln!(
            "stopped after {generated} new tokens: the model has {} positions",
            ck.config.max_positions()
        );
    }
    Ok(())
}

fn sampler(args: &GenerateArgs) -> anyhow::Result<Sampler> {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(user_error(format!(
            "command line: --temperature {}: must be a number >= 0 (0 is greedy)",
            args.temperature
        )));
    }
    if args.top_k == Some(0) {
        return Err(user_error("command line: --top-k 0: must be at least 1"));
    }
    // Unseeded sampling differs run to run, as it should; a seed makes it repeat.
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    Ok(Sampler { temperature: args.temperature, top_k: args.top_k, seed })
}

/// The prompt's GPT-2 tokens (`<|endoftext|>` alone when there is none, as every document
/// starts in training), checked against the model.
fn prompt_tokens(prompt: Option<&str>, model: &Decoder) -> anyhow::Result<Vec<u32>> {
    let tokens = match prompt {
        Some(text) if !text.is_empty() => bpe_encode(text),
        _ => vec![EOT as u32],
    };
    if tokens.len() > model.max_positions() {
        return Err(user_error(format!(
            "command line: --prompt: {} tokens, more than the model's {} positions (max_position_embeddings)",
            tokens.len(),
            model.max_positions()
        )));
    }
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= model.vocab()) {
        return Err(user_error(format!(
            "command line: --prompt: token {t} ({:?}) is outside the model's vocabulary of {}",
            String::from_utf8_lossy(&bpe_decode(&[t])),
            model.vocab()
        )));
    }
    Ok(tokens)
}

/// Generates up to `max_new` tokens after `prompt`, calling `emit` with each as it comes,
/// and stops early when the model's positions are full. With `cache`, each new token runs
/// one position; without, every position again (the same numbers, for checking).
/// Returns how many tokens were generated.
fn generate<E>(
    model: &Decoder,
    prompt: &[u32],
    max_new: usize,
    sampler: Sampler,
    cache: bool,
    mut emit: impl FnMut(u32) -> Result<(), E>,
) -> Result<usize, E> {
    let candidates = model.vocab().min(TEXT_VOCAB);
    let mut tokens = prompt.to_vec();
    let mut kv = model.empty_cache();
    let mut logits = model.forward(prompt, &mut kv);
    let mut generated = 0;
    while generated < max_new {
        let next = sampler.pick(&logits, candidates, generated as u32);
        emit(next)?;
        tokens.push(next);
        generated += 1;
        if generated == max_new || tokens.len() >= model.max_positions() {
            break;
        }
        logits = if cache {
            model.forward(&[next], &mut kv)
        } else {
            model.forward(&tokens, &mut model.empty_cache())
        };
    }
    Ok(generated)
}

/// A short greedy continuation of `<|endoftext|>` by a model, as text, for the train
/// summary; None when its vocabulary has no `<|endoftext|>`.
pub fn greedy_sample(config: &ModelConfig, weights: &[NamedTensor], tokens: usize) -> Option<String> {
    if config.vocab_size() < TEXT_VOCAB {
        return None;
    }
    let model = Decoder::new(config, weights);
    let mut out = Vec::new();
    let emit = |t: u32| {
        out.push(t);
        Ok::<(), std::convert::Infallible>(())
    };
    let Ok(_) = generate(&model, &[EOT as u32], tokens, Sampler::GREEDY, true, emit);
    Some(String::from_utf8_lossy(&bpe_decode(&out)).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_model() -> Decoder {
        fixture("hf_tiny")
    }

    fn fixture(name: &str) -> Decoder {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let ck = checkpoint::load_checkpoint(&dir).unwrap();
        Decoder::new(&ck.config, &ck.model)
    }

    /// GPT-2, and a Llama whose cache holds its 2 key/value groups for 4 query heads at
    /// rotated positions.
    #[test]
    fn the_kv_cache_gives_the_logits_of_a_full_forward_bit_for_bit() {
        for name in ["hf_tiny", "hf_llama_tiny"] {
            the_kv_cache_matches_a_full_forward(&fixture(name));
        }
    }

    fn the_kv_cache_matches_a_full_forward(model: &Decoder) {
        let bits = |logits: &[f32]| logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // Sampled, so the positions see varied tokens; a three-token prompt fills the cache
        // several rows at once first.
        let sampler = Sampler { temperature: 1.0, top_k: None, seed: 3 };
        let mut tokens = vec![87, 28, 88];
        let mut kv = model.empty_cache();
        let mut cached = model.forward(&tokens, &mut kv);
        while tokens.len() < model.max_positions() {
            let full = model.forward(&tokens, &mut model.empty_cache());
            assert!(bits(&cached) == bits(&full), "logits after {} tokens differ", tokens.len());
            let next = sampler.pick(&cached, model.vocab(), tokens.len() as u32);
            tokens.push(next);
            cached = model.forward(&[next], &mut kv);
        }
        // Generation through either path gives the same tokens.
        let run = |cache| {
            let mut out = Vec::new();
            let emit = |t| {
                out.push(t);
                Ok::<(), ()>(())
            };
            generate(model, &[0], 15, sampler, cache, emit).unwrap();
            out
        };
        let with = run(true);
        assert_eq!(with.len(), 15);
        assert_eq!(with, run(false));
    }

    #[test]
    fn prompts_are_checked_against_the_model() {
        let model = fixture_model();
        assert_eq!(prompt_tokens(Some("x=y"), &model).unwrap(), [87, 28, 88]);
        let long = vec!["a"; 17].join(" ");
        assert_eq!(
            prompt_tokens(Some(&long), &model).unwrap_err().to_string(),
            "command line: --prompt: 17 tokens, more than the model's 16 positions (max_position_embeddings)"
        );
        assert_eq!(
            prompt_tokens(None, &model).unwrap_err().to_string(),
            "command line: --prompt: token 50256 (\"<|endoftext|>\") is outside the model's vocabulary of 96"
        );
    }
}
