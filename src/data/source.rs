//! The token sources a data path names, opened: each path, prefix or glob resolved to llm.c
//! token files and Megatron datasets, every file memory-mapped and checked (a window fits,
//! its tokenizer's ids and every token are below `vocab_size`) before the first step.

use std::path::{Path, PathBuf};

use super::indexed::{is_indexed, open_indexed};
use super::record::{Records, TokenizerSpec};
use super::TokenFile;
use crate::config::DataPath;
use crate::error::user_error;

/// One source: the files whose windows are drawn as one pool, in order.
pub struct Source {
    pub name: String,
    /// Normalised: the weights of a data path's sources sum to 1.
    pub weight: f64,
    pub files: Vec<TokenFile>,
}

/// Every source of a data path (one, unless it is a blend).
pub struct TokenData {
    pub sources: Vec<Source>,
    /// The tokenizer that made every file, where their `tokenize` records name one and the
    /// same; None where a file has no record or two name different tokenizers.
    pub tokenizer: Option<TokenizerSpec>,
}

impl TokenData {
    /// Opens every file of `path`, checking each holds a window of `seq_len`, was not made
    /// by a tokenizer with more ids than `vocab_size` (its `tokenize` record), and holds
    /// only tokens below `vocab_size`.
    pub fn open(path: &DataPath, seq_len: usize, vocab_size: usize) -> anyhow::Result<TokenData> {
        let mut sources = Vec::new();
        let mut records = Records::default();
        let mut tokenizers = Vec::new();
        for ((weight, patterns), name) in path.sources().into_iter().zip(path.source_names()) {
            let mut locations: Vec<Location> = Vec::new();
            for pattern in &patterns {
                add_new(&mut locations, expand(pattern)?);
            }
            let files = locations
                .iter()
                .map(|l| {
                    let f = l.open()?;
                    f.check_seq_len(seq_len)?;
                    tokenizers.push(records.check_vocab_size(f.path(), vocab_size)?);
                    f.check_vocab(vocab_size)?;
                    Ok(f)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            sources.push(Source { name, weight, files });
        }
        let first = tokenizers.first().cloned().flatten();
        let tokenizer = first.filter(|f| tokenizers.iter().all(|t| t.as_ref() == Some(f)));
        Ok(TokenData { sources, tokenizer })
    }

    /// One llm.c file or Megatron prefix, checked as [`TokenData::open`] does.
    pub fn open_file(path: &Path, seq_len: usize, vocab_size: usize) -> anyhow::Result<TokenData> {
        TokenData::open(&DataPath::One(path.display().to_string()), seq_len, vocab_size)
    }
}

/// A file a data path resolves to.
#[derive(Clone, Debug, PartialEq)]
enum Location {
    /// An llm.c token file.
    LlmC(PathBuf),
    /// A Megatron dataset, by prefix.
    Indexed(PathBuf),
}

impl Location {
    /// What `path` names: a Megatron prefix (its `.idx` exists), the `.bin` or `.idx` of one,
    /// a prefix whose `.idx` is missing beside its `.bin`, or else an llm.c file.
    fn of(path: &Path) -> Location {
        if is_indexed(path) {
            return Location::Indexed(path.to_path_buf());
        }
        let text = path.as_os_str().to_string_lossy();
        if let Some(stem) = text.strip_suffix(".bin").or_else(|| text.strip_suffix(".idx")) {
            if is_indexed(Path::new(stem)) {
                return Location::Indexed(stem.into());
            }
        }
        let bin = PathBuf::from(format!("{text}.bin"));
        match !path.exists() && bin.is_file() {
            true => Location::Indexed(path.to_path_buf()),
            false => Location::LlmC(path.to_path_buf()),
        }
    }

    fn open(&self) -> anyhow::Result<TokenFile> {
        match self {
            Location::LlmC(p) => TokenFile::open(p),
            Location::Indexed(prefix) => open_indexed(prefix),
        }
    }
}

/// The files `pattern` names: itself, or a glob's matches in sorted order (a Megatron
/// dataset's `.bin` and `.idx` count once).
fn expand(pattern: &str) -> anyhow::Result<Vec<Location>> {
    if !pattern.contains(['*', '?', '[']) {
        return Ok(vec![Location::of(Path::new(pattern))]);
    }
    let matches = glob::glob(pattern).map_err(|e| user_error(format!("{pattern}: bad glob pattern: {e}")))?;
    let mut paths = matches
        .map(|m| m.map_err(|e| user_error(format!("{pattern}: {e}"))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    paths.sort();
    let mut out: Vec<Location> = Vec::new();
    add_new(&mut out, paths.iter().map(|p| Location::of(p)));
    match out.is_empty() {
        true => Err(user_error(format!("{pattern}: no file matches this pattern"))),
        false => Ok(out),
    }
}

/// Appends the locations `to` does not hold yet, in order: a file named twice is read once.
fn add_new(to: &mut Vec<Location>, locations: impl IntoIterator<Item = Location>) {
    for l in locations {
        if !to.contains(&l) {
            to.push(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    #[test]
    fn paths_resolve_to_llmc_files_and_megatron_prefixes() {
        let dir = test_dir("src_locate");
        for f in ["a.bin", "m.idx", "m.bin", "only.bin"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let at = |f: &str| dir.join(f);
        assert_eq!(Location::of(&at("a.bin")), Location::LlmC(at("a.bin")));
        for given in ["m", "m.bin", "m.idx"] {
            assert_eq!(Location::of(&at(given)), Location::Indexed(at("m")), "{given}");
        }
        // `only` has a .bin but no .idx: a prefix, whose missing index the opener names.
        assert_eq!(Location::of(&at("only")), Location::Indexed(at("only")));
        assert_eq!(Location::of(&at("none.bin")), Location::LlmC(at("none.bin")));

        let glob = format!("{}/*", dir.display());
        assert_eq!(
            expand(&glob).unwrap(),
            [Location::LlmC(at("a.bin")), Location::Indexed(at("m")), Location::LlmC(at("only.bin"))]
        );
        let none = format!("{}/x_*.bin", dir.display());
        assert_eq!(expand(&none).unwrap_err().to_string(), format!("{none}: no file matches this pattern"));
        assert!(crate::error::is_user_error(&expand(&none).unwrap_err()));
        let bad = format!("{}/[.bin", dir.display());
        assert!(expand(&bad).unwrap_err().to_string().starts_with(&format!("{bad}: bad glob pattern: ")));
    }
}
