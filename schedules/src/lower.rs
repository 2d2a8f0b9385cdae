//! Lowering: adds the transfers to a compute schedule, giving the exact lists the trainer
//! runs and the simulator times.
//!
//! * After a Forward of virtual stage `s < p*v - 1`: `SendActivation` to the stage of `s + 1`.
//! * After a Backward or BackwardInput of virtual stage `s > 0`: `SendGrad` to the stage of
//!   `s - 1`. (BackwardWeight sends nothing: no other stage needs it.)
//! * Neither where the neighbouring virtual stage is on the same stage (a V placement's turn):
//!   the tensor stays there, and the list's own order carries the dependency.
//! * Before a compute action that reads another stage's tensor: the receive for it, and, first,
//!   any earlier-sent message on the same channel not yet received. Receives therefore happen
//!   in send order on every channel (FIFO channels suffice), and never earlier than needed:
//!   a message sent earlier arrives no later than the one being waited for.
//!
//! Guarantee for a trainer that runs each stage's list on its own thread with one bounded FIFO
//! channel per (sender, receiver, payload) — see [`crate::execute`] for the exact semantics:
//! every [`LoweredSchedule`] has been executed under those semantics with
//! [`LoweredSchedule::required_capacity`] messages per channel and completed, which (by
//! persistence) means it completes under every thread interleaving with that capacity or
//! more. In particular no stage ever blocks on a send whose receiver would first need
//! something back from it. For the schedules the generators produce the capacity is 1, but
//! ZB-V's greedy order needs 2 from p = 6 on (checked by the property tests); a rendezvous
//! channel (capacity 0) would deadlock even plain 1F1B.

use crate::execute::{run, ChannelCapacity};
use crate::ir::{Action, ActionKind, Payload, Schedule, Shape};
use crate::validate::validate;
use crate::ScheduleError;
use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;

/// A FIFO link the trainer must create: stage `from` sends `payload` tensors to stage `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Channel {
    pub from: usize,
    pub to: usize,
    pub payload: Payload,
}

/// A schedule with transfers that is proven to run to completion (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoweredSchedule {
    schedule: Schedule,
    channels: Vec<Channel>,
    required_capacity: NonZeroUsize,
}

impl LoweredSchedule {
    /// Accepts a schedule that already has its transfers (for instance parsed from text),
    /// after executing it: errors name the broken or deadlocked actions.
    pub fn new(schedule: Schedule) -> Result<Self, ScheduleError> {
        let mut messages: BTreeMap<Channel, usize> = BTreeMap::new();
        for action in schedule.stages().iter().flatten() {
            if let ActionKind::SendActivation { to } | ActionKind::SendGrad { to } = action.kind {
                let payload = action.kind.transfer().expect("a send").1;
                *messages.entry(Channel { from: action.stage, to, payload }).or_default() += 1;
            }
        }
        let attempt = |capacity: usize| {
            let capacity = NonZeroUsize::new(capacity).expect("capacities start at 1");
            run(&schedule, ChannelCapacity::Bounded(capacity), |_| {})
        };
        // Completion is monotone in the capacity, so success with one message per channel
        // settles it. Otherwise a broken list is reported as such; a deadlock is either real
        // (the unbounded run says so) or a matter of buffering, and then a capacity as large
        // as the busiest channel's message count never blocks a send and so completes; the
        // smallest capacity that does lies in between.
        let mut hi = 1;
        match attempt(1) {
            Ok(()) => {}
            Err(ScheduleError::Deadlock { .. }) => {
                run(&schedule, ChannelCapacity::Unbounded, |_| {})?;
                let mut lo = 1;
                hi = messages.values().copied().max().unwrap_or(1);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if attempt(mid).is_ok() {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
            }
            Err(broken) => return Err(broken),
        }
        let required_capacity = NonZeroUsize::new(hi).expect("at least 1");
        Ok(Self { schedule, channels: messages.into_keys().collect(), required_capacity })
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Stage `stage`'s lowered list: what its thread executes.
    pub fn actions(&self, stage: usize) -> &[Action] {
        self.schedule.actions(stage)
    }

    /// Every channel the lists use, sorted.
    pub fn channels(&self) -> &[Channel] {
        &self.channels
    }

    /// The smallest per-channel buffer (in messages) with which the lists always complete.
    pub fn required_capacity(&self) -> NonZeroUsize {
        self.required_capacity
    }

    /// Runs the lists under the executor's semantics with the given capacity; `Ok` proves
    /// completion for every thread interleaving, an error names the stuck actions.
    pub fn execute(&self, capacity: ChannelCapacity) -> Result<(), ScheduleError> {
        run(&self.schedule, capacity, |_| {})
    }
}

impl fmt::Display for LoweredSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.schedule.fmt(f)
    }
}

impl FromStr for LoweredSchedule {
    type Err = ScheduleError;

    fn from_str(text: &str) -> Result<Self, ScheduleError> {
        Self::new(text.parse()?)
    }
}

/// Validates a compute-only schedule and inserts its transfers (see the module docs).
pub fn lower(schedule: &Schedule) -> Result<LoweredSchedule, ScheduleError> {
    if let Some((stage, position, action)) = schedule
        .stages()
        .iter()
        .enumerate()
        .find_map(|(r, list)| list.iter().position(|a| !a.kind.is_compute()).map(|i| (r, i, list[i])))
    {
        return Err(ScheduleError::Action {
            stage,
            position,
            action: action.token(schedule.shape().chunks).to_string(),
            reason: "the schedule is already lowered".into(),
        });
    }
    validate(schedule)?;
    let shape = schedule.shape();

    // Each channel's messages (receiver's chunk, microbatch) in send order, and for each
    // received tensor its index in that order.
    let mut sequences: BTreeMap<Channel, Vec<(usize, usize)>> = BTreeMap::new();
    let mut index = vec![0usize; shape.slots() * 2];
    let slot =
        |stage, chunk, microbatch, payload| shape.slot(stage, chunk, microbatch) * 2 + payload as usize;
    for action in schedule.stages().iter().flatten() {
        if let Some((to, chunk, payload)) = output(shape, action) {
            let sequence = sequences.entry(Channel { from: action.stage, to, payload }).or_default();
            index[slot(to, chunk, action.microbatch, payload)] = sequence.len();
            sequence.push((chunk, action.microbatch));
        }
    }

    let mut received: BTreeMap<Channel, usize> = BTreeMap::new();
    let mut lists = Vec::with_capacity(shape.stages);
    for (stage, list) in schedule.stages().iter().enumerate() {
        let mut lowered = Vec::with_capacity(list.len() * 2);
        for action in list {
            if let Some((from, payload)) = input(shape, action) {
                let channel = Channel { from, to: stage, payload };
                let wanted = index[slot(stage, action.chunk, action.microbatch, payload)];
                let cursor = received.entry(channel).or_default();
                for &(chunk, microbatch) in sequences[&channel].get(*cursor..=wanted).unwrap_or_default() {
                    let kind = match payload {
                        Payload::Activation => ActionKind::RecvActivation { from },
                        Payload::Grad => ActionKind::RecvGrad { from },
                    };
                    lowered.push(Action::new(stage, chunk, microbatch, kind));
                }
                *cursor = (*cursor).max(wanted + 1);
            }
            lowered.push(*action);
            if let Some((to, _, payload)) = output(shape, action) {
                let kind = match payload {
                    Payload::Activation => ActionKind::SendActivation { to },
                    Payload::Grad => ActionKind::SendGrad { to },
                };
                lowered.push(Action { kind, ..*action });
            }
        }
        lists.push(lowered);
    }
    LoweredSchedule::new(Schedule::new(shape, lists)?)
}

/// Where a compute action's result goes: (receiving stage, its chunk, payload), if to another
/// stage (a V schedule's turn keeps it on this one).
fn output(shape: Shape, action: &Action) -> Option<(usize, usize, Payload)> {
    let s = shape.virtual_stage(action.stage, action.chunk);
    let (neighbour, payload) = match action.kind {
        ActionKind::Forward if s + 1 < shape.virtual_stages() => (s + 1, Payload::Activation),
        ActionKind::Backward | ActionKind::BackwardInput if s > 0 => (s - 1, Payload::Grad),
        _ => return None,
    };
    let (stage, chunk) = shape.locate(neighbour);
    (stage != action.stage).then_some((stage, chunk, payload))
}

/// Where a compute action's cross-stage input comes from: (sending stage, payload), if from
/// another stage.
fn input(shape: Shape, action: &Action) -> Option<(usize, Payload)> {
    let s = shape.virtual_stage(action.stage, action.chunk);
    let (neighbour, payload) = match action.kind {
        ActionKind::Forward if s > 0 => (s - 1, Payload::Activation),
        ActionKind::Backward | ActionKind::BackwardInput if s + 1 < shape.virtual_stages() => {
            (s + 1, Payload::Grad)
        }
        _ => return None,
    };
    let stage = shape.locate(neighbour).0;
    (stage != action.stage).then_some((stage, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lowered(text: &str) -> Result<LoweredSchedule, ScheduleError> {
        lower(&text.parse::<Schedule>().unwrap())
    }

    #[test]
    fn sends_follow_their_compute_and_receives_precede_it() {
        let text = lowered(
            "schedule stages=2 chunks=1 microbatches=2\n\
             stage 0: F0 F1 B0 B1\n\
             stage 1: F0 B0 F1 B1\n",
        )
        .unwrap()
        .to_string();
        assert_eq!(
            text,
            "schedule stages=2 chunks=1 microbatches=2\n\
             stage 0: F0 SA0@1 F1 SA1@1 RG0@1 B0 RG1@1 B1\n\
             stage 1: RA0@0 F0 B0 SG0@0 RA1@0 F1 B1 SG1@0\n"
        );
    }

    #[test]
    fn interleaving_wraps_from_the_last_stage_to_the_first() {
        let lowered =
            lower(&crate::generate(crate::ScheduleKind::Interleaved1F1B, 2, 2, 2).unwrap()).unwrap();
        let channels: Vec<_> = lowered.channels().iter().map(|c| (c.from, c.to, c.payload)).collect();
        use Payload::*;
        assert_eq!(channels, [(0, 1, Activation), (0, 1, Grad), (1, 0, Activation), (1, 0, Grad)]);
        let stage_1 = lowered.schedule().to_string();
        assert!(stage_1.contains("stage 1: RA0c0@0 F0c0 SA0c0@0"), "{stage_1}");
    }

    #[test]
    fn the_turn_of_a_v_stays_on_its_stage() {
        // Stage 1 of 2 holds virtual stages 1 and 2: chunk 0's output feeds chunk 1 there and
        // chunk 1's input gradient goes back to chunk 0 with no transfer; stage 0 holds both
        // ends of the model.
        let lowered = lower(&crate::generate(crate::ScheduleKind::DualPipeV, 2, 2, 4).unwrap()).unwrap();
        let text = lowered.to_string();
        assert!(text.starts_with("schedule stages=2 chunks=2 microbatches=4 placement=v\n"), "{text}");
        assert!(
            text.contains(
                "stage 1: RA0c0@0 F0c0 F0c1 SA0c1@0 RA1c0@0 F1c0 F1c1 SA1c1@0 \
                 RA2c0@0 F2c0 RG0c1@0 B0c1 F2c1 SA2c1@0 B0c0 SG0c0@0 "
            ),
            "{text}"
        );
        let channels: Vec<_> = lowered.channels().iter().map(|c| (c.from, c.to, c.payload)).collect();
        use Payload::*;
        assert_eq!(channels, [(0, 1, Activation), (0, 1, Grad), (1, 0, Activation), (1, 0, Grad)]);
        assert_eq!(text.parse::<LoweredSchedule>().unwrap(), lowered);
    }

    #[test]
    fn receives_keep_the_senders_order() {
        // Stage 1 wants microbatch 1 first; microbatch 0's activation was sent before it, so
        // it is taken off the channel first.
        let text = lowered(
            "schedule stages=2 chunks=1 microbatches=2\n\
             stage 0: F0 F1 B1 B0\n\
             stage 1: F1 B1 F0 B0\n",
        )
        .unwrap()
        .to_string();
        assert!(text.contains("stage 1: RA0@0 RA1@0 F1 B1 SG1@0 F0 B0 SG0@0\n"), "{text}");
    }

    #[test]
    fn finds_the_buffering_a_schedule_needs() {
        // Stage 0 runs GPipe, stage 1 1F1B: stage 1 sends its second gradient while stage 0
        // is still sending forwards, so one message per channel deadlocks; two suffice.
        let lowered = lowered(
            "schedule stages=2 chunks=1 microbatches=4\n\
             stage 0: F0 F1 F2 F3 B0 B1 B2 B3\n\
             stage 1: F0 B0 F1 B1 F2 B2 F3 B3\n",
        )
        .unwrap();
        assert_eq!(lowered.required_capacity().get(), 2);
        let err = lowered.execute(ChannelCapacity::Bounded(NonZeroUsize::MIN)).unwrap_err().to_string();
        assert_eq!(
            err,
            "deadlock: stage 0 blocked at SA3@1 (action 7): channel to stage 1 is full (1 queued); \
             stage 1 blocked at SG1@0 (action 7): channel to stage 0 is full (1 queued)"
        );
    }

    #[test]
    fn hand_written_lowered_lists_are_checked() {
        let parse = |body: &str| {
            format!("schedule stages=2 chunks=1 microbatches=2\n{body}")
                .parse::<LoweredSchedule>()
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            parse("stage 0: F0 SA0@1 F1 SA1@1 RG0@1 B0 RG1@1 B1\nstage 1: RA1@0 RA0@0 F0 B0 SG0@0 F1 B1 SG1@0\n"),
            "stage 1, action 0 (RA1@0): the channel's next message is for RA0@0: the sender's order differs"
        );
        assert_eq!(
            parse("stage 0: F0 SA0@1 F1 SA1@1 RG0@1 B0 RG1@1 B1\nstage 1: F0 RA0@0 B0 SG0@0 RA1@0 F1 B1 SG1@0\n"),
            "stage 1, action 0 (F0): runs before its input activation is received"
        );
        assert_eq!(
            parse("stage 0: F0 SA0@1 F1 SA1@1 RG0@1 B0 RG1@1 B1\nstage 1: RA0@0 F0 B0 SG0@0 RA1@0 F1 B1\n"),
            "stage 1: no SG1 transfer on virtual stage 1"
        );
        assert_eq!(
            parse("stage 0: F0 RG0@1 SA0@1 F1 SA1@1 B0 RG1@1 B1\nstage 1: RA0@0 F0 B0 SG0@0 RA1@0 F1 B1 SG1@0\n"),
            "deadlock: stage 0 blocked at RG0@1 (action 1): nothing from stage 1 yet; \
             stage 1 blocked at RA0@0 (action 0): nothing from stage 0 yet"
        );
    }
}
