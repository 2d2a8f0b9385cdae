//! The stage runtime: each stage, on its own thread, executes its lowered action list — the
//! very list `simulate` times — moving tensors only through its [`Transport`].
//!
//! A stage that fails (an error or a panic) drops its transport; every peer waiting on it
//! then fails with `PeerStopped`, so the whole step ends within one action, and the driver
//! reports the failing stage's own message.

use crate::chunk::Microbatch;
use crate::stage::Stage;
use crate::transport::{InProcess, Message, Transport, TransportError};
use kernels::{Category, Tensor};
use schedules::{Action, ActionKind, Channel, LoweredSchedule, Payload, Shape};
use std::collections::HashMap;
use std::time::Instant;

/// One microbatch's tokens: inputs and targets [B*T] each.
pub struct MicrobatchData {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

/// What every stage needs to run one step.
pub struct StepInputs<'a> {
    pub step: u32,
    pub microbatches: &'a [MicrobatchData],
    /// None: evaluation (forward only, no dropout, nothing stashed).
    pub grad_scale: Option<f32>,
}

/// When one action ran, in seconds since the step's clock started.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionTiming {
    pub action: Action,
    pub start_s: f64,
    pub end_s: f64,
}

/// What a stage reports after a step.
#[derive(Debug, Default)]
pub struct StageStepReport {
    /// (microbatch, mean loss over its tokens), from the stage holding the head.
    pub losses: Vec<(usize, f64)>,
    pub timings: Vec<ActionTiming>,
    /// Most microbatches whose activations the stage held at once.
    pub max_in_flight: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("stage {stage}: {source}")]
    Transport { stage: usize, source: TransportError },
    #[error("stage {stage}: received {got} for {action}, expected it for virtual stage {expected_vs}, microbatch {expected_mb}")]
    Mismatch { stage: usize, action: String, got: String, expected_vs: usize, expected_mb: usize },
    #[error("stage {stage} panicked: {message}")]
    Panic { stage: usize, message: String },
    #[error("stage {stage}: injected fault at step {step}")]
    Injected { stage: usize, step: u32 },
}

/// A deliberate failure, for testing that a failing stage stops the run cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInjection {
    pub stage: usize,
    pub step: u32,
    /// Panic (true) or return an error (false).
    pub panic: bool,
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
/// each forward's output sent on at once.
pub fn forward_only(shape: Shape) -> (Vec<Vec<Action>>, Vec<Channel>) {
    let (p, v) = (shape.stages, shape.chunks);
    let last = p * v - 1;
    let mut lists = vec![Vec::new(); p];
    let mut channels = Vec::new();
    for mb in 0..shape.microbatches {
        for vs in 0..=last {
            let (rank, chunk) = shape.locate(vs);
            if vs > 0 {
                let from = shape.locate(vs - 1).0;
                lists[rank].push(Action::new(rank, chunk, mb, ActionKind::RecvActivation { from }));
            }
            lists[rank].push(Action::new(rank, chunk, mb, ActionKind::Forward));
            if vs < last {
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

/// Runs one step on every stage, each on its own thread, linked by in-process channels.
/// Returns each stage's report, or the first root-cause failure.
pub fn run_step(
    stages: &mut [Stage],
    plan: &StepPlan,
    inputs: &StepInputs,
    fault: Option<FaultInjection>,
) -> Result<Vec<StageStepReport>, RuntimeError> {
    let p = stages.len();
    let transports = InProcess::mesh(p, plan.channels, plan.capacity);
    let clock = Instant::now();
    let results: Vec<Result<StageStepReport, RuntimeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = stages
            .iter_mut()
            .zip(transports)
            .enumerate()
            .map(|(rank, (stage, mut transport))| {
                let actions = &plan.lists[rank];
                let shape = plan.shape;
                scope.spawn(move || {
                    if let Some(f) = fault.filter(|f| f.stage == rank && f.step == inputs.step) {
                        if f.panic {
                            panic!("injected fault at step {}", f.step);
                        }
                        return Err(RuntimeError::Injected { stage: rank, step: f.step });
                    }
                    run_stage(stage, rank, shape, actions, &mut transport, inputs, clock)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or_else(|payload| Err(panic_error(rank, payload))))
            .collect()
    });
    root_cause(results)
}

fn panic_error(stage: usize, payload: Box<dyn std::any::Any + Send>) -> RuntimeError {
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    RuntimeError::Panic { stage, message }
}

/// All reports, or the error of the stage that failed first-hand (not one that only saw a
/// peer stop).
fn root_cause(
    results: Vec<Result<StageStepReport, RuntimeError>>,
) -> Result<Vec<StageStepReport>, RuntimeError> {
    let mut reports = Vec::with_capacity(results.len());
    let mut secondary = None;
    for r in results {
        match r {
            Ok(report) => reports.push(report),
            Err(e @ RuntimeError::Transport { source: TransportError::PeerStopped { .. }, .. }) => {
                secondary.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match secondary {
        Some(e) => Err(e),
        None => Ok(reports),
    }
}

/// Executes one stage's action list for one step.
pub fn run_stage(
    stage: &mut Stage,
    rank: usize,
    shape: Shape,
    actions: &[Action],
    transport: &mut dyn Transport,
    inputs: &StepInputs,
    clock: Instant,
) -> Result<StageStepReport, RuntimeError> {
    let dev = stage.device.clone();
    let mut report = StageStepReport::default();
    // Tensors waiting for the action that consumes them, by (chunk, microbatch).
    let mut inbox_act: HashMap<(usize, usize), Tensor> = HashMap::new();
    let mut inbox_grad: HashMap<(usize, usize), Tensor> = HashMap::new();
    let mut outbox_act: HashMap<(usize, usize), Tensor> = HashMap::new();
    let mut outbox_grad: HashMap<(usize, usize), Tensor> = HashMap::new();
    let transport_err = |source| RuntimeError::Transport { stage: rank, source };
    for action in actions {
        let key = (action.chunk, action.microbatch);
        let start = clock.elapsed().as_secs_f64();
        match action.kind {
            ActionKind::Forward => {
                let data = &inputs.microbatches[action.microbatch];
                let mb = Microbatch {
                    step: inputs.step,
                    index: action.microbatch as u32,
                    tokens: &data.inputs,
                    targets: &data.targets,
                    grad_scale: inputs.grad_scale,
                };
                let (output, losses) = stage.forward(action.chunk, &mb, inbox_act.remove(&key));
                if let Some(out) = output {
                    outbox_act.insert(key, out);
                }
                if let Some(l) = losses {
                    report.losses.push((action.microbatch, mean(&l)));
                }
                report.max_in_flight = report.max_in_flight.max(stage.in_flight());
            }
            ActionKind::Backward | ActionKind::BackwardInput => {
                let split = action.kind == ActionKind::BackwardInput;
                if let Some(dinput) =
                    stage.backward(action.chunk, action.microbatch as u32, inbox_grad.remove(&key), split)
                {
                    outbox_grad.insert(key, dinput);
                }
            }
            ActionKind::BackwardWeight => stage.backward_weight(action.chunk, action.microbatch as u32),
            ActionKind::SendActivation { to } | ActionKind::SendGrad { to } => {
                let payload = action.kind.transfer().expect("a send").1;
                let outbox = if payload == Payload::Activation { &mut outbox_act } else { &mut outbox_grad };
                let t = outbox.remove(&key).expect("the lowering sends only what was computed");
                let msg = Message {
                    virtual_stage: shape.virtual_stage(rank, action.chunk),
                    microbatch: action.microbatch,
                    shape: t.shape().to_vec(),
                    data: dev.to_host(&t),
                };
                drop(t);
                transport.send(to, payload, msg).map_err(transport_err)?;
            }
            ActionKind::RecvActivation { from } | ActionKind::RecvGrad { from } => {
                let payload = action.kind.transfer().expect("a receive").1;
                let msg = transport.recv(from, payload).map_err(transport_err)?;
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
                let t = dev.from_host(&msg.data, &msg.shape, Category::Transfer);
                let inbox = if payload == Payload::Activation { &mut inbox_act } else { &mut inbox_grad };
                inbox.insert(key, t);
            }
        }
        report.timings.push(ActionTiming {
            action: *action,
            start_s: start,
            end_s: clock.elapsed().as_secs_f64(),
        });
    }
    Ok(report)
}

/// Mean of per-token losses, summed in order in f64.
pub fn mean(losses: &[f32]) -> f64 {
    losses.iter().map(|&l| l as f64).sum::<f64>() / losses.len() as f64
}
