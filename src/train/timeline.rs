//! The measured timeline of a run: when every stage ran each action of each step, and its
//! post-schedule phase (exchange, grad norm, AdamW), for the Chrome trace (`train --trace`)
//! and the measured bubble rate per stage.

use super::pipeline::last_action_end;
use crate::trace::TraceEvent;
use schedules::ActionKind;
use stages::runtime::{ActionTiming, StageStepReport};

/// One step as measured.
struct StepRecord {
    step: usize,
    /// Seconds from the first step's start to this step's.
    offset: f64,
    /// Per stage, its actions.
    timings: Vec<Vec<ActionTiming>>,
    /// When the step's last action ended, in seconds since the step's start.
    schedule_end: f64,
    /// Per stage, seconds from `schedule_end` to the end of its optimizer step.
    post_schedule: Vec<f64>,
}

pub struct Timeline {
    steps: Vec<StepRecord>,
    /// Compute seconds and step seconds per stage, summed over the steps after the first
    /// (the first step warms caches and allocators up).
    busy: Vec<f64>,
    /// Model chunks per stage, for naming actions.
    chunks: usize,
    /// Most microbatches each stage held activations of at once.
    pub max_in_flight: Vec<usize>,
    total: f64,
    elapsed: f64,
}

impl Timeline {
    pub fn new(stages: usize, chunks: usize) -> Self {
        Timeline {
            steps: Vec::new(),
            busy: vec![0.0; stages],
            chunks,
            max_in_flight: vec![0; stages],
            total: 0.0,
            elapsed: 0.0,
        }
    }

    /// Records a step of `step_s` seconds: the stages' reports and, per stage, the seconds
    /// from the end of the step's last action to the end of its optimizer step.
    pub fn record(&mut self, step: usize, step_s: f64, reports: &[StageStepReport], post_schedule: &[f64]) {
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
            timings: reports.iter().map(|r| r.timings.clone()).collect(),
            schedule_end: last_action_end(reports),
            post_schedule: post_schedule.to_vec(),
        });
        self.elapsed += step_s;
    }

    /// Per stage: the share of step time not spent computing (None with fewer than 2 steps).
    pub fn bubble_rates(&self) -> Option<Vec<f64>> {
        (self.total > 0.0).then(|| self.busy.iter().map(|b| 1.0 - b / self.total).collect())
    }

    /// Every recorded action, and every stage's post-schedule phase, as trace events.
    pub fn events(&self) -> Vec<TraceEvent> {
        let mut events = Vec::new();
        for s in &self.steps {
            for t in s.timings.iter().flatten() {
                let a = t.action;
                events.push(TraceEvent {
                    stage: a.stage,
                    name: a.token(self.chunks).to_string(),
                    category: category(a.kind).to_string(),
                    start_s: s.offset + t.start_s,
                    dur_s: t.end_s - t.start_s,
                    args: serde_json::json!({ "chunk": a.chunk, "microbatch": a.microbatch, "step": s.step }),
                });
            }
            events.extend(s.post_schedule.iter().enumerate().map(|(stage, &dur_s)| TraceEvent {
                stage,
                name: crate::trace::category::OPTIMIZER.to_string(),
                category: crate::trace::category::OPTIMIZER.to_string(),
                start_s: s.offset + s.schedule_end,
                dur_s,
                args: serde_json::json!({ "step": s.step }),
            }));
        }
        events
    }

    pub fn write_trace(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let names: Vec<String> = (0..self.busy.len()).map(|s| format!("stage {s}")).collect();
        crate::trace::write_chrome_trace(path, &self.events(), &names)
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
