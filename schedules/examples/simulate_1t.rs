//! Times the simulator on a 1T-parameter configuration: interleaved 1F1B over p = 64 stages,
//! v = 2 chunks per stage, m = 1024 microbatches (about 262k compute actions, as many
//! transfers again on each side). Run with
//!
//! ```text
//! cargo run --release -p schedules --example simulate_1t
//! ```
//!
//! The costs follow Megatron-LM's 1T GPT (128 layers, hidden 25600, sequence 2048,
//! microbatch 1, tensor parallel 8, bf16): one layer per chunk, ~3.3e13 forward FLOPs per
//! layer and microbatch shared by 8 GPUs at ~156 TFLOP/s, backward twice that, selective
//! recompute's 34·s·h/t bytes of activations, a 105 MB activation message over 25 GB/s.

use schedules::{generate, lower, simulate, ChunkCosts, ChunkMemory, Link, ScheduleKind, SimInput};
use std::time::Instant;

fn main() -> Result<(), schedules::ScheduleError> {
    let (p, v, m) = (64, 2, 1024);
    let (seq, hidden, tp) = (2048.0f64, 25600.0f64, 8.0f64);
    let layer_flops = 24.0 * seq * hidden * hidden * (1.0 + seq / (6.0 * hidden));
    let forward = layer_flops / tp / 156e12;
    let message = (seq * hidden * 2.0) as u64;
    let activations = (34.0 * seq * hidden / tp) as u64;
    let costs = ChunkCosts {
        forward,
        backward_input: forward,
        backward_weight: forward,
        recompute: 0.0,
        memory: ChunkMemory {
            activation_bytes: activations,
            weight_grad_bytes: activations / 2,
            forward_working_bytes: message,
            recompute_working_bytes: 0,
            backward_input_working_bytes: 2 * message,
            backward_weight_working_bytes: message,
        },
    };
    // Parameters per GPU times 18 bytes (bf16 weights and grads, fp32 master and Adam).
    let static_bytes = (1e12 / (p as f64 * tp) * 18.0) as u64;
    let link = Link { latency: 10e-6, bandwidth: 25e9, activation_bytes: message, grad_bytes: message };
    let input = SimInput::uniform(p, v, costs, static_bytes, link)?;

    let t0 = Instant::now();
    let schedule = generate(ScheduleKind::Interleaved1F1B, p, v, m)?;
    let t1 = Instant::now();
    let lowered = lower(&schedule)?;
    let t2 = Instant::now();
    let report = simulate(&lowered, &input)?;
    let t3 = Instant::now();

    println!(
        "p={p} v={v} m={m}: {} compute actions, {} after lowering, {} timeline events",
        schedule.len(),
        lowered.schedule().len(),
        report.timeline.len()
    );
    println!(
        "generate {:.1} ms, lower (validate + insert transfers + prove capacity {}) {:.1} ms, simulate {:.1} ms",
        (t1 - t0).as_secs_f64() * 1e3,
        lowered.required_capacity(),
        (t2 - t1).as_secs_f64() * 1e3,
        (t3 - t2).as_secs_f64() * 1e3,
    );
    println!(
        "simulated iteration {:.2} s, bubble {:.2}%, stage 0 peak {:.1} GiB",
        report.iteration_time,
        report.bubble_rate * 100.0,
        report.stages[0].peak_memory as f64 / (1u64 << 30) as f64
    );
    Ok(())
}
