//! Interleaved 1F1B (Narayanan et al. 2021), ordered as Megatron-LM's
//! `forward_backward_pipelining_with_interleaving`.
//!
//! Each stage holds v model chunks; chunk c of stage r is virtual stage `c * p + r`. A stage
//! walks `v * m` "virtual microbatches" whose order is Megatron's schedule table: the
//! microbatches are cut into groups of `group` (Megatron's `microbatch_group_size_per_vp_stage`,
//! default p), and each group runs through chunk 0, then chunk 1, ... (the last group takes
//! whatever remains). Forward number i is table entry i; backward number i runs table entry
//! i's microbatch on the mirrored chunk `v - 1 - c`, so backwards go down the chunks.
//!
//! Stage r runs `min(2 (p - r - 1) + (v - 1) * group, v m)` warm-up forwards (one group
//! through every chunk but the last, plus two per stage still ahead: one for the forward to
//! reach the end and one for the backward to come back), then one forward and one backward
//! per step, then the remaining backwards. It thus holds at most one more than its warm-up.
//!
//! Constraints, all from Megatron-LM:
//! * `p >= 2`: interleaving needs a pipeline (Megatron: "pipeline-model-parallel size should
//!   be greater than 1 with interleaved schedule");
//! * `v >= 2`: with one chunk it is plain 1F1B (use `1f1b`);
//! * `p <= group <= m`, and the last group (`m % group` when non-zero) has at least p
//!   microbatches: a shorter group cannot keep p stages busy and its chunk hand-off would
//!   stall. With the default `group = p` that means m is a multiple of p, which is also what
//!   Megatron's original implementation required outright.
//!
//! With unit forward and backward times per chunk (so a whole stage's work per microbatch
//! is v forward units and v backward units) and free transfers, the bubble rate is
//! `(p-1)/(v m + p-1)`: the same `(p-1)` units of ramp as 1F1B, but each unit is a chunk,
//! 1/v of a stage.

use super::per_stage;
use crate::ir::{ActionKind, InFlight, Schedule, Shape};
use crate::ScheduleError;

/// Interleaved 1F1B with an explicit microbatch group size (`generate` uses `group = p`).
pub fn interleaved_1f1b(p: usize, v: usize, m: usize, group: usize) -> Result<Schedule, ScheduleError> {
    build(shape(p, v, m, group)?, group)
}

/// The peak in-flight promise for [`interleaved_1f1b`] with this group size.
pub fn promised_in_flight(
    p: usize,
    v: usize,
    m: usize,
    group: usize,
) -> Result<Vec<InFlight>, ScheduleError> {
    Ok(promised(shape(p, v, m, group)?, group))
}

pub(super) fn shape(p: usize, v: usize, m: usize, group: usize) -> Result<Shape, ScheduleError> {
    let shape = Shape::new(p, v, m)?;
    let fail = |msg: String| Err(ScheduleError::Shape(format!("interleaved-1f1b: {msg}")));
    if p < 2 {
        return fail(format!("needs pipeline_model_parallel_size >= 2 (as Megatron-LM), got {p}"));
    }
    if v < 2 {
        return fail(format!(
            "needs virtual_pipeline_model_parallel_size >= 2, got {v} (with one chunk per stage use 1f1b)"
        ));
    }
    if group == p && !m.is_multiple_of(p) {
        return fail(format!(
            "the number of microbatches ({m}) must be a multiple of pipeline_model_parallel_size ({p}), \
             as in Megatron-LM: microbatches go through the model chunks in groups of {p}"
        ));
    }
    if group < p || group > m {
        return fail(format!(
            "the microbatch group size ({group}) must lie between pipeline_model_parallel_size ({p}) \
             and the number of microbatches ({m})"
        ));
    }
    let last = m % group;
    if last != 0 && last < p {
        return fail(format!(
            "the last microbatch group would have {last} microbatches, fewer than the {p} stages: \
             make the number of microbatches ({m}) a multiple of the group size ({group}) or leave \
             a remainder of at least {p}"
        ));
    }
    Ok(shape)
}

/// Megatron's schedule table: (microbatch, chunk) for each forward step.
fn table(shape: Shape, group: usize) -> Vec<(usize, usize)> {
    let (v, m) = (shape.chunks, shape.microbatches);
    let mut table = Vec::with_capacity(v * m);
    let mut first = 0;
    while first < m {
        let end = if first + group >= m { m } else { first + group };
        for chunk in 0..v {
            table.extend((first..end).map(|mb| (mb, chunk)));
        }
        first = end;
    }
    table
}

fn warmup(shape: Shape, group: usize, stage: usize) -> usize {
    let (p, v, m) = (shape.stages, shape.chunks, shape.microbatches);
    (2 * (p - stage - 1) + (v - 1) * group).min(v * m)
}

pub(super) fn build(shape: Shape, group: usize) -> Result<Schedule, ScheduleError> {
    let table = table(shape, group);
    let v = shape.chunks;
    per_stage(shape, |stage, push| {
        let warmup = warmup(shape, group, stage);
        for &(mb, chunk) in &table[..warmup] {
            push(chunk, mb, ActionKind::Forward);
        }
        for (step, &(mb, chunk)) in table.iter().enumerate() {
            if let Some(&(f_mb, f_chunk)) = table.get(warmup + step) {
                push(f_chunk, f_mb, ActionKind::Forward);
            }
            push(v - 1 - chunk, mb, ActionKind::Backward);
        }
    })
}

/// One more than the warm-up (the steady state's forward before its backward), at most v m.
pub(super) fn promised(shape: Shape, group: usize) -> Vec<InFlight> {
    let total = shape.chunks * shape.microbatches;
    (0..shape.stages)
        .map(|r| {
            let n = (warmup(shape, group, r) + 1).min(total);
            InFlight { full: n, total: n }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_megatrons_example() {
        // Megatron's comment for PP2 N3 M5 VP2: microbatches 0 1 2 0 1 2 3 4 3 4,
        // chunks 0 0 0 1 1 1 0 0 1 1.
        let shape = Shape::new(2, 2, 5).unwrap();
        let (mbs, chunks): (Vec<_>, Vec<_>) = table(shape, 3).into_iter().unzip();
        assert_eq!(mbs, [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]);
        assert_eq!(chunks, [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]);
    }

    #[test]
    fn orders_stage_0_like_megatron() {
        // p = 2, v = 2, m = 4: warm-up 2 + 2 = 4 forwards on stage 0, 2 on stage 1.
        let schedule = interleaved_1f1b(2, 2, 4, 2).unwrap();
        let text = schedule.to_string();
        assert!(text.contains("stage 0: F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0"), "{text}");
        assert!(text.contains("stage 1: F0c0 F1c0 F0c1 B0c1 F1c1 B1c1"), "{text}");
    }

    #[test]
    fn rejects_what_megatron_rejects() {
        let err = |p, v, m, g| interleaved_1f1b(p, v, m, g).unwrap_err().to_string();
        assert!(err(4, 2, 10, 4).contains("(10) must be a multiple of pipeline_model_parallel_size (4)"));
        assert!(err(1, 2, 4, 1).contains("needs pipeline_model_parallel_size >= 2"));
        assert!(err(4, 1, 8, 4).contains("with one chunk per stage use 1f1b"));
        assert!(err(4, 2, 8, 3).contains("group size (3) must lie between"));
        assert!(err(4, 2, 10, 8).contains("last microbatch group would have 2 microbatches"));
        // A remainder of at least p is fine (Megatron's tunable group size).
        interleaved_1f1b(4, 2, 13, 9).unwrap();
    }
}
