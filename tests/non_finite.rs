//! `check_for_nan_in_loss_and_grad`: a NaN or infinite loss or gradient stops the run before
//! that step's update, naming the step, stage and rank, with exit 1 and the last checkpoint
//! the newest; a checkpoint holding a non-finite weight is refused at load (exit 2).

mod common;
use common::*;
use std::path::Path;
use std::process::Output;

/// Trains the small model at p = 2 in `dir/run`, with `fault` injected.
fn train_p2(dir: &Path, run: &str, extra: &[&str], fault: Option<&str>) -> Output {
    let mut c = bin();
    c.args(["train", "--quiet", "--peak-flops", "1e9", "--config"])
        .arg(config(dir))
        .arg("--run-dir")
        .arg(dir.join(run))
        .args(["--pipeline-model-parallel-size", "2", "--global-batch-size", "4"])
        .args(extra);
    if let Some(f) = fault {
        c.env("PIPETRAIN_INJECT_FAULT", f);
    }
    c.output().unwrap()
}

/// The run's last line on stderr (with `--quiet`, a log line precedes it for each step).
fn last_line(err: &str) -> &str {
    err.trim_end().lines().last().unwrap_or_default()
}

fn latest(run_dir: &Path) -> String {
    std::fs::read_to_string(run_dir.join("checkpoints/latest")).unwrap().trim().to_string()
}

fn metrics_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_nan_gradient_stops_the_run_naming_the_step_stage_and_rank_where_it_arose() {
    let dir = temp_dir("nan-grad");
    let args = ["--train-iters", "50", "--save-interval", "2"];
    for rank in [1, 0] {
        let run = format!("run-{rank}");
        let out = train_p2(&dir, &run, &args, Some(&format!("{rank}:3:nan")));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(
            last_line(&err),
            format!(
                "error: step 3: the gradient is NaN, first on stage {rank} (rank {rank}); stopped before its \
                 update, the newest checkpoint is step 2 (check_for_nan_in_loss_and_grad)"
            )
        );
        // Step 3 is neither recorded nor saved, and step 2's checkpoint resumes.
        let run_dir = dir.join(&run);
        assert_eq!(latest(&run_dir), "step_000002");
        assert!(!run_dir.join("checkpoints/step_000003").exists());
        assert_eq!(metrics_lines(&run_dir).len(), 2);
        let resumed = train_p2(&dir, &run, &["--train-iters", "3", "--resume"], None);
        assert!(resumed.status.success(), "{}", stderr(&resumed));
    }
}

/// With the check off the run trains on: the NaN update is applied, every later loss is
/// NaN (null in the metrics), and the checkpoint it saves is then refused as a start, naming
/// its first tensor in the model's order (every weight took a NaN step).
#[test]
fn with_the_check_off_the_run_trains_on_and_its_checkpoint_is_refused() {
    let dir = temp_dir("nan-off");
    let off = ["--train-iters", "4", "--check-for-nan-in-loss-and-grad", "false"];
    let out = train_p2(&dir, "run", &off, Some("1:3:nan"));
    assert!(out.status.success(), "{}", stderr(&out));
    let losses: Vec<bool> = metrics_lines(&dir.join("run")).iter().map(|v| v["loss"].is_null()).collect();
    assert_eq!(losses, [false, false, false, true]);
    let resumed = train_p2(&dir, "run", &["--train-iters", "6", "--resume"], None);
    let file = dir.join("run/checkpoints/step_000004/model.safetensors");
    assert_user_error(
        &resumed,
        &format!("{}: wte.weight holds a non-finite value (NaN at element 0 of 3072)", file.display()),
    );
}

/// A learning rate no run survives: its first non-finite value stops it, before any
/// checkpoint.
#[test]
fn a_diverging_run_stops_at_its_first_non_finite_value() {
    let dir = temp_dir("nan-diverge");
    let out = train_p2(&dir, "run", &["--lr", "1e30", "--min-lr", "1e30", "--train-iters", "20"], None);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        last_line(&err),
        "error: step 2: the loss is NaN, first on stage 1 (rank 1); stopped before its update, \
         no checkpoint was written (check_for_nan_in_loss_and_grad)"
    );
    assert!(!dir.join("run/checkpoints").exists());
}

/// The case: NaN bytes written over one weight of a saved checkpoint.
#[test]
fn a_nan_written_into_a_checkpoint_weight_is_refused_at_resume() {
    let dir = temp_dir("nan-weight");
    let out = train_p2(&dir, "run", &["--train-iters", "2"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = dir.join("run/checkpoints/step_000002/model.safetensors");
    overwrite_element(&file, "h.1.mlp.c_fc.weight", 5, f32::NAN);
    // Past the checksums (a checkpoint without a manifest, or one saved with NaN weights).
    resign_manifest(file.parent().unwrap());
    let resumed = train_p2(&dir, "run", &["--train-iters", "4", "--resume"], None);
    assert_user_error(
        &resumed,
        &format!(
            "{}: h.1.mlp.c_fc.weight holds a non-finite value (NaN at element 5 of 4096)",
            file.display()
        ),
    );
}

/// Writes `value` over element `index` of tensor `name` in a safetensors file, in place.
fn overwrite_element(file: &Path, name: &str, index: usize, value: f32) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let at = 8 + n + start + 4 * index;
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    std::fs::write(file, bytes).unwrap();
}
