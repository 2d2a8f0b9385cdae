//! The simulated timeline as a Chrome trace, in the trainer's categories and names so the
//! two read alike. Stage r's compute is track r; its outgoing messages, which overlap its
//! compute, are track p + r (overlapping slices on one track would not nest). Each stage's
//! optimizer step, after its list, is on its compute track, named as the trainer names it.

use super::setup::Setup;
use crate::trace::{category, write_chrome_trace, TraceEvent};
use schedules::{EventKind, Payload, SimReport};
use serde_json::json;
use std::path::Path;

/// Category and short name prefix of a simulated event (as the trainer's: F, B, I, W).
pub fn label(kind: EventKind) -> (&'static str, &'static str) {
    match kind {
        EventKind::Forward => (category::FORWARD, "F"),
        EventKind::Backward => (category::BACKWARD, "B"),
        EventKind::BackwardInput => (category::BACKWARD_INPUT, "I"),
        EventKind::BackwardWeight => (category::BACKWARD_WEIGHT, "W"),
        EventKind::Recompute => (category::RECOMPUTE, "R"),
        EventKind::Transfer { payload: Payload::Activation, .. } => (category::TRANSFER, "SA"),
        EventKind::Transfer { payload: Payload::Grad, .. } => (category::TRANSFER, "SG"),
        EventKind::Optimizer => (category::OPTIMIZER, category::OPTIMIZER),
    }
}

pub fn write(path: &Path, setup: &Setup, sim: &SimReport) -> anyhow::Result<()> {
    let p = setup.p;
    let events: Vec<TraceEvent> = sim
        .timeline
        .iter()
        .map(|e| {
            let (cat, short) = label(e.kind);
            let mut args = json!({"chunk": e.chunk, "microbatch": e.microbatch, "step": 0});
            let mut name = format!("{short}{}c{}", e.microbatch, e.chunk);
            let track = match e.kind {
                EventKind::Transfer { to, payload } => {
                    args["to"] = json!(to);
                    args["payload"] =
                        json!(if payload == Payload::Activation { "activation" } else { "grad" });
                    p + e.stage
                }
                EventKind::Optimizer => {
                    // As the trainer writes it: one per stage and step, for no microbatch.
                    args = json!({"step": 0});
                    name = short.to_string();
                    e.stage
                }
                _ => e.stage,
            };
            TraceEvent {
                stage: track,
                name,
                category: cat.to_string(),
                start_s: e.start,
                dur_s: e.end - e.start,
                args,
            }
        })
        .collect();
    let names: Vec<String> = (0..p)
        .map(|r| format!("stage {r}: {}", setup.stage_layers(r)))
        .chain((0..p).map(|r| format!("stage {r} sends")))
        .collect();
    write_chrome_trace(path, None, &events, &names)
}
