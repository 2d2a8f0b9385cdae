//! The executor: runs lowered lists the way the trainer does, one thread of control per stage,
//! and so proves they complete.
//!
//! Semantics, which are also the trainer's contract:
//! * Each stage executes its list strictly in order.
//! * Transfers go through FIFO channels, one per (sending stage, receiving stage, payload);
//!   each has exactly one writer and one reader. A send appends and returns at once while the
//!   channel holds fewer than `capacity` messages, and otherwise blocks until the reader takes
//!   one; `Unbounded` never blocks, which models NCCL `isend` inside a group (the sender does
//!   not wait for the receiver). A receive blocks until a message is there and must find the
//!   (chunk, microbatch) it names at the head: the lowering keeps receive order equal to send
//!   order on every channel.
//! * Every action's local prerequisites must have run (forward before backward, receive before
//!   the compute that reads it, compute before the send of its result).
//!
//! Once enabled, a stage's next action stays enabled whatever the other stages do (a channel
//! only gains messages from its one writer and only loses them to its one reader). Such a
//! system is persistent: every maximal run ends in the same state. So this one run, in an
//! arbitrary order, decides for every thread interleaving whether the lists complete or
//! deadlock, and a deadlock found here is reported with each stuck stage's action.

use crate::ir::{Action, ActionKind, Payload, Schedule};
use crate::progress::{census, Mode, Progress};
use crate::ScheduleError;
use std::collections::VecDeque;
use std::num::NonZeroUsize;

/// How many messages a channel buffers before a send blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelCapacity {
    Bounded(NonZeroUsize),
    /// Sends never block (buffered like NCCL `isend`).
    Unbounded,
}

/// One executed action, in an order that respects every dependency: a receive comes after its
/// send. `channel` numbers the action's channel (dense, from 0) when it is a transfer.
pub(crate) struct Step<'a> {
    pub stage: usize,
    pub action: &'a Action,
    pub channel: Option<usize>,
}

/// The FIFO channels, created as transfers name them.
struct Channels {
    /// Per sending stage: (receiving stage, payload, channel id). A stage talks to few peers,
    /// so a scan beats hashing.
    by_sender: Vec<Vec<(usize, Payload, usize)>>,
    /// Queued messages as (receiver's chunk, microbatch).
    queues: Vec<VecDeque<(usize, usize)>>,
}

impl Channels {
    fn id(&mut self, from: usize, to: usize, payload: Payload) -> usize {
        let known = self.by_sender[from].iter().find(|&&(t, p, _)| t == to && p == payload);
        if let Some(&(_, _, id)) = known {
            return id;
        }
        let id = self.queues.len();
        self.by_sender[from].push((to, payload, id));
        self.queues.push(VecDeque::new());
        id
    }
}

/// The end of a channel a transfer uses (and, when it cannot proceed, what its stage waits on).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Port {
    Send(usize),
    Recv(usize),
}

/// Runs `schedule` (lowered) with the given channel capacity, calling `on_step` for every
/// action as it runs. Errors name the first broken action, or every stuck stage on deadlock.
pub(crate) fn run(
    schedule: &Schedule,
    capacity: ChannelCapacity,
    mut on_step: impl FnMut(Step<'_>),
) -> Result<(), ScheduleError> {
    census(schedule, Mode::Lowered)?;
    let shape = schedule.shape();
    let p = shape.stages;
    let mut progress = Progress::new(shape, Mode::Lowered);
    let mut channels = Channels { by_sender: vec![Vec::new(); p], queues: Vec::new() };
    let mut next = vec![0usize; p];
    let mut blocked: Vec<Option<Port>> = vec![None; p];
    let mut ready: Vec<usize> = (0..p).rev().collect();
    let limit = match capacity {
        ChannelCapacity::Bounded(c) => c.get(),
        ChannelCapacity::Unbounded => usize::MAX,
    };

    while let Some(stage) = ready.pop() {
        let list = schedule.actions(stage);
        while let Some(action) = list.get(next[stage]) {
            let position = next[stage];
            let fail = |reason: String| ScheduleError::Action {
                stage,
                position,
                action: action.token(shape.chunks).to_string(),
                reason,
            };
            // Checked before any wait, so a wrong peer is reported as such, not as a deadlock.
            progress.check(action).map_err(fail)?;
            let port = action.kind.transfer().map(|(peer, payload)| match action.kind {
                ActionKind::SendActivation { .. } | ActionKind::SendGrad { .. } => {
                    Port::Send(channels.id(stage, peer, payload))
                }
                _ => Port::Recv(channels.id(peer, stage, payload)),
            });
            match port {
                Some(Port::Send(id)) if channels.queues[id].len() >= limit => {
                    blocked[stage] = port;
                    break;
                }
                Some(Port::Recv(id)) if channels.queues[id].is_empty() => {
                    blocked[stage] = port;
                    break;
                }
                _ => {}
            }
            progress.record(action);
            match port {
                Some(Port::Send(id)) => {
                    let s = shape.virtual_stage(stage, action.chunk);
                    let (to, chunk) = match action.kind {
                        ActionKind::SendActivation { .. } => shape.locate(s + 1),
                        _ => shape.locate(s - 1),
                    };
                    channels.queues[id].push_back((chunk, action.microbatch));
                    if blocked[to] == Some(Port::Recv(id)) {
                        blocked[to] = None;
                        ready.push(to);
                    }
                }
                Some(Port::Recv(id)) => {
                    let (chunk, microbatch) = channels.queues[id].pop_front().expect("checked non-empty");
                    if (chunk, microbatch) != (action.chunk, action.microbatch) {
                        let head = Action { chunk, microbatch, ..*action };
                        return Err(fail(format!(
                            "the channel's next message is for {}: the sender's order differs",
                            head.token(shape.chunks)
                        )));
                    }
                    let from = action.kind.transfer().expect("a receive").0;
                    if blocked[from] == Some(Port::Send(id)) {
                        blocked[from] = None;
                        ready.push(from);
                    }
                }
                None => {}
            }
            on_step(Step { stage, action, channel: port.map(|(Port::Send(id) | Port::Recv(id))| id) });
            next[stage] += 1;
        }
    }

    let stuck: Vec<String> = (0..p)
        .filter_map(|stage| {
            let position = next[stage];
            let action = schedule.actions(stage).get(position)?;
            let (peer, _) = action.kind.transfer().expect("only transfers block");
            let why = match blocked[stage] {
                Some(Port::Send(id)) => {
                    format!("channel to stage {peer} is full ({} queued)", channels.queues[id].len())
                }
                _ => format!("nothing from stage {peer} yet"),
            };
            Some(format!(
                "stage {stage} blocked at {} (action {position}): {why}",
                action.token(shape.chunks)
            ))
        })
        .collect();
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(ScheduleError::Deadlock { blocked: stuck })
    }
}
