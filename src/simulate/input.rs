//! The schedule simulator's input for a setup: op times and memory per (stage, chunk),
//! static memory and optimizer time per stage, and the link.

use super::durations::{Durations, P2p};
use super::memory::{chunk_memory, optimizer_working_bytes, stage_static_bytes};
use super::setup::Setup;
use schedules::{simulate, ChunkCosts, Link, SimInput, SimReport};
use stages::tensor_parallel::Split;

/// Bytes of one message between stages: an activation or its gradient, [B,T,C]; under
/// tensor parallelism each rank sends its 1/t (Megatron's scatter-gather, or the sequence
/// shard it holds).
pub fn message_bytes(setup: &Setup) -> u64 {
    let elements = setup.tp.per_rank(setup.shape.tokens() * setup.shape.hidden, Split::Interior);
    (elements * setup.activation_bytes_per_element()) as u64
}

pub fn link(setup: &Setup, p2p: P2p) -> Link {
    let bytes = message_bytes(setup);
    let (latency, bandwidth) = match p2p {
        P2p::Link { latency, bandwidth } => (latency, bandwidth),
        // A fixed time per message: it occupies the link that long, so messages queue.
        P2p::PerMessage(t) if t > 0.0 => (0.0, bytes as f64 / t),
        P2p::PerMessage(_) => (0.0, f64::INFINITY),
    };
    Link { latency, bandwidth, activation_bytes: bytes, grad_bytes: bytes }
}

pub fn sim_input(setup: &Setup, durations: &Durations) -> anyhow::Result<SimInput> {
    let mut costs = Vec::with_capacity(setup.p * setup.v);
    for stage in 0..setup.p {
        for chunk in 0..setup.v {
            let t = durations.chunks[stage * setup.v + chunk];
            costs.push(ChunkCosts {
                forward: t.forward,
                backward_input: t.backward_input,
                backward_weight: t.backward_weight,
                recompute: t.recompute,
                memory: chunk_memory(setup, stage, chunk),
            });
        }
    }
    let static_bytes = (0..setup.p).map(|r| stage_static_bytes(setup, r)).collect();
    let input = SimInput::new(setup.p, setup.v, costs, static_bytes, link(setup, durations.p2p))?;
    let working = (0..setup.p).map(|r| optimizer_working_bytes(setup, r)).collect();
    Ok(input.with_optimizer_times(durations.optimizer.clone())?.with_optimizer_working_bytes(working)?)
}

/// Simulates one iteration of the setup's schedule.
pub fn run(setup: &Setup, durations: &Durations) -> anyhow::Result<SimReport> {
    Ok(simulate(setup.schedule()?, &sim_input(setup, durations)?)?)
}
