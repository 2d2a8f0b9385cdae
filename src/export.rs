//! `pipetrain export --checkpoint PATH --hf DIR`: a Hugging Face directory of the model, with
//! the tokenizer.json of its text where it is known: copied, or written for tiktoken's; and
//! config.json naming that tokenizer's first and last tokens, which transformers' generate
//! stops at.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::checkpoint::{
    self, Checkpoint, SpecialTokens, TokenizerFiles, CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use crate::cli::ExportArgs;
use crate::data::{tiktoken_tokenizer_json, Tokenizer};
use crate::error::user_error;

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    let tokenizer = match tokenizer_json(&ck) {
        Ok(Some(Source::File(p))) => Some(copied(&p)?),
        Ok(Some(Source::Tiktoken(json))) => Some(TokenizerFiles::as_is(json)),
        Ok(None) => None,
        Err(why) => {
            eprintln!("note: {}: no {TOKENIZER_FILE}: {why}", args.hf.display());
            None
        }
    };
    let special = special_tokens(&ck);
    let files = checkpoint::export_hf(&ck, &args.hf, args.force, (tokenizer.as_ref(), special.as_ref()))?;
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
enum Source {
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
fn tokenizer_json(ck: &Checkpoint) -> Result<Option<Source>, String> {
    let beside = ck.dir.join(TOKENIZER_FILE);
    if beside.is_file() {
        return Ok(Some(Source::File(beside)));
    }
    let Some(spec) = ck.trainer.as_ref().and_then(|t| t.state.tokenizer.as_ref()) else {
        return Ok(None);
    };
    match Path::new(&spec.tokenizer) {
        path if path.is_file() => Ok(Some(Source::File(path.to_path_buf()))),
        _ => match tiktoken_tokenizer_json(&spec.tokenizer) {
            Some(json) => Ok(Some(Source::Tiktoken(json))),
            None => Err(format!(
                "the run's data was tokenized with {}, which is not a tokenizer.json file here; give generate --tokenizer",
                spec.tokenizer
            )),
        },
    }
}

/// The text's first and last tokens, for config.json, from where the tokenizer comes: the
/// ones a Hugging Face directory's config.json names (or an export's, beside its
/// tokenizer.json); else the end-of-text token that separated the run's documents. None
/// where they are unknown, and the class names its own.
fn special_tokens(ck: &Checkpoint) -> Option<SpecialTokens> {
    let Some(trainer) = ck.trainer.as_ref().filter(|_| !ck.dir.join(TOKENIZER_FILE).is_file()) else {
        return named_beside(&ck.dir);
    };
    let spec = trainer.state.tokenizer.as_ref()?;
    let tokenizer = Tokenizer::load(&spec.tokenizer, Some(&spec.eot_token)).ok()?;
    Some(SpecialTokens::end_of_text(tokenizer.eot))
}

/// The first and last tokens the config.json of a model directory (the one just loaded)
/// names, null for the one of the two it leaves out; None where it names neither, and the
/// export's class names its own.
fn named_beside(dir: &Path) -> Option<SpecialTokens> {
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).ok()?;
    let config: Value = serde_json::from_str(&text).ok()?;
    let (bos, eos) = (config.get("bos_token_id"), config.get("eos_token_id"));
    (bos.is_some() || eos.is_some()).then(|| SpecialTokens {
        bos: bos.cloned().unwrap_or(Value::Null),
        eos: eos.cloned().unwrap_or(Value::Null),
    })
}
