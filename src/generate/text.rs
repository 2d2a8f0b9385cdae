//! The text of a growing sequence of tokens, written as it comes. A token may end partway
//! through a character (a byte-level BPE), and a Hugging Face decoder may place a space by
//! what follows (SentencePiece), so each push decodes the whole sequence and returns what it
//! adds to the text already written.

use crate::data::Tokenizer;

/// U+FFFD, which a Hugging Face decoder writes for a character its tokens do not complete.
const INCOMPLETE: &[u8] = "\u{FFFD}".as_bytes();

pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    tokens: Vec<u32>,
    written: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> TextStream<'a> {
        TextStream { tokenizer, tokens: Vec::new(), written: 0 }
    }

    /// The bytes `tokens` add to the text; none while it ends in an incomplete character,
    /// which a later push (or [`TextStream::finish`]) completes.
    pub fn push(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<u8>> {
        self.tokens.extend_from_slice(tokens);
        let text = self.tokenizer.decode(&self.tokens)?;
        if text.ends_with(INCOMPLETE) {
            return Ok(Vec::new());
        }
        Ok(self.take(text))
    }

    /// What is left unwritten, incomplete or not, at the end.
    pub fn finish(mut self) -> anyhow::Result<Vec<u8>> {
        let text = self.tokenizer.decode(&self.tokens)?;
        Ok(self.take(text))
    }

    fn take(&mut self, text: Vec<u8>) -> Vec<u8> {
        let new = text.get(self.written..).unwrap_or_default().to_vec();
        self.written = self.written.max(text.len());
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a stream writes, token by token, are the sequence's text, for a tokenizer
    /// whose tokens split a character.
    #[test]
    fn writes_the_whole_text_once() {
        let gpt2 = Tokenizer::load("gpt2", None).unwrap();
        let text = "naïve café, 東京";
        let tokens = gpt2.encode(text).unwrap();
        let mut stream = TextStream::new(&gpt2);
        let mut written = Vec::new();
        for &t in &tokens {
            written.extend(stream.push(&[t]).unwrap());
        }
        written.extend(stream.finish().unwrap());
        assert_eq!(String::from_utf8(written).unwrap(), text);
    }
}
