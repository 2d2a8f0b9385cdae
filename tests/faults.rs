//! Failures end the run cleanly: a rank that errors or panics stops every rank within
//! seconds with that rank's message and a non-zero exit, a rank that stops answering ends
//! the run at the distributed timeout, and the last checkpoint stays intact; Ctrl-C stops
//! at a step boundary with a checkpoint.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn spawn_train(dir: &Path, run: &str, extra: &[&str], fault: Option<&str>) -> Child {
    let data = synthetic_data(dir);
    let cfg = write_config(
        dir,
        "model.yaml",
        &format!("{MODEL}train_data_path: {}\nvalid_data_path: {}\n", data.display(), data.display()),
    );
    let mut c = bin();
    c.args(["train", "--quiet", "--peak-flops", "1e9", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(dir.join(run))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(f) = fault {
        c.env("PIPETRAIN_INJECT_FAULT", f);
    }
    c.spawn().unwrap()
}

/// Trains with `fault` injected and expects the run to fail, exit 1, within 20 s: its
/// stderr and how long it took.
fn failed_run(dir: &Path, run: &str, args: &[&str], fault: &str) -> (String, Duration) {
    let (out, took) = wait_with_deadline(spawn_train(dir, run, args, Some(fault)), Duration::from_secs(20));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    (err, took)
}

#[test]
fn a_failing_stage_stops_every_stage_with_its_message() {
    let dir = temp_dir("faults");
    let common = [
        "--pipeline-model-parallel-size",
        "4",
        "--global-batch-size",
        "8",
        "--train-iters",
        "50",
        "--save-interval",
        "2",
    ];
    for (fault, message) in [
        ("2:3", "error: rank 2: stage 2: injected fault at step 3"),
        ("1:3:panic", "error: rank 1 panicked: injected fault at step 3"),
    ] {
        let run = format!("run-{}", fault.replace(':', "-"));
        let (err, _) = failed_run(&dir, &run, &common, fault);
        assert!(err.trim_end().ends_with(message), "{err}");
        // Step 2's checkpoint is whole and still the latest: it loads for a resume.
        assert_eq!(latest(&dir.join(&run)), "step_000002");
        let (resumed, _) = wait_with_deadline(
            spawn_train(
                &dir,
                &run,
                &[
                    "--pipeline-model-parallel-size",
                    "4",
                    "--global-batch-size",
                    "8",
                    "--train-iters",
                    "4",
                    "--resume",
                ],
                None,
            ),
            Duration::from_secs(20),
        );
        assert!(resumed.status.success(), "{}", stderr(&resumed));
    }
}

/// An error the device recorded outside any call (how CUDA's asynchronous errors arrive;
/// injected here, so the path is checked without a GPU) is taken once per step: one line
/// naming the rank, the step and the device, exit 1, and the last checkpoint intact.
#[test]
fn a_recorded_device_error_is_one_line_naming_rank_and_step() {
    let dir = temp_dir("faults-device");
    let args = [
        "--pipeline-model-parallel-size",
        "2",
        "--global-batch-size",
        "4",
        "--train-iters",
        "50",
        "--save-interval",
        "2",
    ];
    let (err, _) = failed_run(&dir, "run", &args, "1:3:device");
    let line = err.trim_end().lines().last().unwrap_or_default();
    assert!(line.starts_with("error: rank 1: step 3: cpu ("), "{err}");
    assert!(line.ends_with(" threads): injected device error"), "{err}");
    assert_eq!(latest(&dir.join("run")), "step_000002");
}

/// A rank that stops answering without failing (a hung thread) is waited for up to the
/// distributed timeout (here 0.02 min, 1.2 s); then the run ends, although that rank's
/// thread never does: one line naming the step, what the waiting rank waited for and the
/// silent peer, exit 1, and the last checkpoint intact.
#[test]
fn a_rank_that_stops_answering_ends_the_run_at_the_timeout() {
    let dir = temp_dir("faults-stall");
    let args = [
        "--pipeline-model-parallel-size",
        "2",
        "--global-batch-size",
        "4",
        "--train-iters",
        "50",
        "--save-interval",
        "2",
        "--distributed-timeout-minutes",
        "0.02",
    ];
    let (err, took) = failed_run(&dir, "run", &args, "1:3:stall");
    assert_eq!(
        err.trim_end().lines().last().unwrap_or_default(),
        "error: rank 0: step 3: stage 0: recv grad of microbatch 0 from stage 1: rank 1 (stage 1) sent \
         nothing within 1.2 s (distributed_timeout_minutes)",
        "{err}"
    );
    assert!(took >= Duration::from_millis(1200), "ended after {took:?}, before the timeout");
    assert_eq!(latest(&dir.join("run")), "step_000002");
}

/// A tensor-parallel peer that fails ends the job with its message, as a pipeline peer
/// does; one that stops answering ends it at the timeout, named, with the layer's
/// collective that waited; the last checkpoint is whole either way.
#[test]
fn a_tensor_parallel_peer_that_fails_or_stalls_ends_the_run() {
    let dir = temp_dir("faults-tensor");
    let args = [
        "--tensor-model-parallel-size",
        "2",
        "--global-batch-size",
        "4",
        "--train-iters",
        "50",
        "--save-interval",
        "2",
        "--distributed-timeout-minutes",
        "0.02",
    ];
    let (err, _) = failed_run(&dir, "fails", &args, "1:3");
    assert!(err.trim_end().ends_with("error: rank 1: stage 0: injected fault at step 3"), "{err}");
    assert_eq!(latest(&dir.join("fails")), "step_000002");
    let (err, took) = failed_run(&dir, "stalls", &args, "1:3:stall");
    assert_eq!(
        err.trim_end().lines().last().unwrap_or_default(),
        "error: rank 0: step 3: stage 0: backward of microbatch 0, in the tensor-parallel group: all-reduce over \
         the tensor-parallel group: rank 1 (stage 0, tensor rank 1) did not join within 1.2 s \
         (distributed_timeout_minutes)",
        "{err}"
    );
    assert!(took >= Duration::from_millis(1200), "ended after {took:?}, before the timeout");
    assert_eq!(latest(&dir.join("stalls")), "step_000002");
}

#[test]
fn ctrl_c_stops_at_a_step_boundary_with_a_checkpoint() {
    let dir = temp_dir("ctrl-c");
    let child = spawn_train(
        &dir,
        "run",
        &["--train-iters", "100000", "--pipeline-model-parallel-size", "2", "--global-batch-size", "4"],
        None,
    );
    let metrics = dir.join("run/metrics.jsonl");
    let start = Instant::now();
    while std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) < 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "no steps recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let (out, _) = wait_with_deadline(child, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let steps = std::fs::read_to_string(&metrics).unwrap().lines().count();
    assert_eq!(latest(&dir.join("run")), format!("step_{steps:06}"));
    assert!(stderr(&out).contains(&format!("checkpoint of step {steps} saved")), "{}", stderr(&out));
}
