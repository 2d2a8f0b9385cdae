//! `pipetrain generate` end to end: greedy text from the committed Hugging Face GPT-2, Llamas
//! (grouped-query attention, rotary positions, sharded files; Llama 3.1's rope scaling and a
//! tied output layer), Qwen2 (biases on q, k and v), Qwen3 (QK-norm), Mistral (Nemo's wide
//! heads, and v0.1's sliding window), Phi-3 (q, k, v and gate, up fused in the file), Nemotron (LayerNorm1P,
//! squared ReLU, rope on half of each head), StableLM 2 (LayerNorms, q, k and v biases,
//! rope on a quarter of each head) and Gemma (GeGLU, embeddings multiplied by
//! sqrt(hidden_size)) equals transformers'
//! `generate(do_sample=False)` token for token, with and without the KV cache; seeded
//! sampling repeats byte for byte, and mistakes are one line with exit code 2.
//!
//! `generate.json` in `tests/fixtures/` hf_tiny, hf_llama_tiny, hf_llama_tiny_rope_llama3,
//! hf_qwen2_tiny, hf_qwen3_tiny, hf_mistral_tiny, hf_mistral_nemo_tiny, hf_phi3_tiny,
//! hf_mistral_v01_tiny, hf_nemotron_tiny, hf_stablelm_tiny, hf_gemma_tiny, hf_olmo2_tiny and
//! hf_olmo3_tiny hold
//! transformers' tokens; the script beside the fixtures', `tests/hf/make_generate_fixture.py`,
//! regenerates them. Every token of that 96-token vocabulary is one distinct byte, so equal
//! output bytes are equal tokens.

mod common;
use common::*;
use serde_json::Value;
use std::process::Output;

fn generate(extra: &[&str]) -> Output {
    generate_from("hf_tiny", extra)
}

fn generate_from(fixture: &str, extra: &[&str]) -> Output {
    let dir = format!("tests/fixtures/{fixture}");
    bin().args(["generate", "--checkpoint", &dir]).args(extra).output().unwrap()
}

fn stdout_of(o: &Output) -> Vec<u8> {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), stderr(o));
    o.stdout.clone()
}

fn tokens(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_generation_equals_transformers() {
    for fixture in [
        "hf_tiny",
        "hf_llama_tiny",
        "hf_llama_tiny_rope_llama3",
        "hf_qwen2_tiny",
        "hf_qwen3_tiny",
        "hf_mistral_tiny",
        "hf_mistral_nemo_tiny",
        "hf_phi3_tiny",
        "hf_nemotron_tiny",
        "hf_stablelm_tiny",
        "hf_gemma_tiny",
        "hf_olmo2_tiny",
        "hf_mistral_v01_tiny",
        "hf_olmo3_tiny",
    ] {
        greedy_equals_transformers(fixture);
    }
}

fn greedy_equals_transformers(fixture: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/{fixture}/generate.json"));
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let bpe = tiktoken_rs::r50k_base_singleton();
    for case in expected["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let new = tokens(&case["new_tokens"]);
        // With the fixture's tokenizer.json, transformers' `tokenizer.decode` of the prompt
        // it encoded (<|begin_of_text|> first) and the new tokens; else GPT-2's bytes.
        let mut want = match case["text"].as_str() {
            Some(text) => text.as_bytes().to_vec(),
            None => {
                assert_eq!(bpe.encode_ordinary(prompt), tokens(&case["prompt_tokens"]), "{prompt}");
                let mut want = prompt.as_bytes().to_vec();
                want.extend(bpe.decode_bytes(&new).unwrap());
                want
            }
        };
        want.push(b'\n');
        let n = new.len().to_string();
        let args = ["--prompt", prompt, "--max-new-tokens", &n, "--temperature", "0"];
        assert_eq!(stdout_of(&generate_from(fixture, &args)), want, "{fixture}: {prompt}");
        let uncached = generate_from(fixture, &[&args[..], &["--no-kv-cache"]].concat());
        assert_eq!(stdout_of(&uncached), want, "{fixture}: {prompt}");
    }
}

#[test]
fn seeded_sampling_repeats_byte_for_byte() {
    let sample = |seed: &str| {
        stdout_of(&generate(&["--prompt", "!", "--temperature", "1.2", "--top-k", "40", "--seed", seed]))
    };
    let first = sample("11");
    // The prompt, then as many tokens as the 16 positions leave (each one byte here).
    assert_eq!(first.len(), 1 + 15 + 1);
    assert_eq!(sample("11"), first);
    assert_ne!(sample("12"), first);
    let o = generate(&["--prompt", "!", "--seed", "11"]);
    assert_eq!(stderr(&o), "stopped after 15 new tokens: the model has 16 positions\n");
}

#[test]
fn mistakes_are_one_line_and_exit_2() {
    let long = vec!["a"; 17].join(" ");
    let cases: [(&[&str], &str); 5] = [
        (&["--prompt", &long], "command line: --prompt: 17 tokens, more than the model's 16 positions"),
        (
            &["--prompt", "Hello"],
            "command line: --prompt: token 15496 (\"Hello\") is outside the model's vocabulary of 96",
        ),
        (
            &["--prompt", "!", "--temperature=-1"],
            "command line: --temperature -1: must be a number >= 0 (0 is greedy)",
        ),
        (&["--prompt", "!", "--top-k", "0"], "command line: --top-k 0: must be at least 1"),
        (
            &["--prompt", "!", "--temperature", "NaN"],
            "command line: --temperature NaN: must be a number >= 0",
        ),
    ];
    for (extra, needle) in cases {
        assert_user_error(&generate(extra), needle);
    }
    let dir = temp_dir("generate-bad-checkpoint");
    let o = bin().args(["generate", "--checkpoint"]).arg(&dir).output().unwrap();
    assert_user_error(&o, "not a checkpoint: no model.safetensors, and no checkpoints/latest to follow");
}

/// A model trained on data a tokenizer.json made writes that tokenizer's text: the tokenizer
/// its run recorded, or a Hugging Face directory's own tokenizer.json. GPT-2's BPE, the
/// default with neither, would read its ids as other text; here GPT-2's id of the prompt's
/// first word is not even in the model's vocabulary, so the export without the file is
/// refused.
#[test]
fn the_text_is_the_tokenizer_the_data_was_made_with() {
    let dir = temp_dir("gen-tokenizer");
    let tok = dir.join("tokenizer.json");
    std::fs::write(&tok, WORD_LEVEL).unwrap();
    let docs = dir.join("docs.jsonl");
    std::fs::write(&docs, "{\"text\": \"hello world ! world hello\"}\n".repeat(200)).unwrap();
    let data = dir.join("words.bin");
    let o = bin()
        .arg("tokenize")
        .arg(&docs)
        .arg(&data)
        .args(["--quiet", "--tokenizer"])
        .arg(&tok)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = format!(
        "{MODEL}global_batch_size: 2\ntrain_data_path: {}\nvalid_data_path: {}\n",
        data.display(),
        data.display()
    );
    let run = dir.join("run");
    let o = train(&write_config(&dir, "c.yaml", &yaml), &run, &["--train-iters", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let greedy = ["--max-new-tokens", "6", "--temperature", "0", "--prompt", "hello world"];
    let from = |ck: &std::path::Path, extra: &[&str]| {
        bin().arg("generate").arg("--checkpoint").arg(ck).args(greedy).args(extra).output().unwrap()
    };
    let text = String::from_utf8(stdout_of(&from(&run, &[]))).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words.len(), 2 + 6, "{text:?}");
    assert_eq!(words[..2], ["hello", "world"]);
    let vocabulary = ["<|endoftext|>", "hello", "world", "!", "[UNK]"];
    assert!(words.iter().all(|w| vocabulary.contains(w)), "{text:?}");
    // The flag names the same tokenizer, to the byte.
    assert_eq!(stdout_of(&from(&run, &["--tokenizer", tok.to_str().unwrap()])), text.as_bytes());

    // The export carries the tokenizer.json, so its text is the run's, and the settings
    // beside it (a Hugging Face directory's special tokens, its chat template).
    let settings = "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"eos_token\": \"<|endoftext|>\"}\n";
    std::fs::write(dir.join("tokenizer_config.json"), settings).unwrap();
    let export = |to: &std::path::Path| {
        let o = bin().args(["export", "--checkpoint"]).arg(&run).arg("--hf").arg(to).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let hf = dir.join("hf");
    let o = export(&hf);
    assert!(String::from_utf8_lossy(&o.stdout).ends_with(
        "(config.json, model.safetensors, tokenizer.json, tokenizer_config.json, manifest.sha256)\n"
    ));
    assert_eq!(std::fs::read(hf.join("tokenizer.json")).unwrap(), WORD_LEVEL.as_bytes());
    assert_eq!(std::fs::read_to_string(hf.join("tokenizer_config.json")).unwrap(), settings);
    assert_eq!(stdout_of(&from(&hf, &[])), text.as_bytes());
    // config.json names the documents' end-of-text token, id 0 of this vocabulary, where
    // GPT-2's own 50256 would not even be a token of it.
    assert_eq!(special_tokens(&hf), (0.into(), 0.into()));
    // A tokenizer.json since moved away is said, and the export goes on without it.
    std::fs::rename(&tok, dir.join("moved.json")).unwrap();
    let o = export(&dir.join("hf2"));
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "note: {}: no tokenizer.json: the run's data was tokenized with {}, which is not a tokenizer.json file \
             here; give generate --tokenizer",
            dir.join("hf2").display(),
            tok.display()
        )
    );
    assert!(!dir.join("hf2/tokenizer.json").exists());
    assert_eq!(
        special_tokens(&dir.join("hf2")),
        (50256.into(), 50256.into()),
        "GPT-2's, as generate assumes"
    );
}

/// An export's config.json's (bos_token_id, eos_token_id).
fn special_tokens(hf: &std::path::Path) -> (Value, Value) {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    (config["bos_token_id"].clone(), config["eos_token_id"].clone())
}

/// transformers' generate stops at the eos its config.json names, else at its class's
/// default (LlamaConfig's 2, here the byte "#"): an export names its tokenizer's. A Hugging
/// Face directory's own config.json names them; a run's text without a known tokenizer
/// names none.
#[test]
fn an_export_names_its_tokenizers_first_and_last_tokens_or_none() {
    let dir = temp_dir("export-special-tokens");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf_llama_tiny_rope_llama3");
    let export = |from: &std::path::Path, to: &str| {
        let o =
            bin().args(["export", "--checkpoint"]).arg(from).arg("--hf").arg(dir.join(to)).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        dir.join(to)
    };
    let hf = export(std::path::Path::new(fixture), "llama3");
    assert_eq!(special_tokens(&hf), (95.into(), 95.into()));
    assert_eq!(
        std::fs::read(hf.join("tokenizer.json")).unwrap(),
        std::fs::read(format!("{fixture}/tokenizer.json")).unwrap()
    );
    let run = run_small(
        &dir,
        "run",
        &[flags(&llama_flags()), flags(&[("global-batch-size", "2".into())])].concat(),
    );
    let hf = export(&run, "synthetic");
    assert_eq!(special_tokens(&hf), (Value::Null, Value::Null));
    assert!(!hf.join("tokenizer.json").exists());
}

/// A run on data tiktoken's cl100k_base made exports the tokenizer.json that encodes as
/// cl100k_base does: `tokenize` with it writes the same tokens, and the export generates the
/// run's text.
#[test]
fn an_export_of_a_tiktoken_run_carries_the_tokenizer_json_of_its_encoding() {
    let dir = temp_dir("gen-tiktoken-export");
    let docs = dir.join("docs.jsonl");
    let text = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, \
                seemed to unite some of the best blessings of existence; 1816 — naïve café.";
    std::fs::write(&docs, format!("{{\"text\": {text:?}}}\n").repeat(40)).unwrap();
    let tokenize = |tokenizer: &str, out: &std::path::Path| {
        let o =
            bin().arg("tokenize").arg(&docs).arg(out).args(["--quiet", "--tokenizer", tokenizer]).output();
        let o = o.unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    };
    let data = dir.join("cl100k.bin");
    tokenize("cl100k_base", &data);
    let yaml = format!(
        "{MODEL}vocab_size: 100277\nglobal_batch_size: 2\ntrain_data_path: {}\nvalid_data_path: {}\n",
        data.display(),
        data.display()
    )
    .replace("vocab_size: 96\n", "");
    let run = dir.join("run");
    let o = train(&write_config(&dir, "c.yaml", &yaml), &run, &["--train-iters", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hf = dir.join("hf");
    let o = bin().args(["export", "--checkpoint"]).arg(&run).arg("--hf").arg(&hf).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).ends_with(
        "(config.json, model.safetensors, tokenizer.json, tokenizer_config.json, manifest.sha256)\n"
    ));
    // AutoTokenizer takes the file as it is, where GPT2Tokenizer would split by GPT-2's
    // pattern.
    assert_eq!(
        std::fs::read_to_string(hf.join("tokenizer_config.json")).unwrap(),
        "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"}\n"
    );
    // The same tokens from the exported file as from tiktoken (the files' 1024-byte headers
    // aside).
    let again = dir.join("again.bin");
    tokenize(hf.join("tokenizer.json").to_str().unwrap(), &again);
    let tokens = |p: &std::path::Path| std::fs::read(p).unwrap()[1024..].to_vec();
    assert!(tokens(&again) == tokens(&data), "the exported tokenizer.json encodes otherwise");
    assert_eq!(special_tokens(&hf), (100257.into(), 100257.into()), "cl100k_base's <|endoftext|>");
    let greedy = ["--max-new-tokens", "5", "--temperature", "0", "--prompt", "Emma Woodhouse, handsome"];
    let from = |ck: &std::path::Path| {
        stdout_of(&bin().arg("generate").arg("--checkpoint").arg(ck).args(greedy).output().unwrap())
    };
    assert_eq!(from(&hf), from(&run));
}
