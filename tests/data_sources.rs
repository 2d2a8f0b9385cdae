//! End-to-end: training from shards, uint32 token files, Megatron indexed datasets and
//! blends of them; resumes are bit for bit, and the served tokens are counted per source.

mod common;
use common::*;
use std::path::Path;

/// `n` tokens below 70000 whose values pass 65,535, varied by `salt`.
fn wide_tokens(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 7 + salt + (i * i) % 13) % 96 + if i % 3 == 0 { 69_900 } else { 0 }).collect()
}

/// The small model with a vocabulary past uint16's, a global batch of 4 rows of 16 tokens.
fn wide_config(dir: &Path, train: &str, valid: &str) -> std::path::PathBuf {
    let model = MODEL.replace("vocab_size: 96", "vocab_size: 70000");
    write_config(
        dir,
        "c.yaml",
        &format!("{model}global_batch_size: 4\ntrain_data_path: {train}\nvalid_data_path: {valid}\n"),
    )
}

/// Every metrics line's (step, loss bits, tokens served per source).
fn served(run_dir: &Path) -> Vec<(u64, u64, serde_json::Value)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap().to_bits(), v["tokens_served"].clone())
        })
        .collect()
}

/// Trains `cfg` for 6 steps straight and for 3 then 3 more resumed; asserts both give the
/// same losses, tokens served and final weights to the bit, and returns the unbroken run.
fn resumes_bit_for_bit(dir: &Path, cfg: &Path) -> std::path::PathBuf {
    let ok = |o: std::process::Output| assert!(o.status.success(), "{}", stderr(&o));
    let six = ["--train-iters", "6", "--lr-decay-iters", "6", "--peak-flops", "1e9"];
    ok(train(cfg, &dir.join("full"), &six));
    ok(train(
        cfg,
        &dir.join("split"),
        &["--train-iters", "3", "--lr-decay-iters", "6", "--peak-flops", "1e9"],
    ));
    ok(train(cfg, &dir.join("split"), &[&six[..], &["--resume"]].concat()));
    assert_eq!(served(&dir.join("split")), served(&dir.join("full")));
    assert_eq!(weights_at(&dir.join("split"), 6), weights_at(&dir.join("full"), 6));
    // The resumed run's report counts the tokens served since step 1, as the unbroken one's.
    assert_eq!(report(&dir.join("split"))["data_sources"], report(&dir.join("full"))["data_sources"]);
    dir.join("full")
}

#[test]
fn uint32_tokens_train_a_vocabulary_past_65535() {
    let dir = temp_dir("data-u32");
    let data = dir.join("wide.bin");
    write_u32_tokens(&data, &wide_tokens(3000, 0));
    let cfg = wide_config(&dir, &data.display().to_string(), &data.display().to_string());
    let o = train(&cfg, &dir.join("run"), &["--peak-flops", "1e9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // An untrained model's loss is about ln(vocab_size): 70000 logits, not 65536 or 96.
    let first = f64::from_bits(losses(&dir.join("run"))[0].1);
    assert!((first - 70000f64.ln()).abs() < 0.3, "first loss {first}");
    // The same tokens under a uint16-sized vocabulary: the first token past it is named.
    let o = train(&cfg, &dir.join("narrow"), &["--vocab-size", "65536"]);
    assert_user_error(
        &o,
        &format!("{}: token 69900 at position 0 is not below vocab_size 65536", data.display()),
    );
}

#[test]
fn shards_resume_bit_for_bit_and_count_as_one_source() {
    let dir = temp_dir("data-shards");
    for (i, n) in [700u32, 300, 500].into_iter().enumerate() {
        write_u32_tokens(&dir.join(format!("shard_{i:03}.bin")), &wide_tokens(n, i as u32));
    }
    let glob = format!("'{}/shard_*.bin'", dir.display());
    let cfg = wide_config(&dir, &glob, &dir.join("shard_001.bin").display().to_string());
    let full = resumes_bit_for_bit(&dir, &cfg);
    let name = format!("{}/shard_*.bin", dir.display());
    let lines = served(&full);
    assert_eq!(lines.len(), 6);
    for (step, _, tokens) in &lines {
        assert_eq!(tokens, &serde_json::json!({ name.clone(): step * 4 * 16 }));
    }
}

/// The aim: a weighted blend of a Megatron dataset and llm.c uint32 shards trains
/// and resumes bit for bit; each source serves about its share.
#[test]
fn a_blend_of_a_megatron_dataset_and_uint32_shards_resumes_bit_for_bit() {
    let dir = temp_dir("data-blend");
    for (i, n) in [600u32, 400].into_iter().enumerate() {
        write_u32_tokens(&dir.join(format!("web_{i:03}.bin")), &wide_tokens(n, 5 + i as u32));
    }
    let web = format!("{}/web_*.bin", dir.display());
    let cfg = wide_config(&dir, &format!("[0.6, {MEGATRON_FIXTURE}, 0.4, '{web}']"), MEGATRON_FIXTURE);
    let full = resumes_bit_for_bit(&dir, &cfg);
    let lines = served(&full);
    let (last_step, _, last) = lines.last().unwrap();
    let (megatron, shards) = (last[MEGATRON_FIXTURE].as_u64().unwrap(), last[&web].as_u64().unwrap());
    assert_eq!(megatron + shards, last_step * 4 * 16);
    // 24 rows drawn at 0.6 / 0.4, pinned (checked against an independent Python Philox).
    assert_eq!((megatron / 16, shards / 16), (17, 7));
    let report = report(&full);
    assert_eq!(
        report["data_sources"],
        serde_json::json!([
            {"path": MEGATRON_FIXTURE, "weight": 0.6, "tokens_served": megatron},
            {"path": web, "weight": 0.4, "tokens_served": shards},
        ])
    );
}
