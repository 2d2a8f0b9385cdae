//! ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", the handcrafted schedule with
//! 1F1B's memory): the backward is split into B (input gradient, `BackwardInput`), which the
//! previous stage waits for, and W (weight gradient, `BackwardWeight`), which nobody waits
//! for. The F/B skeleton is 1F1B's; stage r postpones its W passes by r microbatches, so the
//! cool-down bubble that 1F1B leaves on stage r is filled with deferred Ws, and every
//! steady-state step is F, B, W.
//!
//! With free transfers and m >= p, the bubble shrinks from 1F1B's `(p-1)(F+B+W)` to
//! `(p-1)(F+B-W)` per stage; with F = B = W that is a bubble rate of `(p-1)/(3m+p-1)`.
//! (With m < p the ramp dominates and the rate is higher, though still below 1F1B's.)
//!
//! Memory: as in 1F1B, stage r holds at most `min(p - r, m)` full activation sets (F started,
//! B not done). The r postponed Ws keep only what W needs, so counting those too stage r
//! holds at most `min(p, m)` microbatches: never more than 1F1B's stage 0.

use super::per_stage;
use crate::ir::{ActionKind, InFlight, Schedule, Shape};
use crate::ScheduleError;

pub(super) fn build(shape: Shape) -> Result<Schedule, ScheduleError> {
    let (p, m) = (shape.stages, shape.microbatches);
    per_stage(shape, |stage, push| {
        let warmup = (p - stage - 1).min(m);
        (0..warmup).for_each(|mb| push(0, mb, ActionKind::Forward));
        let mut next_weight = 0;
        for mb in 0..m {
            if warmup + mb < m {
                push(0, warmup + mb, ActionKind::Forward);
            }
            push(0, mb, ActionKind::BackwardInput);
            // The first `stage` Ws wait; from then on each B is followed by the oldest W.
            if mb >= stage {
                push(0, next_weight, ActionKind::BackwardWeight);
                next_weight += 1;
            }
        }
        (next_weight..m).for_each(|mb| push(0, mb, ActionKind::BackwardWeight));
    })
}

/// `full = min(p - r, m)` and `total = min(p, m)` on stage r (see the module docs).
pub(super) fn promised(shape: Shape) -> Vec<InFlight> {
    let (p, m) = (shape.stages, shape.microbatches);
    (0..p).map(|r| InFlight { full: (p - r).min(m), total: p.min(m) }).collect()
}
