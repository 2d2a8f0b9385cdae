//! One writer per run dir: a second `train` on a run dir a live run is writing is refused
//! (exit 2, naming the live run's pid) and touches nothing; the lock of a killed run does
//! not block the next resume.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn train_cmd(dir: &Path, extra: &[&str]) -> Command {
    let mut c = bin();
    c.args(["train", "--quiet", "--peak-flops", "1e9", "--global-batch-size", "2", "--config"])
        .arg(config(dir))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .args(extra);
    c
}

fn wait_for_checkpoint(run_dir: &Path, child: &mut Child) {
    let start = Instant::now();
    while !run_dir.join("checkpoints/latest").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the first run ended early");
        assert!(start.elapsed() < Duration::from_secs(30), "no checkpoint written");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_writer_is_refused_and_a_killed_runs_lock_does_not_block() {
    let dir = temp_dir("run-lock");
    let run_dir = dir.join("run");
    // The first run's stderr is kept, so that a failure below can say why it ended.
    let first_stderr = dir.join("first.stderr");
    let mut first = train_cmd(&dir, &["--train-iters", "100000", "--save-interval", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&first_stderr).unwrap())
        .spawn()
        .unwrap();
    wait_for_checkpoint(&run_dir, &mut first);
    let pid = first.id();
    let config_before = std::fs::read(run_dir.join("config.yaml")).unwrap();
    for extra in [&["--resume"][..], &[]] {
        let mut args = vec!["--train-iters", "5", "--lr", "5e-3"];
        args.extend_from_slice(extra);
        let second = train_cmd(&dir, &args).output().unwrap();
        if let Some(status) = first.try_wait().unwrap() {
            let said = std::fs::read_to_string(&first_stderr).unwrap();
            panic!("the first run ended ({status}) before the refusals were checked: {said}");
        }
        assert_user_error(
            &second,
            &format!(
                "{}: another train (pid {pid}) is writing this run dir; wait for it to end or stop it",
                run_dir.display()
            ),
        );
    }
    // The refused runs wrote nothing: the first run's config stands.
    assert_eq!(std::fs::read(run_dir.join("config.yaml")).unwrap(), config_before);

    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    first.wait().unwrap();
    let lock = std::fs::read_to_string(run_dir.join("train.lock")).unwrap();
    assert_eq!(lock, format!("{pid}\n"), "the killed run's pid stays in the file");
    let latest = std::fs::read_to_string(run_dir.join("checkpoints/latest")).unwrap();
    let step: usize = latest.trim().trim_start_matches("step_").parse().unwrap();
    let resumed = train_cmd(&dir, &["--train-iters", &(step + 1).to_string(), "--resume"]).output().unwrap();
    assert!(resumed.status.success(), "{}", stderr(&resumed));
}
