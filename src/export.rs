//! `pipetrain export --checkpoint PATH --hf DIR`: a Hugging Face directory of the model, with
//! the tokenizer.json of its text where it is known: copied, or written for tiktoken's.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Checkpoint, TokenizerFiles, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use crate::cli::ExportArgs;
use crate::data::tiktoken_tokenizer_json;
use crate::error::user_error;

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    let tokenizer = match tokenizer_json(&ck) {
        Ok(Some(Tokenizer::File(p))) => Some(copied(&p)?),
        Ok(Some(Tokenizer::Tiktoken(json))) => Some(TokenizerFiles::as_is(json)),
        Ok(None) => None,
        Err(why) => {
            eprintln!("note: {}: no {TOKENIZER_FILE}: {why}", args.hf.display());
            None
        }
    };
    let files = checkpoint::export_hf(&ck, &args.hf, args.force, tokenizer.as_ref())?;
    println!("exported {} -> {} ({})", ck.dir.display(), args.hf.display(), files.join(", "));
    Ok(())
}

/// The tokenizer.json at `path`, with the tokenizer_config.json beside it where there is one
/// (a Hugging Face directory's: its special tokens and chat template), else the settings
/// that take it as it is.
fn copied(path: &Path) -> anyhow::Result<TokenizerFiles> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| user_error(format!("{}: cannot read the tokenizer: {e}", p.display())))
    };
    let files = TokenizerFiles::as_is(read(path)?);
    match path.with_file_name(TOKENIZER_CONFIG_FILE) {
        config if config.is_file() => Ok(TokenizerFiles { config: read(&config)?, ..files }),
        _ => Ok(files),
    }
}

/// Where the export's tokenizer.json comes from.
enum Tokenizer {
    /// A tokenizer.json file, copied.
    File(PathBuf),
    /// A tiktoken encoding, written as the tokenizer.json that encodes as it does.
    Tiktoken(String),
}

/// The tokenizer.json of the model's text, as `generate` would choose it without a flag: the
/// one beside the weights (a Hugging Face directory's, or an export's); else the one the
/// run's data was tokenized with, from its trainer state: its file, or, for tiktoken's GPT-2,
/// cl100k_base and o200k_base, the tokenizer.json that encodes as it does. None where the
/// text is unknown (data no `tokenize` record describes); an error, saying why, where the
/// run's tokenizer.json has since moved.
fn tokenizer_json(ck: &Checkpoint) -> Result<Option<Tokenizer>, String> {
    let beside = ck.dir.join(TOKENIZER_FILE);
    if beside.is_file() {
        return Ok(Some(Tokenizer::File(beside)));
    }
    let Some(spec) = ck.trainer.as_ref().and_then(|t| t.state.tokenizer.as_ref()) else {
        return Ok(None);
    };
    match Path::new(&spec.tokenizer) {
        path if path.is_file() => Ok(Some(Tokenizer::File(path.to_path_buf()))),
        _ => match tiktoken_tokenizer_json(&spec.tokenizer) {
            Some(json) => Ok(Some(Tokenizer::Tiktoken(json))),
            None => Err(format!(
                "the run's data was tokenized with {}, which is not a tokenizer.json file here; give generate --tokenizer",
                spec.tokenizer
            )),
        },
    }
}
