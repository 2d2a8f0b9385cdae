//! The measured timeline of a run: when every stage ran each action of each step, for the
//! Chrome trace (`train --trace`) and the measured bubble rate per stage.

use schedules::ActionKind;
use stages::runtime::{ActionTiming, StageStepReport};

pub struct Timeline {
    /// (step, offset of the step's start in seconds since the first step, timings) per step.
    steps: Vec<(usize, f64, Vec<Vec<ActionTiming>>)>,
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

    pub fn record(&mut self, step: usize, step_s: f64, reports: &[StageStepReport]) {
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
        self.steps.push((step, self.elapsed, reports.iter().map(|r| r.timings.clone()).collect()));
        self.elapsed += step_s;
    }

    /// Per stage: the share of step time not spent computing (None with fewer than 2 steps).
    pub fn bubble_rates(&self) -> Option<Vec<f64>> {
        (self.total > 0.0).then(|| self.busy.iter().map(|b| 1.0 - b / self.total).collect())
    }

    /// Every recorded action as a trace event.
    pub fn events(&self) -> Vec<crate::trace::TraceEvent> {
        let mut events = Vec::new();
        for (step, offset, stages) in &self.steps {
            for timings in stages {
                for t in timings {
                    let a = t.action;
                    events.push(crate::trace::TraceEvent {
                        stage: a.stage,
                        name: a.token(self.chunks).to_string(),
                        category: category(a.kind).to_string(),
                        start_s: offset + t.start_s,
                        dur_s: t.end_s - t.start_s,
                        args: serde_json::json!({ "chunk": a.chunk, "microbatch": a.microbatch, "step": step }),
                    });
                }
            }
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
