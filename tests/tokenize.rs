//! `pipetrain tokenize` end to end: inputs (text, JSONL, directories), outputs (llm.c files and
//! shards, Megatron indexed datasets), tokenizers, determinism across thread counts, and
//! one-line errors.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/megatron");

fn tokenize(input: &Path, output: &Path, flags: &[&str]) -> Output {
    bin().arg("tokenize").arg(input).arg(output).args(flags).output().unwrap()
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// The header's ints and the token bytes of an llm.c file.
fn llmc(path: &Path) -> ([i32; 3], Vec<u8>) {
    let bytes = fs::read(path).unwrap();
    let int = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    ([int(0), int(1), int(2)], bytes[1024..].to_vec())
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Documents with words, punctuation, non-ASCII text, newlines and an empty one.
fn documents(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 5 {
            0 => format!("Document {i}: the quick brown fox jumps over the lazy dog.\n"),
            1 => String::new(),
            2 => format!("Zürich – {i} naïve café, 東京 {}", "and so on ".repeat(i % 13)),
            3 => format!("  leading spaces, \"quotes\" and\ttabs {i}\n\n"),
            _ => format!("{i}"),
        })
        .collect()
}

fn write_text(path: &Path, docs: &[String]) {
    fs::write(path, docs.join("<|endoftext|>")).unwrap();
}

fn write_jsonl(path: &Path, docs: &[String]) {
    let lines: Vec<String> =
        docs.iter().map(|d| serde_json::json!({ "id": 1, "text": d }).to_string()).collect();
    fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn jsonl_gives_the_tokens_of_the_same_documents_as_text() {
    let dir = temp_dir("tok-jsonl-text");
    let docs = documents(50);
    let (txt, jsonl) = (dir.join("in.txt"), dir.join("in.jsonl"));
    write_text(&txt, &docs);
    write_jsonl(&jsonl, &docs);
    ok(tokenize(&txt, &dir.join("t.bin"), &[]));
    ok(tokenize(&jsonl, &dir.join("j.bin"), &[]));
    let (t, j) = (llmc(&dir.join("t.bin")), llmc(&dir.join("j.bin")));
    assert_eq!(t, j);
    assert_eq!(t.0, [20240520, 1, (t.1.len() / 2) as i32]);
    // Every document is preceded by <|endoftext|>, as the text file's separators give.
    assert_eq!(u16s(&t.1).iter().filter(|&&x| x == 50256).count(), docs.len());
    // A directory of both reads them in name order: in.jsonl, then in.txt.
    let both = dir.join("both");
    fs::create_dir(&both).unwrap();
    fs::copy(&txt, both.join("in.txt")).unwrap();
    fs::copy(&jsonl, both.join("in.jsonl")).unwrap();
    ok(tokenize(&both, &dir.join("d.bin"), &[]));
    assert_eq!(llmc(&dir.join("d.bin")).1, [j.1.clone(), t.1.clone()].concat());
}

#[test]
fn shards_split_at_exactly_n_tokens_and_concatenate_to_the_single_file() {
    let dir = temp_dir("tok-shards");
    let input = dir.join("in.txt");
    write_text(&input, &documents(40));
    ok(tokenize(&input, &dir.join("all.bin"), &[]));
    let (header, all) = llmc(&dir.join("all.bin"));
    let total = header[2] as usize;
    let n = 37;
    let out = ok(tokenize(&input, &dir.join("sh.bin"), &["--shard-tokens", "37"]));
    let shards = total.div_ceil(n);
    assert!(shards > 3, "{total} tokens");
    let mut joined = Vec::new();
    for i in 0..shards {
        let (h, body) = llmc(&dir.join(format!("sh_{i:06}.bin")));
        let want = if i + 1 < shards { n } else { total - n * (shards - 1) };
        assert_eq!(h, [20240520, 1, want as i32], "shard {i}");
        joined.extend(body);
    }
    assert_eq!(joined, all);
    assert!(!dir.join(format!("sh_{shards:06}.bin")).exists());
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.contains(&format!("({shards} files): {total} tokens (40 documents)")), "{stdout}");
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("sh.meta.json")).unwrap()).unwrap();
    assert_eq!(meta["files"].as_array().unwrap().len(), shards);
    assert_eq!(meta["tokens"].as_u64(), Some(total as u64));

    // Again with --force and larger shards: the earlier run's later shards go.
    ok(tokenize(&input, &dir.join("sh.bin"), &["--shard-tokens", "100000", "--force"]));
    assert_eq!(llmc(&dir.join("sh_000000.bin")).1, all);
    assert!(!dir.join("sh_000001.bin").exists());
}

#[test]
fn the_output_is_the_same_bytes_for_any_thread_count() {
    let dir = temp_dir("tok-threads");
    let input = dir.join("in.jsonl");
    write_jsonl(&input, &documents(20_000));
    let mut outputs: Vec<Vec<Vec<u8>>> = Vec::new();
    for threads in ["1", "4"] {
        let (l, m) = (dir.join(format!("l{threads}.bin")), dir.join(format!("m{threads}")));
        ok(tokenize(&input, &l, &["--threads", threads, "--shard-tokens", "100000"]));
        ok(tokenize(&input, &m, &["--threads", threads, "--format", "megatron"]));
        let mut files =
            vec![fs::read(m.with_extension("bin")).unwrap(), fs::read(m.with_extension("idx")).unwrap()];
        for i in 0.. {
            let Ok(bytes) = fs::read(dir.join(format!("l{threads}_{i:06}.bin"))) else { break };
            files.push(bytes);
        }
        outputs.push(files);
    }
    assert!(outputs[0].len() > 3, "several shards");
    assert!(outputs[0] == outputs[1], "1 and 4 threads differ");
}

#[test]
fn megatron_output_matches_the_format_rules_fixture() {
    let fixtures = Path::new(FIXTURES);
    let dir = temp_dir("tok-megatron");
    for tokenizer in ["gpt2", "cl100k_base"] {
        let prefix = dir.join(tokenizer);
        ok(tokenize(
            &fixtures.join("docs.jsonl"),
            &prefix,
            &["--format", "megatron", "--tokenizer", tokenizer],
        ));
        for ext in ["bin", "idx"] {
            let want = fs::read(fixtures.join(format!("{tokenizer}.{ext}"))).unwrap();
            assert_eq!(fs::read(prefix.with_extension(ext)).unwrap(), want, "{tokenizer}.{ext}");
        }
    }
    // The fields themselves, for GPT-2 (uint16, code 8): 3 sequences (the empty document has
    // none), 5 document indices.
    let idx = fs::read(dir.join("gpt2.idx")).unwrap();
    assert_eq!(&idx[..9], b"MMIDIDX\0\0");
    assert_eq!(u64::from_le_bytes(idx[9..17].try_into().unwrap()), 1);
    assert_eq!(idx[17], 8);
    let q = |at: usize| i64::from_le_bytes(idx[at..at + 8].try_into().unwrap());
    assert_eq!((q(18), q(26)), (3, 5));
    let lengths: Vec<i32> =
        (0..3).map(|i| i32::from_le_bytes(idx[34 + 4 * i..38 + 4 * i].try_into().unwrap())).collect();
    assert_eq!(lengths, [3, 2, 2]);
    assert_eq!((0..3).map(|i| q(46 + 8 * i)).collect::<Vec<_>>(), [0, 6, 10]);
    assert_eq!((0..5).map(|i| q(70 + 8 * i)).collect::<Vec<_>>(), [0, 1, 1, 2, 3]);
    assert_eq!(u16s(&fs::read(dir.join("gpt2.bin")).unwrap()), [15496, 995, 50256, 15496, 50256, 995, 50256]);
}

#[test]
fn a_vocabulary_above_65536_writes_uint32_tokens() {
    let dir = temp_dir("tok-uint32");
    let input = dir.join("in.txt");
    fs::write(&input, "Hello world<|endoftext|>Hello").unwrap();
    ok(tokenize(&input, &dir.join("o.bin"), &["--tokenizer", "cl100k_base"]));
    let (header, body) = llmc(&dir.join("o.bin"));
    assert_eq!(header, [20240801, 7, 5]);
    let tokens: Vec<u32> = body.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(tokens, [100257, 9906, 1917, 100257, 9906]);
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("o.meta.json")).unwrap()).unwrap();
    assert_eq!(meta["tokenizer"], "cl100k_base");
    assert_eq!((meta["vocab_size"].as_u64(), meta["eot"].as_u64()), (Some(100277), Some(100257)));
    assert_eq!(
        (meta["eot_position"].as_str(), meta["token_bytes"].as_u64()),
        (Some("before each document"), Some(4))
    );
}

#[test]
fn a_hugging_face_tokenizer_json_tokenizes_and_is_recorded() {
    let dir = temp_dir("tok-hf");
    let tok = dir.join("tokenizer.json");
    fs::write(&tok, WORD_LEVEL).unwrap();
    let input = dir.join("in.jsonl");
    fs::write(&input, "{\"text\": \"hello world!\"}\n{\"text\": \"world Hello\"}\n").unwrap();
    let tok_flag = tok.to_str().unwrap();
    ok(tokenize(&input, &dir.join("o.bin"), &["--tokenizer", tok_flag]));
    assert_eq!(llmc(&dir.join("o.bin")), ([20240520, 1, 7], u16s_bytes(&[0, 1, 2, 3, 0, 2, 4])));
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("o.meta.json")).unwrap()).unwrap();
    assert_eq!(meta["tokenizer"].as_str(), Some(tok_flag));
    assert_eq!((meta["vocab_size"].as_u64(), meta["eot"].as_u64()), (Some(5), Some(0)));
    // Another end-of-text token, by name.
    ok(tokenize(&input, &dir.join("e.bin"), &["--tokenizer", tok_flag, "--eot-token", "!"]));
    assert_eq!(llmc(&dir.join("e.bin")).1, u16s_bytes(&[3, 1, 2, 3, 3, 2, 4]));
}

/// `--add-special-tokens` begins each document with what a tokenizer.json's post-processor
/// adds, as transformers' `tokenizer(text)` and Megatron's preprocess_data.py do: with the
/// Llama 3 style tokenizer of the Llama fixture (ids 0..93 the characters ! to ~, 94
/// <|begin_of_text|> first in every text, 95 <|end_of_text|>), a run on such data has its
/// prompts begin the same way in `generate`, and tiktoken's encodings refuse the flag.
#[test]
fn special_tokens_begin_each_document_and_then_each_prompt() {
    let dir = temp_dir("tok-special");
    let tok = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf_llama_tiny_rope_llama3/tokenizer.json");
    let input = dir.join("in.jsonl");
    let docs: Vec<String> = (0..40).map(|i| if i % 2 == 0 { "x=y".into() } else { "Q".into() }).collect();
    write_jsonl(&input, &docs);
    ok(tokenize(&input, &dir.join("plain.bin"), &["--tokenizer", tok]));
    assert_eq!(u16s(&llmc(&dir.join("plain.bin")).1)[..6], [95, 87, 28, 88, 95, 48]);
    ok(tokenize(&input, &dir.join("special.bin"), &["--tokenizer", tok, "--add-special-tokens"]));
    assert_eq!(u16s(&llmc(&dir.join("special.bin")).1)[..8], [95, 94, 87, 28, 88, 95, 94, 48]);
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("special.meta.json")).unwrap()).unwrap();
    assert_eq!(meta["special_tokens"], true);
    // Megatron's layout: <|begin_of_text|>, the text, <|end_of_text|> (--append-eod).
    let m = dir.join("m");
    ok(tokenize(&input, &m, &["--tokenizer", tok, "--add-special-tokens", "--format", "megatron"]));
    assert_eq!(u16s(&fs::read(dir.join("m.bin")).unwrap())[..8], [94, 87, 28, 88, 95, 94, 48, 95]);
    assert_user_error(
        &tokenize(&input, &dir.join("g.bin"), &["--add-special-tokens"]),
        "command line: --add-special-tokens: gpt2 adds no special tokens (a tokenizer.json's post-processor does)",
    );

    // A run on that data keeps the convention for its prompts.
    let data = dir.join("special.bin");
    let cfg = write_config(
        &dir,
        "c.yaml",
        &format!(
            "{MODEL}global_batch_size: 2\ntrain_data_path: {}\nvalid_data_path: {}\n",
            data.display(),
            data.display()
        ),
    );
    let run = dir.join("run");
    ok(train(&cfg, &run, &[]));
    let o = ok(bin()
        .args(["generate", "--checkpoint"])
        .arg(&run)
        .args(["--prompt", "x=y", "--max-new-tokens", "3"])
        .output()
        .unwrap());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.starts_with("<|begin_of_text|>x=y"), "{text}");
}

fn u16s_bytes(tokens: &[u16]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

#[test]
fn bad_inputs_are_one_line_naming_the_place_and_exit_2() {
    let dir = temp_dir("tok-bad");
    let out = dir.join("o.bin");
    let jsonl = dir.join("in.jsonl");
    let shown = jsonl.display().to_string();
    fs::write(&jsonl, "{\"text\": \"a\"}\n{\"body\": \"b\"}\n").unwrap();
    assert_user_error(&tokenize(&jsonl, &out, &[]), &format!("{shown}:2: no \"text\" key (--json-key)"));
    fs::write(&jsonl, "{\"text\": \"a\"}\n{\"text\": \"b\"\n").unwrap();
    assert_user_error(&tokenize(&jsonl, &out, &[]), &format!("{shown}:2: not a JSON object: "));
    fs::write(&jsonl, "{\"text\": \"a\"}\n").unwrap();
    assert_user_error(
        &tokenize(&jsonl, &out, &["--json-key", "body"]),
        &format!("{shown}:1: no \"body\" key"),
    );
    let tok = dir.join("tokenizer.json");
    fs::write(&tok, "{\"model\": ").unwrap();
    let o = tokenize(&jsonl, &out, &["--tokenizer", tok.to_str().unwrap()]);
    assert_user_error(&o, &format!("{}: cannot load tokenizer: ", tok.display()));
    fs::write(&tok, WORD_LEVEL).unwrap();
    let o = tokenize(&jsonl, &out, &["--tokenizer", tok.to_str().unwrap(), "--eot-token", "</s>"]);
    assert_user_error(&o, "--eot-token </s> is not in the vocabulary");
    let o = tokenize(&jsonl, &out, &["--format", "megatron", "--shard-tokens", "10"]);
    assert_user_error(
        &o,
        "error: command line: --shard-tokens 10: shards are llm.c files; not with --format megatron",
    );
    assert_user_error(
        &tokenize(&jsonl, &out, &["--shard-tokens", "0"]),
        "error: command line: --shard-tokens 0: a shard holds at least one token",
    );
    // An output that is an input, even by another spelling, is refused, --force or not.
    let spelled = dir.join(".").join("in.jsonl");
    assert_user_error(
        &tokenize(&jsonl, &spelled, &["--force"]),
        &format!(
            "error: {}: is the input too; tokenizing would replace the text by its tokens",
            spelled.display()
        ),
    );
    assert_eq!(fs::read_to_string(&jsonl).unwrap(), "{\"text\": \"a\"}\n");
    let inside = dir.join("o.bin");
    assert_user_error(
        &tokenize(&dir, &inside, &[]),
        &format!(
            "error: {}: inside the input directory {}, whose every file is read as documents; write it elsewhere",
            inside.display(),
            dir.display()
        ),
    );
    // Nothing was written by any of them.
    let left: Vec<PathBuf> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn a_failure_midway_leaves_only_complete_shards() {
    let dir = temp_dir("tok-midway");
    let jsonl = dir.join("in.jsonl");
    // More than one batch (8 MiB of text) before the bad line, so shards are written first.
    let mut text = String::new();
    for i in 0..90_000 {
        text += &format!("{{\"text\": \"document {i:>6}: {}\"}}\n", "a few words ".repeat(8));
    }
    text += "not json\n";
    fs::write(&jsonl, text).unwrap();
    let o = tokenize(&jsonl, &dir.join("s.bin"), &["--shard-tokens", "100000"]);
    assert_user_error(&o, &format!("{}:90001: not a JSON object", jsonl.display()));
    let mut shards = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(!name.starts_with('.'), "a temporary file is left: {name}");
        if name.starts_with("s_") {
            assert_eq!(llmc(&path).0[2], 100_000, "{name} is complete");
            shards += 1;
        }
    }
    assert!(shards > 1, "shards were written before the error");
    assert!(!dir.join("s.meta.json").exists());
}

#[test]
fn a_run_whose_vocab_size_is_below_the_tokenizers_is_one_line() {
    let dir = temp_dir("tok-vocab");
    let input = dir.join("in.txt");
    fs::write(&input, "The quick brown fox jumps over the lazy dog. ".repeat(20)).unwrap();
    ok(tokenize(&input, &dir.join("web.bin"), &["--tokenizer", "cl100k_base", "--shard-tokens", "50"]));
    let shards = format!("{}/web_*.bin", dir.display());
    // Every token is below 100,276, but cl100k_base has ids up to 100,276.
    let model = MODEL.replace("vocab_size: 96", "vocab_size: 100276");
    let data = format!("global_batch_size: 4\ntrain_data_path: {shards}\nvalid_data_path: {shards}\n");
    let cfg = write_config(&dir, "c.yaml", &format!("{model}{data}"));
    let o = train(&cfg, &dir.join("run"), &[]);
    assert_user_error(
        &o,
        &format!(
            "error: {}: key `train_data_path`: {}: made by tokenizer cl100k_base (as {} records), whose 100277 ids \
             exceed vocab_size 100276",
            cfg.display(),
            dir.join("web_000000.bin").display(),
            dir.join("web.meta.json").display()
        ),
    );
    assert!(!dir.join("run").exists(), "nothing was written");
}

#[test]
fn an_interrupt_leaves_no_partial_file() {
    let dir = temp_dir("tok-interrupt");
    let jsonl = dir.join("in.jsonl");
    let line = format!("{{\"text\": \"{}\"}}\n", "a few more words to tokenize ".repeat(40));
    fs::write(&jsonl, line.repeat(60_000)).unwrap();
    let child = bin()
        .arg("tokenize")
        .arg(&jsonl)
        .arg(dir.join("s.bin"))
        .args(["--shard-tokens", "200000", "--threads", "1", "--quiet"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let staged =
        || fs::read_dir(&dir).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with('.'));
    let start = std::time::Instant::now();
    while !staged() {
        assert!(start.elapsed().as_secs() < 60, "no shard was begun");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SIGINT, as Ctrl-C sends it.
    assert!(std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("interrupted: "), "{}", stderr(&o));
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(!name.starts_with('.'), "a temporary file is left: {name}");
        if name.starts_with("s_") {
            assert_eq!(llmc(&path).0[2], 200_000, "{name} is complete");
        }
    }
    assert!(!dir.join("s.meta.json").exists());
}
