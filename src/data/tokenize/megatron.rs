//! Megatron-LM's indexed dataset (`megatron/core/datasets/indexed_dataset.py`), as its
//! `tools/preprocess_data.py --append-eod` writes it, one sequence per document:
//! - `PREFIX.bin`: every sequence's tokens back to back, each document followed by the
//!   end-of-text token, in the dtype Megatron picks for the vocabulary (uint16 below 65,500
//!   ids, else int32);
//! - `PREFIX.idx`: the magic `MMIDIDX\0\0`, version 1 (uint64), the dtype's code (uint8), the
//!   sequence count and the document-index count (uint64), then each sequence's length
//!   (int32), each sequence's byte offset in the .bin (int64), and the document indices
//!   (int64): 0, then after each document the number of sequences so far.
//!
//! An empty document has no sequence (Megatron appends the end of text only to a document
//! with tokens) but still counts as a document, as preprocess_data.py records it.
//! The index holds 12 bytes per document in memory until the end, as Megatron's builder does.

use std::path::{Path, PathBuf};

use super::staged::StagedFile;
use super::TokenSink;
use crate::data::indexed::{INDEX_MAGIC, INDEX_VERSION};
use crate::error::user_error;

/// Megatron's `DType` codes for the two token dtypes it picks.
pub const DTYPE_INT32: u8 = 4;
pub const DTYPE_UINT16: u8 = 8;
/// Megatron's `DType.optimal_dtype`: uint16 below this many ids.
const UINT16_BELOW: usize = 65500;

pub struct MegatronWriter {
    bin: StagedFile,
    idx_path: PathBuf,
    eot: u32,
    wide: bool,
    lengths: Vec<i32>,
    document_indices: Vec<i64>,
    tokens: usize,
}

impl MegatronWriter {
    pub fn new(prefix: &str, vocab_size: usize, eot: u32) -> anyhow::Result<MegatronWriter> {
        Ok(MegatronWriter {
            bin: StagedFile::create(Path::new(&format!("{prefix}.bin")))?,
            idx_path: PathBuf::from(format!("{prefix}.idx")),
            eot,
            wide: vocab_size >= UINT16_BELOW,
            lengths: Vec::new(),
            document_indices: vec![0],
            tokens: 0,
        })
    }

    fn index(&self) -> Vec<u8> {
        let mut idx = Vec::with_capacity(34 + 12 * self.lengths.len() + 8 * self.document_indices.len());
        idx.extend_from_slice(INDEX_MAGIC);
        idx.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        idx.push(if self.wide { DTYPE_INT32 } else { DTYPE_UINT16 });
        idx.extend_from_slice(&(self.lengths.len() as u64).to_le_bytes());
        idx.extend_from_slice(&(self.document_indices.len() as u64).to_le_bytes());
        for len in &self.lengths {
            idx.extend_from_slice(&len.to_le_bytes());
        }
        let mut pointer = 0i64;
        for &len in &self.lengths {
            idx.extend_from_slice(&pointer.to_le_bytes());
            pointer += len as i64 * self.token_bytes() as i64;
        }
        for d in &self.document_indices {
            idx.extend_from_slice(&d.to_le_bytes());
        }
        idx
    }
}

impl TokenSink for MegatronWriter {
    fn document(&mut self, tokens: &[u32]) -> anyhow::Result<()> {
        if !tokens.is_empty() {
            let len = i32::try_from(tokens.len() + 1).map_err(|_| {
                user_error(format!(
                    "a document of {} tokens does not fit Megatron's int32 length",
                    tokens.len()
                ))
            })?;
            let bytes: Vec<u8> = if self.wide {
                tokens.iter().chain([&self.eot]).flat_map(|&t| (t as i32).to_le_bytes()).collect()
            } else {
                // Every id is below 65,500 here.
                tokens.iter().chain([&self.eot]).flat_map(|&t| (t as u16).to_le_bytes()).collect()
            };
            self.bin.write(&bytes)?;
            self.lengths.push(len);
            self.tokens += len as usize;
        }
        self.document_indices.push(self.lengths.len() as i64);
        Ok(())
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

    fn finish(self: Box<Self>) -> anyhow::Result<Vec<PathBuf>> {
        let mut idx = StagedFile::create(&self.idx_path)?;
        idx.write(&self.index())?;
        let this = *self;
        let bin = this.bin.commit()?;
        Ok(vec![bin, idx.commit()?])
    }
}
