//! A training step makes one host sync per rank — the step's losses and its gradients' sums
//! of squares, read together — and, after the first step and its update, no call to the
//! backing allocator: every tensor and scratch buffer comes from the device's cache of freed
//! ones. Its one zero fill is its gradients', in one op after its update: every activation
//! and activation gradient is overwritten by the op that makes it, so none is zeroed first
//! (on a GPU, a memset each).
//! Each rank's device counts all three where a CUDA device would synchronise, allocate or
//! memset, so the CPU run says the same about the structure of a CUDA step; on a GPU the
//! same test counts the CUDA device's real waits, allocations and memsets.

use super::rank::Rank;
use crate::config::{Config, Named};
use crate::data::TokenData;
use kernels::DeviceCounters;

/// A vocabulary of 96: the counts do not depend on its size, and on the CUDA stand-in a
/// GPT-2 vocabulary's classifier and embedding gradient would take most of the test's minutes
/// in the SIMT emulator.
const VOCABULARY: usize = 96;

/// A token file of 4096 tokens below [`VOCABULARY`], in this test process's directory `name`.
fn small_vocabulary_tokens(name: &str) -> TokenData {
    let path = crate::data::test_dir(name).join("tokens.bin");
    let tokens: Vec<u16> = (0..4096u16).map(|i| (i * 7 + i / 13) % VOCABULARY as u16).collect();
    let mut bytes = Vec::new();
    crate::data::write_tokens(&mut bytes, &tokens).unwrap();
    std::fs::write(&path, bytes).unwrap();
    TokenData::open_file(&path, 1, VOCABULARY).unwrap()
}

/// Every rank's device counts over `steps` training steps after a first one and its update, on `device`
/// at `precision`, under `schedule` with p = 2, m = 4, dropout on and `recompute`; over t
/// `tensor` ranks a stage, with sequence parallelism where t > 1.
fn counts_after_the_first_step(
    (device, precision): (&str, &str),
    schedule: &str,
    recompute: &str,
    tensor: usize,
    steps: usize,
) -> Vec<DeviceCounters> {
    let data = small_vocabulary_tokens(&format!("sync-count-{device}-{precision}"));
    let cfg = Config {
        num_layers: 4,
        hidden_size: 64,
        num_attention_heads: 4,
        seq_length: 16,
        max_position_embeddings: 16,
        vocab_size: VOCABULARY,
        micro_batch_size: 2,
        global_batch_size: 8,
        pipeline_model_parallel_size: 2,
        tensor_model_parallel_size: tensor,
        sequence_parallel: tensor > 1,
        pipeline_schedule: schedule.parse().unwrap(),
        virtual_pipeline_model_parallel_size: (schedule == "interleaved-1f1b").then_some(2),
        recompute_granularity: Some(Named::parse(recompute).unwrap()),
        recompute_method: (recompute == "full").then_some(crate::config::RecomputeMethod::Uniform),
        recompute_num_layers: (recompute == "full").then_some(1),
        device: Named::parse(device).unwrap(),
        precision: Named::parse(precision).unwrap(),
        ..Config::default()
    };
    let mut ranks = Rank::all_in_threads(&cfg);
    let run = |ranks: &mut [Rank], step: usize| {
        std::thread::scope(|s| {
            for r in ranks.iter_mut() {
                let (cfg, data) = (&cfg, &data);
                s.spawn(move || r.train_step(cfg, data, step, 1e-3, None).unwrap());
            }
        });
    };
    run(&mut ranks, 1);
    // The first step's AdamW update, which the next step would start with: it and the
    // zeroing of the gradients after it upload the tables of the stage's tensors that every
    // later update reuses (cuda/tensor_table.rs), so it belongs to the first step.
    for r in ranks.iter_mut() {
        r.apply_pending_update().unwrap();
    }
    let before: Vec<DeviceCounters> = ranks.iter().map(|r| r.stage.device.counters()).collect();
    for step in 2..2 + steps {
        run(&mut ranks, step);
    }
    // The last step's update, so that each step counts its own.
    for r in ranks.iter_mut() {
        r.apply_pending_update().unwrap();
    }
    ranks.iter().zip(before).map(|(r, before)| r.stage.device.counters() - before).collect()
}

/// Five schedules with recompute on `device` at a precision, and one with t = 2 and
/// sequence parallelism (whose gathers, reduce-scatters and vocabulary-parallel loss stay on
/// the device): one host sync and one zero fill per step per rank, and no allocation after
/// the first step.
fn assert_once_per_step(device: (&str, &str)) {
    let steps = 3;
    let once_per_step =
        DeviceCounters { host_syncs: steps as u64, backing_allocations: 0, zero_fills: steps as u64 };
    for (schedule, recompute) in [
        ("1f1b", "full"),
        ("gpipe", "selective"),
        ("zb-h1", "full"),
        ("interleaved-1f1b", "selective"),
        ("zb-v", "full"),
    ] {
        // Every rank's counts at once, so a failure shows them all.
        let counts = counts_after_the_first_step(device, schedule, recompute, 1, steps);
        assert_eq!(
            counts, [once_per_step; 2],
            "{device:?}: {schedule}, recompute {recompute}, ranks 0 and 1, {steps} steps"
        );
    }
    let counts = counts_after_the_first_step(device, "1f1b", "selective", 2, steps);
    assert_eq!(counts, [once_per_step; 4], "{device:?}: t = 2 x p = 2, ranks 0 to 3, {steps} steps");
}

#[test]
fn a_step_syncs_once_per_rank_and_allocates_nothing_after_the_first() {
    assert_once_per_step(("cpu", "fp32"));
}

/// The same on a GPU, where the counts are real waits and cudaMallocs, in fp32 and with
/// bf16 storage (bf16 buffers and parameters' copies come from the same arena).
#[cfg(feature = "cuda")]
#[test]
fn a_gpu_step_syncs_once_per_rank_and_allocates_nothing_after_the_first() {
    if let Err(why) = kernels::cuda::CudaDevice::new(0) {
        assert!(
            std::env::var_os("PIPETRAIN_REQUIRE_GPU").is_none(),
            "PIPETRAIN_REQUIRE_GPU is set, but there is no usable GPU: {why}"
        );
        eprintln!("skipped: no GPU here ({why})");
        return;
    }
    assert_once_per_step(("cuda", "fp32"));
    assert_once_per_step(("cuda", "bf16"));
}
