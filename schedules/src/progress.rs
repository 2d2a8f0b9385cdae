//! Bookkeeping shared by the validator (compute lists) and the executor (lowered lists):
//! a census that finds missing and duplicated actions, and per-(stage, chunk, microbatch)
//! progress flags that check each action's local prerequisites before it runs.

use crate::ir::{Action, ActionKind, Schedule, Shape};
use crate::ScheduleError;

/// Whether transfers are part of the lists being checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Compute only: cross-stage inputs are the validator's business.
    Compute,
    /// Lowered: every cross-stage input must be received on this stage first.
    Lowered,
}

const KINDS: usize = 8;

fn kind_index(kind: ActionKind) -> usize {
    match kind {
        ActionKind::Forward => 0,
        ActionKind::Backward => 1,
        ActionKind::BackwardInput => 2,
        ActionKind::BackwardWeight => 3,
        ActionKind::SendActivation { .. } => 4,
        ActionKind::RecvActivation { .. } => 5,
        ActionKind::SendGrad { .. } => 6,
        ActionKind::RecvGrad { .. } => 7,
    }
}

fn err(schedule: &Schedule, stage: usize, position: usize, reason: String) -> ScheduleError {
    let action = schedule.actions(stage)[position];
    ScheduleError::Action {
        stage,
        position,
        action: action.token(schedule.shape().chunks).to_string(),
        reason,
    }
}

/// Every (stage, chunk, microbatch) must have exactly one Forward and either one Backward or
/// one BackwardInput plus one BackwardWeight; lowered, also exactly the transfers its virtual
/// stage needs (none at the ends of the pipeline). Names the first duplicate or the first
/// missing action.
pub(crate) fn census(schedule: &Schedule, mode: Mode) -> Result<(), ScheduleError> {
    let shape = schedule.shape();
    let mut counts = vec![[0u8; KINDS]; shape.slots()];
    for (stage, list) in schedule.stages().iter().enumerate() {
        for (position, a) in list.iter().enumerate() {
            let count = &mut counts[shape.slot(stage, a.chunk, a.microbatch)][kind_index(a.kind)];
            if *count == 1 {
                return Err(err(schedule, stage, position, "duplicate action".into()));
            }
            *count = 1;
        }
    }
    let last = shape.virtual_stages() - 1;
    for stage in 0..shape.stages {
        for chunk in 0..shape.chunks {
            let s = shape.virtual_stage(stage, chunk);
            for mb in 0..shape.microbatches {
                let c = counts[shape.slot(stage, chunk, mb)];
                let name = |kind| Action::new(stage, chunk, mb, kind).token(shape.chunks).to_string();
                let missing = |reason: String| Err(ScheduleError::Missing { stage, reason });
                if c[0] == 0 {
                    return missing(format!("no {}", name(ActionKind::Forward)));
                }
                match (c[1], c[2], c[3]) {
                    (1, 0, 0) | (0, 1, 1) => {}
                    (0, 0, 0) => {
                        return missing(format!("no {} for its forward", name(ActionKind::Backward)))
                    }
                    (1, _, _) => {
                        return missing(format!(
                            "{} and a split {}/{} both present",
                            name(ActionKind::Backward),
                            name(ActionKind::BackwardInput),
                            name(ActionKind::BackwardWeight)
                        ))
                    }
                    (_, 1, _) => {
                        return missing(format!(
                            "{} has no {}",
                            name(ActionKind::BackwardInput),
                            name(ActionKind::BackwardWeight)
                        ))
                    }
                    _ => {
                        return missing(format!(
                            "{} has no {}",
                            name(ActionKind::BackwardWeight),
                            name(ActionKind::BackwardInput)
                        ))
                    }
                }
                if mode == Mode::Lowered {
                    // No transfer at the ends of the pipeline, nor to a virtual stage on this
                    // same stage.
                    let next = s < last && !shape.same_stage(s, s + 1);
                    let prev = s > 0 && !shape.same_stage(s, s - 1);
                    let expected = [(4, next), (5, prev), (6, prev), (7, next)];
                    for (kind, wanted) in expected {
                        if (c[kind] == 1) != wanted {
                            let what = ["SA", "RA", "SG", "RG"][kind - 4];
                            let token =
                                format!("{what}{}", name(ActionKind::Forward).trim_start_matches('F'));
                            let reason = if wanted {
                                format!("no {token} transfer on virtual stage {s}")
                            } else {
                                format!("{token} on virtual stage {s}, which has no such peer")
                            };
                            return missing(reason);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

const FORWARD: u8 = 1;
/// Backward or BackwardInput done: the input gradient exists.
const INPUT_GRAD: u8 = 2;
/// BackwardInput done and BackwardWeight may follow.
const SPLIT: u8 = 4;
const ACT_RECEIVED: u8 = 8;
const GRAD_RECEIVED: u8 = 16;

/// Per-(stage, chunk, microbatch) progress: [`Progress::check`] tells whether an action's local
/// prerequisites have run, [`Progress::record`] notes that it ran. Assumes [`census`] passed
/// (no duplicates, no transfers past the ends of the pipeline).
pub(crate) struct Progress {
    shape: Shape,
    mode: Mode,
    flags: Vec<u8>,
}

impl Progress {
    pub(crate) fn new(shape: Shape, mode: Mode) -> Self {
        Self { shape, mode, flags: vec![0; shape.slots()] }
    }

    /// True once the (stage, chunk, microbatch) Forward ran.
    pub(crate) fn forward_done(&self, stage: usize, chunk: usize, microbatch: usize) -> bool {
        self.flags[self.shape.slot(stage, chunk, microbatch)] & FORWARD != 0
    }

    /// True once the (stage, chunk, microbatch) input gradient (Backward or BackwardInput) ran.
    pub(crate) fn input_grad_done(&self, stage: usize, chunk: usize, microbatch: usize) -> bool {
        self.flags[self.shape.slot(stage, chunk, microbatch)] & INPUT_GRAD != 0
    }

    /// Says which local prerequisite `action` lacks (or which peer it names wrongly), if any.
    /// Cross-stage readiness is the caller's concern.
    pub(crate) fn check(&self, action: &Action) -> Result<(), String> {
        let shape = self.shape;
        let s = shape.virtual_stage(action.stage, action.chunk);
        let last = shape.virtual_stages() - 1;
        let lowered = self.mode == Mode::Lowered;
        let flags = self.flags[shape.slot(action.stage, action.chunk, action.microbatch)];
        let token = |kind| Action { kind, ..*action }.token(shape.chunks).to_string();
        // The message is built only on failure: this runs for every action of every check.
        let require = |flag: u8, what: &dyn Fn() -> String| {
            if flags & flag == 0 {
                Err(format!("runs before {}", what()))
            } else {
                Ok(())
            }
        };
        let check_peer = |peer: usize, neighbour: usize| {
            let actual = shape.locate(neighbour).0;
            if peer == actual {
                Ok(())
            } else {
                Err(format!("virtual stage {neighbour} is on stage {actual}, not {peer}"))
            }
        };
        // A neighbour on this same stage hands its tensor over locally: what must have run is
        // its compute, earlier in this list.
        let local = |neighbour: usize| {
            let (stage, chunk) = shape.locate(neighbour);
            (stage == action.stage).then_some(chunk)
        };
        let local_done = |done: bool, what: &dyn Fn() -> String| {
            if done {
                Ok(())
            } else {
                Err(format!("runs before {}", what()))
            }
        };
        match action.kind {
            ActionKind::Forward if lowered && s > 0 => match local(s - 1) {
                Some(chunk) => local_done(self.forward_done(action.stage, chunk, action.microbatch), &|| {
                    let f = Action { chunk, ..*action };
                    format!("its input's forward {}", f.token(shape.chunks))
                }),
                None => require(ACT_RECEIVED, &|| "its input activation is received".into()),
            },
            ActionKind::Forward => Ok(()),
            ActionKind::Backward | ActionKind::BackwardInput => {
                require(FORWARD, &|| format!("its forward {}", token(ActionKind::Forward)))?;
                if lowered && s < last {
                    match local(s + 1) {
                        Some(chunk) => {
                            local_done(self.input_grad_done(action.stage, chunk, action.microbatch), &|| {
                                let f = Action { chunk, kind: ActionKind::Forward, ..*action };
                                format!("the backward of {}", f.token(shape.chunks))
                            })?
                        }
                        None => require(GRAD_RECEIVED, &|| "its output gradient is received".into())?,
                    }
                }
                Ok(())
            }
            ActionKind::BackwardWeight => {
                require(SPLIT, &|| format!("its input-gradient pass {}", token(ActionKind::BackwardInput)))
            }
            ActionKind::SendActivation { to } => {
                check_peer(to, s + 1)?;
                require(FORWARD, &|| format!("its forward {}", token(ActionKind::Forward)))
            }
            ActionKind::SendGrad { to } => {
                check_peer(to, s - 1)?;
                require(INPUT_GRAD, &|| "its backward".into())
            }
            ActionKind::RecvActivation { from } => check_peer(from, s - 1),
            ActionKind::RecvGrad { from } => check_peer(from, s + 1),
        }
    }

    /// Records that `action` ran (after [`Progress::check`] passed).
    pub(crate) fn record(&mut self, action: &Action) {
        let flags = &mut self.flags[self.shape.slot(action.stage, action.chunk, action.microbatch)];
        *flags |= match action.kind {
            ActionKind::Forward => FORWARD,
            ActionKind::Backward => INPUT_GRAD,
            ActionKind::BackwardInput => INPUT_GRAD | SPLIT,
            ActionKind::RecvActivation { .. } => ACT_RECEIVED,
            ActionKind::RecvGrad { .. } => GRAD_RECEIVED,
            _ => 0,
        };
    }
}
