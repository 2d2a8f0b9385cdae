//! Pipeline parallelism changes nothing but speed: for every schedule, stage count and
//! microbatch count (dropout on), losses and final weights are bitwise those of p = 1.

mod common;
use common::*;

#[test]
fn every_schedule_and_stage_count_matches_one_stage_bitwise() {
    let dir = temp_dir("pipeline-bitwise");
    for m in [1usize, 3, 4, 8] {
        let gb = (2 * m).to_string();
        let base = run_small(&dir, &format!("p1-m{m}"), &flags(&[("global-batch-size", gb.clone())]));
        let (base_losses, base_weights) = (losses(&base), weights(&base));
        for schedule in ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"] {
            for p in 1..=4usize {
                let interleaved = schedule == "interleaved-1f1b";
                // Megatron's interleaving needs p >= 2 and m a multiple of p.
                if interleaved && (p < 2 || !m.is_multiple_of(p)) {
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
