//! The command line: subcommands and their own flags. Config keys are not flags here: any
//! `--kebab-case-key VALUE` is split off first as a config override (see config.rs).

mod refusal;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

pub use refusal::refusal;

/// Parses the command line (the program's name first). Every flag that takes a value takes
/// a negative number as one, so `--top -1` is refused as a value out of range, not read as
/// an unknown flag `-1`.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Cli, clap::Error> {
    let command = Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|arg| match arg.get_action().takes_values() {
            true => arg.allow_negative_numbers(true),
            false => arg,
        })
    });
    Cli::from_arg_matches(&command.try_get_matches_from(args)?)
}

#[derive(Parser, Debug)]
#[command(
    name = "pipetrain",
    version,
    about = "Pipeline-parallel pretraining of GPT-2 and Llama-family models, activation recompute, schedule simulation"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pretrain a GPT-2 or Llama-family model from a YAML config (config keys override as --kebab-case VALUE).
    #[command(after_help = crate::config::alias_help())]
    Train(TrainArgs),
    /// Simulate a schedule/recompute plan: time and memory per stage, no weights, no GPU.
    #[command(after_help = crate::config::alias_help())]
    Simulate(crate::simulate::SimulateArgs),
    /// Tokenize text or JSONL into llm.c .bin token files (one or shards) or a Megatron indexed dataset.
    Tokenize(TokenizeArgs),
    /// Export a checkpoint as a Hugging Face directory (config.json + model.safetensors) in its model's transformers class (GPT2LMHeadModel, LlamaForCausalLM, Qwen2, Qwen3, Mistral, Phi-3, Nemotron, StableLM, Gemma, OLMo 2, OLMo 3), or model_type pipetrain where none builds it.
    Export(ExportArgs),
    /// Mean loss of a checkpoint over the first N non-overlapping windows of a token file.
    Eval(EvalArgs),
    /// Continue a prompt with a checkpoint's model, token by token to stdout, in its tokenizer's text.
    Generate(GenerateArgs),
    /// Benchmarks: `recompute` (step time and activation memory per policy), `pipeline`
    /// (tokens/s per stage count), `family` (GPT-2 against a Llama of the same width),
    /// measured in one process, `gpu` (the GPU path against the CPU, its predictions and
    /// PyTorch; exit 3 where there is no usable GPU), or `attention` (the bf16 attention
    /// core's TFLOP/s alone, at #21's shapes and the config's).
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// recompute | pipeline | family | gpu | attention
    pub what: String,
    /// The run config (YAML); config keys override as --kebab-case VALUE.
    #[arg(long)]
    pub config: PathBuf,
    /// Timed steps per variant (after one warm-up step); for `gpu`, of the MFU runs.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Run only these variants, comma-separated names as the table prints them (each
    /// variant holds a whole model, so fewer fit a large shape in memory).
    #[arg(long, value_delimiter = ',')]
    pub variants: Option<Vec<String>>,
}

#[derive(Args, Clone, Debug)]
pub struct TrainArgs {
    /// The run config (YAML, Megatron-LM key names).
    #[arg(long)]
    pub config: PathBuf,
    /// Directory for everything the run writes (metrics, checkpoints, report, trace).
    #[arg(long, default_value = "runs/latest")]
    pub run_dir: PathBuf,
    /// Continue from the run dir's latest checkpoint, bit for bit.
    #[arg(long)]
    pub resume: bool,
    /// Write a Chrome trace of every stage's measured actions.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// No progress bar (logs one line per log_interval instead).
    #[arg(long)]
    pub quiet: bool,
    /// The MFU denominator in FLOP/s; when not given, measured at start on the CPU (a second
    /// of matmul), the GPU's published peak at the run's precision on CUDA.
    #[arg(long)]
    pub peak_flops: Option<f64>,
}

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// A text file (documents separated by <|endoftext|>), a JSONL file (.jsonl, .json,
    /// .ndjson: one document per line), or a directory of them (read in name order).
    pub input: PathBuf,
    /// The token file; with --shard-tokens, PREFIX_000000.bin ... (PREFIX is OUTPUT less
    /// `.bin`); with --format megatron, PREFIX.bin and PREFIX.idx.
    pub output: PathBuf,
    /// Replace existing outputs.
    #[arg(long)]
    pub force: bool,
    /// gpt2 (r50k_base), cl100k_base, o200k_base, or the path of a Hugging Face tokenizer.json.
    #[arg(long, default_value = "gpt2")]
    pub tokenizer: String,
    /// The end-of-text token of a tokenizer.json [default: the first of <|endoftext|>,
    /// <|end_of_text|>, </s>, <eos> in its vocabulary].
    #[arg(long, value_name = "TOKEN")]
    pub eot_token: Option<String>,
    /// Begin each document with the special tokens a tokenizer.json's post-processor adds,
    /// as transformers' `tokenizer(text)` and Megatron's preprocess_data.py do (Llama 3:
    /// <|begin_of_text|>).
    #[arg(long)]
    pub add_special_tokens: bool,
    /// The key of a JSONL line's document (Megatron's --json-keys).
    #[arg(long, value_name = "KEY", default_value = "text")]
    pub json_key: String,
    /// llmc: llm.c .bin token files; megatron: a Megatron-LM indexed dataset (.bin + .idx).
    #[arg(long, value_enum, default_value = "llmc")]
    pub format: crate::data::OutputFormat,
    /// Cut the llm.c output into shards of exactly N tokens (the last may be shorter).
    #[arg(long, value_name = "N")]
    pub shard_tokens: Option<usize>,
    /// Tokenizing threads [default: all cores]; the output is the same for any number.
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A checkpoint dir, or a run dir (its latest checkpoint).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The Hugging Face directory to write.
    #[arg(long)]
    pub hf: PathBuf,
    /// Replace the contents of a non-empty HF dir.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A checkpoint dir, a run dir, or a Hugging Face GPT-2 or Llama dir.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The text to continue [default: <|endoftext|>, as a document starts].
    #[arg(long)]
    pub prompt: Option<String>,
    /// Tokens to generate (fewer if the model's positions fill up first).
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 always takes the most likely token.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Seed of the sampling draws: the same seed gives the same output [default: from the clock].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run every position again for each new token instead of keeping a KV cache (slower;
    /// the same output, for checking).
    #[arg(long)]
    pub no_kv_cache: bool,
    /// gpt2, cl100k_base, o200k_base or a tokenizer.json [default: a Hugging Face dir's
    /// tokenizer.json, else the one that made the run's training data, else gpt2].
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// The end-of-text token of a tokenizer.json (as `tokenize --eot-token`).
    #[arg(long, value_name = "TOKEN")]
    pub eot_token: Option<String>,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// A checkpoint dir, a run dir, or a Hugging Face GPT-2 or Llama dir.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The token file (.bin) to evaluate on.
    #[arg(long)]
    pub data: PathBuf,
    /// Number of consecutive non-overlapping windows of seq_length tokens.
    #[arg(long)]
    pub windows: usize,
    /// Tokens per window (defaults to the checkpoint's n_positions).
    #[arg(long)]
    pub seq_length: Option<usize>,
}
