//! `pipetrain generate`: text from a checkpoint, a run dir or a Hugging Face directory, in
//! and out through the model's tokenizer, one position's forward per new token (model.rs
//! keeps a KV cache), greedy or sampled (sample.rs), each token's text written to stdout as
//! it comes (text.rs).

mod model;
mod sample;
mod text;

use crate::checkpoint::{self, ModelConfig, NamedTensor};
use crate::cli::GenerateArgs;
use crate::data::{Tokenizer, TokenizerSpec};
use crate::error::user_error;
use model::Decoder;
use sample::Sampler;
use std::io::Write;
use std::path::Path;
use text::TextStream;

pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let sampler = sampler(args)?;
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    let recorded = ck.trainer.as_ref().and_then(|t| t.state.tokenizer.as_ref());
    let tokenizer = tokenizer(args, &ck.dir, recorded)?;
    let model = Decoder::new(&ck.config, &ck.model);
    // As the model's training text: a checkpoint without pipetrain's trainer state is a
    // Hugging Face directory (or an export), whose prompts transformers encodes with the
    // tokenizer's special tokens; a run's data says how it was tokenized.
    let convention = PromptConvention::special_tokens(
        ck.trainer.is_none() || recorded.is_some_and(|spec| spec.special_tokens),
    );
    let prompt = prompt_tokens(args.prompt.as_deref(), &tokenizer, convention, &model)?;
    let mut out = std::io::stdout().lock();
    let mut text = TextStream::new(&tokenizer);
    out.write_all(&text.push(&prompt)?)?;
    out.flush()?;
    let candidates = model.vocab().min(tokenizer.vocab_size);
    let emit = |token| -> anyhow::Result<()> {
        out.write_all(&text.push(&[token])?)?;
        Ok(out.flush()?)
    };
    let generated =
        generate(&model, &prompt, args.max_new_tokens, sampler, !args.no_kv_cache, candidates, emit)?;
    out.write_all(&text.finish()?)?;
    writeln!(out)?;
    if generated < args.max_new_tokens {
        eprintln!(
            "stopped after {generated} new tokens: the model has {} positions",
            ck.config.max_positions()
        );
    }
    Ok(())
}

/// The tokenizer of the model's text: `--tokenizer`; else the `tokenizer.json` a Hugging
/// Face directory keeps beside the weights; else the one that made the run's training data
/// (`recorded`, from its trainer state); else GPT-2's.
fn tokenizer(args: &GenerateArgs, dir: &Path, recorded: Option<&TokenizerSpec>) -> anyhow::Result<Tokenizer> {
    let eot = args.eot_token.as_deref();
    if let Some(spec) = &args.tokenizer {
        return Tokenizer::load(spec, eot);
    }
    let beside = dir.join(checkpoint::TOKENIZER_FILE);
    if beside.is_file() {
        return Tokenizer::load(&beside.to_string_lossy(), eot);
    }
    data_tokenizer(recorded, eot).map_err(|e| match recorded {
        Some(spec) => user_error(format!(
            "{}: the run's data was tokenized with {}, which does not load here; give --tokenizer",
            dir.display(),
            spec.tokenizer
        )),
        None => e,
    })
}

/// The tokenizer a run's data records name (`spec`; GPT-2's where none does), `eot`
/// overriding its end-of-text token.
fn data_tokenizer(spec: Option<&TokenizerSpec>, eot: Option<&str>) -> anyhow::Result<Tokenizer> {
    match spec {
        Some(spec) => Tokenizer::load(&spec.tokenizer, eot.or(Some(&spec.eot_token))),
        None => Tokenizer::load("gpt2", eot),
    }
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

/// How a prompt becomes tokens: as the model's training text did.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PromptConvention {
    /// As `pipetrain tokenize` writes a document by default: the text alone.
    TextOnly,
    /// As transformers' `tokenizer(prompt)` (and `tokenize --add-special-tokens`): a
    /// tokenizer.json's post-processor adds its special tokens (Llama 3's
    /// `<|begin_of_text|>` first).
    SpecialTokens,
}

impl PromptConvention {
    fn special_tokens(with: bool) -> PromptConvention {
        match with {
            true => PromptConvention::SpecialTokens,
            false => PromptConvention::TextOnly,
        }
    }
}

/// The prompt's tokens, the end-of-text token's text written in it as that token, checked
/// against the model. An empty prompt is the end-of-text token alone, as every document
/// starts in training; or, with special tokens, what the post-processor makes of no text
/// (Llama 3's `<|begin_of_text|>`) where it makes anything.
fn prompt_tokens(
    prompt: Option<&str>,
    tokenizer: &Tokenizer,
    convention: PromptConvention,
    model: &Decoder,
) -> anyhow::Result<Vec<u32>> {
    let text = prompt.unwrap_or("");
    let mut tokens = match convention == PromptConvention::SpecialTokens && tokenizer.has_post_processor() {
        true => tokenizer.encode_with_special_tokens(text)?,
        false => text_tokens(text, tokenizer)?,
    };
    if tokens.is_empty() {
        tokens.push(tokenizer.eot);
    }
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
            String::from_utf8_lossy(&tokenizer.decode(&[t])?),
            model.vocab()
        )));
    }
    Ok(tokens)
}

/// The tokens of `text`, the end-of-text token's text in it as that token.
fn text_tokens(text: &str, tokenizer: &Tokenizer) -> anyhow::Result<Vec<u32>> {
    let mut tokens = Vec::new();
    for (i, piece) in text.split(tokenizer.eot_token.as_str()).enumerate() {
        if i > 0 {
            tokens.push(tokenizer.eot);
        }
        tokens.extend(tokenizer.encode(piece)?);
    }
    Ok(tokens)
}

/// Generates up to `max_new` tokens after `prompt`, drawn from ids below `candidates` (the
/// tokenizer's, where the model's vocabulary is padded past them), calling `emit` with each
/// as it comes, and stops early when the model's positions are full. With `cache`, each new
/// token runs one position; without, every position again (the same numbers, for
/// checking). Returns how many tokens were generated.
fn generate<E>(
    model: &Decoder,
    prompt: &[u32],
    max_new: usize,
    sampler: Sampler,
    cache: bool,
    candidates: usize,
    mut emit: impl FnMut(u32) -> Result<(), E>,
) -> Result<usize, E> {
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

/// A short greedy continuation by a model of what begins a document of its training data,
/// as text, for the train summary: the end-of-text token, or where the data was tokenized
/// with special tokens what the tokenizer puts first (Llama 3's `<|begin_of_text|>`), as
/// generate begins an empty prompt. Through the tokenizer that made the data (`data`;
/// GPT-2's where no record says). None where that tokenizer does not load or its tokens are
/// not in the model's vocabulary.
pub fn greedy_sample(
    config: &ModelConfig,
    weights: &[NamedTensor],
    data: Option<&TokenizerSpec>,
    tokens: usize,
) -> Option<String> {
    let tokenizer = data_tokenizer(data, None).ok()?;
    let model = Decoder::new(config, weights);
    let convention = PromptConvention::special_tokens(data.is_some_and(|spec| spec.special_tokens));
    let start = prompt_tokens(None, &tokenizer, convention, &model).ok()?;
    let mut out = Vec::new();
    let emit = |t: u32| {
        out.push(t);
        Ok::<(), std::convert::Infallible>(())
    };
    let candidates = model.vocab().min(tokenizer.vocab_size);
    let Ok(_) = generate(&model, &start, tokens, Sampler::GREEDY, true, candidates, emit);
    Some(String::from_utf8_lossy(&tokenizer.decode(&out).ok()?).into_owned())
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
            generate(model, &[0], 15, sampler, cache, model.vocab(), emit).unwrap();
            out
        };
        let with = run(true);
        assert_eq!(with.len(), 15);
        assert_eq!(with, run(false));
    }

    /// A Llama with its norms on the attention's and MLP's outputs (OLMo 2's order) and
    /// QK-norm: the decode pieces give, position by position, the per-token losses of the
    /// training blocks' forward over the whole sequence.
    #[test]
    fn decoding_norms_on_the_outputs_gives_the_training_forwards_losses() {
        use kernels::Device;
        use stages::{
            Architecture, ChunkLayout, Microbatch, NormPlacement, RecomputePolicy, Shard, TensorGroup,
        };
        let arch = Architecture {
            norm_placement: NormPlacement::Output,
            qk_norm: true,
            ..Architecture::llama(1e4, 1e-5)
        };
        let config = checkpoint::testing::llama(arch);
        let weights = checkpoint::testing::model(&config, 1.0);
        let tokens: Vec<u32> = (0..13).map(|i| (i * 7 + 3) % 64).collect();
        let (inputs, targets) = (&tokens[..12], &tokens[1..]);
        let run = config.run_config(inputs.len(), 1);
        let dev = kernels::cpu::CpuDevice::new(2);
        let layout = ChunkLayout { blocks: 0..run.num_layers, embedding: true, head: true };
        let whole = (Shard::WHOLE, stages::OptimizerShard::WHOLE);
        let mut chunk =
            crate::plan::build_chunk(&dev, &run, layout, whole, RecomputePolicy::None, Some(&weights))
                .unwrap();
        let mb = Microbatch { step: 0, index: 0, tokens: inputs, targets, mode: stages::Mode::Eval };
        let losses = chunk.forward(&dev, &mb, None, &mut TensorGroup::whole()).losses.unwrap();
        let trained = dev.to_host(&losses);
        let model = Decoder::new(&config, &weights);
        let mut cache = model.empty_cache();
        for (t, (&token, &target)) in inputs.iter().zip(targets).enumerate() {
            let logits = model.forward(&[token], &mut cache);
            let top = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
            let sum: f64 = logits.iter().map(|&x| (x as f64 - top).exp()).sum();
            let decoded = top + sum.ln() - logits[target as usize] as f64;
            let want = trained[t] as f64;
            assert!((decoded - want).abs() <= 1e-5 * want.abs(), "position {t}: {decoded} against {want}");
        }
    }

    #[test]
    fn prompts_are_checked_against_the_model() {
        let model = fixture_model();
        let gpt2 = Tokenizer::load("gpt2", None).unwrap();
        for convention in [PromptConvention::TextOnly, PromptConvention::SpecialTokens] {
            assert_eq!(prompt_tokens(Some("x=y"), &gpt2, convention, &model).unwrap(), [87, 28, 88]);
            let long = vec!["a"; 17].join(" ");
            assert_eq!(
                prompt_tokens(Some(&long), &gpt2, convention, &model).unwrap_err().to_string(),
                "command line: --prompt: 17 tokens, more than the model's 16 positions (max_position_embeddings)"
            );
            assert_eq!(
                prompt_tokens(None, &gpt2, convention, &model).unwrap_err().to_string(),
                "command line: --prompt: token 50256 (\"<|endoftext|>\") is outside the model's vocabulary of 96"
            );
        }
    }

    /// A Llama 3 style tokenizer.json (ids 0..93 the characters ! to ~, 94
    /// <|begin_of_text|>, which its post-processor puts first, 95 <|end_of_text|>): with
    /// special tokens every prompt begins with <|begin_of_text|>, as `tokenizer(prompt)`
    /// does in transformers; as `tokenize` writes text by default, none.
    #[test]
    fn special_tokens_begin_the_prompt_as_the_post_processor_puts_them() {
        let model = fixture("hf_llama_tiny_rope_llama3");
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf_llama_tiny_rope_llama3/tokenizer.json");
        let llama3 = Tokenizer::load(path, None).unwrap();
        assert_eq!((llama3.eot, llama3.eot_token.as_str()), (95, "<|end_of_text|>"));
        let tokens = |prompt, convention| prompt_tokens(prompt, &llama3, convention, &model).unwrap();
        let (text_only, special) = (PromptConvention::TextOnly, PromptConvention::SpecialTokens);
        assert_eq!(tokens(Some("x=y"), text_only), [87, 28, 88]);
        assert_eq!(tokens(Some("x=y"), special), [94, 87, 28, 88]);
        assert_eq!(tokens(Some("a<|end_of_text|>b"), text_only), [64, 95, 65]);
        assert_eq!(tokens(Some("a<|end_of_text|>b"), special), [94, 64, 95, 65]);
        assert_eq!(tokens(None, text_only), [95]);
        assert_eq!(tokens(None, special), [94]);
    }

    /// The train summary's sample begins where the run's documents begin: after
    /// <|begin_of_text|> where `tokenize --add-special-tokens` wrote the data, after the end
    /// of text otherwise; each the greedy continuation generate gives from that token.
    #[test]
    fn the_summary_sample_begins_as_the_data_does() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_llama_tiny_rope_llama3");
        let ck = checkpoint::load_checkpoint(&dir).unwrap();
        let model = Decoder::new(&ck.config, &ck.model);
        let path = dir.join("tokenizer.json").to_string_lossy().into_owned();
        let llama3 = Tokenizer::load(&path, None).unwrap();
        let continuation = |start: u32| {
            let mut out = Vec::new();
            generate(&model, &[start], 8, Sampler::GREEDY, true, 96, |t| {
                out.push(t);
                Ok::<(), std::convert::Infallible>(())
            })
            .unwrap();
            String::from_utf8(llama3.decode(&out).unwrap()).unwrap()
        };
        let sample = |special_tokens| {
            let spec = TokenizerSpec {
                tokenizer: path.clone(),
                eot_token: "<|end_of_text|>".into(),
                special_tokens,
            };
            greedy_sample(&ck.config, &ck.model, Some(&spec), 8).unwrap()
        };
        let (begin, end) = (continuation(94), continuation(95));
        assert_ne!(begin, end, "the two starts give the same text: the test cannot tell them apart");
        assert_eq!((sample(true), sample(false)), (begin, end));
    }
}
