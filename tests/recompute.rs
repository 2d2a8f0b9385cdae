//! Activation recompute changes memory and time, never results: with dropout on, losses and
//! final weights are bitwise identical across every policy, schedule and stage count, and
//! the activation memory the device ledger measures is what the memory model predicts.

mod common;
use common::*;

/// (name, flags) of every policy under test.
fn policies() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    vec![
        ("none", vec![]),
        ("uniform-1", full_recompute("uniform", "1")),
        ("uniform-2", full_recompute("uniform", "2")),
        ("uniform-3", full_recompute("uniform", "3")),
        ("block-1", full_recompute("block", "1")),
        ("block-2", full_recompute("block", "2")),
        ("block-all", full_recompute("block", "8")),
        ("selective-core_attn", selective_recompute("core_attn")),
        ("selective-mlp", selective_recompute("mlp")),
        ("selective-layernorm", selective_recompute("layernorm")),
        ("selective-all", selective_recompute("core_attn,mlp,layernorm")),
        (
            "per-stage",
            vec![("recompute-granularity", "full".to_string()), ("recompute-method", "uniform".to_string())],
        ),
    ]
}

/// `recompute_num_layers_per_stage` for `p` stages: more recompute on early stages, which
/// hold more microbatches under 1F1B, none on the last.
fn per_stage_counts(p: usize) -> String {
    (0..p).map(|r| (p - 1 - r).to_string()).collect::<Vec<_>>().join(",")
}

#[test]
fn every_policy_schedule_and_stage_count_gives_the_same_bits_and_predicted_memory() {
    let dir = temp_dir("recompute-matrix");
    let base = run_small(&dir, "reference", &flags(&schedule_flags("1f1b", 1)));
    let (base_losses, base_weights) = (losses(&base), weights(&base));
    for (policy, policy_flags) in policies() {
        for p in [1usize, 2, 4] {
            for schedule in ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"] {
                if schedule == "interleaved-1f1b" && p == 1 {
                    continue;
                }
                let name = format!("{policy}-{schedule}-p{p}");
                let mut f = schedule_flags(schedule, p);
                f.extend(policy_flags.iter().cloned());
                if policy == "per-stage" {
                    f.push(("recompute-num-layers-per-stage", per_stage_counts(p)));
                }
                let r = run_small(&dir, &name, &flags(&f));
                assert_eq!(losses(&r), base_losses, "{name}: losses differ");
                assert!(weights(&r) == base_weights, "{name}: weights differ");
                for (i, s) in report(&r)["stages"].as_array().unwrap().iter().enumerate() {
                    let measured = s["peak_bytes_by_category"]["activations"].as_f64().unwrap();
                    let predicted = s["predicted_activation_peak_bytes"].as_f64().unwrap();
                    assert!(
                        (measured - predicted).abs() <= 0.02 * predicted,
                        "{name} stage {i}: measured {measured} activation bytes, predicted {predicted}"
                    );
                }
            }
        }
    }
}

#[test]
fn one_f_one_b_stage_r_holds_at_most_min_p_minus_r_m_microbatches() {
    let dir = temp_dir("recompute-inflight");
    for (p, m) in [(4usize, 8usize), (4, 2), (3, 5)] {
        let f = vec![
            ("pipeline-model-parallel-size", p.to_string()),
            ("global-batch-size", (2 * m).to_string()),
            ("num-layers-per-stage", if p == 4 { "2,2,2,2".into() } else { "3,3,2".into() }),
        ];
        let r = run_small(&dir, &format!("p{p}-m{m}"), &flags(&f));
        let one = run_small(
            &dir,
            &format!("p{p}-m{m}-one-microbatch"),
            &flags(&[f[0].clone(), ("global-batch-size", "2".into()), f[2].clone()]),
        );
        for (rank, (s, s1)) in report(&r)["stages"]
            .as_array()
            .unwrap()
            .iter()
            .zip(report(&one)["stages"].as_array().unwrap())
            .enumerate()
        {
            let expected = (p - rank).min(m);
            assert_eq!(s["max_in_flight"], expected as u64, "p={p} m={m} stage {rank}");
            // Through the ledger: the activation peak is exactly that many microbatches'
            // stashes (every microbatch's stash on a stage is the same size).
            let per_microbatch = s1["peak_bytes_by_category"]["activations"].as_u64().unwrap();
            assert_eq!(
                s["peak_bytes_by_category"]["activations"].as_u64().unwrap(),
                expected as u64 * per_microbatch,
                "p={p} m={m} stage {rank}"
            );
        }
    }
}

#[test]
fn the_report_gives_each_stages_policy_what_it_kept_and_saved_and_the_recompute_time() {
    let dir = temp_dir("recompute-report");
    let data = synthetic_data(&dir);
    let cfg = write_config(
        &dir,
        "model.yaml",
        &format!("{MODEL}train_data_path: {}\nvalid_data_path: {}\n", data.display(), data.display()),
    );
    let stages_of = |name: &str, extra: &[&str]| {
        let run_dir = dir.join(name);
        let o = train(
            &cfg,
            &run_dir,
            &[
                &["--peak-flops", "1e9", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8"],
                extra,
            ]
            .concat(),
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        (String::from_utf8(o.stdout).unwrap(), report(&run_dir)["stages"].as_array().unwrap().clone())
    };
    let (_, none) = stages_of("none", &[]);
    let (out, selective) = stages_of("selective", &["--recompute-granularity", "selective"]);
    for (rank, (n, s)) in none.iter().zip(&selective).enumerate() {
        let bytes = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
        assert!(s["holds"].as_str().unwrap().ends_with("recompute selective (core_attn)"), "{s}");
        assert!(n["holds"].as_str().unwrap().ends_with("recompute none"), "{n}");
        // Kept: what the ledger measured, as predicted; saved: against the run without
        // recompute, whose prediction the report also gives.
        let kept = bytes(s, "predicted_activation_peak_bytes");
        assert_eq!(bytes(&s["peak_bytes_by_category"], "activations"), kept);
        let without = bytes(s, "predicted_activation_peak_bytes_without_recompute");
        assert_eq!(without, bytes(n, "predicted_activation_peak_bytes"), "stage {rank}");
        assert!(kept < without, "stage {rank}: {s}");
        assert!(s["recompute_s"].as_f64().unwrap() > 0.0 && n["recompute_s"].as_f64().unwrap() == 0.0);
        let pct = format!("({:.0}%)", 100.0 * (without - kept) as f64 / without as f64);
        let line = out.lines().find(|l| l.starts_with(&format!("stage {rank} recompute saved "))).unwrap();
        assert!(line.contains(&pct) && line.contains(", recomputing took "), "{line}");
    }
}
