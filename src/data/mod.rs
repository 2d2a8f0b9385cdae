//! Token data: llm.c token files and Megatron indexed datasets, the sources a data path
//! names (files, shards, blends), tokenization (`pipetrain tokenize`), and the batch loader.

mod indexed;
mod loader;
mod record;
mod source;
mod token_file;
mod tokenize;

pub use record::TokenizerSpec;
pub use source::TokenData;
#[cfg(test)]
pub(crate) use token_file::write_tokens;
pub use token_file::TokenFile;
pub use tokenize::{run as tokenize, tiktoken_tokenizer_json, OutputFormat, Tokenizer};

/// A fresh, empty directory for one test.
#[cfg(test)]
pub(crate) fn test_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pipetrain-test-{}", std::process::id())).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
