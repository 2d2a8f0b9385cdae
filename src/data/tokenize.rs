//! `pipetrain tokenize IN.txt OUT.bin`: GPT-2 BPE (tiktoken's r50k_base, which ships inside
//! the tiktoken-rs crate, so this works offline).
//!
//! End of text: the input is a sequence of documents separated by the literal string
//! `<|endoftext|>`, which becomes token 50256 (the GPT-2 convention). The output also begins
//! with 50256, as llm.c's data scripts do, so every document is preceded by the separator and
//! the first one is not special.

use std::fmt;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::token_file::write_tokens;
use crate::error::user_error;

/// GPT-2's `<|endoftext|>` token.
pub const EOT: u16 = 50256;

/// What `tokenize_file` did, for the CLI to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizeSummary {
    pub output: PathBuf,
    pub input_bytes: usize,
    pub tokens: usize,
    /// `<|endoftext|>` tokens written, the leading one included.
    pub documents: usize,
}

impl fmt::Display for TokenizeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let docs = if self.documents == 1 { "document" } else { "documents" };
        write!(
            f,
            "{}: {} tokens ({} {docs}) from {} bytes of text",
            self.output.display(),
            self.tokens,
            self.documents,
            self.input_bytes
        )
    }
}

/// Tokens GPT-2's BPE has text for: 0 ..= `<|endoftext|>`.
pub const TEXT_VOCAB: usize = EOT as usize + 1;

/// GPT-2 tokens of `text`, with the leading `<|endoftext|>`.
pub fn encode(text: &str) -> Vec<u16> {
    let mut tokens = vec![EOT];
    // r50k ranks are below 50257, so they fit u16.
    tokens.extend(bpe_encode(text).into_iter().map(|t| t as u16));
    tokens
}

/// GPT-2 tokens of `text` alone; the literal `<|endoftext|>` becomes its token.
pub fn bpe_encode(text: &str) -> Vec<u32> {
    tiktoken_rs::r50k_base_singleton().encode_with_special_tokens(text)
}

/// The bytes of GPT-2 tokens below [`TEXT_VOCAB`]. One token may hold part of a UTF-8
/// character, so a stream of them is bytes, valid text only once complete.
pub fn bpe_decode(tokens: &[u32]) -> Vec<u8> {
    tiktoken_rs::r50k_base_singleton().decode_bytes(tokens).expect("tokens below TEXT_VOCAB decode")
}

/// Tokenizes `input` into a token file at `output`. An existing `output` is replaced only
/// with `force`; the file is written beside it under a temporary name and renamed into place,
/// so on any error nothing at `output` changes.
pub fn tokenize_file(input: &Path, output: &Path, force: bool) -> anyhow::Result<TokenizeSummary> {
    if output.exists() && !force {
        return Err(user_error(format!(
            "{}: already exists; pass --force to overwrite it",
            output.display()
        )));
    }
    let bytes = fs::read(input).map_err(|e| user_error(format!("{}: cannot read: {e}", input.display())))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| user_error(format!("{}: not UTF-8 text (byte {})", input.display(), e.valid_up_to())))?;
    let tokens = encode(text);

    let tmp = temp_sibling(output)?;
    if let Err(e) = write_file(&tmp, &tokens).and_then(|()| fs::rename(&tmp, output)) {
        let _ = fs::remove_file(&tmp);
        return Err(user_error(format!("{}: cannot write: {e}", output.display())));
    }
    Ok(TokenizeSummary {
        output: output.to_path_buf(),
        input_bytes: bytes.len(),
        documents: tokens.iter().filter(|&&t| t == EOT).count(),
        tokens: tokens.len(),
    })
}

/// `dir/.name.tmp` for `dir/name`: same filesystem, so the final rename is atomic.
fn temp_sibling(output: &Path) -> anyhow::Result<PathBuf> {
    let name =
        output.file_name().ok_or_else(|| user_error(format!("{}: not a file name", output.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    Ok(output.with_file_name(tmp_name))
}

fn write_file(path: &Path, tokens: &[u16]) -> std::io::Result<()> {
    let file = File::create(path)?;
    let mut w = BufWriter::new(file);
    write_tokens(&mut w, tokens)?;
    w.flush()?;
    w.get_ref().sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;
    use crate::data::TokenFile;

    #[test]
    fn encodes_gpt2_tokens_and_end_of_text() {
        // Reference ids from the GPT-2 tokenizer: "Hello" 15496, " world" 995.
        assert_eq!(encode("Hello world"), [EOT, 15496, 995]);
        assert_eq!(encode("Hello<|endoftext|> world"), [EOT, 15496, EOT, 995]);
    }

    #[test]
    fn writes_a_token_file() {
        let dir = test_dir("tok_write");
        let (inp, out) = (dir.join("in.txt"), dir.join("out.bin"));
        fs::write(&inp, "Hello world<|endoftext|>Hello").unwrap();
        let s = tokenize_file(&inp, &out, false).unwrap();
        assert_eq!((s.tokens, s.documents, s.input_bytes), (5, 2, 29));
        assert_eq!(s.to_string(), format!("{}: 5 tokens (2 documents) from 29 bytes of text", out.display()));
        let f = TokenFile::open(&out).unwrap();
        assert_eq!(
            (0..f.len()).map(|i| f.token(i) as u16).collect::<Vec<_>>(),
            [EOT, 15496, 995, EOT, 15496]
        );
        assert!(!dir.join(".out.bin.tmp").exists());
    }

    #[test]
    fn refuses_to_overwrite_without_force() {
        let dir = test_dir("tok_force");
        let (inp, out) = (dir.join("in.txt"), dir.join("out.bin"));
        fs::write(&inp, "Hello").unwrap();
        fs::write(&out, "precious").unwrap();
        let err = tokenize_file(&inp, &out, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}: already exists; pass --force to overwrite it", out.display())
        );
        assert_eq!(fs::read(&out).unwrap(), b"precious");
        tokenize_file(&inp, &out, true).unwrap();
        assert_eq!(TokenFile::open(&out).unwrap().len(), 2);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let dir = test_dir("tok_bad_input");
        let (inp, out) = (dir.join("in.txt"), dir.join("out.bin"));
        fs::write(&out, "precious").unwrap();
        let err = tokenize_file(&dir.join("nope.txt"), &out, true).unwrap_err();
        assert!(err.to_string().starts_with(&format!("{}: cannot read: ", dir.join("nope.txt").display())));
        fs::write(&inp, b"ok \xff").unwrap();
        let err = tokenize_file(&inp, &out, true).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: not UTF-8 text (byte 3)", inp.display()));
        assert_eq!(fs::read(&out).unwrap(), b"precious");
    }
}
