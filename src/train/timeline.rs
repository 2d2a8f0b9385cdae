//! The measured timeline of a run: when every rank ran each action of each step, its
//! post-schedule phase (gradient reductions, grad norm) and its AdamW update (at the start
//! of the next step), for the Chrome trace (`train --trace`) and the measured bubble rate
//! per rank. With one replica a rank is its stage.

use super::report::StepReport;
use crate::trace::category::{OPTIMIZER, REDUCE};
use crate::trace::TraceEvent;
use schedules::ActionKind;
use stages::dist::Topology;
use stages::runtime::ActionTiming;

/// One step as measured.
struct StepRecord {
    step: usize,
    /// Seconds from the first step's start to this step's.
    offset: f64,
    /// Per rank, its actions.
    timings: Vec<Vec<ActionTiming>>,
    /// Per rank, (start, end) of its post-schedule phase: from the end of the step's last
    /// action (on any rank: every rank's reductions wait for it) to the end of its grad
    /// norm's readout, in seconds since the step's start.
    post_schedule: Vec<(f64, f64)>,
    /// Per rank, (start, end) of the AdamW update the step began with, where there was one.
    updates: Vec<Option<(f64, f64)>>,
}

pub struct Timeline {
    steps: Vec<StepRecord>,
    /// Compute seconds per rank, summed over the steps after the first (the first step
    /// warms caches and allocators up).
    busy: Vec<f64>,
    topology: Topology,
    /// Model chunks per stage, for naming actions.
    chunks: usize,
    /// Most microbatches each rank held activations of at once.
    pub max_in_flight: Vec<usize>,
    total: f64,
    elapsed: f64,
}

impl Timeline {
    pub fn new(topology: Topology, chunks: usize) -> Self {
        Timeline {
            steps: Vec::new(),
            busy: vec![0.0; topology.world()],
            topology,
            chunks,
            max_in_flight: vec![0; topology.world()],
            total: 0.0,
            elapsed: 0.0,
        }
    }

    /// Records a step of `step_s` seconds from every rank's report, each rank's times moved
    /// onto rank 0's step clock.
    pub fn record(&mut self, step: usize, step_s: f64, reports: &[StepReport]) {
        let shift = |r: &StepReport| r.start_wall_s - reports[0].start_wall_s;
        let timings: Vec<Vec<ActionTiming>> = reports
            .iter()
            .map(|r| {
                let dt = shift(r);
                r.timings
                    .iter()
                    .map(|t| ActionTiming { start_s: t.start_s + dt, end_s: t.end_s + dt, ..t.clone() })
                    .collect()
            })
            .collect();
        let schedule_end = reports.iter().map(|r| r.last_action_end() + shift(r)).fold(0.0, f64::max);
        for (m, r) in self.max_in_flight.iter_mut().zip(reports) {
            *m = (*m).max(r.max_in_flight);
        }
        if !self.steps.is_empty() {
            for (busy, r) in self.busy.iter_mut().zip(reports) {
                *busy += r
                    .timings
                    .iter()
                    .filter(|t| t.action.kind.is_compute())
                    .map(|t| t.end_s - t.start_s)
                    .sum::<f64>();
            }
            self.total += step_s;
        }
        self.steps.push(StepRecord {
            step,
            offset: self.elapsed,
            timings,
            post_schedule: reports.iter().map(|r| (schedule_end, r.end_s + shift(r))).collect(),
            updates: reports.iter().map(|r| r.update.map(|(a, b)| (a + shift(r), b + shift(r)))).collect(),
        });
        self.elapsed += step_s;
    }

    /// Per rank: the share of step time not spent computing (None with fewer than 2 steps).
    pub fn bubble_rates(&self) -> Option<Vec<f64>> {
        (self.total > 0.0).then(|| self.busy.iter().map(|b| 1.0 - b / self.total).collect())
    }

    /// Every recorded action, and every rank's post-schedule phase and update, as trace
    /// events (the rank is the trace's thread).
    pub fn events(&self) -> Vec<TraceEvent> {
        let mut events = Vec::new();
        for s in &self.steps {
            for (rank, t) in s.timings.iter().enumerate().flat_map(|(r, ts)| ts.iter().map(move |t| (r, t))) {
                let a = t.action;
                events.push(TraceEvent {
                    stage: rank,
                    name: a.token(self.chunks).to_string(),
                    category: category(a.kind).to_string(),
                    start_s: s.offset + t.start_s,
                    dur_s: t.end_s - t.start_s,
                    args: serde_json::json!({ "chunk": a.chunk, "microbatch": a.microbatch, "step": s.step }),
                });
            }
            let phase = |rank: usize, (start, end): (f64, f64), category: &str| TraceEvent {
                stage: rank,
                name: category.to_string(),
                category: category.to_string(),
                start_s: s.offset + start,
                dur_s: end - start,
                args: serde_json::json!({ "step": s.step }),
            };
            events.extend(s.post_schedule.iter().enumerate().map(|(rank, &span)| phase(rank, span, REDUCE)));
            events.extend(
                s.updates
                    .iter()
                    .enumerate()
                    .filter_map(|(rank, span)| span.map(|span| phase(rank, span, OPTIMIZER))),
            );
        }
        events
    }

    /// The trace of `run` (`plan::describe_run`), each rank's track named by what its stage
    /// holds (`holds[rank]`, `plan::describe_stage`).
    pub fn write_trace(&self, path: &std::path::Path, run: &str, holds: &[String]) -> anyhow::Result<()> {
        let t = self.topology;
        let names: Vec<String> = (0..t.world())
            .map(|r| match t.world() == t.pipeline {
                true => format!("stage {r}: {}", holds[r]),
                false => format!("{}: {}", t.describe(&[r]), holds[r]),
            })
            .collect();
        crate::trace::write_chrome_trace(path, Some(run), &self.events(), &names)
    }
}

/// The trace category of an action, shared with the simulator's traces.
fn category(kind: ActionKind) -> &'static str {
    use crate::trace::category::*;
    match kind {
        ActionKind::Forward => FORWARD,
        ActionKind::Backward => BACKWARD,
        ActionKind::BackwardInput => BACKWARD_INPUT,
        ActionKind::BackwardWeight => BACKWARD_WEIGHT,
        ActionKind::SendActivation { .. } => SEND_ACTIVATION,
        ActionKind::RecvActivation { .. } => RECV_ACTIVATION,
        ActionKind::SendGrad { .. } => SEND_GRAD,
        ActionKind::RecvGrad { .. } => RECV_GRAD,
    }
}
