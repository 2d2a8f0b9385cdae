//! The simulator: times one iteration of a lowered schedule and tracks memory per stage.
//!
//! Model, as on a GPU with separate compute and communication streams:
//! * Each stage has one compute stream that runs its compute actions in list order, each as
//!   soon as the previous one ended and its inputs are there. A `Backward` takes
//!   `recompute + backward_input + backward_weight`, a `BackwardInput` `recompute +
//!   backward_input`, a `BackwardWeight` `backward_weight` (see [`ChunkCosts`]).
//! * A send is issued when the stream reaches it (after the compute before it) and costs the
//!   stream nothing: the stage computes on while the message travels on the link to the
//!   peer ([`Link`]: per-direction FIFO, `latency + bytes / bandwidth`). Sends are buffered
//!   (NCCL `isend`), never waiting for the receiver.
//! * A receive makes the stream wait until the message has arrived.
//! * After the lists, every stage waits for the global grad norm (it needs every stage's
//!   gradients), then runs its own optimizer step: stage r's optimizer event spans
//!   `[makespan, makespan + optimizer(r)]` ([`SimInput::with_optimizer_times`], which
//!   includes the exchange and the norm), and the iteration ends with the slowest of them.
//!   That time is not busy time: busy time and the bubble rate count pipeline compute only.
//!   During it a stage holds what its lists left plus its optimizer working bytes
//!   ([`SimInput::with_optimizer_working_bytes`]).
//!
//! Every resource (a stage's stream, a link) serves its work in an order fixed by the lists,
//! so the simulation is a dataflow pass: the executor ([`crate::execute`]) visits actions in
//! a dependency-respecting order (every receive after its send), and each event time is the
//! max of its predecessors' on the same resource and across the channel. This gives the same
//! times as a time-ordered event queue in O(actions) instead of O(actions log actions).
//!
//! Memory follows the conventions of [`ChunkMemory`]; each stage starts at its static bytes.

pub mod input;
pub mod report;

pub use input::{ChunkCosts, ChunkMemory, Link, SimInput};
pub use report::{EventKind, MemoryPoint, SimReport, StageReport, TimelineEvent};

use crate::execute::{run, ChannelCapacity, Step};
use crate::ir::{Action, ActionKind};
use crate::lower::LoweredSchedule;
use crate::ScheduleError;
use std::collections::VecDeque;

/// A stage's memory level over time.
struct Memory {
    current: u64,
    peak: u64,
    points: Vec<MemoryPoint>,
}

impl Memory {
    /// Sets the level at `time` (never earlier than the last point): `current + add - sub`.
    fn change(&mut self, time: f64, add: u64, sub: u64) {
        if add == sub {
            return;
        }
        self.current = self.current + add - sub;
        self.peak = self.peak.max(self.current);
        match self.points.last_mut() {
            Some(last) if last.time == time => last.bytes = self.current,
            _ => self.points.push(MemoryPoint { time, bytes: self.current }),
        }
    }
}

/// One stage's compute stream.
struct Stream {
    /// When the last action issued on the stream ends (or its last wait is over).
    clock: f64,
    busy: f64,
    memory: Memory,
    /// Offloaded activations in host memory.
    host: Memory,
}

impl Stream {
    /// Runs a compute action: the recompute (if any), then the pass, back to back.
    fn compute(&mut self, action: &Action, costs: &ChunkCosts, timeline: &mut Vec<TimelineEvent>) {
        let m = &costs.memory;
        // (event, recompute time, pass time, working bytes, bytes kept from the start on,
        // bytes released at the end besides the working bytes, bytes kept from the end on)
        let (kind, recompute, time, working, kept, released, kept_after) = match action.kind {
            ActionKind::Forward => {
                (EventKind::Forward, 0.0, costs.forward, m.forward_working_bytes, m.activation_bytes, 0, 0)
            }
            ActionKind::Backward => (
                EventKind::Backward,
                costs.recompute,
                costs.backward_input + costs.backward_weight,
                m.backward_input_working_bytes.max(m.backward_weight_working_bytes),
                0,
                m.activation_bytes,
                0,
            ),
            ActionKind::BackwardInput => (
                EventKind::BackwardInput,
                costs.recompute,
                costs.backward_input,
                m.backward_input_working_bytes,
                0,
                m.activation_bytes,
                m.weight_grad_bytes,
            ),
            ActionKind::BackwardWeight => (
                EventKind::BackwardWeight,
                0.0,
                costs.backward_weight,
                m.backward_weight_working_bytes,
                0,
                m.weight_grad_bytes,
                0,
            ),
            _ => unreachable!("transfers are not computed"),
        };
        let event = |start, end, kind| TimelineEvent {
            stage: action.stage,
            chunk: action.chunk,
            microbatch: action.microbatch,
            start,
            end,
            kind,
        };
        let start = self.clock;
        let begin = start + recompute;
        let end = begin + time;
        if recompute > 0.0 {
            timeline.push(event(start, begin, EventKind::Recompute));
            self.memory.change(start, m.recompute_working_bytes, 0);
            self.memory.change(begin, 0, m.recompute_working_bytes);
        }
        self.memory.change(begin, kept + working, 0);
        self.memory.change(end, kept_after, working + released);
        match action.kind {
            ActionKind::Forward => self.host.change(begin, m.host_bytes, 0),
            ActionKind::Backward | ActionKind::BackwardInput => self.host.change(end, 0, m.host_bytes),
            _ => {}
        }
        timeline.push(event(begin, end, kind));
        self.busy += recompute + time;
        self.clock = end;
    }
}

/// Simulates one iteration of `schedule` under `input` (see the module docs).
pub fn simulate(schedule: &LoweredSchedule, input: &SimInput) -> Result<SimReport, ScheduleError> {
    let shape = schedule.schedule().shape();
    if (input.stages(), input.chunks()) != (shape.stages, shape.chunks) {
        return Err(ScheduleError::Input(format!(
            "costs are for {} stages x {} chunks, the schedule has {} x {}",
            input.stages(),
            input.chunks(),
            shape.stages,
            shape.chunks
        )));
    }
    let p = shape.stages;
    let link = input.link();
    let mut streams: Vec<Stream> = (0..p)
        .map(|r| {
            let bytes = input.static_bytes(r);
            let memory =
                Memory { current: bytes, peak: bytes, points: vec![MemoryPoint { time: 0.0, bytes }] };
            let host = Memory { current: 0, peak: 0, points: vec![MemoryPoint { time: 0.0, bytes: 0 }] };
            Stream { clock: 0.0, busy: 0.0, memory, host }
        })
        .collect();
    // Arrival times of the messages in flight, per executor channel.
    let mut arrivals: Vec<VecDeque<f64>> = Vec::new();
    // Per sending stage: (receiving stage, time from which that link can take a message).
    let mut link_free: Vec<Vec<(usize, f64)>> = vec![Vec::new(); p];
    let mut timeline = Vec::with_capacity(schedule.schedule().len());

    run(schedule.schedule(), ChannelCapacity::Unbounded, |Step { stage, action, channel }| {
        let stream = &mut streams[stage];
        match action.kind {
            ActionKind::SendActivation { to } | ActionKind::SendGrad { to } => {
                let payload = action.kind.transfer().expect("a send").1;
                let free = match link_free[stage].iter_mut().position(|(peer, _)| *peer == to) {
                    Some(i) => &mut link_free[stage][i].1,
                    None => {
                        link_free[stage].push((to, 0.0));
                        &mut link_free[stage].last_mut().expect("just pushed").1
                    }
                };
                let depart = stream.clock.max(*free);
                *free = depart + link.occupancy(payload);
                let arrival = depart + link.hop_time(payload);
                let id = channel.expect("a transfer has a channel");
                if arrivals.len() <= id {
                    arrivals.resize_with(id + 1, VecDeque::new);
                }
                arrivals[id].push_back(arrival);
                timeline.push(TimelineEvent {
                    stage,
                    chunk: action.chunk,
                    microbatch: action.microbatch,
                    start: depart,
                    end: arrival,
                    kind: EventKind::Transfer { to, payload },
                });
            }
            ActionKind::RecvActivation { .. } | ActionKind::RecvGrad { .. } => {
                let id = channel.expect("a transfer has a channel");
                let arrival = arrivals[id].pop_front().expect("the executor runs a receive after its send");
                stream.clock = stream.clock.max(arrival);
            }
            _ => stream.compute(action, input.chunk(stage, action.chunk), &mut timeline),
        }
    })?;

    let makespan = streams.iter().map(|s| s.clock).fold(0.0, f64::max);
    for (r, stream) in streams.iter_mut().enumerate() {
        let working = input.optimizer_working_bytes(r);
        stream.memory.change(makespan, working, 0);
        stream.memory.change(makespan + input.optimizer(r), 0, working);
    }
    timeline.extend(optimizer_events(input, makespan));
    let iteration_time = makespan + (0..p).map(|r| input.optimizer(r)).fold(0.0, f64::max);
    let busiest = streams.iter().map(|s| s.busy).fold(0.0, f64::max);
    let bubble_rate = if iteration_time > 0.0 { (iteration_time - busiest) / iteration_time } else { 0.0 };
    let stages = streams
        .into_iter()
        .enumerate()
        .map(|(r, s)| StageReport {
            busy: s.busy,
            optimizer: input.optimizer(r),
            idle: iteration_time - s.busy - input.optimizer(r),
            peak_memory: s.memory.peak,
            peak_host: s.host.peak,
            memory: s.memory.points,
        })
        .collect();
    Ok(SimReport { iteration_time, bubble_rate, stages, timeline })
}

/// Each stage's optimizer step, from the end of the last list on (none where it takes no
/// time, so plain schedule timelines stay as they were).
fn optimizer_events(input: &SimInput, makespan: f64) -> impl Iterator<Item = TimelineEvent> + '_ {
    (0..input.stages()).filter(|&r| input.optimizer(r) > 0.0).map(move |stage| TimelineEvent {
        stage,
        chunk: 0,
        microbatch: 0,
        start: makespan,
        end: makespan + input.optimizer(stage),
        kind: EventKind::Optimizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{generate, lower, ScheduleKind};

    /// 1F1B, p = 2, m = 2, unit forward and backward: the lists end at 6 (closed form).
    fn run(optimizer: Vec<f64>) -> SimReport {
        let lowered = lower(&generate(ScheduleKind::OneFOneB, 2, 1, 2).unwrap()).unwrap();
        let costs = ChunkCosts { forward: 1.0, backward_input: 1.0, ..Default::default() };
        let input = SimInput::uniform(2, 1, costs, 0, Link::INSTANT).unwrap();
        simulate(&lowered, &input.with_optimizer_times(optimizer).unwrap()).unwrap()
    }

    #[test]
    fn the_step_ends_with_the_slowest_optimizer_after_the_last_list() {
        let report = run(vec![3.0, 1.0]);
        assert_eq!(report.iteration_time, 6.0 + 3.0);
        // Busy time is the lists' compute (4 each); the optimizer phase is bubble.
        assert_eq!(report.bubble_rate, 5.0 / 9.0);
        let split: Vec<_> = report.stages.iter().map(|s| (s.busy, s.optimizer, s.idle)).collect();
        assert_eq!(split, [(4.0, 3.0, 2.0), (4.0, 1.0, 4.0)]);
        let optimizer: Vec<_> = report
            .timeline
            .iter()
            .filter(|e| e.kind == EventKind::Optimizer)
            .map(|e| (e.stage, e.start, e.end))
            .collect();
        assert_eq!(optimizer, [(0, 6.0, 9.0), (1, 6.0, 7.0)]);
    }

    #[test]
    fn offloaded_bytes_peak_in_host_memory_with_the_microbatches_in_flight() {
        let lowered = lower(&generate(ScheduleKind::OneFOneB, 2, 1, 4).unwrap()).unwrap();
        let memory = ChunkMemory { activation_bytes: 10, host_bytes: 7, ..Default::default() };
        let costs = ChunkCosts { forward: 1.0, backward_input: 1.0, memory, ..Default::default() };
        let report =
            simulate(&lowered, &SimInput::uniform(2, 1, costs, 100, Link::INSTANT).unwrap()).unwrap();
        // 1F1B: stage 0 holds two microbatches at once, stage 1 one.
        let peaks: Vec<(u64, u64)> = report.stages.iter().map(|s| (s.peak_memory, s.peak_host)).collect();
        assert_eq!(peaks, [(120, 14), (110, 7)]);
    }

    #[test]
    fn the_optimizer_phase_holds_its_working_bytes_on_what_the_lists_left() {
        let lowered = lower(&generate(ScheduleKind::OneFOneB, 2, 1, 2).unwrap()).unwrap();
        let memory = ChunkMemory { activation_bytes: 10, ..Default::default() };
        let costs = ChunkCosts { forward: 1.0, backward_input: 1.0, memory, ..Default::default() };
        let input = SimInput::uniform(2, 1, costs, 100, Link::INSTANT).unwrap();
        let input = input.with_optimizer_times(vec![3.0, 1.0]).unwrap();
        let report = simulate(&lowered, &input.with_optimizer_working_bytes(vec![5, 50]).unwrap()).unwrap();
        // Stage 0 peaks at two microbatches in flight (120), stage 1 in its optimizer phase.
        assert_eq!((report.stages[0].peak_memory, report.stages[1].peak_memory), (120, 150));
        let tail: Vec<(f64, u64)> =
            report.stages[1].memory.iter().rev().take(2).map(|p| (p.time, p.bytes)).collect();
        assert_eq!(tail, [(7.0, 100), (6.0, 150)]);
    }

    #[test]
    fn zero_optimizer_times_leave_the_schedule_alone() {
        let report = run(vec![0.0, 0.0]);
        assert_eq!((report.iteration_time, report.bubble_rate), (6.0, 2.0 / 6.0));
        assert!(report.timeline.iter().all(|e| e.kind != EventKind::Optimizer));
    }
}
