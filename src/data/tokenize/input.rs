//! The documents of `tokenize`'s input, read as a stream: a text file is documents separated
//! by the literal `<|endoftext|>`; a JSONL file (`.jsonl`, `.json`, `.ndjson`) is one document
//! per line, the string under a key (Megatron's `preprocess_data.py --json-keys`, default
//! `text`); a directory is its files (hidden ones skipped) in sorted name order, each read by
//! its own extension. Memory holds one read buffer and the batch being tokenized, never a
//! whole file (a single document is held whole, as it must be to tokenize it).

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use memchr::memmem;

use crate::error::user_error;

/// The separator between a text file's documents.
pub const TEXT_SEPARATOR: &[u8] = b"<|endoftext|>";

/// How much of a text file is read at a time.
const READ_CHUNK: usize = 1 << 20;

/// The input files, in the order their documents are tokenized.
pub fn input_files(input: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let meta =
        fs::metadata(input).map_err(|e| user_error(format!("{}: cannot read: {e}", input.display())))?;
    if !meta.is_dir() {
        return Ok(vec![input.to_path_buf()]);
    }
    let mut files = Vec::new();
    let entries =
        fs::read_dir(input).map_err(|e| user_error(format!("{}: cannot read: {e}", input.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| user_error(format!("{}: cannot read: {e}", input.display())))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(user_error(format!("{}: no input files in the directory", input.display())));
    }
    Ok(files)
}

/// Errors where an output would be read as input: the input file itself (`--force` would
/// replace the text by its tokens), or a file in the input directory (the next run over it
/// would read the tokens, or the record's JSON, as documents).
pub fn refuse_outputs_among_inputs<'a>(
    input: &Path,
    outputs: impl IntoIterator<Item = &'a PathBuf>,
) -> anyhow::Result<()> {
    let Ok(read) = input.canonicalize() else { return Ok(()) };
    for output in outputs {
        let Some(written) = resolved(output) else { continue };
        if written == read {
            return Err(user_error(format!(
                "{}: is the input too; tokenizing would replace the text by its tokens",
                output.display()
            )));
        }
        if read.is_dir() && written.parent() == Some(read.as_path()) {
            return Err(user_error(format!(
                "{}: inside the input directory {}, whose every file is read as documents; \
                 write it elsewhere",
                output.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// `path` with its directory resolved (links, `..`), whether or not the file exists yet;
/// None where the directory does not exist, so that nothing can be read from there.
fn resolved(path: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    Some(absolute.parent()?.canonicalize().ok()?.join(absolute.file_name()?))
}

fn is_jsonl(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("jsonl" | "json" | "ndjson"))
}

/// Documents, one at a time, over all input files; also counts the bytes read.
pub struct Documents {
    files: std::vec::IntoIter<PathBuf>,
    json_key: String,
    current: Option<FileDocs>,
    pub bytes_read: u64,
}

impl Documents {
    pub fn new(files: Vec<PathBuf>, json_key: &str) -> Documents {
        Documents { files: files.into_iter(), json_key: json_key.to_string(), current: None, bytes_read: 0 }
    }

    /// The next document, or `None` after the last file's last one.
    pub fn next_doc(&mut self) -> anyhow::Result<Option<String>> {
        loop {
            if let Some(file) = &mut self.current {
                if let Some(doc) = file.next_doc(&mut self.bytes_read)? {
                    return Ok(Some(doc));
                }
                self.current = None;
            }
            let Some(path) = self.files.next() else { return Ok(None) };
            let f =
                File::open(&path).map_err(|e| user_error(format!("{}: cannot read: {e}", path.display())))?;
            self.current = Some(if is_jsonl(&path) {
                FileDocs::Jsonl(JsonlDocs {
                    path,
                    reader: BufReader::new(f),
                    line: 0,
                    key: self.json_key.clone(),
                })
            } else {
                FileDocs::Text(TextDocs {
                    path,
                    file: f,
                    buf: Vec::new(),
                    pos: 0,
                    base: 0,
                    scanned: 0,
                    eof: false,
                })
            });
        }
    }
}

enum FileDocs {
    Text(TextDocs),
    Jsonl(JsonlDocs),
}

impl FileDocs {
    fn next_doc(&mut self, bytes_read: &mut u64) -> anyhow::Result<Option<String>> {
        match self {
            FileDocs::Text(t) => t.next_doc(bytes_read),
            FileDocs::Jsonl(j) => j.next_doc(bytes_read),
        }
    }
}

/// A text file split at [`TEXT_SEPARATOR`]: n separators make n + 1 documents (an empty file
/// is one empty document), so the documents and their separators give back the file.
struct TextDocs {
    path: PathBuf,
    file: File,
    /// Bytes read and not yet handed out start at `buf[pos]`.
    buf: Vec<u8>,
    pos: usize,
    /// The file offset of `buf[0]`, for error messages.
    base: u64,
    /// `buf[pos..scanned]` holds no separator.
    scanned: usize,
    eof: bool,
}

impl TextDocs {
    fn next_doc(&mut self, bytes_read: &mut u64) -> anyhow::Result<Option<String>> {
        loop {
            if let Some(i) = memmem::find(&self.buf[self.scanned..], TEXT_SEPARATOR) {
                let end = self.scanned + i;
                let doc = self.take(end)?;
                self.pos = end + TEXT_SEPARATOR.len();
                self.scanned = self.pos;
                return Ok(Some(doc));
            }
            if self.eof {
                if self.pos > self.buf.len() {
                    return Ok(None);
                }
                let doc = self.take(self.buf.len())?;
                // Past the end: the last document has been handed out.
                self.pos = self.buf.len() + 1;
                return Ok(Some(doc));
            }
            // A separator may straddle the chunk boundary.
            self.scanned = self.buf.len().saturating_sub(TEXT_SEPARATOR.len() - 1).max(self.pos);
            // Drop what was handed out before reading more, so the buffer holds at most one
            // document and a chunk.
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.scanned -= self.pos;
            self.pos = 0;
            let start = self.buf.len();
            self.buf.resize(start + READ_CHUNK, 0);
            let n = self
                .file
                .read(&mut self.buf[start..])
                .map_err(|e| user_error(format!("{}: cannot read: {e}", self.path.display())))?;
            self.buf.truncate(start + n);
            *bytes_read += n as u64;
            self.eof = n == 0;
        }
    }

    /// `buf[pos..end]` as text.
    fn take(&self, end: usize) -> anyhow::Result<String> {
        let bytes = &self.buf[self.pos..end];
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(user_error(format!(
                "{}: not UTF-8 text (byte {})",
                self.path.display(),
                self.base + (self.pos + e.valid_up_to()) as u64
            ))),
        }
    }
}

/// A JSONL file: each non-blank line one JSON object whose `key` is the document.
struct JsonlDocs {
    path: PathBuf,
    reader: BufReader<File>,
    /// 1-based number of the last line read.
    line: usize,
    key: String,
}

impl JsonlDocs {
    fn next_doc(&mut self, bytes_read: &mut u64) -> anyhow::Result<Option<String>> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut line)
                .map_err(|e| user_error(format!("{}: cannot read: {e}", self.path.display())))?;
            if n == 0 {
                return Ok(None);
            }
            *bytes_read += n as u64;
            self.line += 1;
            if !line.iter().all(u8::is_ascii_whitespace) {
                return self.document(&line).map(Some);
            }
        }
    }

    fn document(&self, line: &[u8]) -> anyhow::Result<String> {
        let at = format!("{}:{}", self.path.display(), self.line);
        let mut object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(line).map_err(|e| user_error(format!("{at}: not a JSON object: {e}")))?;
        match object.remove(&self.key) {
            Some(serde_json::Value::String(s)) => Ok(s),
            Some(_) => Err(user_error(format!("{at}: \"{}\" is not a string", self.key))),
            None => Err(user_error(format!("{at}: no \"{}\" key (--json-key)", self.key))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    fn all_docs(files: Vec<PathBuf>) -> anyhow::Result<Vec<String>> {
        let mut docs = Documents::new(files, "text");
        let mut out = Vec::new();
        while let Some(d) = docs.next_doc()? {
            out.push(d);
        }
        Ok(out)
    }

    #[test]
    fn text_splits_at_every_separator_across_read_chunks() {
        let dir = test_dir("input_text");
        let path = dir.join("a.txt");
        // The second separator straddles the first read chunk's end.
        let first = "x".repeat(READ_CHUNK - 20);
        let text = format!("{first}<|endoftext|>ab<|endoftext|><|endoftext|>tail");
        fs::write(&path, &text).unwrap();
        assert_eq!(all_docs(vec![path.clone()]).unwrap(), [first.as_str(), "ab", "", "tail"]);
        fs::write(&path, "").unwrap();
        assert_eq!(all_docs(vec![path.clone()]).unwrap(), [""]);
        fs::write(&path, "a<|endoftext|>").unwrap();
        assert_eq!(all_docs(vec![path]).unwrap(), ["a", ""]);
    }

    #[test]
    fn jsonl_reads_the_key_and_names_bad_lines() {
        let dir = test_dir("input_jsonl");
        let path = dir.join("a.jsonl");
        fs::write(&path, "{\"text\": \"one\", \"id\": 1}\n\n{\"text\": \"two\\n\"}\n").unwrap();
        assert_eq!(all_docs(vec![path.clone()]).unwrap(), ["one", "two\n"]);
        fs::write(&path, "{\"text\": \"one\"}\n{\"body\": \"two\"}\n").unwrap();
        let err = all_docs(vec![path.clone()]).unwrap_err();
        assert_eq!(err.to_string(), format!("{}:2: no \"text\" key (--json-key)", path.display()));
        fs::write(&path, "{\"text\": 3}\n").unwrap();
        let err = all_docs(vec![path.clone()]).unwrap_err();
        assert_eq!(err.to_string(), format!("{}:1: \"text\" is not a string", path.display()));
    }

    #[test]
    fn a_directory_is_its_visible_files_in_name_order() {
        let dir = test_dir("input_dir");
        fs::write(dir.join("b.txt"), "b").unwrap();
        fs::write(dir.join("a.jsonl"), "{\"text\": \"a\"}\n").unwrap();
        fs::write(dir.join(".hidden.txt"), "h").unwrap();
        let files = input_files(&dir).unwrap();
        assert_eq!(files, [dir.join("a.jsonl"), dir.join("b.txt")]);
        assert_eq!(all_docs(files).unwrap(), ["a", "b"]);
    }
}
