//! Pipeline parallelism changes nothing but speed: for every schedule, stage count and
//! microbatch count (dropout on), losses and final weights are bitwise those of p = 1. The V
//! schedules (zb-v, dualpipe-v) hold the embedding and the head both on stage 0, so their
//! tied gradient is summed there with no exchange.

mod common;
use common::*;

#[test]
fn every_schedule_and_stage_count_matches_one_stage_bitwise() {
    let dir = temp_dir("pipeline-bitwise");
    for m in [1usize, 3, 4, 8] {
        let gb = (2 * m).to_string();
        let base = run_small(&dir, &format!("p1-m{m}"), &flags(&[("global-batch-size", gb.clone())]));
        let (base_losses, base_weights) = (losses(&base), weights(&base));
        for schedule in ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "dualpipe-v"] {
            for p in 1..=4usize {
                let interleaved = schedule == "interleaved-1f1b";
                // Megatron's interleaving needs p >= 2 and m a multiple of p; DualPipeV m >= 2p.
                if interleaved && (p < 2 || !m.is_multiple_of(p)) || schedule == "dualpipe-v" && m < 2 * p {
                    continue;
                }
                let mut a = vec![
                    ("pipeline-schedule", schedule.to_string()),
                    ("pipeline-model-parallel-size", p.to_string()),
                    ("global-batch-size", gb.clone()),
                ];
                if interleaved {
                    a.push(("virtual-pipeline-model-parallel-size", "2".into()));
                }
                let name = format!("{schedule}-p{p}-m{m}");
                let r = run_small(&dir, &name, &flags(&a));
                assert_eq!(losses(&r), base_losses, "{name}: losses differ from p=1");
                assert!(weights(&r) == base_weights, "{name}: final weights differ from p=1");
            }
        }
    }
}

#[test]
fn uneven_explicit_splits_match_too() {
    let dir = temp_dir("pipeline-uneven");
    let gb = ("global-batch-size", "6".to_string());
    let base = run_small(&dir, "p1", &flags(std::slice::from_ref(&gb)));
    for (p, split) in [(2, "5,3"), (3, "1,4,3"), (4, "3,1,1,3")] {
        let name = format!("p{p}-{split}");
        let r = run_small(
            &dir,
            &name,
            &flags(&[
                gb.clone(),
                ("pipeline-model-parallel-size", p.to_string()),
                ("num-layers-per-stage", split.into()),
            ]),
        );
        assert_eq!(losses(&r), losses(&base), "{name}");
        assert!(weights(&r) == weights(&base), "{name}: weights differ");
    }
}

#[test]
fn v_schedules_match_one_stage_bitwise_under_every_recompute_policy() {
    let dir = temp_dir("pipeline-v-recompute");
    // m = 8: enough for DualPipeV's 2p at p = 4.
    let gb = ("global-batch-size", "16".to_string());
    let policies = [
        full_recompute("uniform", "1"),
        full_recompute("uniform", "3"),
        full_recompute("block", "1"),
        full_recompute("block", "8"),
        selective_recompute("core_attn"),
        selective_recompute("mlp"),
        selective_recompute("layernorm,core_attn"),
    ];
    for (i, policy) in policies.iter().enumerate() {
        let mut base_flags = vec![gb.clone()];
        base_flags.extend(policy.iter().cloned());
        let base = run_small(&dir, &format!("p1-{i}"), &flags(&base_flags));
        // Each policy once per V schedule, at a stage count that turns with it (2 to 4).
        for (schedule, p) in [("zb-v", 2 + i % 3), ("dualpipe-v", 2 + (i + 1) % 3)] {
            let mut f = base_flags.clone();
            f.extend([
                ("pipeline-schedule", schedule.to_string()),
                ("pipeline-model-parallel-size", p.to_string()),
            ]);
            let name = format!("{schedule}-p{p}-policy{i}");
            let r = run_small(&dir, &name, &flags(&f));
            assert_eq!(losses(&r), losses(&base), "{name}: losses differ from p=1");
            assert!(weights(&r) == weights(&base), "{name}: final weights differ from p=1");
        }
    }
}
