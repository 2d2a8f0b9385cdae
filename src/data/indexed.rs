//! Megatron-LM's indexed dataset: `PREFIX.bin` holds the tokens of every sequence back to
//! back with no header; `PREFIX.idx` describes them, all little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 9 | `MMIDIDX\x00\x00` |
//! | 8 | version, u64 = 1 |
//! | 1 | dtype code: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16 |
//! | 8 | sequence count S, u64 |
//! | 8 | document count D, u64 (documents + 1: a leading 0) |
//! | 4 S | sequence lengths, i32, in tokens |
//! | 8 S | sequence pointers, i64, byte offsets into `.bin` |
//! | 8 D | document indices, i64: where each document's sequences start, then S |
//!
//! Training reads the `.bin` as one stream of tokens, as Megatron's GPT dataset does, so
//! only the totals are kept; the rest of the index is checked, because an index that does
//! not describe its `.bin` means the two files do not belong together.

use std::path::Path;

use super::token_file::{map_file, Dtype, TokenFile};
use crate::error::user_error;

/// The index file's magic and version (Megatron's `_INDEX_HEADER`, version 1), which
/// `tokenize --format megatron` writes too.
pub const INDEX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
pub const INDEX_VERSION: u64 = 1;
const HEADER_BYTES: usize = 9 + 8 + 1 + 8 + 8;

/// Whether `prefix` names a Megatron dataset: its `.idx` exists.
pub fn is_indexed(prefix: &Path) -> bool {
    index_path(prefix).is_file()
}

fn index_path(prefix: &Path) -> std::path::PathBuf {
    with_suffix(prefix, ".idx")
}

fn data_path(prefix: &Path) -> std::path::PathBuf {
    with_suffix(prefix, ".bin")
}

/// `prefix` + `suffix` (not `set_extension`: a prefix such as `web_text_document.v2` keeps
/// its dot).
fn with_suffix(prefix: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

/// Opens the dataset `prefix` (`prefix.idx` + `prefix.bin`); every way the pair can be wrong
/// is a one-line user error naming the file at fault.
pub fn open_indexed(prefix: &Path) -> anyhow::Result<TokenFile> {
    let idx_path = index_path(prefix);
    let idx = map_file(&idx_path, "Megatron index")?;
    let (dtype, tokens) =
        read_index(&idx).map_err(|what| user_error(format!("{}: {what}", idx_path.display())))?;
    let bin_path = data_path(prefix);
    let bin = map_file(&bin_path, "Megatron data file")?;
    let expected = tokens.checked_mul(dtype.size() as u64);
    if expected != Some(bin.len() as u64) {
        return Err(user_error(format!(
            "{}: its index says {tokens} tokens of {} bytes but the file has {} bytes: truncated, or \
             not the data of {}",
            bin_path.display(),
            dtype.size(),
            bin.len(),
            idx_path.display()
        )));
    }
    Ok(TokenFile::from_map(bin_path, bin, 0, tokens as usize, dtype))
}

/// The token width and total token count an index describes, or what is wrong with it.
fn read_index(b: &[u8]) -> Result<(Dtype, u64), String> {
    if b.len() < HEADER_BYTES {
        return Err(format!(
            "{} bytes, too short for the {HEADER_BYTES}-byte header: not a Megatron index",
            b.len()
        ));
    }
    if &b[..9] != INDEX_MAGIC {
        return Err("does not start with MMIDIDX: not a Megatron index".into());
    }
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let version = u64_at(9);
    if version != INDEX_VERSION {
        return Err(format!("unsupported version {version} (expected {INDEX_VERSION})"));
    }
    let dtype = match b[17] {
        1 => Dtype::U8,
        2 => Dtype::I8,
        3 => Dtype::I16,
        4 => Dtype::I32,
        5 => Dtype::I64,
        8 => Dtype::U16,
        6 | 7 => return Err(format!("dtype code {} is a float type, not tokens", b[17])),
        code => return Err(format!("unknown dtype code {code}")),
    };
    let (sequences, documents) = (u64_at(18), u64_at(26));
    let expected = sequences
        .checked_mul(4 + 8)
        .and_then(|s| documents.checked_mul(8).and_then(|d| s.checked_add(d)))
        .and_then(|n| n.checked_add(HEADER_BYTES as u64));
    if expected != Some(b.len() as u64) {
        let shown = expected.map_or("more than 2^64".to_string(), |e| e.to_string());
        return Err(format!(
            "header says {sequences} sequences and {documents} document indices ({shown} bytes) but the \
             file has {} bytes: truncated or corrupt",
            b.len()
        ));
    }
    let s = sequences as usize;
    let lengths = HEADER_BYTES;
    let pointers = lengths + 4 * s;
    let docs = pointers + 8 * s;
    let mut tokens = 0u64;
    for i in 0..s {
        let len = i32::from_le_bytes(b[lengths + 4 * i..lengths + 4 * i + 4].try_into().expect("4 bytes"));
        let ptr = u64_at(pointers + 8 * i) as i64;
        if len < 0 {
            return Err(format!("sequence {i} has negative length {len}"));
        }
        let at = tokens * dtype.size() as u64;
        if ptr < 0 || ptr as u64 != at {
            return Err(format!(
                "sequence {i} starts at byte {ptr}, but the sequences before it end at byte {at}: \
                 inconsistent index"
            ));
        }
        tokens += len as u64;
    }
    let doc = |j: usize| u64_at(docs + 8 * j) as i64;
    let d = documents as usize;
    if d == 0 || doc(0) != 0 || doc(d - 1) != sequences as i64 {
        let (first, last) = if d == 0 { (None, None) } else { (Some(doc(0)), Some(doc(d - 1))) };
        return Err(format!(
            "document indices must run from 0 to the sequence count {sequences}, found first {first:?}, \
             last {last:?}: inconsistent index"
        ));
    }
    if let Some(j) = (1..d).find(|&j| doc(j) < doc(j - 1)) {
        return Err(format!(
            "document index {j} is {}, below the one before it ({}): inconsistent index",
            doc(j),
            doc(j - 1)
        ));
    }
    Ok((dtype, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    /// An index, as Megatron's writer lays it out, for sequences of these lengths (each its
    /// own document) in a `.bin` of `dtype_code`'s width.
    fn index_bytes(dtype_code: u8, width: u64, lengths: &[i32]) -> Vec<u8> {
        let mut b = INDEX_MAGIC.to_vec();
        b.extend(1u64.to_le_bytes());
        b.push(dtype_code);
        b.extend((lengths.len() as u64).to_le_bytes());
        b.extend((lengths.len() as u64 + 1).to_le_bytes());
        b.extend(lengths.iter().flat_map(|l| l.to_le_bytes()));
        let mut at = 0i64;
        for l in lengths {
            b.extend(at.to_le_bytes());
            at += *l as i64 * width as i64;
        }
        b.extend((0..=lengths.len() as i64).flat_map(|j| j.to_le_bytes()));
        b
    }

    fn write_pair(name: &str, idx: &[u8], bin: &[u8]) -> std::path::PathBuf {
        let prefix = test_dir(name).join("ds_text_document");
        std::fs::write(index_path(&prefix), idx).unwrap();
        std::fs::write(data_path(&prefix), bin).unwrap();
        prefix
    }

    fn err(prefix: &Path) -> String {
        open_indexed(prefix).err().expect("expected an error").to_string()
    }

    #[test]
    fn every_integer_dtype_reads_its_tokens() {
        let tokens = [3i64, 0, 100, 7, 120];
        for (code, dtype) in [
            (1u8, Dtype::U8),
            (2, Dtype::I8),
            (3, Dtype::I16),
            (4, Dtype::I32),
            (5, Dtype::I64),
            (8, Dtype::U16),
        ] {
            let w = dtype.size();
            let bin: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()[..w].to_vec()).collect();
            let prefix =
                write_pair(&format!("idx_dtype_{code}"), &index_bytes(code, w as u64, &[2, 3]), &bin);
            assert!(is_indexed(&prefix));
            let f = open_indexed(&prefix).unwrap();
            assert_eq!((f.len(), f.dtype()), (5, dtype));
            assert_eq!((0..5).map(|i| f.token(i) as i64).collect::<Vec<_>>(), tokens);
            assert_eq!(f.path(), data_path(&prefix));
        }
    }

    /// tests/fixtures/megatron/make_fixture.py writes the dataset by Megatron's rules; its
    /// token i is (i * 7919 + 65521) % 70000, int32, 400 tokens in three documents.
    #[test]
    fn the_committed_fixture_reads_as_its_script_wrote_it() {
        let prefix = Path::new("tests/fixtures/megatron/tiny_text_document");
        assert!(is_indexed(prefix));
        let f = open_indexed(prefix).unwrap();
        assert_eq!((f.len(), f.dtype()), (400, Dtype::I32));
        let want: Vec<u32> = (0..400).map(|i| (i * 7919 + 65521) % 70000).collect();
        assert_eq!((0..400).map(|i| f.token(i)).collect::<Vec<_>>(), want);
        f.check_vocab(70000).unwrap();
        assert_eq!(
            f.check_vocab(65536).unwrap_err().to_string(),
            format!(
                "{}: token 66792 at position 9 is not below vocab_size 65536",
                data_path(prefix).display()
            )
        );
    }

    #[test]
    fn each_inconsistency_has_its_message() {
        let good = index_bytes(4, 4, &[2, 3]);
        let bin = vec![0u8; 20];
        let prefix = write_pair("idx_bad", &good, &bin);
        let idx = index_path(&prefix).display().to_string();
        let binp = data_path(&prefix).display().to_string();
        let with = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            edit(&mut b);
            std::fs::write(index_path(&prefix), &b).unwrap();
            err(&prefix)
        };
        assert_eq!(
            with(&|b| b.truncate(20)),
            format!("{idx}: 20 bytes, too short for the 34-byte header: not a Megatron index")
        );
        assert_eq!(
            with(&|b| b[0] = b'X'),
            format!("{idx}: does not start with MMIDIDX: not a Megatron index")
        );
        assert_eq!(with(&|b| b[9] = 2), format!("{idx}: unsupported version 2 (expected 1)"));
        assert_eq!(with(&|b| b[17] = 7), format!("{idx}: dtype code 7 is a float type, not tokens"));
        assert_eq!(with(&|b| b[17] = 9), format!("{idx}: unknown dtype code 9"));
        assert_eq!(
            with(&|b| b.truncate(b.len() - 8)),
            format!(
                "{idx}: header says 2 sequences and 3 document indices (82 bytes) but the file has 74 \
                 bytes: truncated or corrupt"
            )
        );
        assert_eq!(
            with(&|b| b[34..38].copy_from_slice(&(-1i32).to_le_bytes())),
            format!("{idx}: sequence 0 has negative length -1")
        );
        assert_eq!(
            with(&|b| b[50..58].copy_from_slice(&12i64.to_le_bytes())),
            format!(
                "{idx}: sequence 1 starts at byte 12, but the sequences before it end at byte 8: \
                 inconsistent index"
            )
        );
        assert_eq!(
            with(&|b| b[74..82].copy_from_slice(&1i64.to_le_bytes())),
            format!(
                "{idx}: document indices must run from 0 to the sequence count 2, found first Some(0), \
                 last Some(1): inconsistent index"
            )
        );
        assert_eq!(
            with(&|b| b[66..74].copy_from_slice(&5i64.to_le_bytes())),
            format!("{idx}: document index 2 is 2, below the one before it (5): inconsistent index")
        );
        std::fs::write(index_path(&prefix), &good).unwrap();
        std::fs::write(data_path(&prefix), &bin[..18]).unwrap();
        assert_eq!(
            err(&prefix),
            format!(
                "{binp}: its index says 5 tokens of 4 bytes but the file has 18 bytes: truncated, or not \
                 the data of {idx}"
            )
        );
        std::fs::remove_file(data_path(&prefix)).unwrap();
        assert!(err(&prefix).starts_with(&format!("{binp}: cannot open Megatron data file: ")));
        let e = open_indexed(&prefix).err().unwrap();
        assert!(crate::error::is_user_error(&e));
    }
}
