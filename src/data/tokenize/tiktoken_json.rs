//! tiktoken's encodings as Hugging Face `tokenizer.json` files, so that an export of a model
//! trained on them carries its tokenizer: a byte-level BPE whose vocabulary is tiktoken's
//! ranks and whose merges are recovered from them, split first by tiktoken's own pattern.
//!
//! A tiktoken rank is the priority of the merge that makes its token; the token of rank r is
//! the merge of the two parts that byte-pair merging with the ranks below r leaves of its
//! bytes (transformers' `TikTokenConverter` recovers Llama 3's merges so). Listed in rank
//! order those merges apply in tiktoken's order; `ignore_merges` takes a piece that is a
//! token whole, as tiktoken does before merging.

use std::collections::HashMap;

use serde_json::{json, Value};
use tiktoken_rs::CoreBPE;

/// tiktoken's pre-tokenizing patterns, as tiktoken-rs compiles them, in Oniguruma's
/// dialect (Hugging Face's regex engine): `$`, the end of the text there and of a line in
/// Oniguruma, is `\z`; `{1,3}+`, possessive there and a repeated `{1,3}` in Oniguruma, is
/// `{1,3}`, which matches the same where nothing follows it to backtrack into.
pub const R50K_PATTERN: &str =
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++\z|\s+(?!\S)|\s";
pub const CL100K_PATTERN: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*+",
    r"|\s++\z|\s*[\r\n]|\s+(?!\S)|\s"
);

/// o200k_base's pattern, which Oniguruma reads as tiktoken does.
pub const O200K_PATTERN: &str = tiktoken_rs::O200K_BASE_PAT_STR;

/// The tokenizer.json of tiktoken encoding `bpe` (`vocab_size`: its highest id + 1), which
/// pre-tokenizes by `pattern`: its special tokens added, no normalizer and no
/// post-processor (tiktoken adds no token to a text).
pub fn tokenizer_json(bpe: &CoreBPE, vocab_size: usize, pattern: &str) -> String {
    let vocab_size = u32::try_from(vocab_size).expect("a tiktoken vocabulary fits a u32");
    let special: Vec<(u32, String)> = {
        let mut s: Vec<(u32, String)> = bpe
            .special_tokens()
            .into_iter()
            .map(|t| (bpe.encode_with_special_tokens(t)[0], t.to_string()))
            .collect();
        s.sort();
        s
    };
    let ranks: HashMap<Vec<u8>, u32> = (0..vocab_size)
        .filter(|id| !special.iter().any(|(s, _)| s == id))
        .filter_map(|id| bpe.decode_bytes(&[id]).ok().map(|b| (b, id)))
        .collect();
    let mut by_rank: Vec<(&Vec<u8>, u32)> = ranks.iter().map(|(b, &r)| (b, r)).collect();
    by_rank.sort_by_key(|&(_, r)| r);
    let unicode = byte_level_chars();
    let text = |bytes: &[u8]| -> String { bytes.iter().map(|&b| unicode[b as usize]).collect() };
    // The special tokens in the vocabulary too: Hugging Face gives an added token that is
    // not there the next free id, whatever the file says, and tiktoken's leave gaps.
    let vocab: serde_json::Map<String, Value> = by_rank
        .iter()
        .map(|(b, r)| (text(b), json!(r)))
        .chain(special.iter().map(|(id, content)| (content.clone(), json!(id))))
        .collect();
    let merges: Vec<Value> = by_rank
        .iter()
        .filter(|(b, _)| b.len() > 1)
        .map(|&(b, r)| {
            let (left, right) = last_merge(b, r, &ranks);
            json!([text(left), text(right)])
        })
        .collect();
    let added: Vec<Value> = special
        .iter()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
                  "vocab": vocab, "merges": merges},
    })
    .to_string()
}

/// The two parts whose merge makes the token `bytes` of rank `rank`: what byte-pair merging
/// with the ranks below `rank` leaves of it.
fn last_merge<'a>(bytes: &'a [u8], rank: u32, ranks: &HashMap<Vec<u8>, u32>) -> (&'a [u8], &'a [u8]) {
    // The parts are bytes[cuts[i]..cuts[i + 1]]: the single bytes to begin with.
    let mut cuts: Vec<usize> = (0..=bytes.len()).collect();
    while cuts.len() > 3 {
        let best = (0..cuts.len() - 2)
            .filter_map(|i| ranks.get(&bytes[cuts[i]..cuts[i + 2]]).filter(|&&r| r < rank).map(|&r| (r, i)))
            .min();
        let Some((_, i)) = best else { break };
        cuts.remove(i + 1);
    }
    assert_eq!(cuts.len(), 3, "tiktoken's ranks make every token of two lower ones");
    (&bytes[..cuts[1]], &bytes[cuts[1]..])
}

/// GPT-2's byte-level alphabet: each byte as a printable character, the printable ASCII and
/// Latin-1 ones as themselves and the rest from U+0100 on, in byte order.
fn byte_level_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("a Latin-1 character")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("a character above U+00FF")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(bpe: &CoreBPE, vocab_size: usize, pattern: &str) {
        let json = tokenizer_json(bpe, vocab_size, pattern);
        let hf: tokenizers::Tokenizer = json.parse().unwrap();
        let corpus =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/corpus/val.txt")).unwrap();
        let mut texts: Vec<String> = corpus.lines().map(str::to_string).collect();
        texts.push(corpus.chars().take(20000).collect());
        texts.extend(
            [
                "Hello world",
                "  leading",
                "trailing  ",
                "a\n\nb",
                "tabs\t\tand\r\nlines \n",
                "1234567 89",
                "I'm you're THEY'LL we'VE",
                "naïve café — 東京 😀👍🏽",
                "x  \n  y",
                "\n",
                " ",
                "",
                "fn main() { println!(\"{}\", 1+2); }",
                "\u{00a0}nbsp \u{2003}em",
            ]
            .map(str::to_string),
        );
        // Strings of the characters the patterns tell apart, drawn by a fixed generator:
        // runs of spaces, line ends and tabs beside letters of each case and script,
        // digits, punctuation, apostrophes, marks and characters above the BMP.
        let alphabet: Vec<char> =
            " \n\r\t aAzZ'sSltTdDmM01234!?/.,-\u{a0}\u{2003}éÉ\u{301}東京😀ßﬁ".chars().collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..4000 {
            let mut next = || {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) as usize
            };
            let len = next() % 24;
            texts.push((0..len).map(|_| alphabet[next() % alphabet.len()]).collect());
        }
        for t in &texts {
            let want = bpe.encode_ordinary(t);
            let got = hf.encode(t.as_str(), false).unwrap().get_ids().to_vec();
            assert_eq!(got, want, "{t:?}");
            assert_eq!(&hf.decode(&want, false).unwrap(), t, "decoded");
        }
        // The special tokens are added tokens, matched whole in a text as tiktoken matches
        // them where it is allowed to.
        let text = "a<|endoftext|>b";
        assert_eq!(hf.encode(text, false).unwrap().get_ids(), bpe.encode_with_special_tokens(text));
    }

    #[test]
    fn cl100k() {
        check(tiktoken_rs::cl100k_base_singleton(), 100277, CL100K_PATTERN);
    }

    #[test]
    fn r50k() {
        check(tiktoken_rs::r50k_base_singleton(), 50257, R50K_PATTERN);
    }

    #[test]
    fn o200k() {
        check(tiktoken_rs::o200k_base_singleton(), 200019, O200K_PATTERN);
    }
}
