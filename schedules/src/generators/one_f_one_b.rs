//! 1F1B as in Megatron-LM (PipeDream-Flush): stage r runs `min(p - r - 1, m)` warm-up
//! forwards, then alternates one forward and one backward, then drains the remaining
//! backwards. A microbatch's backward can start as soon as the last stage has it, so stage r
//! never holds more than `min(p - r, m)` microbatches.

use super::per_stage;
use crate::ir::{ActionKind, InFlight, Schedule, Shape};
use crate::ScheduleError;

pub(super) fn build(shape: Shape) -> Result<Schedule, ScheduleError> {
    let (p, m) = (shape.stages, shape.microbatches);
    per_stage(shape, |stage, push| {
        let warmup = (p - stage - 1).min(m);
        (0..warmup).for_each(|mb| push(0, mb, ActionKind::Forward));
        for mb in 0..m {
            // Steady state: the forward `warmup` ahead, then the oldest backward; cool-down
            // once no forwards remain.
            if warmup + mb < m {
                push(0, warmup + mb, ActionKind::Forward);
            }
            push(0, mb, ActionKind::Backward);
        }
    })
}

/// `min(p - r, m)` on stage r.
pub(super) fn promised(shape: Shape) -> Vec<InFlight> {
    let (p, m) = (shape.stages, shape.microbatches);
    (0..p)
        .map(|r| {
            let n = (p - r).min(m);
            InFlight { full: n, total: n }
        })
        .collect()
}
