//! llm.c's token files, as its `dev/data/data_common.py` writes them: a header of 256
//! little-endian int32 (magic, version, token count, zeros), then the tokens little-endian:
//! uint16 under magic 20240520 version 1 (GPT-2's vocabulary), uint32 under magic 20240801
//! version 7 (its Llama 3 files; any vocabulary above 65,536 ids). `<|endoftext|>` precedes
//! every document, as llm.c's data scripts and `tokenize` have always written it. With a shard
//! size the token stream is cut into files of exactly that many tokens (the last may be
//! shorter); a document may span two shards, as in llm.c's fineweb shards.

use std::path::PathBuf;

use super::staged::StagedFile;
use super::TokenSink;
use crate::data::token_file::{HEADER_BYTES, MAGIC, MAGIC_U32, VERSION, VERSION_U32};
use crate::error::user_error;

/// Ids below this fit uint16.
const UINT16_IDS: usize = 1 << 16;

/// Where the tokens go: one file, or numbered shards.
pub enum Naming {
    Single(PathBuf),
    /// `PREFIX_000000.bin`, `PREFIX_000001.bin`, ...
    Shards {
        prefix: String,
        tokens: usize,
    },
}

impl Naming {
    pub fn shard(prefix: &str, index: usize) -> PathBuf {
        PathBuf::from(format!("{prefix}_{index:06}.bin"))
    }
}

pub struct LlmcWriter {
    naming: Naming,
    eot: u32,
    wide: bool,
    /// The open file and its token count.
    current: Option<(StagedFile, usize)>,
    written: Vec<PathBuf>,
    tokens: usize,
}

impl LlmcWriter {
    pub fn new(naming: Naming, vocab_size: usize, eot: u32) -> LlmcWriter {
        LlmcWriter {
            naming,
            eot,
            wide: vocab_size > UINT16_IDS,
            current: None,
            written: Vec::new(),
            tokens: 0,
        }
    }

    /// Tokens per file: the shard size, or all an int32 count can hold.
    fn limit(&self) -> usize {
        match self.naming {
            Naming::Single(_) => i32::MAX as usize,
            Naming::Shards { tokens, .. } => tokens,
        }
    }

    fn open_next(&mut self) -> anyhow::Result<()> {
        let path = match &self.naming {
            Naming::Single(path) if self.written.is_empty() => path.clone(),
            Naming::Single(path) => {
                return Err(user_error(format!(
                    "{}: more than {} tokens, the most an llm.c header counts; pass --shard-tokens",
                    path.display(),
                    i32::MAX
                )))
            }
            Naming::Shards { prefix, .. } => Naming::shard(prefix, self.written.len()),
        };
        let mut file = StagedFile::create(&path)?;
        file.write(&self.header(0))?;
        self.current = Some((file, 0));
        Ok(())
    }

    fn header(&self, count: usize) -> Vec<u8> {
        let (magic, version) = if self.wide { (MAGIC_U32, VERSION_U32) } else { (MAGIC, VERSION) };
        let mut header = vec![0u8; HEADER_BYTES];
        for (i, v) in [magic, version, count as i32].into_iter().enumerate() {
            header[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        header
    }

    fn close(&mut self) -> anyhow::Result<()> {
        if let Some((mut file, count)) = self.current.take() {
            file.patch(0, &self.header(count))?;
            self.written.push(file.commit()?);
        }
        Ok(())
    }

    fn push(&mut self, mut tokens: &[u32]) -> anyhow::Result<()> {
        while !tokens.is_empty() {
            if self.current.is_none() {
                self.open_next()?;
            }
            let limit = self.limit();
            let wide = self.wide;
            let (file, count) = self.current.as_mut().expect("opened above");
            let take = (limit - *count).min(tokens.len());
            let bytes: Vec<u8> = if wide {
                tokens[..take].iter().flat_map(|t| t.to_le_bytes()).collect()
            } else {
                // Every id is below the vocabulary size, at most 65,536 here.
                tokens[..take].iter().flat_map(|&t| (t as u16).to_le_bytes()).collect()
            };
            file.write(&bytes)?;
            *count += take;
            self.tokens += take;
            tokens = &tokens[take..];
            if *count == limit {
                self.close()?;
            }
        }
        Ok(())
    }
}

impl TokenSink for LlmcWriter {
    fn document(&mut self, tokens: &[u32]) -> anyhow::Result<()> {
        self.push(&[self.eot])?;
        self.push(tokens)
    }

    fn tokens(&self) -> usize {
        self.tokens
    }

    fn token_bytes(&self) -> usize {
        if self.wide {
            4
        } else {
            2
        }
    }

    fn finish(mut self: Box<Self>) -> anyhow::Result<Vec<PathBuf>> {
        // No documents still make one (empty) file, so the output exists.
        if self.written.is_empty() && self.current.is_none() {
            self.open_next()?;
        }
        self.close()?;
        Ok(std::mem::take(&mut self.written))
    }
}
