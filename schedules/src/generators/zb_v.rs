//! ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism" 2023 §6 and "Pipeline Parallelism
//! with Controllable Memory" 2024): two chunks per stage in a V (stage r holds virtual stages
//! r and 2p-1-r), the backward split into B (input gradient) and W (weight gradient).
//!
//! Like the zero-bubble repository's V scheduler, the order comes from placing passes on a
//! clock where F, B and W each take one unit and transfers are free; ours is a plain greedy
//! list scheduler. At every unit each stage takes, first ready first:
//! 1. a B, which is what the other stages wait for (chunk 0 first: when both are ready its
//!    microbatch is the older one, whose activations have been held longest);
//! 2. an F (chunk 1 first: it brings a microbatch closer to the loss), if memory allows it;
//! 3. otherwise the oldest W.
//!
//! Memory is counted as the paper counts it: a chunk's activations are two halves, one freed by
//! its B and one kept for its W, and a stage holds at most 2p halves' worth of whole sets, that
//! is `2 * whole + waiting <= 4p` (`whole`: forwards whose B has not run; `waiting`: Bs whose W
//! has not). That caps the whole sets at 2p half-stage chunks, 1F1B's peak of p whole-stage
//! microbatches, and lets Ws wait, to fill the bubbles of the drain, only as far as the whole
//! sets leave room. A W keeps what the weight gradients need (each matmul's input and output
//! gradient), well under half of what a block keeps for B, so the peak in bytes is at most
//! 1F1B's.
//!
//! With F = B = W = 1 and free transfers this keeps every stage busy from its first F to its
//! last W but for the p-1 units of the ramp: `6m + p - 1` units, the paper's figure, for
//! every m >= 2p (held for p <= 16 in `schedules/tests/closed_forms.rs`). Capping the
//! waiting Ws harder costs bubbles: with `whole + waiting <= 2p` instead, the order is up to
//! 3 units longer from p = 3 on.

use super::per_stage;
use crate::ir::{ActionKind, InFlight, Schedule, Shape};
use crate::ScheduleError;
use std::collections::VecDeque;

/// One stage's progress on the greedy clock.
#[derive(Clone, Default)]
struct Stage {
    /// Next microbatch to forward / to run B for, per chunk.
    forward: [usize; 2],
    backward: [usize; 2],
    /// Forwards whose B has not run (either chunk).
    whole: usize,
    /// (chunk, microbatch) whose B ran and W has not, oldest first.
    weights: VecDeque<(usize, usize)>,
    order: Vec<(usize, usize, ActionKind)>,
}

pub(super) fn build(shape: Shape) -> Result<Schedule, ScheduleError> {
    let (p, m) = (shape.stages, shape.microbatches);
    let last = shape.virtual_stages() - 1;
    // End times of each virtual stage's F and B per microbatch (None: not run yet).
    let mut f_end = vec![vec![None; m]; last + 1];
    let mut b_end = vec![vec![None; m]; last + 1];
    let mut stages = vec![Stage::default(); p];
    let work = 6 * m;
    let mut t = 0usize;
    while stages.iter().any(|s| s.order.len() < work) {
        // Greedy decisions at time t see only passes that ended by t, so the order in which
        // stages decide does not matter.
        let done = |end: &Option<usize>| end.is_some_and(|e| e <= t);
        let mut started = Vec::new();
        for (r, stage) in stages.iter_mut().enumerate() {
            let vs = |chunk| shape.virtual_stage(r, chunk);
            let b_ready = |chunk: usize, stage: &Stage| {
                let mb = stage.backward[chunk];
                mb < stage.forward[chunk]
                    && done(&f_end[vs(chunk)][mb])
                    && (vs(chunk) == last || done(&b_end[vs(chunk) + 1][mb]))
            };
            let f_ready = |chunk: usize, stage: &Stage| {
                let mb = stage.forward[chunk];
                mb < m && (vs(chunk) == 0 || done(&f_end[vs(chunk) - 1][mb]))
            };
            let pick = if let Some(chunk) = [0, 1].into_iter().find(|&c| b_ready(c, stage)) {
                Some((chunk, stage.backward[chunk], ActionKind::BackwardInput))
            } else if let Some(chunk) = [1, 0]
                .into_iter()
                .find(|&c| f_ready(c, stage) && 2 * (stage.whole + 1) + stage.weights.len() <= 4 * p)
            {
                Some((chunk, stage.forward[chunk], ActionKind::Forward))
            } else {
                stage.weights.pop_front().map(|(chunk, mb)| (chunk, mb, ActionKind::BackwardWeight))
            };
            if let Some((chunk, mb, kind)) = pick {
                match kind {
                    ActionKind::Forward => {
                        stage.forward[chunk] += 1;
                        stage.whole += 1;
                    }
                    ActionKind::BackwardInput => {
                        stage.backward[chunk] += 1;
                        stage.whole -= 1;
                        stage.weights.push_back((chunk, mb));
                    }
                    _ => {}
                }
                stage.order.push((chunk, mb, kind));
                started.push((vs(chunk), mb, kind));
            }
        }
        // Every pass takes one unit, so a unit where no stage can start anything leaves the
        // next one the same: the order would never finish.
        assert!(!started.is_empty(), "zb-v's greedy order stalled at unit {t} for p = {p}, m = {m}");
        for (s, mb, kind) in started {
            match kind {
                ActionKind::Forward => f_end[s][mb] = Some(t + 1),
                ActionKind::BackwardInput => b_end[s][mb] = Some(t + 1),
                _ => {}
            }
        }
        t += 1;
    }
    per_stage(shape, |r, push| {
        for &(chunk, mb, kind) in &stages[r].order {
            push(chunk, mb, kind);
        }
    })
}

/// Bounds, not exact counts (the order is greedy): `2 * whole + waiting <= 4p` at every point
/// (see the module docs) gives at most `min(2p, 2m)` whole sets and `min(4p, 2m)` in all.
pub(super) fn promised(shape: Shape) -> Vec<InFlight> {
    let (p, m) = (shape.stages, shape.microbatches);
    vec![InFlight { full: (2 * p).min(2 * m), total: (4 * p).min(2 * m) }; p]
}
