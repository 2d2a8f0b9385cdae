//! The stage runtime: a stage executes its lowered action list — the very list `simulate`
//! times — moving tensors only through its [`Transport`]. Which thread or process runs it,
//! and how the ranks are launched, is the caller's.
//!
//! A stage that fails drops its transport; every peer waiting on it then fails with
//! `PeerStopped`, so the whole step ends within one action, and the launcher reports the
//! failing stage's own message. A peer that neither answers nor fails is waited for up to
//! the distributed timeout; the error then names the action that waited.

use crate::chunk::{Microbatch, Mode};
use crate::dist::{DistError, Message, TensorGroup, Transport};
use crate::stage::Stage;
use kernels::{Mark, Readings, Tensor};
use schedules::{Action, ActionKind, Channel, LoweredSchedule, Payload, Shape};
use std::collections::HashMap;

/// One microbatch's tokens: inputs and targets [B*T] each.
pub struct MicrobatchData {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

/// What a stage needs to run one step.
pub struct StepInputs<'a> {
    pub step: u32,
    /// This replica's microbatches; the action lists number them from 0.
    pub microbatches: &'a [MicrobatchData],
    /// The global index of this replica's microbatch 0 (replica r of dp, m each: r * m), so
    /// dropout masks are keyed as with one replica.
    pub first_microbatch: usize,
    pub mode: Mode,
}

/// When one action ran, in seconds since the step's clock started.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionTiming {
    pub action: Action,
    pub start_s: f64,
    pub end_s: f64,
}

/// Where one action began and ended in the stage device's work, read at the step's end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActionMarks {
    pub action: Action,
    pub start: Mark,
    pub end: Mark,
}

/// What a stage reports after a step.
#[derive(Debug, Default)]
pub struct StageStepReport {
    pub marks: Vec<ActionMarks>,
    /// Most microbatches whose activations the stage held at once.
    pub max_in_flight: usize,
}

impl StageStepReport {
    /// Each action's times, from the device clock's `readings` (taken after the step).
    pub fn timings(&self, readings: &Readings) -> Vec<ActionTiming> {
        self.marks
            .iter()
            .map(|m| ActionTiming {
                action: m.action,
                start_s: readings.at(m.start),
                end_s: readings.at(m.end),
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// `action` names the transfer ("recv activation of microbatch 3 from stage 0"); what
    /// went wrong with it is the source, next in the error's chain.
    #[error("stage {stage}: {action}")]
    Transport { stage: usize, action: String, source: DistError },
    /// A collective of the tensor-parallel group inside a layer failed during `action`
    /// ("forward of microbatch 3").
    #[error("stage {stage}: {action}, in the tensor-parallel group")]
    TensorGroup { stage: usize, action: String, source: DistError },
    #[error("stage {stage}: received {got} for {action}, expected it for virtual stage {expected_vs}, microbatch {expected_mb}")]
    Mismatch { stage: usize, action: String, got: String, expected_vs: usize, expected_mb: usize },
    #[error("stage {stage}: injected fault at step {step}")]
    Injected { stage: usize, step: u32 },
}

impl RuntimeError {
    /// Whether this stage only saw a peer stop (a consequence, not a root cause).
    pub fn is_peer_stopped(&self) -> bool {
        matches!(
            self,
            RuntimeError::Transport { source: DistError::PeerStopped { .. }, .. }
                | RuntimeError::TensorGroup { source: DistError::PeerStopped { .. }, .. }
        )
    }
}

/// A deliberate failure, for testing that a failing rank stops the run cleanly: the rank
/// fails in the middle of `step`, after its first action, while its peers wait on it; or,
/// for a device error or a non-finite gradient, at the step's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInjection {
    pub rank: usize,
    pub step: u32,
    pub kind: Fault,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The stage returns an error.
    Error,
    /// The stage panics.
    Panic,
    /// The device reports an error it recorded (as CUDA's asynchronous errors arrive).
    Device,
    /// A gradient of the stage turns NaN at the end of its backward (as an overflow would
    /// leave it).
    NonFinite,
    /// The stage stops answering without failing, as a hung rank or a partitioned host
    /// does: its peers wait on it until the distributed timeout.
    Stall,
}

/// The per-stage action lists one step executes, with the channels they use.
pub struct StepPlan<'a> {
    pub shape: Shape,
    pub lists: &'a [Vec<Action>],
    pub channels: &'a [Channel],
    /// Messages each channel buffers.
    pub capacity: usize,
}

impl<'a> StepPlan<'a> {
    pub fn lowered(schedule: &'a LoweredSchedule) -> Self {
        StepPlan {
            shape: schedule.schedule().shape(),
            lists: schedule.schedule().stages(),
            channels: schedule.channels(),
            capacity: schedule.required_capacity().get(),
        }
    }
}

/// A forward-only plan (evaluation): every microbatch through every virtual stage in order,
/// each forward's output sent on at once (or, to a chunk of the same stage, handed over).
pub fn forward_only(shape: Shape) -> (Vec<Vec<Action>>, Vec<Channel>) {
    let (p, v) = (shape.stages, shape.chunks);
    let last = p * v - 1;
    let mut lists = vec![Vec::new(); p];
    let mut channels = Vec::new();
    for mb in 0..shape.microbatches {
        for vs in 0..=last {
            let (rank, chunk) = shape.locate(vs);
            // A neighbour on this same stage (a V's turn) hands its output over locally.
            if vs > 0 && !shape.same_stage(vs - 1, vs) {
                let from = shape.locate(vs - 1).0;
                lists[rank].push(Action::new(rank, chunk, mb, ActionKind::RecvActivation { from }));
            }
            lists[rank].push(Action::new(rank, chunk, mb, ActionKind::Forward));
            if vs < last && !shape.same_stage(vs, vs + 1) {
                let to = shape.locate(vs + 1).0;
                lists[rank].push(Action::new(rank, chunk, mb, ActionKind::SendActivation { to }));
                let c = Channel { from: rank, to, payload: Payload::Activation };
                if !channels.contains(&c) {
                    channels.push(c);
                }
            }
        }
    }
    (lists, channels)
}

/// Executes stage `rank`'s action list for one step, marking each action's start and end
/// on the stage's device clock (which the caller starts and reads) and leaving the losses of
/// the microbatches whose head ran here on the device for [`Stage::read_step`](crate::Stage::read_step).
/// `fault`, when given, fails this stage after its first action. The layers' tensor-parallel
/// collectives go through `tp`.
#[allow(clippy::too_many_arguments)]
pub fn run_stage(
    stage: &mut Stage,
    rank: usize,
    shape: Shape,
    actions: &[Action],
    transport: &mut dyn Transport,
    tp: &mut TensorGroup,
    inputs: &StepInputs,
    fault: Option<FaultInjection>,
) -> Result<StageStepReport, RuntimeError> {
    let dev = stage.device.clone();
    stage.begin_step(inputs.microbatches.len());
    let mut report = StageStepReport::default();
    // Tensors waiting for the action that consumes them, by (chunk, microbatch).
    let mut inbox_act: HashMap<(usize, usize), Tensor> = HashMap::new();
    let mut inbox_grad: HashMap<(usize, usize), Tensor> = HashMap::new();
    let mut outbox_act: HashMap<(usize, usize), Tensor> = HashMap::new();
    let mut outbox_grad: HashMap<(usize, usize), Tensor> = HashMap::new();
    let global = |mb: usize| (inputs.first_microbatch + mb) as u32;
    for (i, action) in actions.iter().enumerate() {
        match fault.filter(|_| i == 1) {
            Some(FaultInjection { kind: Fault::Panic, step, .. }) => panic!("injected fault at step {step}"),
            Some(FaultInjection { kind: Fault::Error, step, .. }) => {
                return Err(RuntimeError::Injected { stage: rank, step })
            }
            Some(FaultInjection { kind: Fault::Stall, .. }) => loop {
                std::thread::park();
            },
            _ => {}
        }
        let transport_err =
            |source| RuntimeError::Transport { stage: rank, action: describe(action), source };
        let key = (action.chunk, action.microbatch);
        let start = dev.clock_mark();
        match action.kind {
            ActionKind::Forward => {
                let data = &inputs.microbatches[action.microbatch];
                let mb = Microbatch {
                    step: inputs.step,
                    index: global(action.microbatch),
                    tokens: &data.inputs,
                    targets: &data.targets,
                    mode: inputs.mode,
                };
                if let Some(out) = stage.forward(action.chunk, &mb, inbox_act.remove(&key), tp) {
                    match local(shape, rank, action, 1) {
                        Some(next) => inbox_act.insert((next, action.microbatch), out),
                        None => outbox_act.insert(key, out),
                    };
                }
                report.max_in_flight = report.max_in_flight.max(stage.in_flight());
            }
            ActionKind::Backward | ActionKind::BackwardInput => {
                let split = action.kind == ActionKind::BackwardInput;
                if let Some(dinput) = stage.backward(
                    action.chunk,
                    global(action.microbatch),
                    inbox_grad.remove(&key),
                    split,
                    tp,
                ) {
                    match local(shape, rank, action, -1) {
                        Some(previous) => inbox_grad.insert((previous, action.microbatch), dinput),
                        None => outbox_grad.insert(key, dinput),
                    };
                }
            }
            ActionKind::BackwardWeight => stage.backward_weight(action.chunk, global(action.microbatch)),
            ActionKind::SendActivation { to } | ActionKind::SendGrad { to } => {
                let payload = action.kind.transfer().expect("a send").1;
                let outbox = if payload == Payload::Activation { &mut outbox_act } else { &mut outbox_grad };
                let t = outbox.remove(&key).expect("the lowering sends only what was computed");
                let msg = Message {
                    virtual_stage: shape.virtual_stage(rank, action.chunk),
                    microbatch: action.microbatch,
                    tensor: t,
                };
                transport.send(to, payload, msg, &*dev).map_err(transport_err)?;
            }
            ActionKind::RecvActivation { from } | ActionKind::RecvGrad { from } => {
                let payload = action.kind.transfer().expect("a receive").1;
                let msg = transport.recv(from, payload, &*dev).map_err(transport_err)?;
                let vs = shape.virtual_stage(rank, action.chunk);
                let expected_vs = if payload == Payload::Activation { vs - 1 } else { vs + 1 };
                if msg.virtual_stage != expected_vs || msg.microbatch != action.microbatch {
                    return Err(RuntimeError::Mismatch {
                        stage: rank,
                        action: format!("{action:?}"),
                        got: format!("virtual stage {}, microbatch {}", msg.virtual_stage, msg.microbatch),
                        expected_vs,
                        expected_mb: action.microbatch,
                    });
                }
                let inbox = if payload == Payload::Activation { &mut inbox_act } else { &mut inbox_grad };
                inbox.insert(key, msg.tensor);
            }
        }
        if let Some(source) = tp.take_error() {
            let what = if action.kind == ActionKind::Forward { "forward" } else { "backward" };
            let action = format!("{what} of microbatch {}", action.microbatch);
            return Err(RuntimeError::TensorGroup { stage: rank, action, source });
        }
        report.marks.push(ActionMarks { action: *action, start, end: dev.clock_mark() });
    }
    Ok(report)
}

/// A transfer as an error names it: "recv activation of microbatch 3 from stage 0".
fn describe(action: &Action) -> String {
    let (peer, payload) = action.kind.transfer().expect("a transfer");
    let (verb, preposition) = match action.kind {
        ActionKind::SendActivation { .. } | ActionKind::SendGrad { .. } => ("send", "to"),
        _ => ("recv", "from"),
    };
    let what = match payload {
        Payload::Activation => "activation",
        Payload::Grad => "grad",
    };
    format!("{verb} {what} of microbatch {} {preposition} stage {peer}", action.microbatch)
}

/// The chunk of this stage that holds the virtual stage `step` (+1 or -1) away from the
/// action's, if this stage holds it: a V placement's turn, where the tensor is handed over
/// here instead of through the transport (the lowering adds no transfer for it).
fn local(shape: Shape, rank: usize, action: &Action, step: isize) -> Option<usize> {
    let neighbour = shape.virtual_stage(rank, action.chunk).checked_add_signed(step)?;
    (neighbour < shape.virtual_stages())
        .then(|| shape.locate(neighbour))
        .and_then(|(stage, chunk)| (stage == rank).then_some(chunk))
}
