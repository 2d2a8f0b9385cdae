//! `manifest.sha256`: the sha256 of every file a checkpoint's save writes, in the format of
//! `sha256sum` (so `sha256sum -c manifest.sha256` checks one by hand), written last, so a
//! directory with a manifest was written whole. Every load checks it before reading a
//! tensor: a changed byte anywhere, or a listed file gone, is one line naming the file.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::user_error;

pub const MANIFEST_FILE: &str = "manifest.sha256";

/// What a load found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verified {
    /// Every listed file matched; their names.
    Files(Vec<String>),
    /// No manifest: a checkpoint from before they were written, or a Hugging Face directory.
    NoManifest,
}

impl Verified {
    /// Refuses to let a load read `path` unchecked: a manifest that leaves out a file the
    /// load reads (cut short, or emptied) is itself damaged. A file that is not there is
    /// left to the read, which names it missing.
    pub fn require(&self, path: &Path) -> anyhow::Result<()> {
        let listed = |names: &[String]| names.iter().any(|n| path.file_name() == Some(n.as_ref()));
        match self {
            Verified::Files(names) if !listed(names) && path.exists() => Err(user_error(format!(
                "{}: not listed in {MANIFEST_FILE}: the manifest is damaged",
                path.display()
            ))),
            _ => Ok(()),
        }
    }
}

/// The sha256 of `bytes`, in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// An incremental sha256, for a file written in pieces.
#[derive(Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn hex(self) -> String {
        hex(&self.0.finalize())
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The manifest listing `files`, each (name in the directory, sha256 hex).
pub fn text(files: &[(String, String)]) -> String {
    files.iter().map(|(name, sha)| format!("{sha}  {name}\n")).collect()
}

/// Checks every file `dir`'s manifest lists against its sha256.
pub fn verify(dir: &Path) -> anyhow::Result<Verified> {
    let path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Verified::NoManifest),
        Err(e) => return Err(user_error(format!("{}: cannot read: {e}", path.display()))),
    };
    let entries = parse(&text).ok_or_else(|| {
        user_error(format!("{}: not a manifest (lines of `SHA256  FILE`): damaged", path.display()))
    })?;
    for (sha, name) in &entries {
        let file = dir.join(name);
        let actual = hash_file(&file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                user_error(format!("{}: missing, but {MANIFEST_FILE} lists it", file.display()))
            }
            _ => user_error(format!("{}: cannot read: {e}", file.display())),
        })?;
        if &actual != sha {
            return Err(user_error(format!(
                "{}: sha256 {actual} differs from {sha} in {MANIFEST_FILE}: the file is damaged",
                file.display()
            )));
        }
    }
    Ok(Verified::Files(entries.into_iter().map(|(_, name)| name).collect()))
}

/// (sha256 hex, file name) of each line; None unless every line is one, naming a file of
/// the directory itself.
fn parse(text: &[u8]) -> Option<Vec<(String, String)>> {
    let text = std::str::from_utf8(text).ok()?;
    text.lines()
        .map(|line| {
            let (sha, name) = line.split_once("  ")?;
            let hex =
                sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
            (hex && plain).then(|| (sha.to_string(), name.to_string()))
        })
        .collect()
}

fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(hasher.hex()),
            n => hasher.update(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    #[test]
    fn sha256_of_a_known_input() {
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_hex(b"abc"), abc);
        let mut h = Hasher::default();
        h.update(b"a");
        h.update(b"bc");
        assert_eq!(h.hex(), abc);
    }

    #[test]
    fn each_damage_is_one_line_naming_the_file() {
        let dir = test_dir("manifest_damage");
        assert_eq!(verify(&dir).unwrap(), Verified::NoManifest);
        std::fs::write(dir.join("a.json"), b"{}\n").unwrap();
        std::fs::write(dir.join("b.bin"), [1u8, 2, 3]).unwrap();
        let files = [("a.json", &b"{}\n"[..]), ("b.bin", &[1, 2, 3])]
            .map(|(name, bytes)| (name.to_string(), sha256_hex(bytes)));
        std::fs::write(dir.join(MANIFEST_FILE), text(&files)).unwrap();
        let verified = verify(&dir).unwrap();
        assert_eq!(verified, Verified::Files(vec!["a.json".into(), "b.bin".into()]));
        verified.require(&dir.join("b.bin")).unwrap();
        Verified::NoManifest.require(&dir.join("c.bin")).unwrap();
        verified.require(&dir.join("c.bin")).unwrap();
        std::fs::write(dir.join("c.bin"), [5u8]).unwrap();
        let e = verified.require(&dir.join("c.bin")).unwrap_err();
        assert!(crate::error::is_user_error(&e));
        assert_eq!(
            e.to_string(),
            format!(
                "{}: not listed in manifest.sha256: the manifest is damaged",
                dir.join("c.bin").display()
            )
        );

        let err = |dir: &Path| {
            let e = verify(dir).unwrap_err();
            assert!(crate::error::is_user_error(&e));
            e.to_string()
        };
        std::fs::write(dir.join("b.bin"), [1u8, 2, 4]).unwrap();
        let b = dir.join("b.bin");
        assert_eq!(
            err(&dir),
            format!(
                "{}: sha256 {} differs from {} in manifest.sha256: the file is damaged",
                b.display(),
                sha256_hex(&[1, 2, 4]),
                files[1].1
            )
        );
        std::fs::remove_file(&b).unwrap();
        assert_eq!(err(&dir), format!("{}: missing, but manifest.sha256 lists it", b.display()));

        for bad in
            ["not a manifest\n", &format!("{}  ../b.bin\n", files[1].1), &format!("{} b.bin\n", files[1].1)]
        {
            std::fs::write(dir.join(MANIFEST_FILE), bad).unwrap();
            assert_eq!(
                err(&dir),
                format!(
                    "{}: not a manifest (lines of `SHA256  FILE`): damaged",
                    dir.join(MANIFEST_FILE).display()
                )
            );
        }
    }
}
