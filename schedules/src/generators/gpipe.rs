//! GPipe (Huang et al. 2019): every stage runs all m forwards, then all m backwards, both in
//! microbatch order. Simple and bubble-equal to 1F1B, but every stage holds all m
//! microbatches' activations at the turn.

use super::per_stage;
use crate::ir::{ActionKind, InFlight, Schedule, Shape};
use crate::ScheduleError;

pub(super) fn build(shape: Shape) -> Result<Schedule, ScheduleError> {
    let m = shape.microbatches;
    per_stage(shape, |_, push| {
        (0..m).for_each(|mb| push(0, mb, ActionKind::Forward));
        (0..m).for_each(|mb| push(0, mb, ActionKind::Backward));
    })
}

/// All m, on every stage.
pub(super) fn promised(shape: Shape) -> Vec<InFlight> {
    let m = shape.microbatches;
    vec![InFlight { full: m, total: m }; shape.stages]
}
