//! Ranks as processes: under `mpirun`, every schedule gives the threads run's losses and
//! weights bit for bit (dropout and recompute on), data parallelism included; a killed or
//! failing rank ends the job quickly, naming it, with the last checkpoint whole; runs
//! resume across launchers. Each test skips, saying why, where `mpirun` is missing or the
//! binary was built without the `mpi` feature.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `mpirun` for `np` ranks of the test binary, as CI runs it: as root, more ranks than
/// cores, and waiting ranks yielding their core.
fn mpirun(np: usize) -> Option<Command> {
    mpirun_with(np, &[])
}

/// The same, with more of mpirun's own options.
fn mpirun_with(np: usize, options: &[&str]) -> Option<Command> {
    if !mpi_available() {
        return None;
    }
    let mut c = Command::new("mpirun");
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"])
        .args(options)
        .args(["-np", &np.to_string()])
        .arg(env!("CARGO_BIN_EXE_pipetrain"));
    Some(c)
}

/// Trains under `mpirun -np np`; panics unless it succeeds.
fn run_mpi(mut mpirun: Command, dir: &Path, name: &str, extra: &[String]) -> PathBuf {
    let run_dir = dir.join(name);
    let out = mpirun.args(train_args(&config(dir), &run_dir, extra)).output().unwrap();
    assert!(out.status.success(), "{name}: {}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    run_dir
}

#[test]
fn every_schedule_under_mpirun_matches_threads_bitwise() {
    let dir = temp_dir("mpi-bitwise");
    let cases = [
        ("gpipe", 2, "none"),
        ("1f1b", 2, "selective"),
        ("1f1b", 3, "full"),
        ("zb-h1", 2, "full"),
        ("zb-h1", 4, "selective"),
        ("interleaved-1f1b", 2, "selective"),
        ("gpipe", 4, "full"),
        ("zb-v", 2, "selective"),
        ("dualpipe-v", 2, "full"),
    ];
    for (schedule, p, recompute) in cases {
        let Some(mpirun) = mpirun(p) else { return };
        let mut a = vec![
            ("pipeline-schedule", schedule.to_string()),
            ("pipeline-model-parallel-size", p.to_string()),
            ("global-batch-size", "8".to_string()),
        ];
        if schedule == "interleaved-1f1b" {
            a.push(("virtual-pipeline-model-parallel-size", "2".into()));
        }
        match recompute {
            "selective" => a.push(("recompute-granularity", "selective".into())),
            "full" => a.extend([
                ("recompute-granularity", "full".to_string()),
                ("recompute-method", "uniform".into()),
                ("recompute-num-layers", "1".into()),
            ]),
            _ => {}
        }
        let name = format!("{schedule}-p{p}-{recompute}");
        let threads = run_small(&dir, &format!("{name}-threads"), &flags(&a));
        let processes = run_mpi(mpirun, &dir, &format!("{name}-mpi"), &flags(&a));
        assert_eq!(losses(&processes), losses(&threads), "{name}: losses differ from threads");
        assert!(weights(&processes) == weights(&threads), "{name}: weights differ from threads");
        let report = report(&processes);
        assert_eq!(report["stages"].as_array().unwrap().len(), p, "{name}: the report holds every rank");
    }
}

#[test]
fn data_parallel_replicas_are_bitwise_run_to_run_and_agree_with_one_replica() {
    let dir = temp_dir("mpi-dp");
    let a = flags(&[("pipeline-model-parallel-size", "2".into()), ("global-batch-size", "8".into())]);
    let Some(first) = mpirun(4) else { return };
    let one = run_mpi(first, &dir, "dp2-a", &a);
    let two = run_mpi(mpirun(4).unwrap(), &dir, "dp2-b", &a);
    assert_eq!(losses(&one), losses(&two), "dp=2 is not bitwise run to run");
    assert!(weights(&one) == weights(&two));
    let mut t = a.clone();
    t.extend(flags(&[("data-parallel-size", "2".into())]));
    let threads = run_small(&dir, "dp2-threads", &t);
    assert_eq!(losses(&one), losses(&threads), "dp=2 under MPI differs from dp=2 in threads");
    assert!(weights(&one) == weights(&threads));
    let single = run_small(&dir, "dp1", &a);
    for ((s, a, _), (_, b, _)) in losses(&one).iter().zip(losses(&single)) {
        let (a, b) = (f64::from_bits(*a), f64::from_bits(b));
        assert!(((a - b) / b).abs() < 1e-5, "step {s}: dp=2 loss {a} vs dp=1 {b}");
    }
    let report = report(&one);
    let ranks: Vec<(u64, u64)> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_u64().unwrap(), s["replica"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranks, [(0, 0), (0, 1), (1, 0), (1, 1)], "rank = dp_rank + dp * pp_rank");
}

/// The distributed optimizer across processes: MPI's reduce-scatter moves only each
/// replica's part, and the run is the threads run's bits, which are the unsharded run's.
#[test]
fn the_distributed_optimizer_under_mpirun_matches_threads_and_the_unsharded_run() {
    let dir = temp_dir("mpi-zero1");
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "8".into()),
        ("use-distributed-optimizer", "true".into()),
    ]);
    let Some(launcher) = mpirun(4) else { return };
    let processes = run_mpi(launcher, &dir, "mpi", &a);
    let mut t = a.clone();
    t.extend(flags(&[("data-parallel-size", "2".into())]));
    let threads = run_small(&dir, "threads", &t);
    let unsharded = run_mpi(
        mpirun(4).unwrap(),
        &dir,
        "unsharded",
        &flags(&[("pipeline-model-parallel-size", "2".into()), ("global-batch-size", "8".into())]),
    );
    for (name, other) in [("threads", &threads), ("the unsharded optimizer", &unsharded)] {
        assert_eq!(losses(&processes), losses(other), "differs from {name}");
        assert!(weights(&processes) == weights(other), "weights differ from {name}");
    }
}

/// Tensor-parallel ranks as processes give the threads run's bits: t = 2 with p = 2
/// (sequence parallelism, selective recompute), and t = 2 with dp = 2 (full recompute),
/// four ranks each, tensor ranks fastest.
#[test]
fn tensor_parallel_ranks_under_mpirun_match_threads_bitwise() {
    let dir = temp_dir("mpi-tp");
    let base = [("tensor-model-parallel-size", "2".to_string()), ("global-batch-size", "8".to_string())];
    let cases = [
        (
            "t2-p2-sp",
            vec![
                ("pipeline-model-parallel-size", "2".to_string()),
                ("sequence-parallel", "true".to_string()),
            ],
            selective_recompute("core_attn"),
            1,
        ),
        ("t2-dp2", vec![], full_recompute("uniform", "2"), 2),
    ];
    for (name, layout, recompute, dp) in cases {
        let Some(mpirun) = mpirun(4) else { return };
        let a = [base.to_vec(), layout, recompute].concat();
        let processes = run_mpi(mpirun, &dir, &format!("{name}-mpi"), &flags(&a));
        let threads = [a, vec![("data-parallel-size", dp.to_string())]].concat();
        let threads = run_small(&dir, &format!("{name}-threads"), &flags(&threads));
        assert_eq!(losses(&processes), losses(&threads), "{name}: losses differ from threads");
        assert!(weights(&processes) == weights(&threads), "{name}: weights differ from threads");
        let ranks: Vec<(u64, u64, u64)> = report(&processes)["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["stage"].as_u64().unwrap(),
                    s["replica"].as_u64().unwrap(),
                    s["tensor_rank"].as_u64().unwrap(),
                )
            })
            .collect();
        let order = match dp {
            1 => [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)],
            _ => [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)],
        };
        assert_eq!(ranks, order, "{name}: rank = tp_rank + t * (dp_rank + dp * pp_rank)");
    }
}

#[test]
fn a_run_resumes_from_threads_into_processes_exactly() {
    let dir = temp_dir("mpi-resume");
    // The learning rate decays over lr_decay_iters, fixed so both halves follow one schedule.
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "4".into()),
        ("lr-decay-iters", "3".into()),
    ]);
    let Some(mpirun) = mpirun(2) else { return };
    let whole = run_small(&dir, "whole", &a);
    let mut first = a.clone();
    first.extend(flags(&[("train-iters", "2".into())]));
    let run = run_small(&dir, "split", &first);
    let mut rest = a.clone();
    rest.push("--resume".into());
    run_mpi(mpirun, &dir, "split", &rest);
    let train_losses =
        |r: &Path| losses(r).into_iter().map(|(step, loss, _)| (step, loss)).collect::<Vec<_>>();
    assert_eq!(train_losses(&run), train_losses(&whole));
    assert!(weights(&run) == weights(&whole), "resumed under mpirun, the weights differ");
}

/// The pid of MPI rank `rank` among `mpirun`'s children.
fn rank_pid(mpirun_pid: u32, rank: usize) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{mpirun_pid}/task/{mpirun_pid}/children")).ok()?;
    children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| {
                env.split(|&b| b == 0).any(|kv| kv == format!("OMPI_COMM_WORLD_RANK={rank}").as_bytes())
            })
            .unwrap_or(false)
    })
}

#[test]
fn a_killed_rank_ends_the_job_within_seconds_and_the_run_resumes_exactly() {
    let dir = temp_dir("mpi-kill");
    let Some(mpirun) = mpirun(2) else { return };
    let run = dir.join("run");
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "4".into()),
        ("train-iters", "100000".into()),
        ("lr-decay-iters", "100000".into()),
        ("save-interval", "2".into()),
    ]);
    let child = spawn_until(mpirun, &config(&dir), &run, &a, 5);
    let victim = rank_pid(child.id(), 1).expect("rank 1 among mpirun's children");
    assert!(Command::new("kill").args(["-KILL", &victim.to_string()]).status().unwrap().success());
    let (out, took) = wait_with_deadline(child, Duration::from_secs(10));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("rank 1"), "the message does not name rank 1: {err}");
    eprintln!("the job ended {took:?} after rank 1 was killed");
    // The last checkpoint is whole: a resume (in threads, to a fixed step) equals a run
    // that was never interrupted.
    let saved: usize = latest(&run).trim_start_matches("step_").parse().unwrap();
    let upto = (saved + 1).to_string();
    let mut resume = a.clone();
    resume.extend(flags(&[("train-iters", upto.clone())]));
    resume.push("--resume".into());
    let o = train(&config(&dir), &run, &resume.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let mut whole = a.clone();
    whole.extend(flags(&[("train-iters", upto)]));
    let reference = run_small(&dir, "reference", &whole);
    assert!(weights_at(&run, saved + 1) == weights_at(&reference, saved + 1), "the resume is not exact");
}

#[test]
fn a_failing_rank_ends_the_job_with_its_message() {
    let dir = temp_dir("mpi-fault");
    let Some(mut mpirun) = mpirun(2) else { return };
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "4".into()),
        ("train-iters", "50".into()),
        ("save-interval", "2".into()),
    ]);
    let child = mpirun
        .env("PIPETRAIN_INJECT_FAULT", "1:3")
        .args(train_args(&config(&dir), &dir.join("run"), &a))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, _) = wait_with_deadline(child, Duration::from_secs(20));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: rank 1: stage 1: injected fault at step 3"), "{err}");
    assert_eq!(latest(&dir.join("run")), "step_000002");
}

/// A rank that stops answering without failing, as a hung process or a partitioned host
/// does: its peer waits up to the distributed timeout (here 0.02 min, 1.2 s), says what it
/// waited for and on whom, and ends the job.
#[test]
fn a_rank_that_stops_answering_ends_the_job_at_the_timeout() {
    let dir = temp_dir("mpi-stall");
    let Some(mut mpirun) = mpirun(2) else { return };
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "4".into()),
        ("train-iters", "50".into()),
        ("save-interval", "2".into()),
        ("distributed-timeout-minutes", "0.02".into()),
    ]);
    let child = mpirun
        .env("PIPETRAIN_INJECT_FAULT", "1:3:stall")
        .args(train_args(&config(&dir), &dir.join("run"), &a))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, took) = wait_with_deadline(child, Duration::from_secs(20));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line =
        "error: rank 0: step 3: stage 0: recv grad of microbatch 0 from stage 1: rank 1 (stage 1) sent \
                nothing within 1.2 s (distributed_timeout_minutes)";
    assert!(err.lines().any(|l| l == line), "{err}");
    assert!(took >= Duration::from_millis(1200), "ended after {took:?}, before the timeout");
    assert_eq!(latest(&dir.join("run")), "step_000002");
}

#[test]
fn a_world_that_p_does_not_divide_is_one_line_from_rank_0() {
    let dir = temp_dir("mpi-world");
    let Some(mut mpirun) = mpirun(3) else { return };
    let out = mpirun
        .args(train_args(
            &config(&dir),
            &dir.join("run"),
            &flags(&[("pipeline-model-parallel-size", "2".into()), ("global-batch-size", "4".into())]),
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(
        ours[0].ends_with(
            "command line: --pipeline-model-parallel-size 2: 2 does not divide the 3 ranks mpirun started"
        ),
        "{err}"
    );
    assert!(!dir.join("run").exists(), "nothing is written");
}

#[test]
fn ctrl_c_to_mpirun_saves_at_a_step_boundary() {
    let dir = temp_dir("mpi-ctrl-c");
    // On Ctrl-C, mpirun sends SIGTERM and, this many seconds later, SIGKILL: the time the
    // ranks have to reach the step boundary and save.
    let Some(mpirun) = mpirun_with(2, &["--mca", "odls_base_sigkill_timeout", "10"]) else { return };
    let run = dir.join("run");
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "4".into()),
        ("train-iters", "100000".into()),
    ]);
    let child = spawn_until(mpirun, &config(&dir), &run, &a, 2);
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let (out, _) = wait_with_deadline(child, Duration::from_secs(30));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let steps = steps_recorded(&run);
    assert_eq!(latest(&run), format!("step_{steps:06}"), "{err}");
    assert!(err.contains(&format!("interrupted: checkpoint of step {steps} saved")), "{err}");
}

#[test]
fn ranks_that_read_different_configs_stop_with_one_line() {
    let dir = temp_dir("mpi-differ");
    let Some(mut mpirun) = mpirun(1) else { return };
    let cfg = config(&dir);
    let run = dir.join("run");
    let common = [("pipeline-model-parallel-size", "2".to_string()), ("global-batch-size", "4".into())];
    let mut a = train_args(&cfg, &run, &flags(&common));
    // Two programs in one job (MPMD): the second rank is given another learning rate.
    a.extend([":", "-np", "1", env!("CARGO_BIN_EXE_pipetrain")].map(String::from));
    let mut other = common.to_vec();
    other.push(("lr", "0.5".into()));
    a.extend(train_args(&cfg, &run, &flags(&other)));
    let out = mpirun.args(&a).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        ours,
        ["error: rank 1 read a config that differs from rank 0's: key `lr`: 0.01 vs 0.5"],
        "{err}"
    );
}

/// On a GPU machine: p = 2 GPU ranks under mpirun (NCCL where each has a GPU of its own,
/// else the MPI transport on a shared GPU) give the losses of p = 2 GPU threads, bit for bit.
#[cfg(feature = "cuda")]
#[test]
fn gpu_ranks_under_mpirun_match_gpu_threads() {
    if let Err(why) = kernels::cuda::CudaDevice::new(0) {
        eprintln!("skipped: no GPU here ({why})");
        return;
    }
    let dir = temp_dir("mpi-gpu");
    let Some(mpirun) = mpirun(2) else { return };
    let a = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "8".into()),
        ("device", "cuda".into()),
    ]);
    let threads = run_small(&dir, "threads", &a);
    let processes = run_mpi(mpirun, &dir, "processes", &a);
    assert_eq!(losses(&processes), losses(&threads), "GPU ranks under mpirun differ from GPU threads");
    assert!(weights(&processes) == weights(&threads));
}
