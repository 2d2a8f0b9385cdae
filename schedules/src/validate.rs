//! The validator: proves that a schedule's lists can all run to the end.
//!
//! For compute-only lists it checks, naming the offending action:
//! * completeness: every (stage, chunk, microbatch) has one Forward and either one Backward
//!   or a BackwardInput plus a BackwardWeight, and nothing is duplicated;
//! * local order: a backward after its forward, a BackwardWeight after its BackwardInput;
//! * cross-stage order: by running every stage's list as far as its dependencies allow (a
//!   Forward of virtual stage `s` needs that of `s - 1`; a Backward or BackwardInput of `s`
//!   needs the input gradient of `s + 1`). If the run stops before every list ends, the
//!   remaining dependencies form a cycle: a deadlock, reported with each stuck stage's action.
//!
//! Because each stage's next action only ever becomes more ready as other stages advance,
//! one run decides the question for every interleaving. Lowered lists (with transfers) are
//! checked by executing them with unbounded channels ([`crate::execute`]).

use crate::execute::{run, ChannelCapacity};
use crate::ir::{Action, ActionKind, Schedule, Shape};
use crate::progress::{census, Mode, Progress};
use crate::ScheduleError;

/// Checks that `schedule` is complete and deadlock-free (see the module docs).
pub fn validate(schedule: &Schedule) -> Result<(), ScheduleError> {
    if schedule.has_transfers() {
        return run(schedule, ChannelCapacity::Unbounded, |_| {});
    }
    census(schedule, Mode::Compute)?;
    let shape = schedule.shape();
    let mut progress = Progress::new(shape, Mode::Compute);
    let mut next = vec![0usize; shape.stages];
    let mut waiting: Vec<Option<Need>> = vec![None; shape.stages];
    let mut ready: Vec<usize> = (0..shape.stages).rev().collect();

    while let Some(stage) = ready.pop() {
        let list = schedule.actions(stage);
        while let Some(action) = list.get(next[stage]) {
            // A missing local prerequisite is permanent (it comes later in this very list), so
            // it is reported before any wait on another stage.
            progress.check(action).map_err(|reason| ScheduleError::Action {
                stage,
                position: next[stage],
                action: action.token(shape.chunks).to_string(),
                reason,
            })?;
            if let Some(need) = Need::of(shape, action) {
                if !need.met(&progress) {
                    waiting[stage] = Some(need);
                    break;
                }
            }
            progress.record(action);
            next[stage] += 1;
            if let Some((dependent, need)) = Need::released_by(shape, action) {
                if waiting[dependent] == Some(need) {
                    waiting[dependent] = None;
                    ready.push(dependent);
                }
            }
        }
    }

    let blocked: Vec<String> = (0..shape.stages)
        .filter_map(|stage| {
            let position = next[stage];
            let action = schedule.actions(stage).get(position)?;
            let need = waiting[stage].expect("a stage stops early only while waiting");
            Some(format!(
                "stage {stage} waits at {} (action {position}) for {}",
                action.token(shape.chunks),
                need.describe(shape)
            ))
        })
        .collect();
    if blocked.is_empty() {
        Ok(())
    } else {
        Err(ScheduleError::Deadlock { blocked })
    }
}

/// A cross-stage dependency: an action of another (or the same) stage that must have run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Need {
    stage: usize,
    chunk: usize,
    microbatch: usize,
    /// Forward done, else input gradient done.
    forward: bool,
}

impl Need {
    /// What `action` waits for on the neighbouring virtual stage, if anything.
    fn of(shape: Shape, action: &Action) -> Option<Self> {
        let s = shape.virtual_stage(action.stage, action.chunk);
        let (neighbour, forward) = match action.kind {
            ActionKind::Forward if s > 0 => (s - 1, true),
            ActionKind::Backward | ActionKind::BackwardInput if s + 1 < shape.virtual_stages() => {
                (s + 1, false)
            }
            _ => return None,
        };
        let (stage, chunk) = shape.locate(neighbour);
        Some(Self { stage, chunk, microbatch: action.microbatch, forward })
    }

    /// The stage that may be waiting for `action` to have run, with the need it satisfies.
    fn released_by(shape: Shape, action: &Action) -> Option<(usize, Self)> {
        let s = shape.virtual_stage(action.stage, action.chunk);
        let (dependent, forward) = match action.kind {
            ActionKind::Forward if s + 1 < shape.virtual_stages() => (s + 1, true),
            ActionKind::Backward | ActionKind::BackwardInput if s > 0 => (s - 1, false),
            _ => return None,
        };
        let need = Self { stage: action.stage, chunk: action.chunk, microbatch: action.microbatch, forward };
        Some((shape.locate(dependent).0, need))
    }

    fn met(&self, progress: &Progress) -> bool {
        if self.forward {
            progress.forward_done(self.stage, self.chunk, self.microbatch)
        } else {
            progress.input_grad_done(self.stage, self.chunk, self.microbatch)
        }
    }

    fn describe(&self, shape: Shape) -> String {
        let forward = Action::new(self.stage, self.chunk, self.microbatch, ActionKind::Forward);
        if self.forward {
            format!("{} on stage {}", forward.token(shape.chunks), self.stage)
        } else {
            format!("the backward of {} on stage {}", forward.token(shape.chunks), self.stage)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), String> {
        validate(&text.parse::<Schedule>().unwrap()).map_err(|e| e.to_string())
    }

    const HEADER: &str = "schedule stages=2 chunks=1 microbatches=2\n";

    #[test]
    fn accepts_1f1b() {
        check(&format!("{HEADER}stage 0: F0 F1 B0 B1\nstage 1: F0 B0 F1 B1\n")).unwrap();
    }

    #[test]
    fn rejects_backward_before_forward() {
        let err = check(&format!("{HEADER}stage 0: F0 B1 F1 B0\nstage 1: F0 B0 F1 B1\n")).unwrap_err();
        assert_eq!(err, "stage 0, action 1 (B1): runs before its forward F1");
    }

    #[test]
    fn rejects_missing_and_duplicated_actions() {
        let err = check(&format!("{HEADER}stage 0: F0 F1 B0\nstage 1: F0 B0 F1 B1\n")).unwrap_err();
        assert_eq!(err, "stage 0: no B1 for its forward");
        let err = check(&format!("{HEADER}stage 0: F0 F1 F1 B0 B1\nstage 1: F0 B0 F1 B1\n")).unwrap_err();
        assert_eq!(err, "stage 0, action 2 (F1): duplicate action");
    }

    #[test]
    fn rejects_weight_before_input_gradient() {
        let err = check(&format!("{HEADER}stage 0: F0 F1 W0 I0 B1\nstage 1: F0 B0 F1 B1\n")).unwrap_err();
        assert_eq!(err, "stage 0, action 2 (W0): runs before its input-gradient pass I0");
        let err = check(&format!("{HEADER}stage 0: F0 F1 I0 B1\nstage 1: F0 B0 F1 B1\n")).unwrap_err();
        assert_eq!(err, "stage 0: I0 has no W0");
    }

    #[test]
    fn reports_a_cross_stage_deadlock_with_each_stuck_action() {
        // Stage 1 wants microbatch 1 first, but stage 0 only forwards it after backward 0.
        let err = check(&format!("{HEADER}stage 0: F0 B0 F1 B1\nstage 1: F1 B1 F0 B0\n")).unwrap_err();
        assert_eq!(
            err,
            "deadlock: stage 0 waits at B0 (action 1) for the backward of F0 on stage 1; \
             stage 1 waits at F1 (action 0) for F1 on stage 0"
        );
    }
}
