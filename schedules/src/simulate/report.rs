//! What the simulator returns.

use crate::ir::Payload;

/// Result of simulating one iteration (all microbatches through the pipeline, from time 0).
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// When the last stage finishes its list, plus the longest optimizer time: every stage
    /// waits for the global grad norm, so the step ends with the slowest optimizer step.
    pub iteration_time: f64,
    /// `(iteration_time - busiest stage's busy time) / iteration_time` (0 for an empty run).
    /// Busy time is pipeline compute only, so the optimizer phase counts as bubble: the
    /// share of the step the busiest stage spends outside its forward and backward passes,
    /// as the trainer measures it.
    pub bubble_rate: f64,
    pub stages: Vec<StageReport>,
    /// Every compute pass (recompute separately), every transfer and every non-zero
    /// optimizer step, in simulation order, not sorted by time.
    pub timeline: Vec<TimelineEvent>,
}

impl SimReport {
    /// Throughput for `tokens_per_iteration` tokens (global batch size times sequence length).
    pub fn tokens_per_second(&self, tokens_per_iteration: f64) -> f64 {
        tokens_per_iteration / self.iteration_time
    }

    /// Model FLOPs utilisation: `model_flops_per_iteration` (without recompute, by
    /// convention) over what the stages' devices could do in the iteration time.
    pub fn mfu(&self, model_flops_per_iteration: f64, peak_flops_per_device: f64) -> f64 {
        model_flops_per_iteration / (self.iteration_time * self.stages.len() as f64 * peak_flops_per_device)
    }
}

/// One stage's share of the iteration.
#[derive(Clone, Debug, PartialEq)]
pub struct StageReport {
    /// Time spent on the list's compute passes, recompute included (not the optimizer).
    pub busy: f64,
    /// The stage's post-schedule time (exchange, grad norm, optimizer step), as given.
    pub optimizer: f64,
    /// `iteration_time - busy - optimizer`: time spent waiting.
    pub idle: f64,
    pub peak_memory: u64,
    /// The most bytes of offloaded activations held in host memory at once.
    pub peak_host: u64,
    /// Step series: from each point's time on, the stage holds `bytes` (until the next point).
    /// Starts at time 0 (with the static bytes, plus whatever the first action allocates if it
    /// starts at 0); one point per instant at which memory changes, holding the level after
    /// all changes at that instant (`peak_memory` also sees momentary levels).
    pub memory: Vec<MemoryPoint>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryPoint {
    pub time: f64,
    pub bytes: u64,
}

/// One interval of work: a compute pass on `stage`, a transfer sent by `stage`, or the
/// stage's optimizer step (with `chunk` and `microbatch` 0: it covers them all).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimelineEvent {
    pub stage: usize,
    pub chunk: usize,
    pub microbatch: usize,
    pub start: f64,
    pub end: f64,
    pub kind: EventKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Forward,
    /// The recompute before a Backward or BackwardInput (only when its time is non-zero).
    Recompute,
    Backward,
    BackwardInput,
    BackwardWeight,
    /// A message on the link to stage `to`, from when it starts moving until it arrives.
    Transfer {
        to: usize,
        payload: Payload,
    },
    /// The stage's post-schedule time, from the end of the last stage's list (only when its
    /// time is non-zero).
    Optimizer,
}
