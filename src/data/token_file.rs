//! The llm.c / nanoGPT token file: a 256 x int32 little-endian header (magic, version,
//! token count, zeros) followed by the tokens as uint16 little-endian.
//! Files are memory-mapped, so a multi-gigabyte corpus costs no resident memory up front.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::user_error;

pub const MAGIC: i32 = 20240520;
pub const VERSION: i32 = 1;
pub const HEADER_INTS: usize = 256;
pub const HEADER_BYTES: usize = HEADER_INTS * 4;

/// The header for a file of `count` tokens (the writer is `tokenize`'s own, `tokenize/llmc.rs`;
/// this one makes fixtures for the tests).
#[cfg(test)]
pub fn encode_header(count: usize) -> std::io::Result<[u8; HEADER_BYTES]> {
    use std::io;
    let count = i32::try_from(count).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{count} tokens do not fit the int32 header"))
    })?;
    let mut header = [0u8; HEADER_BYTES];
    for (i, v) in [MAGIC, VERSION, count].into_iter().enumerate() {
        header[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    Ok(header)
}

/// Writes a complete token file (header and tokens) to `w`.
#[cfg(test)]
pub fn write_tokens(w: &mut impl std::io::Write, tokens: &[u16]) -> std::io::Result<()> {
    w.write_all(&encode_header(tokens.len())?)?;
    let body: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    w.write_all(&body)
}

/// A validated, memory-mapped token file.
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
    len: usize,
}

impl TokenFile {
    /// Opens and validates `path`; every way the file can be wrong is a one-line user error
    /// that names the file.
    pub fn open(path: &Path) -> anyhow::Result<TokenFile> {
        let shown = path.display();
        let file =
            File::open(path).map_err(|e| user_error(format!("{shown}: cannot open token file: {e}")))?;
        // SAFETY: the map is read-only and we never hand out references that outlive it;
        // a concurrent writer truncating the file is outside what we can guard against.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| user_error(format!("{shown}: cannot map token file: {e}")))?;
        let len = validate(&map).map_err(|what| user_error(format!("{shown}: {what}")))?;
        Ok(TokenFile { path: path.to_path_buf(), map, len })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Token `i` (`i < len()`).
    #[inline]
    pub fn token(&self, i: usize) -> u16 {
        let at = HEADER_BYTES + 2 * i;
        u16::from_le_bytes([self.map[at], self.map[at + 1]])
    }

    /// Errors, naming the first offending position, if any token is not below `vocab_size`.
    pub fn check_vocab(&self, vocab_size: usize) -> anyhow::Result<()> {
        match (0..self.len).find(|&i| self.token(i) as usize >= vocab_size) {
            None => Ok(()),
            Some(i) => Err(user_error(format!(
                "{}: token {} at position {i} is not below vocab_size {vocab_size}",
                self.path.display(),
                self.token(i)
            ))),
        }
    }
}

/// The token count if `bytes` is a well-formed token file, else what is wrong with it.
fn validate(bytes: &[u8]) -> Result<usize, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "{} bytes, too short for the {HEADER_BYTES}-byte header: not a token file",
            bytes.len()
        ));
    }
    let int = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    if int(0) != MAGIC {
        return Err(format!("bad magic {} (expected {MAGIC}): not a token file", int(0)));
    }
    if int(1) != VERSION {
        return Err(format!("unsupported version {} (expected {VERSION})", int(1)));
    }
    let count = usize::try_from(int(2)).map_err(|_| format!("negative token count {}", int(2)))?;
    let expected = HEADER_BYTES + 2 * count;
    if bytes.len() != expected {
        return Err(format!(
            "header says {count} tokens ({expected} bytes) but the file has {} bytes: truncated or corrupt",
            bytes.len()
        ));
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).unwrap();
    }

    fn file_bytes(tokens: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        write_tokens(&mut v, tokens).unwrap();
        v
    }

    fn open_err(path: &Path) -> String {
        TokenFile::open(path).err().expect("expected an error").to_string()
    }

    #[test]
    fn round_trip() {
        let dir = test_dir("tf_round_trip");
        let path = dir.join("a.bin");
        let tokens = [0u16, 1, 50256, 65535, 7];
        write(&path, &file_bytes(&tokens));
        let f = TokenFile::open(&path).unwrap();
        assert_eq!(f.len(), 5);
        assert_eq!((0..5).map(|i| f.token(i)).collect::<Vec<_>>(), tokens);
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), 1024 + 10);
        assert_eq!(&raw[0..12], &[0x88, 0xD8, 0x34, 0x01, 1, 0, 0, 0, 5, 0, 0, 0]);
        assert!(raw[12..1024].iter().all(|&b| b == 0));
    }

    #[test]
    fn each_corruption_has_its_message() {
        let dir = test_dir("tf_corrupt");
        let p = dir.join("x.bin");
        let shown = p.display().to_string();
        let good = file_bytes(&[1, 2, 3]);

        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&1234i32.to_le_bytes());
        write(&p, &bad);
        assert_eq!(open_err(&p), format!("{shown}: bad magic 1234 (expected 20240520): not a token file"));

        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&2i32.to_le_bytes());
        write(&p, &bad);
        assert_eq!(open_err(&p), format!("{shown}: unsupported version 2 (expected 1)"));

        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&(-5i32).to_le_bytes());
        write(&p, &bad);
        assert_eq!(open_err(&p), format!("{shown}: negative token count -5"));

        write(&p, &good[..good.len() - 1]);
        assert_eq!(
            open_err(&p),
            format!(
                "{shown}: header says 3 tokens (1030 bytes) but the file has 1029 bytes: truncated or corrupt"
            )
        );

        write(&p, &good[..100]);
        assert_eq!(
            open_err(&p),
            format!("{shown}: 100 bytes, too short for the 1024-byte header: not a token file")
        );

        let missing = dir.join("missing.bin");
        assert!(open_err(&missing).starts_with(&format!("{}: cannot open token file: ", missing.display())));
    }

    #[test]
    fn errors_are_user_errors() {
        let dir = test_dir("tf_user_error");
        let err = TokenFile::open(&dir.join("none.bin")).err().unwrap();
        assert!(crate::error::is_user_error(&err));
    }

    #[test]
    fn vocab_check_names_the_first_bad_token() {
        let dir = test_dir("tf_vocab");
        let p = dir.join("v.bin");
        write(&p, &file_bytes(&[5, 50256, 50257, 60000]));
        let f = TokenFile::open(&p).unwrap();
        assert!(f.check_vocab(50258).is_err());
        f.check_vocab(60001).unwrap();
        assert_eq!(
            f.check_vocab(50257).unwrap_err().to_string(),
            format!("{}: token 50257 at position 2 is not below vocab_size 50257", p.display())
        );
    }
}
