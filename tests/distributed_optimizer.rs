//! `use_distributed_optimizer` (ZeRO stage 1) with the threads backend: the replicas
//! reduce-scatter their gradients, each steps its own part of every parameter and they
//! gather the parts, and the run is bitwise the unsharded one (losses, weights and the
//! saved moments) for every schedule and stage count, with tensor parallelism and for the
//! Llama family; each replica's moments take its part's bytes, the two replicas' together
//! the unsharded bytes, and the predicted peak moves by exactly what the last replica's
//! measured peak does; checkpoints keep their format, so a run resumes across the switch;
//! with one replica it is a note.

mod common;
use common::*;
use std::path::{Path, PathBuf};

/// The model's run at dp = 2 (global batch 8), with `extra` flags.
fn dp2(dir: &Path, name: &str, sharded: bool, extra: &[(&str, String)]) -> PathBuf {
    let mut a = vec![
        ("global-batch-size", "8".to_string()),
        ("data-parallel-size", "2".into()),
        ("use-distributed-optimizer", sharded.to_string()),
    ];
    a.extend(extra.iter().cloned());
    run_small(dir, name, &flags(&a))
}

fn moments(run_dir: &Path, step: usize) -> Vec<u8> {
    std::fs::read(run_dir.join(format!("checkpoints/step_{step:06}/trainer_state.safetensors"))).unwrap()
}

#[test]
fn sharded_runs_are_bitwise_the_unsharded_ones_for_every_schedule() {
    let dir = temp_dir("zero1-bitwise");
    // (schedule, p, recompute and chunk flags)
    type Case = (&'static str, usize, &'static [(&'static str, &'static str)]);
    let cases: [Case; 6] = [
        ("1f1b", 1, &[]),
        ("1f1b", 2, &[("recompute-granularity", "selective")]),
        (
            "zb-h1",
            4,
            &[
                ("recompute-granularity", "full"),
                ("recompute-method", "uniform"),
                ("recompute-num-layers", "1"),
            ],
        ),
        ("interleaved-1f1b", 2, &[("virtual-pipeline-model-parallel-size", "2")]),
        // Tensor-parallel ranks beside the replicas: the norm adds each rank's parts of its
        // shards, and a whole parameter's once.
        ("1f1b", 2, &[("tensor-model-parallel-size", "2"), ("sequence-parallel", "true")]),
        // The Llama family: an untied output layer, no biases.
        ("1f1b", 2, LLAMA),
    ];
    for (i, (schedule, p, more)) in cases.into_iter().enumerate() {
        let mut extra = vec![
            ("pipeline-schedule", schedule.to_string()),
            ("pipeline-model-parallel-size", p.to_string()),
        ];
        extra.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
        let name = format!("{i}-{schedule}-p{p}");
        let whole = dp2(&dir, &format!("{name}-unsharded"), false, &extra);
        let sharded = dp2(&dir, &format!("{name}-sharded"), true, &extra);
        assert_eq!(losses(&sharded), losses(&whole), "{name}: losses");
        assert!(weights(&sharded) == weights(&whole), "{name}: weights");
        assert!(moments(&sharded, 3) == moments(&whole, 3), "{name}: the saved AdamW moments");
    }
}

/// The parameters (and gradients) each of the model's two stages owns: 4 GPT-2 blocks of 12,
/// and the token and position embeddings on the first, the final LayerNorm's two on the last
/// (its copy of the tied embedding is the first stage's to count).
const PARAMETERS: u64 = 4 * 12 + 2;

/// Each rank's peak bytes of AdamW moments, its whole peak and its predicted peak, by
/// (stage, replica).
fn memory(run_dir: &Path) -> Vec<((u64, u64), [u64; 3])> {
    let report = report(run_dir);
    let mut ranks: Vec<_> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let at = |k: &str| r[k].as_u64().unwrap();
            let optimizer = r["peak_bytes_by_category"]["optimizerstate"].as_u64().unwrap();
            ((at("stage"), at("replica")), [optimizer, at("peak_bytes"), at("predicted_peak_bytes")])
        })
        .collect();
    ranks.sort();
    ranks
}

#[test]
fn each_replica_keeps_its_part_of_the_moments_and_the_prediction_follows() {
    let dir = temp_dir("zero1-memory");
    let p2 = [("pipeline-model-parallel-size", "2".to_string())];
    let (whole, sharded) =
        (memory(&dp2(&dir, "unsharded", false, &p2)), memory(&dp2(&dir, "sharded", true, &p2)));
    assert_eq!(whole.len(), 4, "2 stages x 2 replicas");
    for stage in 0..2 {
        let [w0, w1] = [0, 1].map(|r| whole[2 * stage + r].1);
        let [s0, s1] = [0, 1].map(|r| sharded[2 * stage + r].1);
        let [optimizer, _, predicted] = w0;
        assert_eq!(w1[0], optimizer, "stage {stage}: unsharded replicas hold the same moments");
        // The replicas' parts tile every parameter: together they hold the unsharded bytes,
        // each half of them to within an element (8 bytes) per parameter.
        assert_eq!(s0[0] + s1[0], optimizer, "stage {stage}: {} + {} bytes", s0[0], s1[0]);
        assert!(s0[0] <= s1[0] && s1[0] - s0[0] <= 8 * PARAMETERS, "stage {stage}: {} vs {}", s0[0], s1[0]);
        // The last replica's part is the larger: the stage's prediction is its bytes, and
        // its measured peak falls by exactly the predicted saving.
        let saving = optimizer - s1[0];
        assert_eq!(predicted - s1[2], saving, "stage {stage}: predicted peaks {predicted} and {}", s1[2]);
        // The unsharded replica also reads a sum of squares per replica part of each
        // gradient, the sharded one its own part's alone: one f64 slot less per parameter.
        assert_eq!(
            w1[1] - s1[1],
            saving + 8 * PARAMETERS,
            "stage {stage}: measured peaks {} and {}",
            w1[1],
            s1[1]
        );
    }
}

#[test]
fn a_run_resumes_across_the_switch_exactly() {
    let dir = temp_dir("zero1-resume");
    let straight = dp2(&dir, "straight", false, &[]);
    let two = [("train-iters", "2".to_string()), ("lr-decay-iters", "3".into())];
    let resumed = dp2(&dir, "resumed", true, &two);
    let mut more = flags(&[
        ("global-batch-size", "8".to_string()),
        ("data-parallel-size", "2".into()),
        ("use-distributed-optimizer", "false".into()),
        ("lr-decay-iters", "3".into()),
    ]);
    more.push("--resume".into());
    run_small(&dir, "resumed", &more);
    // The training losses: the first part's last step also evaluated, as a run's last does.
    let train_losses = |run: &Path| losses(run).into_iter().map(|(s, l, _)| (s, l)).collect::<Vec<_>>();
    assert_eq!(train_losses(&resumed), train_losses(&straight), "sharded for 2 steps, then unsharded");
    assert!(weights(&resumed) == weights(&straight));
    assert!(moments(&resumed, 3) == moments(&straight, 3));
}

#[test]
fn with_one_replica_the_switch_is_a_note() {
    let dir = temp_dir("zero1-dp1");
    let batch = ["--global-batch-size", "4"];
    let o = train(
        &config(&dir),
        &dir.join("run"),
        &[&batch[..], &["--peak-flops", "1e9", "--use-distributed-optimizer", "true"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let note =
        "note: command line: --use-distributed-optimizer true: with one data-parallel replica it shards \
                nothing; the optimizer runs unsharded\n";
    assert!(stderr(&o).starts_with(note), "{}", stderr(&o));
    let plain = run_small(&dir, "plain", &batch.map(String::from));
    assert_eq!(losses(&dir.join("run")), losses(&plain));
}
