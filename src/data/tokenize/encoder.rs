//! The tokenizers `tokenize` can run: tiktoken's GPT-2 (r50k_base), cl100k_base and o200k_base,
//! which ship inside tiktoken-rs (offline), or any Hugging Face `tokenizer.json`.

use std::path::Path;

use tiktoken_rs::CoreBPE;

use super::tiktoken_json;
use crate::error::user_error;

/// The end-of-text spellings looked up in a Hugging Face vocabulary when `--eot-token` is not
/// given, in this order: GPT-2 and most BPEs, Llama 3, SentencePiece models, Gemma.
const HF_EOT_CANDIDATES: [&str; 4] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];

/// One tiktoken encoding: its name, its singleton, its vocabulary size (highest id + 1, as
/// tiktoken's `n_vocab`), its `<|endoftext|>` id and its pre-tokenizing pattern in Hugging
/// Face's regex dialect.
struct Tiktoken {
    name: &'static str,
    bpe: fn() -> &'static CoreBPE,
    vocab_size: usize,
    eot: u32,
    pattern: &'static str,
}

const TIKTOKEN: [Tiktoken; 3] = [
    Tiktoken {
        name: "gpt2",
        bpe: tiktoken_rs::r50k_base_singleton,
        vocab_size: 50257,
        eot: 50256,
        pattern: tiktoken_json::R50K_PATTERN,
    },
    Tiktoken {
        name: "cl100k_base",
        bpe: tiktoken_rs::cl100k_base_singleton,
        vocab_size: 100277,
        eot: 100257,
        pattern: tiktoken_json::CL100K_PATTERN,
    },
    Tiktoken {
        name: "o200k_base",
        bpe: tiktoken_rs::o200k_base_singleton,
        vocab_size: 200019,
        eot: 199999,
        pattern: tiktoken_json::O200K_PATTERN,
    },
];

/// The tiktoken encoding `name` names: `gpt2` (or its alias `r50k_base`), `cl100k_base` or
/// `o200k_base`.
fn tiktoken(name: &str) -> Option<&'static Tiktoken> {
    let wanted = if name == "r50k_base" { "gpt2" } else { name };
    TIKTOKEN.iter().find(|t| t.name == wanted)
}

/// The Hugging Face tokenizer.json that encodes as tiktoken encoding `name` does; None where
/// `name` is not one.
pub fn tiktoken_tokenizer_json(name: &str) -> Option<String> {
    let t = tiktoken(name)?;
    Some(tiktoken_json::tokenizer_json((t.bpe)(), t.vocab_size, t.pattern))
}

enum Engine {
    Tiktoken(&'static CoreBPE),
    HuggingFace(Box<tokenizers::Tokenizer>),
}

/// A loaded tokenizer and the facts the output records about it.
pub struct Tokenizer {
    engine: Engine,
    /// `gpt2`, `cl100k_base`, `o200k_base`, or the tokenizer.json path as given.
    pub name: String,
    pub vocab_size: usize,
    pub eot: u32,
    /// The end-of-text token's text.
    pub eot_token: String,
}

impl Tokenizer {
    /// `spec` names a tiktoken encoding (`gpt2` or its alias `r50k_base`, `cl100k_base`,
    /// `o200k_base`) or is the path of a Hugging Face tokenizer.json. `eot_token` overrides the
    /// end-of-text token's text (Hugging Face only: tiktoken's is `<|endoftext|>`).
    pub fn load(spec: &str, eot_token: Option<&str>) -> anyhow::Result<Tokenizer> {
        if let Some(t) = tiktoken(spec) {
            if let Some(e) = eot_token.filter(|&e| e != "<|endoftext|>") {
                return Err(user_error(format!(
                    "command line: --eot-token {e}: {spec}'s end of text is <|endoftext|> (--eot-token is for a tokenizer.json)"
                )));
            }
            return Ok(Tokenizer {
                engine: Engine::Tiktoken((t.bpe)()),
                name: t.name.to_string(),
                vocab_size: t.vocab_size,
                eot: t.eot,
                eot_token: "<|endoftext|>".to_string(),
            });
        }
        load_hugging_face(Path::new(spec), eot_token)
    }

    /// The tokens of one document, without any end-of-text token (the output format places
    /// it). tiktoken encodes the text as ordinary text; a Hugging Face tokenizer adds no
    /// special tokens of its own (no BOS), as `encode(text, add_special_tokens=False)`.
    pub fn encode(&self, doc: &str) -> anyhow::Result<Vec<u32>> {
        match &self.engine {
            Engine::Tiktoken(bpe) => Ok(bpe.encode_ordinary(doc)),
            Engine::HuggingFace(tok) => tok
                .encode_fast(doc, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| anyhow::anyhow!("{}: cannot encode a document: {e}", self.name)),
        }
    }

    /// Whether this is a Hugging Face tokenizer, whose post-processor may add special
    /// tokens to a text (Llama's `<|begin_of_text|>`); tiktoken's encodings add none.
    pub fn has_post_processor(&self) -> bool {
        matches!(self.engine, Engine::HuggingFace(_))
    }

    /// The tokens transformers' `tokenizer(text)` gives: a Hugging Face tokenizer's added
    /// special tokens matched in the text, and those its post-processor adds (Llama's
    /// `<|begin_of_text|>` before it); tiktoken's as [`Tokenizer::encode`]'s.
    pub fn encode_with_special_tokens(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        match &self.engine {
            Engine::Tiktoken(_) => self.encode(text),
            Engine::HuggingFace(tok) => tok
                .encode_fast(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| anyhow::anyhow!("{}: cannot encode: {e}", self.name)),
        }
    }

    /// The bytes `tokens` stand for, special tokens written out. tiktoken's are the exact
    /// bytes, of which a token may hold part of a character; a Hugging Face decoder's are
    /// text, with U+FFFD for a character the tokens do not complete yet.
    pub fn decode(&self, tokens: &[u32]) -> anyhow::Result<Vec<u8>> {
        match &self.engine {
            Engine::Tiktoken(bpe) => {
                bpe.decode_bytes(tokens).map_err(|e| anyhow::anyhow!("{}: cannot decode: {e}", self.name))
            }
            Engine::HuggingFace(tok) => tok
                .decode(tokens, false)
                .map(String::into_bytes)
                .map_err(|e| anyhow::anyhow!("{}: cannot decode: {e}", self.name)),
        }
    }
}

fn load_hugging_face(path: &Path, eot_token: Option<&str>) -> anyhow::Result<Tokenizer> {
    let shown = path.display();
    if !path.is_file() {
        return Err(user_error(format!(
            "command line: --tokenizer {shown}: neither gpt2, cl100k_base, o200k_base nor a tokenizer.json file"
        )));
    }
    let tok = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| user_error(format!("{shown}: cannot load tokenizer: {}", one_line(&e.to_string()))))?;
    let (eot_token, eot) = match eot_token {
        Some(e) => match tok.token_to_id(e) {
            Some(id) => (e.to_string(), id),
            None => return Err(user_error(format!("{shown}: --eot-token {e} is not in the vocabulary"))),
        },
        None => HF_EOT_CANDIDATES
            .iter()
            .find_map(|&e| tok.token_to_id(e).map(|id| (e.to_string(), id)))
            .ok_or_else(|| {
                user_error(format!(
                    "{shown}: none of {} is in the vocabulary; name the end-of-text token with --eot-token",
                    HF_EOT_CANDIDATES.join(", ")
                ))
            })?,
    };
    // Added tokens may sit above the model's own vocabulary.
    let vocab_size = tok.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1);
    Ok(Tokenizer {
        engine: Engine::HuggingFace(Box::new(tok)),
        name: path.display().to_string(),
        vocab_size,
        eot,
        eot_token,
    })
}

/// serde_json's messages for a bad tokenizer.json can span lines; the CLI prints one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiktoken_facts_match_the_encodings() {
        for t in &TIKTOKEN {
            let bpe = (t.bpe)();
            assert_eq!(bpe.encode_with_special_tokens("<|endoftext|>"), [t.eot], "{}", t.name);
            assert!(bpe.decode_bytes(&[t.vocab_size as u32 - 1]).is_ok(), "{}", t.name);
            assert!(bpe.decode_bytes(&[t.vocab_size as u32]).is_err(), "{}", t.name);
        }
    }

    #[test]
    fn encodes_documents_without_end_of_text() {
        let gpt2 = Tokenizer::load("gpt2", None).unwrap();
        // Reference ids from the GPT-2 tokenizer: "Hello" 15496, " world" 995.
        assert_eq!(gpt2.encode("Hello world").unwrap(), [15496, 995]);
        // Inside a document the literal is text, not the token.
        assert!(!gpt2.encode("a<|endoftext|>b").unwrap().contains(&gpt2.eot));
        let cl100k = Tokenizer::load("cl100k_base", None).unwrap();
        // tiktoken's cl100k_base: "Hello world" is [9906, 1917].
        assert_eq!(cl100k.encode("Hello world").unwrap(), [9906, 1917]);
        assert_eq!((cl100k.vocab_size, cl100k.eot), (100277, 100257));
    }

    #[test]
    fn bad_tokenizer_specs_are_one_line() {
        let Err(err) = Tokenizer::load("nope.json", None) else { panic!("nope.json loaded") };
        assert_eq!(
            err.to_string(),
            "command line: --tokenizer nope.json: neither gpt2, cl100k_base, o200k_base nor a tokenizer.json file"
        );
        let Err(err) = Tokenizer::load("gpt2", Some("</s>")) else { panic!("gpt2 took --eot-token </s>") };
        assert!(err
            .to_string()
            .starts_with("command line: --eot-token </s>: gpt2's end of text is <|endoftext|>"));
    }
}
