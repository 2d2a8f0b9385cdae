//! `pipetrain tokenize INPUT OUTPUT`: text or JSONL documents (a file or a directory of them,
//! see `input.rs`) into llm.c token files, one or sharded (`llmc.rs`), or a Megatron indexed
//! dataset (`megatron.rs`), with GPT-2, cl100k_base, o200k_base or a Hugging Face tokenizer
//! (`encoder.rs`). The tokenizer is recorded beside the output in `PREFIX.meta.json`.
//!
//! Documents are read as a stream in batches of [`BATCH_BYTES`] of text; each batch is
//! tokenized in parallel, document by document, while the next one is read, and written in
//! input order. Batches are cut by bytes, never by thread count, so the output is the same
//! bytes on any number of threads, and memory holds two batches whatever the input's size.

mod encoder;
mod input;
mod llmc;
mod megatron;
mod progress;
mod staged;
mod tiktoken_json;

use std::fmt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

pub use encoder::{tiktoken_tokenizer_json, Tokenizer};
use input::Documents;
use llmc::{LlmcWriter, Naming};
use megatron::MegatronWriter;
use progress::Progress;

use super::record::{record_path, TokenizeRecord};
use crate::cli::TokenizeArgs;
use crate::error::user_error;

/// Text read per batch: enough documents to keep every core busy, few enough to bound memory.
const BATCH_BYTES: usize = 8 << 20;

/// The output layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// llm.c `.bin` token files (one, or shards with --shard-tokens).
    Llmc,
    /// A Megatron-LM indexed dataset, PREFIX.bin + PREFIX.idx.
    Megatron,
}

/// Where a format's tokens go, document by document.
trait TokenSink: Send {
    /// One document's tokens, without its end-of-text token (the format places it).
    fn document(&mut self, tokens: &[u32]) -> anyhow::Result<()>;
    /// Tokens written so far, end-of-text tokens included.
    fn tokens(&self) -> usize;
    fn token_bytes(&self) -> usize;
    /// Completes every file and returns their final paths.
    fn finish(self: Box<Self>) -> anyhow::Result<Vec<PathBuf>>;
}

/// What `run` did, for the CLI to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizeSummary {
    pub files: Vec<PathBuf>,
    pub input_bytes: u64,
    pub tokens: usize,
    pub documents: usize,
}

impl fmt::Display for TokenizeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.files.as_slice() {
            [one] => write!(f, "{}", one.display())?,
            [first, .., last] => {
                write!(f, "{} .. {} ({} files)", first.display(), last.display(), self.files.len())?
            }
            [] => unreachable!("every format writes a file"),
        }
        let docs = if self.documents == 1 { "document" } else { "documents" };
        write!(
            f,
            ": {} tokens ({} {docs}) from {} bytes of text",
            self.tokens, self.documents, self.input_bytes
        )
    }
}

/// OUTPUT without a trailing `.bin`: the shards' and the Megatron files' common prefix.
fn prefix_of(output: &Path) -> String {
    let s = output.to_string_lossy();
    s.strip_suffix(".bin").unwrap_or(&s).to_string()
}

/// Runs `pipetrain tokenize`. Existing outputs are replaced only with `--force`; every file is
/// written under a temporary name and renamed when complete, and an interrupt removes it.
pub fn run(args: &TokenizeArgs) -> anyhow::Result<TokenizeSummary> {
    staged::remove_on_interrupt();
    let prefix = prefix_of(&args.output);
    let naming = match (args.format, args.shard_tokens) {
        (_, Some(0)) => {
            return Err(user_error("command line: --shard-tokens 0: a shard holds at least one token"))
        }
        (OutputFormat::Megatron, Some(n)) => {
            return Err(user_error(format!(
                "command line: --shard-tokens {n}: shards are llm.c files; not with --format megatron"
            )))
        }
        (OutputFormat::Llmc, Some(n)) if n > i32::MAX as usize => {
            return Err(user_error(format!(
                "command line: --shard-tokens {n}: above {}, the most an llm.c header counts",
                i32::MAX
            )))
        }
        (OutputFormat::Llmc, Some(tokens)) => Some(Naming::Shards { prefix: prefix.clone(), tokens }),
        (OutputFormat::Llmc, None) => Some(Naming::Single(args.output.clone())),
        (OutputFormat::Megatron, None) => None,
    };
    let record = record_path(&prefix);
    let first_outputs: Vec<PathBuf> = match &naming {
        Some(Naming::Single(path)) => vec![path.clone()],
        Some(Naming::Shards { prefix, .. }) => vec![Naming::shard(prefix, 0)],
        None => vec![format!("{prefix}.bin").into(), format!("{prefix}.idx").into()],
    };
    input::refuse_outputs_among_inputs(&args.input, first_outputs.iter().chain([&record]))?;
    if !args.force {
        if let Some(p) = first_outputs.iter().chain([&record]).find(|p| p.exists()) {
            return Err(user_error(format!("{}: already exists; pass --force to overwrite it", p.display())));
        }
    }
    let tokenizer = Tokenizer::load(&args.tokenizer, args.eot_token.as_deref())?;
    if args.add_special_tokens && !tokenizer.has_post_processor() {
        return Err(user_error(format!(
            "command line: --add-special-tokens: {} adds no special tokens (a tokenizer.json's post-processor does)",
            tokenizer.name
        )));
    }
    let encode = |doc: &String| match args.add_special_tokens {
        true => tokenizer.encode_with_special_tokens(doc),
        false => tokenizer.encode(doc),
    };
    let files = input::input_files(&args.input)?;
    let mut docs = Documents::new(files, &args.json_key);
    let mut sink: Box<dyn TokenSink> = match naming {
        Some(naming) => Box::new(LlmcWriter::new(naming, tokenizer.vocab_size, tokenizer.eot)),
        None => Box::new(MegatronWriter::new(&prefix, tokenizer.vocab_size, tokenizer.eot)?),
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let mut progress = Progress::new(args.quiet);
    let mut documents = 0;
    pool.install(|| -> anyhow::Result<()> {
        let mut batch = read_batch(&mut docs)?;
        while !batch.is_empty() {
            let (encoded, next) = rayon::join(
                || batch.par_iter().map(encode).collect::<anyhow::Result<Vec<_>>>(),
                || read_batch(&mut docs),
            );
            for tokens in encoded? {
                sink.document(&tokens)?;
            }
            documents += batch.len();
            if let Some(p) = &mut progress {
                p.update(docs.bytes_read, sink.tokens());
            }
            batch = next?;
        }
        Ok(())
    })?;
    if let Some(p) = progress {
        p.finish();
    }
    let (tokens, token_bytes) = (sink.tokens(), sink.token_bytes());
    let written = sink.finish()?;
    if args.force {
        remove_stale_shards(&prefix, args.shard_tokens.map(|_| written.len()))?;
    }
    let output = Output { format: args.format, special_tokens: args.add_special_tokens, token_bytes };
    write_record(&record, &tokenizer, output, &written, tokens, documents)?;
    Ok(TokenizeSummary { files: written, input_bytes: docs.bytes_read, tokens, documents })
}

/// The next documents, up to [`BATCH_BYTES`] of text (at least one document unless the input
/// is done).
fn read_batch(docs: &mut Documents) -> anyhow::Result<Vec<String>> {
    let mut batch = Vec::new();
    let mut bytes = 0;
    while bytes < BATCH_BYTES {
        let Some(doc) = docs.next_doc()? else { break };
        bytes += doc.len();
        batch.push(doc);
    }
    Ok(batch)
}

/// Shards numbered from `written` on, left by an earlier, longer run: a reader globbing
/// `PREFIX_*.bin` would otherwise mix the two.
fn remove_stale_shards(prefix: &str, written: Option<usize>) -> anyhow::Result<()> {
    let Some(mut i) = written else { return Ok(()) };
    loop {
        let path = Naming::shard(prefix, i);
        if !path.exists() {
            return Ok(());
        }
        std::fs::remove_file(&path)
            .map_err(|e| user_error(format!("{}: cannot remove a stale shard: {e}", path.display())))?;
        i += 1;
    }
}

/// How the documents were written.
struct Output {
    format: OutputFormat,
    special_tokens: bool,
    token_bytes: usize,
}

/// `PREFIX.meta.json`: which tokenizer made the files, so a run can check its vocab_size.
fn write_record(
    path: &Path,
    tokenizer: &Tokenizer,
    output: Output,
    files: &[PathBuf],
    tokens: usize,
    documents: usize,
) -> anyhow::Result<()> {
    let (format, eot_position) = match output.format {
        OutputFormat::Llmc => ("llmc", "before each document"),
        OutputFormat::Megatron => ("megatron", "after each document"),
    };
    let record = TokenizeRecord {
        tokenizer: tokenizer.name.clone(),
        vocab_size: tokenizer.vocab_size,
        eot: tokenizer.eot,
        eot_token: tokenizer.eot_token.clone(),
        eot_position: eot_position.to_string(),
        format: format.to_string(),
        special_tokens: output.special_tokens,
        token_bytes: output.token_bytes,
        files: files
            .iter()
            .map(|f| f.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned()))
            .collect(),
        tokens,
        documents,
    };
    let text = serde_json::to_string_pretty(&record)? + "\n";
    staged::write_whole(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;
    use crate::data::TokenFile;
    use clap::Parser;
    use std::fs;

    fn args(extra: &[&str]) -> TokenizeArgs {
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            a: TokenizeArgs,
        }
        Wrap::parse_from(std::iter::once("tokenize").chain(extra.iter().copied())).a
    }

    #[test]
    fn writes_a_token_file() {
        let dir = test_dir("tok_write");
        let (inp, out) = (dir.join("in.txt"), dir.join("out.bin"));
        fs::write(&inp, "Hello world<|endoftext|>Hello").unwrap();
        let s = run(&args(&[inp.to_str().unwrap(), out.to_str().unwrap()])).unwrap();
        assert_eq!((s.tokens, s.documents, s.input_bytes), (5, 2, 29));
        assert_eq!(s.to_string(), format!("{}: 5 tokens (2 documents) from 29 bytes of text", out.display()));
        let f = TokenFile::open(&out).unwrap();
        // GPT-2's <|endoftext|> (50256) before each document.
        assert_eq!(
            (0..f.len()).map(|i| f.token(i) as u16).collect::<Vec<_>>(),
            [50256, 15496, 995, 50256, 15496]
        );
        assert!(!dir.join(".out.bin.tmp").exists());
        let record: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(dir.join("out.meta.json")).unwrap()).unwrap();
        assert_eq!(record["tokenizer"], "gpt2");
        assert_eq!((record["vocab_size"].as_u64(), record["eot"].as_u64()), (Some(50257), Some(50256)));
    }

    #[test]
    fn refuses_to_overwrite_without_force() {
        let dir = test_dir("tok_force");
        let (inp, out) = (dir.join("in.txt"), dir.join("out.bin"));
        fs::write(&inp, "Hello").unwrap();
        fs::write(&out, "precious").unwrap();
        let a = args(&[inp.to_str().unwrap(), out.to_str().unwrap()]);
        let err = run(&a).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}: already exists; pass --force to overwrite it", out.display())
        );
        assert_eq!(fs::read(&out).unwrap(), b"precious");
        run(&args(&[inp.to_str().unwrap(), out.to_str().unwrap(), "--force"])).unwrap();
        assert_eq!(TokenFile::open(&out).unwrap().len(), 2);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let dir = test_dir("tok_bad_input");
        let (inp, out) = (dir.join("in.txt"), dir.join("out.bin"));
        fs::write(&out, "precious").unwrap();
        let nope = dir.join("nope.txt");
        let err = run(&args(&[nope.to_str().unwrap(), out.to_str().unwrap(), "--force"])).unwrap_err();
        assert!(err.to_string().starts_with(&format!("{}: cannot read: ", nope.display())));
        fs::write(&inp, b"ok \xff").unwrap();
        let err = run(&args(&[inp.to_str().unwrap(), out.to_str().unwrap(), "--force"])).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: not UTF-8 text (byte 3)", inp.display()));
        assert_eq!(fs::read(&out).unwrap(), b"precious");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2, "no temporary file is left");
    }
}
