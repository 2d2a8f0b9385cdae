//! `PREFIX.meta.json`, the record `tokenize` leaves beside its output: which tokenizer made the
//! files. A run reads it to refuse a `vocab_size` smaller than that tokenizer's, whose ids the
//! model could then not embed, before any token of the data is looked at.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::user_error;

/// What `tokenize` records about its output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizeRecord {
    /// `gpt2`, `cl100k_base`, `o200k_base`, or the tokenizer.json path as given.
    pub tokenizer: String,
    /// The tokenizer's highest id + 1, added tokens included.
    pub vocab_size: usize,
    pub eot: u32,
    pub eot_token: String,
    /// `before each document` (llm.c) or `after each document` (Megatron).
    pub eot_position: String,
    /// `llmc` or `megatron`.
    pub format: String,
    /// Each document begins with the special tokens the tokenizer's post-processor adds
    /// (`--add-special-tokens`: a Llama's `<|begin_of_text|>`). Absent in older records.
    #[serde(default)]
    pub special_tokens: bool,
    pub token_bytes: usize,
    /// The file names written, without their directory.
    pub files: Vec<String>,
    pub tokens: usize,
    pub documents: usize,
}

/// The tokenizer a record names, as `tokenize` was given it (`gpt2`, `cl100k_base`,
/// `o200k_base` or a tokenizer.json's path) with its end-of-text token: what a run trained
/// on the data keeps, so that `generate` reads and writes the model's text with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerSpec {
    pub tokenizer: String,
    pub eot_token: String,
    /// The documents begin with the post-processor's special tokens, as a prompt then
    /// should (absent in older trainer states).
    #[serde(default)]
    pub special_tokens: bool,
}

/// The record of the output whose files share `prefix` (OUTPUT without `.bin`).
pub fn record_path(prefix: &str) -> PathBuf {
    PathBuf::from(format!("{prefix}.meta.json"))
}

/// The records a run has read, by path (a thousand shards share one).
#[derive(Default)]
pub struct Records {
    read: HashMap<PathBuf, TokenizeRecord>,
}

impl Records {
    /// Errors if the record that lists data file `bin` (an llm.c file, or a Megatron
    /// dataset's `.bin`) names a tokenizer with more ids than `vocab_size`; else returns the
    /// tokenizer it names. A file no record lists (made by another tool) is not checked
    /// here, and has no known tokenizer; its tokens still are checked.
    pub fn check_vocab_size(
        &mut self,
        bin: &Path,
        vocab_size: usize,
    ) -> anyhow::Result<Option<TokenizerSpec>> {
        let Some(name) = bin.file_name().map(|n| n.to_string_lossy().into_owned()) else { return Ok(None) };
        for path in candidates(bin) {
            let Some(record) = self.read(&path)? else { continue };
            if !record.files.contains(&name) {
                continue;
            }
            if record.vocab_size > vocab_size {
                return Err(user_error(format!(
                    "{}: made by tokenizer {} (as {} records), whose {} ids exceed vocab_size {vocab_size}",
                    bin.display(),
                    record.tokenizer,
                    path.display(),
                    record.vocab_size,
                )));
            }
            let spec = TokenizerSpec {
                tokenizer: record.tokenizer.clone(),
                eot_token: record.eot_token.clone(),
                special_tokens: record.special_tokens,
            };
            return Ok(Some(spec));
        }
        Ok(None)
    }

    fn read(&mut self, path: &Path) -> anyhow::Result<Option<&TokenizeRecord>> {
        if !self.read.contains_key(path) {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(user_error(format!("{}: cannot read: {e}", path.display()))),
            };
            let record = serde_json::from_str(&text).map_err(|e| {
                user_error(format!("{}: not a record written by `pipetrain tokenize`: {e}", path.display()))
            })?;
            self.read.insert(path.to_path_buf(), record);
        }
        Ok(self.read.get(path))
    }
}

/// Where the record of data file `bin` may be: `X.meta.json` for `X.bin`, and for a shard
/// `P_000042.bin`, `P.meta.json`.
fn candidates(bin: &Path) -> Vec<PathBuf> {
    let text = bin.to_string_lossy();
    let stem = text.strip_suffix(".bin").unwrap_or(&text);
    let mut out = vec![record_path(stem)];
    if let Some((prefix, index)) = stem.rsplit_once('_') {
        if index.len() == 6 && index.bytes().all(|b| b.is_ascii_digit()) {
            out.push(record_path(prefix));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    fn record(vocab_size: usize, files: &[&str]) -> String {
        let r = TokenizeRecord {
            tokenizer: "cl100k_base".into(),
            vocab_size,
            eot: 100257,
            eot_token: "<|endoftext|>".into(),
            eot_position: "before each document".into(),
            format: "llmc".into(),
            special_tokens: false,
            token_bytes: 4,
            files: files.iter().map(|f| f.to_string()).collect(),
            tokens: 10,
            documents: 1,
        };
        serde_json::to_string(&r).unwrap()
    }

    #[test]
    fn finds_the_record_of_a_file_or_a_shard() {
        let at = |s: &str| PathBuf::from(s);
        assert_eq!(candidates(&at("d/x.bin")), [at("d/x.meta.json")]);
        assert_eq!(
            candidates(&at("d/web_000042.bin")),
            [at("d/web_000042.meta.json"), at("d/web.meta.json")]
        );
        assert_eq!(candidates(&at("d/web_42.bin")), [at("d/web_42.meta.json")]);
    }

    #[test]
    fn a_vocab_size_below_the_tokenizers_is_one_line() {
        let dir = test_dir("record_vocab");
        std::fs::write(dir.join("web.meta.json"), record(100277, &["web_000000.bin"])).unwrap();
        let shard = dir.join("web_000000.bin");
        let mut records = Records::default();
        let err = records.check_vocab_size(&shard, 50304).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: made by tokenizer cl100k_base (as {} records), whose 100277 ids exceed vocab_size 50304",
                shard.display(),
                dir.join("web.meta.json").display()
            )
        );
        assert!(crate::error::is_user_error(&err));
        let cl100k = TokenizerSpec {
            tokenizer: "cl100k_base".into(),
            eot_token: "<|endoftext|>".into(),
            special_tokens: false,
        };
        assert_eq!(records.check_vocab_size(&shard, 100277).unwrap(), Some(cl100k));
        // A file the record does not list is not its tokenizer's.
        assert_eq!(records.check_vocab_size(&dir.join("web_000001.bin"), 50304).unwrap(), None);
        // Nor is a file without a record.
        assert_eq!(records.check_vocab_size(&dir.join("other.bin"), 50304).unwrap(), None);
    }

    #[test]
    fn a_broken_record_is_one_line() {
        let dir = test_dir("record_broken");
        std::fs::write(dir.join("x.meta.json"), "{\"tokenizer\": 3}").unwrap();
        let err = Records::default().check_vocab_size(&dir.join("x.bin"), 50304).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "{}: not a record written by `pipetrain tokenize`: ",
                dir.join("x.meta.json").display()
            )),
            "{err}"
        );
    }
}
