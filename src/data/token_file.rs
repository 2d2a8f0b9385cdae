//! Memory-mapped token arrays, and the llm.c / nanoGPT token file: a 256 x int32
//! little-endian header (magic, version, token count, zeros) followed by the tokens, uint16
//! (magic 20240520, version 1: GPT-2) or uint32 (magic 20240801, version 7: vocabularies past
//! 65,536 such as Llama 3's). Megatron's indexed datasets (indexed.rs) open into the same
//! [`TokenFile`]. Files are memory-mapped, so a multi-gigabyte corpus costs no resident
//! memory up front.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::user_error;

pub const MAGIC: i32 = 20240520;
pub const VERSION: i32 = 1;
/// llm.c's header for uint32 tokens.
pub const MAGIC_U32: i32 = 20240801;
pub const VERSION_U32: i32 = 7;
pub const HEADER_INTS: usize = 256;
pub const HEADER_BYTES: usize = HEADER_INTS * 4;

/// How one token is stored: little-endian, of the integer widths llm.c and Megatron write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    U8,
    I8,
    I16,
    U16,
    I32,
    U32,
    I64,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::I16 | Dtype::U16 => 2,
            Dtype::I32 | Dtype::U32 => 4,
            Dtype::I64 => 8,
        }
    }

    #[inline]
    fn read(self, b: &[u8]) -> i64 {
        match self {
            Dtype::U8 => b[0] as i64,
            Dtype::I8 => b[0] as i8 as i64,
            Dtype::I16 => i16::from_le_bytes([b[0], b[1]]) as i64,
            Dtype::U16 => u16::from_le_bytes([b[0], b[1]]) as i64,
            Dtype::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
            Dtype::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
            Dtype::I64 => i64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        }
    }
}

/// The header for a file of `count` uint16 tokens.
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

/// Writes a complete uint16 token file (header and tokens) to `w`.
#[cfg(test)]
pub fn write_tokens(w: &mut impl std::io::Write, tokens: &[u16]) -> std::io::Result<()> {
    w.write_all(&encode_header(tokens.len())?)?;
    let body: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    w.write_all(&body)
}

/// A validated, memory-mapped array of tokens: an llm.c file's body or a Megatron `.bin`.
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
    /// Bytes before the first token.
    offset: usize,
    len: usize,
    dtype: Dtype,
}

/// Maps `path` read-only; `what` names the kind of file in the error.
pub(super) fn map_file(path: &Path, what: &str) -> anyhow::Result<Mmap> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| user_error(format!("{shown}: cannot open {what}: {e}")))?;
    if path.is_dir() {
        return Err(user_error(format!("{shown}: a directory, not a {what}")));
    }
    // SAFETY: the map is read-only and we never hand out references that outlive it;
    // a concurrent writer truncating the file is outside what we can guard against.
    unsafe { Mmap::map(&file) }.map_err(|e| user_error(format!("{shown}: cannot map {what}: {e}")))
}

impl TokenFile {
    /// Opens and validates the llm.c token file `path`; every way the file can be wrong is
    /// a one-line user error that names the file.
    pub fn open(path: &Path) -> anyhow::Result<TokenFile> {
        let map = map_file(path, "token file")?;
        let (len, dtype) =
            validate(&map).map_err(|what| user_error(format!("{}: {what}", path.display())))?;
        Ok(TokenFile { path: path.to_path_buf(), map, offset: HEADER_BYTES, len, dtype })
    }

    /// Tokens `map[offset..]` of `dtype`, already checked to hold `len` of them.
    pub(super) fn from_map(path: PathBuf, map: Mmap, offset: usize, len: usize, dtype: Dtype) -> TokenFile {
        debug_assert_eq!(map.len(), offset + len * dtype.size());
        TokenFile { path, map, offset, len, dtype }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Token `i` (`i < len()`) as stored.
    #[inline]
    fn raw(&self, i: usize) -> i64 {
        let at = self.offset + self.dtype.size() * i;
        self.dtype.read(&self.map[at..at + self.dtype.size()])
    }

    /// Token `i` (`i < len()`) widened to u32; meaningful once [`TokenFile::check_vocab`]
    /// has passed, which every opener of training data runs.
    #[inline]
    pub fn token(&self, i: usize) -> u32 {
        self.raw(i) as u32
    }

    /// Errors, naming the first offending position, if any token is not in `0..vocab_size`.
    pub fn check_vocab(&self, vocab_size: usize) -> anyhow::Result<()> {
        let bad = |t: i64| t < 0 || t as u64 >= vocab_size as u64;
        match (0..self.len).find(|&i| bad(self.raw(i))) {
            None => Ok(()),
            Some(i) => {
                let t = self.raw(i);
                let why = match t < 0 {
                    true => "is negative".to_string(),
                    false => format!("is not below vocab_size {vocab_size}"),
                };
                Err(user_error(format!("{}: token {t} at position {i} {why}", self.path.display())))
            }
        }
    }
}

/// The token count and width if `bytes` is a well-formed llm.c token file, else what is
/// wrong with it.
fn validate(bytes: &[u8]) -> Result<(usize, Dtype), String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "{} bytes, too short for the {HEADER_BYTES}-byte header: not a token file",
            bytes.len()
        ));
    }
    let int = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    let (version, dtype) = match int(0) {
        MAGIC => (VERSION, Dtype::U16),
        MAGIC_U32 => (VERSION_U32, Dtype::U32),
        other => {
            return Err(format!("bad magic {other} (expected {MAGIC} or {MAGIC_U32}): not a token file"))
        }
    };
    if int(1) != version {
        return Err(format!("unsupported version {} (expected {version})", int(1)));
    }
    let count = usize::try_from(int(2)).map_err(|_| format!("negative token count {}", int(2)))?;
    let expected = HEADER_BYTES + dtype.size() * count;
    if bytes.len() != expected {
        return Err(format!(
            "header says {count} tokens ({expected} bytes) but the file has {} bytes: truncated or corrupt",
            bytes.len()
        ));
    }
    Ok((count, dtype))
}

/// llm.c's uint32 layout: magic 20240801, `version` (7 is llm.c's), four bytes a token.
#[cfg(test)]
pub(crate) fn u32_file_bytes(version: i32, tokens: &[u32]) -> Vec<u8> {
    let mut v = vec![0u8; HEADER_BYTES];
    for (i, x) in [MAGIC_U32, version, tokens.len() as i32].into_iter().enumerate() {
        v[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
    v.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    v
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
        assert_eq!((0..5).map(|i| f.token(i) as u16).collect::<Vec<_>>(), tokens);
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
        assert_eq!(
            open_err(&p),
            format!("{shown}: bad magic 1234 (expected 20240520 or 20240801): not a token file")
        );

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
        assert_eq!(open_err(&dir), format!("{}: a directory, not a token file", dir.display()));
    }

    #[test]
    fn uint32_files_read_past_65535() {
        let dir = test_dir("tf_u32");
        let p = dir.join("u.bin");
        let tokens = [0u32, 65535, 65536, 128255, 4_000_000_000];
        write(&p, &u32_file_bytes(7, &tokens));
        let f = TokenFile::open(&p).unwrap();
        assert_eq!((f.len(), f.dtype()), (5, Dtype::U32));
        assert_eq!((0..5).map(|i| f.token(i)).collect::<Vec<_>>(), tokens);
        f.check_vocab(4_000_000_001).unwrap();
        assert_eq!(
            f.check_vocab(128256).unwrap_err().to_string(),
            format!("{}: token 4000000000 at position 4 is not below vocab_size 128256", p.display())
        );
        let shown = p.display().to_string();
        write(&p, &u32_file_bytes(1, &tokens));
        assert_eq!(open_err(&p), format!("{shown}: unsupported version 1 (expected 7)"));
        let good = u32_file_bytes(7, &tokens);
        write(&p, &good[..good.len() - 2]);
        assert_eq!(
            open_err(&p),
            format!(
                "{shown}: header says 5 tokens (1044 bytes) but the file has 1042 bytes: truncated or corrupt"
            )
        );
    }

    #[test]
    fn signed_widths_read_sign_extended_and_negatives_are_refused() {
        let bytes: Vec<u8> = [-2i16, 300].iter().flat_map(|t| t.to_le_bytes()).collect();
        let dir = test_dir("tf_signed");
        let p = dir.join("s.bin");
        write(&p, &bytes);
        let f = TokenFile::from_map(p.clone(), map_file(&p, "test").unwrap(), 0, 2, Dtype::I16);
        assert_eq!(f.raw(0), -2);
        assert_eq!(f.token(1), 300);
        assert_eq!(
            f.check_vocab(50257).unwrap_err().to_string(),
            format!("{}: token -2 at position 0 is negative", p.display())
        );
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
