//! Activation offload moves memory, never results: losses and final weights are bitwise
//! those of the run without it, for every schedule and recompute policy; each stage's
//! device activation peak drops by exactly the bytes the memory model predicts, and its
//! host peak is exactly the predicted one.

mod common;
use common::*;
use std::path::Path;

/// (name, flags) of the offload settings under test, each with the recompute it goes with.
fn offloads() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let fine = |modules: &str| {
        vec![
            ("fine-grained-activation-offloading", "true".to_string()),
            ("offload-modules", modules.to_string()),
        ]
    };
    let with = |mut a: Vec<(&'static str, String)>, b: Vec<(&'static str, String)>| {
        a.extend(b);
        a
    };
    vec![
        ("core_attn", fine("core_attn")),
        ("every-module", fine("attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,mlp_fc1,mlp_act,mlp_fc2")),
        ("attn_proj+selective", with(fine("attn_proj,mlp_fc1"), selective_recompute("core_attn,mlp"))),
        (
            "recompute-inputs",
            with(full_recompute("uniform", "2"), vec![("cpu-offloading-activations", "true".to_string())]),
        ),
        (
            "block-both",
            with(
                with(full_recompute("block", "3"), fine("core_attn,mlp_act")),
                vec![("cpu-offloading-activations", "true".to_string())],
            ),
        ),
    ]
}

/// Each stage's (device activation peak, host peak, predicted device activation peak,
/// predicted host peak), from a run's report.
fn peaks(run: &Path) -> Vec<[u64; 4]> {
    let r = report(run);
    let at = |s: &serde_json::Value, key: &str| s[key].as_u64().unwrap_or_else(|| panic!("{key} in {s}"));
    r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let device = s["peak_bytes_by_category"]["activations"].as_u64().unwrap();
            [
                device,
                at(s, "host_peak_bytes"),
                at(s, "predicted_activation_peak_bytes"),
                at(s, "predicted_host_peak_bytes"),
            ]
        })
        .collect()
}

#[test]
fn offload_keeps_the_bits_and_moves_exactly_the_predicted_bytes() {
    let dir = temp_dir("offload-matrix");
    for (schedule, p) in [("1f1b", 1usize), ("1f1b", 2), ("interleaved-1f1b", 2), ("zb-h1", 2), ("zb-v", 2)] {
        for (name, offload_flags) in offloads() {
            offload_matches_the_run_without(
                &dir,
                &format!("{schedule}-p{p}-{name}"),
                schedule_flags(schedule, p),
                &offload_flags,
            );
        }
    }
}

/// With OLMo 2's order the norms' inputs, the projections' outputs, offload with the norms'
/// modules, and the projections that read no norm's output have nothing to offload.
#[test]
fn offload_of_norms_on_the_outputs_moves_exactly_the_predicted_bytes() {
    let dir = temp_dir("offload-olmo2");
    let mut model = schedule_flags("1f1b", 2);
    model.extend(llama_flags());
    model.push(("norm-placement", "output".into()));
    let every = "attn_norm,core_attn,attn_proj,mlp_norm,mlp_act,mlp_fc2";
    for (name, modules) in [("norms", "attn_norm,mlp_norm"), ("every-module", every)] {
        let offload = [
            ("fine-grained-activation-offloading", "true".to_string()),
            ("offload-modules", modules.to_string()),
        ];
        offload_matches_the_run_without(&dir, &format!("olmo2-{name}"), model.clone(), &offload);
    }
    let mut f = model;
    f.extend([
        ("fine-grained-activation-offloading", "true".to_string()),
        ("offload-modules", "mlp_fc1".to_string()),
    ]);
    let o = train(
        &config(&dir),
        &dir.join("olmo2-mlp_fc1"),
        &flags(&f).iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_user_error(
        &o,
        "command line: --offload-modules mlp_fc1: `mlp_fc1` has nothing to offload under norm_placement: \
         output: its projection reads the residual stream, which attn_norm and mlp_norm offload",
    );
}

/// The run with `offload_flags` (and `model`) against the one with their recompute alone:
/// the same bits, the host peak predicted, and the device peak's drop the predicted one.
fn offload_matches_the_run_without(
    dir: &Path,
    label: &str,
    model: Vec<(&'static str, String)>,
    offload_flags: &[(&'static str, String)],
) {
    // The same recompute without offload is the reference.
    let recompute = offload_flags.iter().filter(|(k, _)| k.starts_with("recompute")).cloned();
    let base =
        run_small(dir, &format!("{label}-without"), &flags(&[model.clone(), recompute.collect()].concat()));
    let run = run_small(dir, label, &flags(&[model, offload_flags.to_vec()].concat()));
    assert_eq!(losses(&run), losses(&base), "{label}: losses differ");
    assert!(weights(&run) == weights(&base), "{label}: weights differ");
    for (stage, (with, without)) in peaks(&run).into_iter().zip(peaks(&base)).enumerate() {
        let [device, host, predicted_device, predicted_host] = with;
        let [device_before, host_before, predicted_before, _] = without;
        assert_eq!(host_before, 0, "{label} stage {stage}: a run without offload used the host");
        assert!(predicted_host > 0, "{label} stage {stage}: offloads nothing");
        assert_eq!(host, predicted_host, "{label} stage {stage}: host peak");
        assert_eq!(
            device_before - device,
            predicted_before - predicted_device,
            "{label} stage {stage}: the device peak's drop"
        );
    }
}

#[test]
fn offload_per_stage_offloads_the_first_layers_of_each_stage() {
    let dir = temp_dir("offload-per-stage");
    let mut f = schedule_flags("1f1b", 2);
    f.extend([
        ("fine-grained-activation-offloading", "true".to_string()),
        ("offload-modules", "core_attn".to_string()),
    ]);
    let all = run_small(&dir, "all", &flags(&f));
    f.push(("offload-num-layers-per-stage", "4,0".to_string()));
    let first = run_small(&dir, "first-stage", &flags(&f));
    assert_eq!(losses(&first), losses(&all));
    let (all, first) = (peaks(&all), peaks(&first));
    // Stage 0 holds blocks 0-3 and offloads all four; stage 1 none.
    assert_eq!(first[0], all[0]);
    assert_eq!(first[1][1], 0);
    assert_eq!(first[1][3], 0);
    assert!(first[1][0] > all[1][0]);
}

/// An offload whose host peak exceeds what the host has available is one line and exit 2
/// before any rank starts: the attention core's saves of micro batches of 2^24 sequences
/// would take 1792 GiB of host memory, which no machine this runs on has free.
#[test]
fn an_offload_the_host_cannot_hold_is_an_error_before_training() {
    let dir = temp_dir("offload-host");
    let cfg = config(&dir);
    let huge = ["--micro-batch-size", "16777216", "--global-batch-size", "134217728"];
    let offload = ["--fine-grained-activation-offloading", "true", "--offload-modules", "core_attn"];
    let o = train(&cfg, &dir.join("run"), &[&huge[..], &offload].concat());
    assert_user_error(
        &o,
        "error: command line: --fine-grained-activation-offloading true: the offloaded activations would take \
         1792.00 GiB of host memory at their peak, more than the ",
    );
    assert!(
        stderr(&o).contains(" this host has available (MemAvailable); offload fewer layers"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("run").exists(), "nothing is written");
}

#[test]
fn offload_settings_that_move_nothing_are_errors_naming_the_key() {
    let dir = temp_dir("offload-errors");
    let cfg = config(&dir);
    let run = |name: &str, extra: &[&str]| {
        train(&cfg, &dir.join(name), &[&["--global-batch-size", "8"], extra].concat())
    };
    assert_user_error(
        &run("unknown", &["--fine-grained-activation-offloading", "true", "--offload-modules", "expert_fc1"]),
        "command line: --offload-modules expert_fc1: `expert_fc1` is not one of attn_norm, qkv_linear, core_attn, attn_proj, \
         mlp_norm, mlp_fc1, mlp_act, mlp_fc2",
    );
    assert_user_error(
        &run("no-switch", &["--offload-modules", "core_attn"]),
        "command line: --offload-modules core_attn: [core_attn] needs fine_grained_activation_offloading: true",
    );
    assert_user_error(
        &run(
            "dropped",
            &[
                "--fine-grained-activation-offloading",
                "true",
                "--offload-modules",
                "mlp_fc2",
                "--recompute-granularity",
                "selective",
                "--recompute-modules",
                "mlp",
            ],
        ),
        "command line: --offload-modules mlp_fc2: `mlp_fc2` has nothing to offload: selective recompute of mlp drops what it keeps",
    );
    assert_user_error(
        &run("inputs-without-full", &["--cpu-offloading-activations", "true"]),
        "command line: --cpu-offloading-activations true: true needs recompute_granularity: full",
    );
    assert_user_error(
        &run(
            "per-stage-length",
            &[
                "--cpu-offloading-activations",
                "true",
                "--recompute-granularity",
                "full",
                "--recompute-method",
                "block",
                "--recompute-num-layers",
                "1",
                "--offload-num-layers-per-stage",
                "1,1",
            ],
        ),
        "command line: --offload-num-layers-per-stage 1,1: [1, 1] has 2 entries, pipeline_model_parallel_size is 1",
    );
}

/// The planner's offload trains: on this machine's profile (its matmul peak fixed, so the
/// choice does not follow the machine's load) the small model fits 1 MiB per stage only
/// with a lever, and the plan offloads every module of two layers; over a host link of
/// 3 GB/s, it recomputes the attention core and offloads the rest; with 200 KiB of host
/// memory per device, stage 0 (holding more microbatches) recomputes and stage 1 offloads.
/// Each plan's lines pasted over the config train, with the bits of the same config without
/// the offload and each stage's host peak as predicted.
#[test]
fn the_planned_offload_trains_with_the_bits_of_the_run_without_it() {
    for (hardware, lever) in [
        ("cpu-measured,peak-tflops=0.1", "offload N=2"),
        ("cpu-measured,peak-tflops=0.1,pcie-gb-s=3", "selective core_attn + offload of the rest N=2"),
        (
            "cpu-measured,peak-tflops=0.1,pcie-gb-s=100,host-memory-gib=0.0002",
            "full/block N per stage 3,0 or offload N per stage 0,3",
        ),
    ] {
        planned_offload_trains(hardware, lever);
    }
}

fn planned_offload_trains(hardware: &str, lever: &str) {
    let dir = temp_dir("offload-plan");
    let cfg = config(&dir);
    let hw = ["--hardware", hardware, "--memory-limit", "1MiB"];
    let shape = ["--pipeline-model-parallel-size", "2", "--global-batch-size", "8"];
    let o = bin().args(["simulate", "--plan", "--config"]).arg(&cfg).args(hw).args(shape).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = String::from_utf8(o.stdout).unwrap();
    assert!(plan.contains(&format!(", memory lever {lever}: ")), "{plan}");
    let lines: serde_norway::Mapping = serde_norway::from_str(&plan).unwrap();
    let mut merged: serde_norway::Mapping =
        serde_norway::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    for (k, v) in lines {
        merged.insert(k, v);
    }
    merged.insert("global_batch_size".into(), 8.into());
    let planned = write_config(&dir, "planned.yaml", &serde_norway::to_string(&merged).unwrap());
    merged.insert("fine_grained_activation_offloading".into(), false.into());
    for key in ["offload_modules", "offload_num_layers_per_stage"] {
        merged.insert(key.into(), serde_norway::Value::Null);
    }
    let plain = write_config(&dir, "plain.yaml", &serde_norway::to_string(&merged).unwrap());
    let run = |name: &str, cfg: &Path| {
        let run_dir = dir.join(name);
        let o = train(cfg, &run_dir, &["--peak-flops", "1e9"]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        run_dir
    };
    let (with, without) = (run("planned", &planned), run("without", &plain));
    assert_eq!(losses(&with), losses(&without), "{lever}");
    assert!(weights(&with) == weights(&without), "{lever}");
    let peaks = peaks(&with);
    for (stage, [_, host, _, predicted_host]) in peaks.iter().enumerate() {
        assert_eq!(host, predicted_host, "{lever} stage {stage}");
    }
    assert!(peaks.iter().any(|[_, host, _, _]| *host > 0), "{lever}: nothing offloaded");
}
