//! Every user mistake is one clear line naming file, key and value, exit code 2, no panic,
//! and nothing overwritten.

mod common;
use common::*;
use std::path::Path;

fn train_err(dir: &Path, yaml: &str, extra: &[&str]) -> std::process::Output {
    let cfg = write_config(dir, "c.yaml", yaml);
    train(&cfg, &dir.join("run"), extra)
}

#[test]
fn config_mistakes() {
    let dir = temp_dir("bad-config");
    let cases: [(String, &[&str], &str); 14] = [
        (
            format!("{SMALL}hidden_sise: 64\n"),
            &[],
            "key `hidden_sise`: unknown key (did you mean `hidden_size`?)",
        ),
        (SMALL.replace("hidden_size: 64", "hidden_size: wide"), &[], "key `hidden_size`: bad value wide"),
        (
            SMALL.replace("hidden_size: 64", "hidden_size: 66"),
            &[],
            "key `hidden_size`: 66 is not a multiple of num_attention_heads 4",
        ),
        (
            SMALL.replace("global_batch_size: 4", "global_batch_size: 5"),
            &[],
            "key `global_batch_size`: 5 is not a multiple of micro_batch_size 2",
        ),
        (
            SMALL.replace("seq_length: 32", "seq_length: 64"),
            &[],
            "key `seq_length`: 64 exceeds max_position_embeddings 32",
        ),
        (format!("{SMALL}lr: [1\n"), &[], "malformed YAML"),
        (
            SMALL.to_string(),
            &["--micro-batch-size", "3"],
            "key `global_batch_size`: 4 is not a multiple of micro_batch_size 3",
        ),
        (SMALL.to_string(), &["--lr", "fast"], "command line: --lr fast"),
        (
            format!("{SMALL}distributed_timeout_minutes: 0\n"),
            &[],
            "key `distributed_timeout_minutes`: 0 must be a number of minutes > 0",
        ),
        (
            format!("{SMALL}recompute_granularity: selective\nrecompute_num_layers: 1\n"),
            &[],
            "key `recompute_num_layers`: 1 must be unset with recompute_granularity: selective",
        ),
        (
            format!("{SMALL}tensor_model_parallel_size: 2\n"),
            &[],
            "c.yaml: key `vocab_size`: 50257: tensor_model_parallel_size 2 does not divide it",
        ),
        (
            format!("{SMALL}tensor_model_parallel_size: 3\n"),
            &[],
            "key `tensor_model_parallel_size`: 3 does not divide num_attention_heads 4",
        ),
        (
            format!("{SMALL}pipeline_schedule: zb-v\nvirtual_pipeline_model_parallel_size: 3\n"),
            &[],
            "key `virtual_pipeline_model_parallel_size`: 3 does not fit pipeline_schedule: zb-v, which places \
             2 chunks per stage in a V (leave it unset or 2)",
        ),
        (
            format!("{SMALL}pipeline_schedule: dualpipe-v\npipeline_model_parallel_size: 2\n"),
            &[],
            "key `pipeline_schedule`: dualpipe-v with p=2, v=2, m=2: dualpipe-v needs at least 2p = 4 \
             microbatches, not 2",
        ),
    ];
    for (yaml, extra, needle) in cases {
        let o = train_err(&dir, &yaml, extra);
        assert_user_error(&o, needle);
        assert!(stderr(&o).contains("c.yaml") || needle.starts_with("command line"), "{}", stderr(&o));
        assert!(!dir.join("run").exists(), "a failed config created the run dir");
    }
}

/// A flag that is neither a config key nor the command's own is one line, hinting the
/// nearest of either (clap alone knows only the command's own), exit 2; so is a command's
/// own flag out of range.
#[test]
fn unknown_flags_name_the_nearest_key_or_flag() {
    let dir = temp_dir("bad-flags");
    let cases: [(&str, &[&str], &str); 9] = [
        (
            "train",
            &["--num-layer", "4"],
            "--num-layer: neither a config key nor a flag of `train` (did you mean `--num-layers`?)",
        ),
        (
            "train",
            &["--run-dri", "r"],
            "--run-dri: neither a config key nor a flag of `train` (did you mean `--run-dir`?)",
        ),
        (
            "simulate",
            &["--hardwar", "h200"],
            "--hardwar: neither a config key nor a flag of `simulate` (did you mean `--hardware`?)",
        ),
        ("bench", &["recompute", "--zzzzzz"], "--zzzzzz: neither a config key nor a flag of `bench`"),
        // A stray value is no misspelt flag: no hint.
        ("train", &["-5"], "-5: neither a config key nor a flag of `train`"),
        // The command's own numbers out of range, negative ones included.
        ("train", &["--peak-flops", "-5"], "--peak-flops -5: must be a number of FLOP/s > 0"),
        ("train", &["--peak-flops=0"], "--peak-flops 0: must be a number of FLOP/s > 0"),
        ("train", &["--peak-flops", "inf"], "--peak-flops inf: must be a number of FLOP/s > 0"),
        // Before the first step, not after the last.
        (
            "train",
            &["--trace", "/no-such-dir/t.json"],
            "--trace /no-such-dir/t.json: no directory /no-such-dir to write it in",
        ),
    ];
    let cfg = write_config(&dir, "c.yaml", SMALL);
    for (command, extra, needle) in cases {
        let o = bin().args([command, "--config", cfg.to_str().unwrap()]).args(extra).output().unwrap();
        assert_user_error(&o, &format!("error: command line: {needle}\n"));
    }
}

/// What clap refuses before any command runs (a command, a flag, a value, a missing
/// argument) is one line too, in the same form, where clap's own is several with a usage
/// block. Nothing here reads a file: the line comes first.
#[test]
fn command_line_refusals_are_one_line() {
    let commands = "train, simulate, tokenize, export, eval, generate or bench";
    let cases: [(&[&str], String); 15] = [
        (&["trian"], format!("trian: not a command; pipetrain's are {commands} (did you mean `train`?)")),
        (&["frobnicate"], format!("frobnicate: not a command; pipetrain's are {commands}")),
        (&["eval", "--checkpoint", "ck"], "`eval` needs --data <DATA> and --windows <WINDOWS>".into()),
        (&["bench"], "`bench` needs --config <CONFIG> and <WHAT>".into()),
        (&["train", "--config"], "--config: needs a value".into()),
        (&["tokenize", "a", "b", "--format", "csv"], "--format csv: expected llmc or megatron".into()),
        (&["tokenize", "a", "b", "c"], "c: `tokenize` takes no more arguments".into()),
        (
            &["export", "--checkpoint", "a", "--hf", "b", "--forc"],
            "--forc: not an argument of `export` (did you mean `--force`?)".into(),
        ),
        (
            &["eval", "--checkpoint", "a", "--data", "b", "--windows", "2.5"],
            "--windows 2.5: not a whole number".into(),
        ),
        (&["generate", "--checkpoint", "a", "--seed", "-1"], "--seed -1: must be 0 or more".into()),
        (
            &["generate", "--checkpoint", "a", "--top-k=99999999999999999999999"],
            "--top-k 99999999999999999999999: too large".into(),
        ),
        (
            &["generate", "--checkpoint", "a", "--temperature", "hot"],
            "--temperature hot: not a number".into(),
        ),
        (&["simulate", "--config", "c.yaml", "--top", "-1"], "--top -1: must be 0 or more".into()),
        (&["tokenize", "a", "b", "--threads=-3"], "--threads -3: must be 0 or more".into()),
        (
            &["simulate", "--config", "c.yaml", "--json", "--json"],
            "the argument '--json' cannot be used multiple times".into(),
        ),
    ];
    for (args, line) in cases {
        assert_user_error(&bin().args(args).output().unwrap(), &format!("error: command line: {line}\n"));
    }
    // Help and the version are not refusals.
    let help = bin().args(["eval", "--help"]).output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("Mean loss of a checkpoint"));
}

/// `eval`'s and `generate`'s own flags out of range: one line naming the flag and what the
/// checkpoint and the file allow, exit 2.
#[test]
fn eval_and_generate_mistakes() {
    let dir = temp_dir("bad-eval");
    let run = dir.join("run");
    let o =
        train(&write_config(&dir, "c.yaml", SMALL), &run, &["--train-iters", "1", "--save-interval", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let val = "data/corpus/val.bin";
    // Windows of 32 tokens and the token after each: (tokens - 1) / 32 of the llm.c file,
    // whose header's third int32 counts its tokens.
    let header = std::fs::read(val).unwrap();
    let windows = (i32::from_le_bytes(header[8..12].try_into().unwrap()) - 1) / 32;
    let cases: [(&[&str], String); 3] = [
        (&["--windows", "0"], format!("command line: --windows 0: {val} holds {windows} windows of 32 tokens; give 1 to {windows}")),
        (&["--windows", "99999999"], format!("command line: --windows 99999999: {val} holds {windows} windows of 32 tokens; give 1 to {windows}")),
        (&["--windows", "1", "--seq-length", "33"], "command line: --seq-length 33: must be between 1 and the model's 32 positions (max_position_embeddings)".into()),
    ];
    for (extra, needle) in cases {
        let o = bin()
            .args(["eval", "--checkpoint", run.to_str().unwrap(), "--data", val])
            .args(extra)
            .output()
            .unwrap();
        assert_user_error(&o, &format!("error: {needle}\n"));
    }
    for (temperature, shown) in [("-1", "-1"), ("nan", "NaN")] {
        let o = bin()
            .args(["generate", "--checkpoint", run.to_str().unwrap(), "--temperature", temperature])
            .output()
            .unwrap();
        assert_user_error(
            &o,
            &format!("error: command line: --temperature {shown}: must be a number >= 0 (0 is greedy)\n"),
        );
    }
}

#[test]
fn data_mistakes() {
    let dir = temp_dir("bad-data");
    let missing = train_err(&dir, &SMALL.replace("data/corpus/train.bin", "nowhere/train.bin"), &[]);
    assert_user_error(&missing, "nowhere/train.bin");
    let corrupt = dir.join("corrupt.bin");
    std::fs::write(&corrupt, vec![7u8; 2048]).unwrap();
    let o = train_err(&dir, &SMALL.replace("data/corpus/train.bin", corrupt.to_str().unwrap()), &[]);
    assert_user_error(&o, "corrupt.bin");
    assert!(stderr(&o).contains("magic"), "{}", stderr(&o));
    // A valid file with 10 tokens is too short for one window of 32.
    let short = dir.join("short.bin");
    let mut bytes = vec![0u8; 1024];
    bytes[0..4].copy_from_slice(&20240520i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1i32.to_le_bytes());
    bytes[8..12].copy_from_slice(&10i32.to_le_bytes());
    bytes.extend(std::iter::repeat_n(0u8, 20));
    std::fs::write(&short, bytes).unwrap();
    let o = train_err(&dir, &SMALL.replace("data/corpus/train.bin", short.to_str().unwrap()), &[]);
    assert_user_error(&o, "short.bin: 10 tokens");
}

/// Truncated, inconsistent and mismatched files of every kind of data source, and
/// malformed data paths: each is one line naming the file (or key), exit 2.
#[test]
fn data_source_mistakes() {
    let dir = temp_dir("bad-sources");
    let with_data = |path: &str| SMALL.replace("data/corpus/train.bin", path);
    let idx = std::fs::read(format!("{MEGATRON_FIXTURE}.idx")).unwrap();
    let bin = std::fs::read(format!("{MEGATRON_FIXTURE}.bin")).unwrap();
    let megatron = |name: &str, idx: &[u8], bin: &[u8]| {
        let prefix = dir.join(name);
        std::fs::write(dir.join(format!("{name}.idx")), idx).unwrap();
        std::fs::write(dir.join(format!("{name}.bin")), bin).unwrap();
        prefix.display().to_string()
    };
    let mut wide = vec![5u32; 100];
    wide[40] = 50257;
    let u32_file = dir.join("wide.bin");
    write_u32_tokens(&u32_file, &wide);
    let truncated_u32 = dir.join("cut.bin");
    std::fs::write(&truncated_u32, &std::fs::read(&u32_file).unwrap()[..1024 + 4 * 99 + 1]).unwrap();
    let cases: Vec<(String, String)> = vec![
        (
            with_data(&megatron("short_idx", &idx[..60], &bin)),
            "short_idx.idx: header says 3 sequences and 4 document indices (102 bytes) but the file has 60 \
             bytes: truncated or corrupt"
                .into(),
        ),
        (
            with_data(&megatron("cut_bin", &idx, &bin[..bin.len() - 4])),
            "cut_bin.bin: its index says 400 tokens of 4 bytes but the file has 1596 bytes".into(),
        ),
        (
            with_data(&megatron("pointers", &{
                let mut bad = idx.clone();
                bad[54] = 9;
                bad
            }, &bin)),
            "pointers.idx: sequence 1 starts at byte 521, but the sequences before it end at byte 600: \
             inconsistent index"
                .into(),
        ),
        (
            with_data(&megatron("not_an_index", &[7u8; 102], &bin)),
            "not_an_index.idx: does not start with MMIDIDX: not a Megatron index".into(),
        ),
        (with_data(MEGATRON_FIXTURE), format!("{MEGATRON_FIXTURE}.bin: token 65521 at position 0 is not below vocab_size 50257")),
        (
            with_data(&u32_file.display().to_string()),
            "wide.bin: token 50257 at position 40 is not below vocab_size 50257".into(),
        ),
        (
            with_data(&truncated_u32.display().to_string()),
            "cut.bin: header says 100 tokens (1424 bytes) but the file has 1421 bytes: truncated or corrupt".into(),
        ),
        (
            with_data(&format!("'{}/none_*.bin'", dir.display())),
            "none_*.bin: no file matches this pattern".into(),
        ),
        (
            with_data("[1, data/corpus/train.bin, 1]"),
            "key `train_data_path`: bad value".into(),
        ),
        (
            format!("{SMALL}eod_mask_loss: true\n"),
            "key `eod_mask_loss`: true is not supported: a window that spans a document boundary trains as one \
             sequence"
                .into(),
        ),
    ];
    for (yaml, needle) in cases {
        let o = train_err(&dir, &yaml, &[]);
        assert_user_error(&o, &needle);
        assert!(!dir.join("run").join("metrics.jsonl").exists(), "{needle}");
    }
}

#[test]
fn run_dir_and_checkpoint_mistakes_overwrite_nothing() {
    let dir = temp_dir("bad-run");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let run = dir.join("run");
    assert!(train(&cfg, &run, &["--train-iters", "2"]).status.success());
    let metrics_before = std::fs::read(run.join("metrics.jsonl")).unwrap();

    let again = train(&cfg, &run, &["--train-iters", "2"]);
    assert_user_error(&again, "already holds a run");
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics_before);

    // A checkpoint of another shape: a 128-wide model cannot start from the 64-wide run.
    let wide = train(&cfg, &dir.join("wide"), &["--hidden-size", "128", "--load", run.to_str().unwrap()]);
    assert_user_error(&wide, "model.safetensors");
    assert!(stderr(&wide).contains("hidden"), "{}", stderr(&wide));

    let no_run = train(&cfg, &dir.join("none"), &["--resume"]);
    assert_user_error(&no_run, "holds no run");
}

/// bf16 activations have only the tensor-core attention kernels: a head size they do not
/// take (96 / 4 = 24, no multiple of 16; 576 / 4 = 144, above 128) is a config error, said
/// before any GPU is opened, so it needs none. The line names where bf16 was set: the file,
/// or the flag.
#[test]
fn bf16_on_cuda_needs_a_head_size_the_tensor_cores_take() {
    let dir = temp_dir("bad-bf16-heads");
    for (hidden, head_size) in [(96, 24), (576, 144)] {
        let yaml = format!("{SMALL}device: cuda\nprecision: bf16\n")
            .replace("hidden_size: 64", &format!("hidden_size: {hidden}"));
        let o = train_err(&dir, &yaml, &[]);
        assert_user_error(
            &o,
            &format!(
                "c.yaml: key `precision`: bf16 on cuda needs a head size (hidden_size / num_attention_heads) \
                 that is a multiple of 16 up to 128, got {head_size}"
            ),
        );
        assert!(!dir.join("run").exists(), "a failed config created the run dir");
    }
    let yaml = format!("{SMALL}device: cuda\n").replace("hidden_size: 64", "hidden_size: 96");
    let o = train_err(&dir, &yaml, &["--precision", "bf16"]);
    assert_user_error(
        &o,
        "command line: --precision bf16: bf16 on cuda needs a head size (hidden_size / num_attention_heads) \
         that is a multiple of 16 up to 128, got 24",
    );
}
