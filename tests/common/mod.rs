//! Helpers shared by the end-to-end tests: run the binary, small configs, temp dirs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The trainer, run from the repository root. `PIPETRAIN_BIN` names another build of it,
/// run from the current directory: a test executable carried to a machine where the tree
/// it was built in does not exist (scripts/gpu-session runs `cuda_train` so).
pub fn bin() -> Command {
    match std::env::var_os("PIPETRAIN_BIN") {
        Some(binary) => Command::new(binary),
        None => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_pipetrain"));
            c.current_dir(env!("CARGO_MANIFEST_DIR"));
            c
        }
    }
}

/// A fresh empty directory for one test. A test leaves its directory for a look after a
/// failure; the first call of a later test process removes those of processes that have
/// ended.
pub fn temp_dir(name: &str) -> PathBuf {
    static CLEAR: std::sync::Once = std::sync::Once::new();
    CLEAR.call_once(remove_ended_processes_dirs);
    let dir = std::env::temp_dir().join(format!("pipetrain-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes `pipetrain-test-PID-*` directories whose process has ended, as /proc tells
/// (Linux); where there is no /proc, nothing.
fn remove_ended_processes_dirs() {
    let proc = Path::new("/proc");
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    if !proc.is_dir() {
        return;
    }
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("pipetrain-test-"))
            .and_then(|rest| rest.split('-').next());
        if let Some(pid) = pid.filter(|p| p.parse::<u32>().is_ok()) {
            if !proc.join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// A two-layer, 64-wide model on the shipped corpus, dropout on: a few steps take a second.
pub const SMALL: &str = "\
num_layers: 2
hidden_size: 64
num_attention_heads: 4
seq_length: 32
max_position_embeddings: 32
vocab_size: 50257
hidden_dropout: 0.1
attention_dropout: 0.1
micro_batch_size: 2
global_batch_size: 4
train_iters: 4
lr: 1.0e-3
min_lr: 1.0e-4
lr_warmup_iters: 2
eval_interval: 2
eval_iters: 2
save_interval: 0
seed: 7
train_data_path: data/corpus/train.bin
valid_data_path: data/corpus/val.bin
";

pub fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn train(config: &Path, run_dir: &Path, extra: &[&str]) -> Output {
    bin()
        .args(["train", "--quiet", "--config"])
        .arg(config)
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .output()
        .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// (step, loss bits, val_loss bits) of every line of a run's metrics.jsonl.
pub fn losses(run_dir: &Path) -> Vec<(u64, u64, Option<u64>)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap().to_bits(),
                v["val_loss"].as_f64().map(f64::to_bits),
            )
        })
        .collect()
}

/// Asserts a user mistake: exit code 2, exactly one line on stderr containing `needle`,
/// no panic.
pub fn assert_user_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "more than one line: {err}");
    assert!(err.contains(needle), "`{needle}` not in: {err}");
}

/// A model small enough that a run takes a fraction of a second: 8 blocks so that p = 4
/// with v = 2 has a block per virtual stage, vocabulary 96 on synthetic tokens.
pub const MODEL: &str = "\
num_layers: 8
hidden_size: 32
num_attention_heads: 4
seq_length: 16
max_position_embeddings: 16
vocab_size: 96
hidden_dropout: 0.1
attention_dropout: 0.1
micro_batch_size: 2
train_iters: 3
lr: 1.0e-2
min_lr: 1.0e-3
lr_warmup_iters: 1
eval_interval: 3
eval_iters: 2
seed: 11
";

/// The flags that make `MODEL` a Llama: RMSNorm, rotary positions, SwiGLU, 4 heads over 2
/// key/value groups, no biases, an untied output layer.
pub const LLAMA: &[(&str, &str)] = &[
    ("normalization", "RMSNorm"),
    ("position-embedding-type", "rope"),
    ("swiglu", "true"),
    ("group-query-attention", "true"),
    ("num-query-groups", "2"),
    ("untie-embeddings-and-output-weights", "true"),
    ("disable-bias-linear", "true"),
    ("ffn-hidden-size", "48"),
];

/// [`LLAMA`] as flag pairs, for `flags` and the runs' extra settings.
pub fn llama_flags() -> Vec<(&'static str, String)> {
    LLAMA.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

pub fn synthetic_data(dir: &Path) -> PathBuf {
    let path = dir.join("tokens.bin");
    let n = 4096u32;
    let mut bytes = vec![0u8; 1024];
    bytes[0..4].copy_from_slice(&20240520i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1i32.to_le_bytes());
    bytes[8..12].copy_from_slice(&(n as i32).to_le_bytes());
    for i in 0..n {
        let t = ((i * 7 + i / 13 + (i * i) % 11) % 96) as u16;
        bytes.extend(t.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A word-level Hugging Face tokenizer: words split by its Whitespace pre-tokenizer (a regex).
pub const WORD_LEVEL: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"<|endoftext|>": 0, "hello": 1, "world": 2, "!": 3, "[UNK]": 4},
            "unk_token": "[UNK]"}
}"#;

/// Writes an llm.c token file of uint32 tokens (magic 20240801, version 7).
pub fn write_u32_tokens(path: &Path, tokens: &[u32]) {
    let mut bytes = vec![0u8; 1024];
    for (i, v) in [20240801i32, 7, tokens.len() as i32].into_iter().enumerate() {
        bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    std::fs::write(path, bytes).unwrap();
}

/// The committed Megatron indexed dataset (tests/fixtures/megatron/make_fixture.py): 400
/// int32 tokens below 70000, in three documents.
pub const MEGATRON_FIXTURE: &str = "tests/fixtures/megatron/tiny_text_document";

/// Trains the small model in `dir/name` with extra flags; panics unless it succeeds.
pub fn run_small(dir: &Path, name: &str, args: &[String]) -> PathBuf {
    let cfg = config(dir);
    let run_dir = dir.join(name);
    let mut extra: Vec<&str> = vec!["--peak-flops", "1e9"];
    extra.extend(args.iter().map(String::as_str));
    let o = train(&cfg, &run_dir, &extra);
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    run_dir
}

/// The final checkpoint's weights file (step 3) of a small-model run.
pub fn weights(run_dir: &Path) -> Vec<u8> {
    weights_at(run_dir, 3)
}

/// The weights file of the checkpoint of `step`.
pub fn weights_at(run_dir: &Path, step: usize) -> Vec<u8> {
    std::fs::read(run_dir.join(format!("checkpoints/step_{step:06}/model.safetensors"))).unwrap()
}

/// The flags of `schedule` over `p` stages, 8 sequences a step (v = 2 for interleaved).
pub fn schedule_flags(schedule: &str, p: usize) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("pipeline-schedule", schedule.to_string()),
        ("pipeline-model-parallel-size", p.to_string()),
        ("global-batch-size", "8".to_string()),
    ];
    if schedule == "interleaved-1f1b" {
        f.push(("virtual-pipeline-model-parallel-size", "2".to_string()));
    }
    f
}

/// `--key value` flags.
pub fn flags(list: &[(&str, String)]) -> Vec<String> {
    list.iter().flat_map(|(k, v)| [format!("--{k}"), v.clone()]).collect()
}

/// A run's report.json.
pub fn report(run_dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join("report.json")).unwrap()).unwrap()
}

/// The flags of full recompute by `method` (uniform or block) over `n` layers.
pub fn full_recompute(method: &str, n: &str) -> Vec<(&'static str, String)> {
    vec![
        ("recompute-granularity", "full".to_string()),
        ("recompute-method", method.to_string()),
        ("recompute-num-layers", n.to_string()),
    ]
}

/// The flags of selective recompute of `modules` (comma-separated).
pub fn selective_recompute(modules: &str) -> Vec<(&'static str, String)> {
    vec![("recompute-granularity", "selective".to_string()), ("recompute-modules", modules.to_string())]
}

/// Rewrites the manifest of checkpoint dir `ck` for its files as they are now: how a test
/// changes a file on purpose and still reaches the checks behind the checksums.
pub fn resign_manifest(ck: &Path) {
    use sha2::{Digest, Sha256};
    let manifest = ck.join("manifest.sha256");
    let text: String = std::fs::read_to_string(&manifest)
        .unwrap()
        .lines()
        .map(|line| {
            let name = line.split_once("  ").unwrap().1;
            let sha = Sha256::digest(std::fs::read(ck.join(name)).unwrap());
            format!("{}  {name}\n", sha.iter().map(|b| format!("{b:02x}")).collect::<String>())
        })
        .collect();
    std::fs::write(manifest, text).unwrap();
}

/// Whether the binary and the machine can run MPI jobs; if not, says why and the caller
/// skips.
pub fn mpi_available() -> bool {
    if !cfg!(feature = "mpi") {
        eprintln!("skipped: the binary is built without the `mpi` feature (cargo test --features mpi)");
        return false;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipped: no `mpirun` on PATH (apt-get install openmpi-bin libopenmpi-dev)");
        return false;
    }
    true
}

/// The small model's config in `dir`, on synthetic tokens.
pub fn config(dir: &Path) -> PathBuf {
    let data = synthetic_data(dir);
    write_config(
        dir,
        "model.yaml",
        &format!("{MODEL}train_data_path: {}\nvalid_data_path: {}\n", data.display(), data.display()),
    )
}

/// The arguments of a quiet `train` of `cfg` into `run_dir`, with `extra` flags.
pub fn train_args(cfg: &Path, run_dir: &Path, extra: &[String]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--quiet", "--peak-flops", "1e9", "--config"].map(String::from).into();
    a.push(cfg.display().to_string());
    a.push("--run-dir".into());
    a.push(run_dir.display().to_string());
    a.extend(extra.iter().cloned());
    a
}

/// Waits for a launched job, killing it and failing past `deadline`; its output and how
/// long it took.
pub fn wait_with_deadline(mut child: Child, deadline: Duration) -> (Output, Duration) {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > deadline {
            child.kill().unwrap();
            panic!("the job did not stop within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    (child.wait_with_output().unwrap(), took)
}

/// Starts a long run under `launcher` (a command that ends in the binary) and returns once
/// it has recorded `steps` steps. A run that records fewer in a minute is stopped, and the
/// test fails with what it said and whether it had ended.
pub fn spawn_until(mut launcher: Command, cfg: &Path, run: &Path, extra: &[String], steps: usize) -> Child {
    let mut child = launcher
        .args(train_args(cfg, run, extra))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while steps_recorded(run) < steps {
        if start.elapsed() > Duration::from_secs(60) {
            let ended = child.try_wait().unwrap();
            let _ = child.kill();
            // What it said, unless a process it started still holds its pipes open.
            let (said, got) = std::sync::mpsc::channel();
            std::thread::spawn(move || said.send(child.wait_with_output().map(|out| stderr(&out))));
            let said = got.recv_timeout(Duration::from_secs(10)).map_or_else(
                |_| "(its output still held open after 10 s)".to_string(),
                |out| out.unwrap_or_else(|e| e.to_string()),
            );
            panic!(
                "{} of {steps} steps recorded after {:.0?}, the run {}:\n{said}",
                steps_recorded(run),
                start.elapsed(),
                ended.map_or("stopped".to_string(), |status| format!("already ended ({status})")),
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

pub fn steps_recorded(run_dir: &Path) -> usize {
    std::fs::read_to_string(run_dir.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
}

/// The run's latest checkpoint's name (`step_000004`).
pub fn latest(run_dir: &Path) -> String {
    std::fs::read_to_string(run_dir.join("checkpoints/latest")).unwrap().trim().to_string()
}
