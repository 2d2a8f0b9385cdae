//! End-to-end: `pipetrain train` learns, is deterministic, resumes bit for bit, and writes
//! what a user expects.

mod common;
use common::*;

#[test]
fn two_runs_of_one_config_give_bitwise_identical_losses() {
    let dir = temp_dir("determinism");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let a = train(&cfg, &dir.join("a"), &[]);
    assert!(a.status.success(), "{}", stderr(&a));
    let b = train(&cfg, &dir.join("b"), &[]);
    assert!(b.status.success(), "{}", stderr(&b));
    let (la, lb) = (losses(&dir.join("a")), losses(&dir.join("b")));
    assert_eq!(la.len(), 4);
    assert_eq!(la, lb);
    // Dropout is on and keyed by the step: a different seed gives different losses.
    let c = train(&cfg, &dir.join("c"), &["--seed", "8"]);
    assert!(c.status.success(), "{}", stderr(&c));
    assert_ne!(losses(&dir.join("c")), la);
}

#[test]
fn resume_continues_bit_for_bit() {
    let dir = temp_dir("resume");
    let cfg = write_config(&dir, "c.yaml", &format!("{SMALL}lr_decay_iters: 6\n"));
    let full = train(&cfg, &dir.join("full"), &["--train-iters", "6"]);
    assert!(full.status.success(), "{}", stderr(&full));
    let first = train(&cfg, &dir.join("split"), &["--train-iters", "3"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = train(&cfg, &dir.join("split"), &["--train-iters", "6", "--resume"]);
    assert!(second.status.success(), "{}", stderr(&second));
    // Training losses match everywhere; validation ran at every eval_interval step in both
    // (the first part also evaluated at its last step, 3).
    let (split, full) = (losses(&dir.join("split")), losses(&dir.join("full")));
    let train_only = |v: &[(u64, u64, Option<u64>)]| v.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>();
    assert_eq!(train_only(&split), train_only(&full));
    let at_even =
        |v: &[(u64, u64, Option<u64>)]| v.iter().filter(|x| x.0 % 2 == 0).map(|x| x.2).collect::<Vec<_>>();
    assert_eq!(at_even(&split), at_even(&full));
    assert!(at_even(&full).iter().all(Option::is_some));
    // The resumed run's chart goes on from the first part's: the train loss and its moving
    // average are drawn from the same numbers as the unbroken run's, and the val points
    // are the unbroken run's plus the first part's last eval.
    let points = |run: &str| {
        let svg = std::fs::read_to_string(dir.join(run).join("loss.svg")).unwrap();
        svg.lines()
            .filter_map(|l| l.strip_prefix("<polyline points=\""))
            .map(|l| l.split('"').next().unwrap().split(' ').map(String::from).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let (split, full) = (points("split"), points("full"));
    assert_eq!(split[0].len(), 6, "a point per step: {:?}", split[0]);
    assert_eq!(split[..2], full[..2]);
    assert_eq!((split[2].len(), full[2].len()), (4, 3));
    assert!(full[2].iter().all(|p| split[2].contains(p)), "{:?} {:?}", split[2], full[2]);
}

#[test]
fn a_run_writes_metrics_report_and_checkpoint_and_learns() {
    let dir = temp_dir("outputs");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let run = dir.join("run");
    let o = train(
        &cfg,
        &run,
        &[
            "--train-iters",
            "8",
            "--hidden-dropout",
            "0",
            "--attention-dropout",
            "0",
            "--lr",
            "0.01",
            "--min-lr",
            "0.001",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 8);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], (i + 1) as u64);
        for key in ["loss", "lr", "tokens_per_s"] {
            assert!(l[key].as_f64().unwrap().is_finite(), "{key} in {l}");
        }
        assert_eq!(l["val_loss"].is_number(), (i + 1) % 2 == 0, "{l}");
    }
    let first = lines[0]["loss"].as_f64().unwrap();
    let last = lines[7]["loss"].as_f64().unwrap();
    assert!((first - (50257f64).ln()).abs() < 0.1, "initial loss {first} is not ln(V)");
    assert!(last < first - 0.5, "loss went {first} -> {last}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    for needle in ["final train loss", "final val loss", "tokens/s", "MFU", "stage 0 peak"] {
        assert!(stdout.contains(needle), "{needle} missing from summary:\n{stdout}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("report.json")).unwrap()).unwrap();
    assert!(report["mfu"].as_f64().unwrap() > 0.0);
    assert!(run.join("checkpoints/latest").exists());
    let chart = run.join("loss.svg");
    assert!(stdout.contains(&format!("loss chart       {}", chart.display())), "{stdout}");
    assert_eq!(report["loss_chart"], chart.to_str().unwrap());
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4, "train, moving average, val, tokens/s");
    assert_eq!(svg.matches("<circle").count(), 4, "a marker per eval");
}

#[test]
fn a_recompute_alias_shows_as_its_canonical_form_and_the_summary_ends_with_a_sample() {
    let dir = temp_dir("alias-sample");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let run = dir.join("run");
    // Not --quiet: the summary ends with a greedy sample. A switch given without a value.
    let o = bin()
        .args(["train", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(&run)
        .args(["--train-iters", "2", "--checkpoint-activations"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let canonical = "recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1";
    let described = format!("{canonical} (given as checkpoint_activations: true)");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(&format!("config           {described}")), "{stdout}");
    let last = stdout.lines().last().unwrap();
    assert!(last.starts_with("sample (greedy)  \"") && last.ends_with('"'), "{stdout}");
    let yaml = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(yaml.starts_with(&format!("# {described}\n")), "{yaml}");
    for line in ["recompute_granularity: full\n", "recompute_method: uniform\n", "recompute_num_layers: 1\n"]
    {
        assert!(yaml.contains(line), "{line} missing from {yaml}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("report.json")).unwrap()).unwrap();
    assert_eq!(
        report["config_aliases"],
        serde_json::json!([{ "given": "checkpoint_activations: true", "means": canonical }])
    );
    let sample = report["sample"].as_str().unwrap();
    assert!(!sample.is_empty());
    assert_eq!(format!("sample (greedy)  {sample:?}"), last);
    // It is the saved final model's: generate from the run dir says the same.
    let g = bin()
        .args(["generate", "--checkpoint"])
        .arg(&run)
        .args(["--temperature", "0", "--max-new-tokens", "24"])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", stderr(&g));
    assert_eq!(String::from_utf8_lossy(&g.stdout), format!("<|endoftext|>{sample}\n"));
    // The stage runs the recompute the alias means.
    assert!(stdout.contains("stage 0 recompute saved"), "{stdout}");
}

#[test]
fn a_resume_refuses_another_model_and_notes_a_changed_setting() {
    let dir = temp_dir("resume-changes");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let run = dir.join("run");
    let first = train(&cfg, &run, &["--train-iters", "2"]);
    assert!(first.status.success(), "{}", stderr(&first));
    // Four heads of 16 or eight of 8: the same tensors, another model.
    let other = train(&cfg, &run, &["--resume", "--train-iters", "3", "--num-attention-heads", "8"]);
    let ck = run.join("checkpoints").join("step_000002");
    assert_user_error(
        &other,
        &format!(
            "error: command line: --num-attention-heads 8: {} holds a model with num_attention_heads 4, not 8",
            ck.display()
        ),
    );
    assert_eq!((steps_recorded(&run), latest(&run)), (2, "step_000002".to_string()));
    // A changed learning rate trains on, saying so; the stage count changes nothing.
    let flags = ["--resume", "--lr", "2e-3", "--lr-decay-iters", "4", "--pipeline-model-parallel-size", "2"];
    let lowered = train(&cfg, &run, &[&flags[..], &["--train-iters", "3"]].concat());
    assert!(lowered.status.success(), "{}", stderr(&lowered));
    let notes = |o: &std::process::Output| -> Vec<String> {
        stderr(o).lines().filter(|l| l.starts_with("note:")).map(String::from).collect()
    };
    let at = format!("note: resuming {} at step 2 with", run.display());
    assert_eq!(
        notes(&lowered),
        [
            format!("{at} lr 0.002, where the run had 0.001"),
            format!("{at} lr_decay_iters 4, where the run had none")
        ]
    );
    // The next resume compares with the settings the last steps were trained with.
    let again = train(&cfg, &run, &[&flags[..], &["--train-iters", "4"]].concat());
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(notes(&again), Vec::<String>::new());
    assert_eq!(steps_recorded(&run), 4);
}

#[test]
fn a_run_resumes_with_another_stage_count() {
    let dir = temp_dir("resume-p");
    let f = |p: &str, iters: &str| {
        flags(&[
            ("pipeline-model-parallel-size", p.into()),
            ("global-batch-size", "8".into()),
            ("train-iters", iters.into()),
            ("lr-decay-iters", "6".into()),
        ])
    };
    let full = run_small(&dir, "full", &f("1", "6"));
    run_small(&dir, "split", &f("1", "3"));
    let mut resume = f("4", "6");
    resume.push("--resume".into());
    let resumed = run_small(&dir, "split", &resume);
    let train_only = |v: Vec<(u64, u64, Option<u64>)>| v.into_iter().map(|x| (x.0, x.1)).collect::<Vec<_>>();
    assert_eq!(train_only(losses(&resumed)), train_only(losses(&full)));
    assert!(weights_at(&resumed, 6) == weights_at(&full, 6));
}

#[test]
fn tokenize_export_and_eval_round_trip() {
    let dir = temp_dir("tokenize-export-eval");
    let text = dir.join("in.txt");
    std::fs::write(&text, "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.\n".repeat(40)).unwrap();
    let bin_path = dir.join("out.bin");
    let tok = bin().arg("tokenize").arg(&text).arg(&bin_path).output().unwrap();
    assert!(tok.status.success(), "{}", stderr(&tok));
    assert!(String::from_utf8_lossy(&tok.stdout).contains("tokens"));
    // Refuses to overwrite.
    let again = bin().arg("tokenize").arg(&text).arg(&bin_path).output().unwrap();
    assert_user_error(&again, "out.bin");

    let cfg = write_config(&dir, "c.yaml", SMALL);
    let run = dir.join("run");
    let o = train(&cfg, &run, &["--train-iters", "2", "--peak-flops", "1e9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hf = dir.join("hf");
    let ex = bin().args(["export", "--checkpoint"]).arg(&run).arg("--hf").arg(&hf).output().unwrap();
    assert!(ex.status.success(), "{}", stderr(&ex));
    assert!(hf.join("config.json").exists() && hf.join("model.safetensors").exists());
    let eval = |ck: &std::path::Path| {
        let o = bin()
            .args(["eval", "--windows", "3", "--checkpoint"])
            .arg(ck)
            .arg("--data")
            .arg(&bin_path)
            .args(["--seq-length", "32"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let from_run = eval(&run);
    assert_eq!(from_run, eval(&hf));
    let loss: f64 = from_run.trim().parse().unwrap();
    assert!(loss > 5.0 && loss < 11.5, "{loss}");

    // And a run can start from the exported Hugging Face directory: its first loss is the
    // loss the weights give, not a fresh initialisation's ln(V).
    let started = train(
        &cfg,
        &dir.join("from-hf"),
        &["--train-iters", "1", "--load", hf.to_str().unwrap(), "--peak-flops", "1e9"],
    );
    assert!(started.status.success(), "{}", stderr(&started));
    let fresh = losses(&dir.join("run"))[0].1;
    assert_ne!(losses(&dir.join("from-hf"))[0].1, fresh);
}
