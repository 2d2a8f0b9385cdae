//! `pipetrain export --checkpoint PATH --hf DIR`: a Hugging Face directory of the model, with
//! the tokenizer.json of its text where there is one to copy.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Checkpoint, TOKENIZER_FILE};
use crate::cli::ExportArgs;
use crate::error::user_error;

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    let tokenizer = match tokenizer_json(&ck) {
        Ok(path) => path
            .map(|p| {
                std::fs::read_to_string(&p)
                    .map_err(|e| user_error(format!("{}: cannot read the tokenizer: {e}", p.display())))
            })
            .transpose()?,
        Err(why) => {
            eprintln!("note: {}: no {TOKENIZER_FILE}: {why}", args.hf.display());
            None
        }
    };
    let files = checkpoint::export_hf(&ck, &args.hf, args.force, tokenizer.as_deref())?;
    println!("exported {} -> {} ({})", ck.dir.display(), args.hf.display(), files.join(", "));
    Ok(())
}

/// The tokenizer.json of the model's text, as `generate` would choose it without a flag: the
/// one beside the weights (a Hugging Face directory's, or an export's); else the one the
/// run's data was tokenized with, from its trainer state. None where the text is GPT-2's
/// (generate's default) or unknown (data no `tokenize` record describes); an error, saying
/// why, where the run's tokenizer is not a tokenizer.json at hand (tiktoken's cl100k_base or
/// o200k_base, or a file since moved).
fn tokenizer_json(ck: &Checkpoint) -> Result<Option<PathBuf>, String> {
    let beside = ck.dir.join(TOKENIZER_FILE);
    if beside.is_file() {
        return Ok(Some(beside));
    }
    let Some(spec) = ck.trainer.as_ref().and_then(|t| t.state.tokenizer.as_ref()) else {
        return Ok(None);
    };
    match Path::new(&spec.tokenizer) {
        path if path.is_file() => Ok(Some(path.to_path_buf())),
        _ if spec.tokenizer == "gpt2" => Ok(None),
        _ => Err(format!(
            "the run's data was tokenized with {}, which is not a tokenizer.json file here; give generate --tokenizer",
            spec.tokenizer
        )),
    }
}
