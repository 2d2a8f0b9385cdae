//! The schedule IR: what one pipeline stage does, in order.
//!
//! A [`Schedule`] is one ordered [`Action`] list per stage plus its [`Shape`]: `stages` (p),
//! model `chunks` per stage (v), `microbatches` (m) and the [`Placement`] of chunks on stages:
//! interleaved (Megatron-LM: chunk `c` of stage `r` is virtual stage `c * p + r`) or V (two
//! chunks, stage `r` holding virtual stages `r` and `2p - 1 - r`). Activations flow from
//! virtual stage `s` to `s + 1` and gradients from `s + 1` back to `s`; where both are on one
//! stage (V's turn at stage p - 1) the tensor stays there, with no transfer.
//!
//! Compute actions are [`ActionKind::Forward`], [`ActionKind::Backward`] (input and weight
//! gradients together) or the split pair [`ActionKind::BackwardInput`] then
//! [`ActionKind::BackwardWeight`] used by zero-bubble schedules. Lowering
//! ([`crate::lower`]) adds the transfers, which carry the peer stage; their `chunk` is always
//! the chunk *on this stage* that produced (send) or will consume (receive) the tensor.

use crate::ScheduleError;

/// What travels between stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Payload {
    /// A forward output, to the next virtual stage.
    Activation,
    /// The gradient of a forward input, to the previous virtual stage.
    Grad,
}

/// One step of a stage's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Forward,
    /// Input and weight gradients in one pass.
    Backward,
    /// Input gradient only (zero-bubble "B"); what the previous stage waits for.
    BackwardInput,
    /// Weight gradient only (zero-bubble "W"); no other stage waits for it.
    BackwardWeight,
    /// Send this chunk's forward output for the microbatch to stage `to`.
    SendActivation {
        to: usize,
    },
    /// Receive the input of this chunk's forward for the microbatch from stage `from`.
    RecvActivation {
        from: usize,
    },
    /// Send the gradient of this chunk's forward input to stage `to`.
    SendGrad {
        to: usize,
    },
    /// Receive the gradient of this chunk's forward output from stage `from`.
    RecvGrad {
        from: usize,
    },
}

impl ActionKind {
    /// True for the four kinds that compute (the others only move tensors).
    pub fn is_compute(self) -> bool {
        matches!(self, Self::Forward | Self::Backward | Self::BackwardInput | Self::BackwardWeight)
    }

    /// The other stage of a transfer, with what travels; `None` for compute.
    pub fn transfer(self) -> Option<(usize, Payload)> {
        match self {
            Self::SendActivation { to } => Some((to, Payload::Activation)),
            Self::RecvActivation { from } => Some((from, Payload::Activation)),
            Self::SendGrad { to } => Some((to, Payload::Grad)),
            Self::RecvGrad { from } => Some((from, Payload::Grad)),
            _ => None,
        }
    }
}

/// One action of one stage on one (chunk, microbatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Action {
    pub stage: usize,
    pub chunk: usize,
    pub microbatch: usize,
    pub kind: ActionKind,
}

impl Action {
    pub const fn new(stage: usize, chunk: usize, microbatch: usize, kind: ActionKind) -> Self {
        Self { stage, chunk, microbatch, kind }
    }
}

/// How the virtual stages are laid on the stages: the one place that decides it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Chunk `c` of stage `r` is virtual stage `c * p + r` (also the single-chunk case).
    #[default]
    Interleaved,
    /// Two chunks: stage `r` holds virtual stages `r` (chunk 0) and `2p - 1 - r` (chunk 1), so
    /// stage 0 holds both ends of the model (ZB-V, DualPipeV).
    V,
}

/// The dimensions of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Pipeline stages, p (one device each).
    pub stages: usize,
    /// Model chunks per stage, v (1 unless interleaved or V).
    pub chunks: usize,
    /// Microbatches per iteration, m.
    pub microbatches: usize,
    pub placement: Placement,
}

impl Shape {
    /// An interleaved (or single-chunk) shape with every count at least 1.
    pub fn new(stages: usize, chunks: usize, microbatches: usize) -> Result<Self, ScheduleError> {
        let shape = Self { stages, chunks, microbatches, placement: Placement::Interleaved };
        shape.check()?;
        Ok(shape)
    }

    /// A V shape: two chunks per stage, placed as [`Placement::V`].
    pub fn v(stages: usize, microbatches: usize) -> Result<Self, ScheduleError> {
        let shape = Self { stages, chunks: 2, microbatches, placement: Placement::V };
        shape.check()?;
        Ok(shape)
    }

    fn check(&self) -> Result<(), ScheduleError> {
        for (name, value) in
            [("stages", self.stages), ("chunks", self.chunks), ("microbatches", self.microbatches)]
        {
            if value == 0 {
                return Err(ScheduleError::Shape(format!("the number of {name} must be at least 1")));
            }
        }
        if self.placement == Placement::V && self.chunks != 2 {
            return Err(ScheduleError::Shape(format!(
                "a V placement has 2 chunks per stage, not {}",
                self.chunks
            )));
        }
        Ok(())
    }

    /// p * v: the length of the model's pipeline.
    pub fn virtual_stages(&self) -> usize {
        self.stages * self.chunks
    }

    /// The virtual stage that chunk `chunk` of stage `stage` holds.
    pub fn virtual_stage(&self, stage: usize, chunk: usize) -> usize {
        match (self.placement, chunk) {
            (Placement::V, 1) => 2 * self.stages - 1 - stage,
            _ => chunk * self.stages + stage,
        }
    }

    /// (stage, chunk) holding virtual stage `virtual_stage`.
    pub fn locate(&self, virtual_stage: usize) -> (usize, usize) {
        let p = self.stages;
        match self.placement {
            Placement::V if virtual_stage >= p => (2 * p - 1 - virtual_stage, 1),
            _ => (virtual_stage % p, virtual_stage / p),
        }
    }

    /// True when virtual stages `a` and `b` sit on one stage, so a tensor between them
    /// stays on that stage: lowering adds no transfer and the runtime hands it over locally.
    pub fn same_stage(&self, a: usize, b: usize) -> bool {
        self.locate(a).0 == self.locate(b).0
    }

    /// Dense index of (stage, chunk, microbatch), for per-microbatch tables.
    pub(crate) fn slot(&self, stage: usize, chunk: usize, microbatch: usize) -> usize {
        (stage * self.chunks + chunk) * self.microbatches + microbatch
    }

    pub(crate) fn slots(&self) -> usize {
        self.stages * self.chunks * self.microbatches
    }
}

/// How many (chunk, microbatch) activation sets a stage holds at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Held whole: from the forward's start to the end of its Backward or BackwardInput.
    pub full: usize,
    /// Held at all: also counting those whose BackwardInput ran but whose BackwardWeight has
    /// not (they keep only what the weight gradient needs). Equals `full` without a split.
    pub total: usize,
}

/// One ordered action list per stage, with the shape they fill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    shape: Shape,
    stages: Vec<Vec<Action>>,
}

impl Schedule {
    /// Checks that there is one list per stage, that each action sits in its own stage's list
    /// and that every index (chunk, microbatch, peer) is in range. Ordering and completeness
    /// are the validator's job ([`crate::validate`]).
    pub fn new(shape: Shape, stages: Vec<Vec<Action>>) -> Result<Self, ScheduleError> {
        shape.check()?;
        if stages.len() != shape.stages {
            return Err(ScheduleError::Shape(format!(
                "{} action lists for {} stages",
                stages.len(),
                shape.stages
            )));
        }
        for (stage, list) in stages.iter().enumerate() {
            for (position, action) in list.iter().enumerate() {
                let reason = if action.stage != stage {
                    Some(format!("belongs to stage {} but is in stage {stage}'s list", action.stage))
                } else if action.chunk >= shape.chunks {
                    Some(format!("chunk {} out of range (chunks = {})", action.chunk, shape.chunks))
                } else if action.microbatch >= shape.microbatches {
                    Some(format!(
                        "microbatch {} out of range (microbatches = {})",
                        action.microbatch, shape.microbatches
                    ))
                } else {
                    match action.kind.transfer() {
                        Some((peer, _)) if peer >= shape.stages => {
                            Some(format!("peer stage {peer} out of range (stages = {})", shape.stages))
                        }
                        _ => None,
                    }
                };
                if let Some(reason) = reason {
                    return Err(ScheduleError::Action {
                        stage,
                        position,
                        action: action.token(shape.chunks).to_string(),
                        reason,
                    });
                }
            }
        }
        Ok(Self { shape, stages })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Stage `stage`'s actions in execution order.
    pub fn actions(&self, stage: usize) -> &[Action] {
        &self.stages[stage]
    }

    /// All lists, indexed by stage.
    pub fn stages(&self) -> &[Vec<Action>] {
        &self.stages
    }

    /// Total number of actions over all stages.
    pub fn len(&self) -> usize {
        self.stages.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if any action is a transfer, i.e. the schedule has been lowered (a one-stage,
    /// one-chunk schedule needs no transfers, so its lowered form has none).
    pub fn has_transfers(&self) -> bool {
        self.stages.iter().flatten().any(|a| !a.kind.is_compute())
    }

    /// Peak in-flight (chunk, microbatch) activation sets per stage, measured by walking each
    /// list: one enters at its Forward and leaves at its Backward (for `full`: also at its
    /// BackwardInput) or its BackwardWeight (for `total`). Transfers do not count.
    pub fn measured_in_flight(&self) -> Vec<InFlight> {
        self.stages
            .iter()
            .map(|list| {
                let (mut full, mut total, mut peak) = (0usize, 0usize, InFlight::default());
                for action in list {
                    match action.kind {
                        ActionKind::Forward => {
                            full += 1;
                            total += 1;
                            peak.full = peak.full.max(full);
                            peak.total = peak.total.max(total);
                        }
                        ActionKind::Backward => {
                            full = full.saturating_sub(1);
                            total = total.saturating_sub(1);
                        }
                        ActionKind::BackwardInput => full = full.saturating_sub(1),
                        ActionKind::BackwardWeight => total = total.saturating_sub(1),
                        _ => {}
                    }
                }
                peak
            })
            .collect()
    }
}
