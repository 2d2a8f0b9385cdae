//! `--measured TRACE.json`: op times calibrated from a Chrome trace of a real run
//! (`pipetrain train --trace`).
//!
//! From the trace's last step only (earlier ones warm caches and allocators up): per
//! (stage = tid, chunk = args.chunk, category) the median duration of the forward,
//! backward, backward-input, backward-weight and recompute events. The trainer's recompute
//! runs inside its backward, so without recompute events it stays there. An unsplit backward
//! is split into its input and weight halves in the model's FLOP proportion (so a 1F1B trace
//! can time ZB-H1). The link time per message is the median duration of the send events: a
//! receive also waits for its peer, so it measures the schedule rather than the link. Each
//! stage's post-schedule time is its `reduce` event plus its `optimizer` event (the update
//! the trainer runs at the next step's start; each 0 where a step has none).
//!
//! The times are those of the run traced, so a trace the trainer wrote is taken only for a
//! config of the same run (`plan::describe_run`: model, micro batch, tensor parallelism,
//! device) whose every stage holds the same layers with the same recompute and offload
//! (`plan::describe_stage`): its backward has its recompute inside. Only the schedule may
//! differ. A trace without that record (a simulated one, or from elsewhere) is taken as
//! it is.

use super::durations::{compute_durations, with_offload_copies, Durations, OpTimes, P2p};
use super::hardware::Hardware;
use super::setup::Setup;
use crate::error::user_error;
use crate::plan;
use crate::trace::{category, read_chrome_trace, ChromeTrace, TraceEvent};
use std::collections::HashMap;
use std::path::Path;

const COMPUTE: [&str; 5] = [
    category::FORWARD,
    category::BACKWARD,
    category::BACKWARD_INPUT,
    category::BACKWARD_WEIGHT,
    category::RECOMPUTE,
];

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

fn arg(e: &TraceEvent, key: &str) -> Option<u64> {
    e.args.get(key).and_then(serde_json::Value::as_u64)
}

/// Op times of `setup`'s stages and chunks from the trace at `path`; `hw` gives the model's
/// FLOP proportions for splitting a whole backward.
pub fn durations(path: &Path, setup: &Setup, hw: &Hardware) -> anyhow::Result<Durations> {
    let bad = |msg: String| user_error(format!("command line: --measured {}: {msg}", path.display()));
    let trace = read_chrome_trace(path)?;
    same_run(&trace, setup).map_err(bad)?;
    let events = trace.events;
    let compute: Vec<&TraceEvent> =
        events.iter().filter(|e| COMPUTE.contains(&e.category.as_str())).collect();
    let last = compute.iter().filter_map(|e| arg(e, "step")).max().ok_or_else(|| {
        bad("no forward/backward events with a step (not a `pipetrain train --trace` trace?)".into())
    })?;

    let mut samples: HashMap<(usize, usize, &str), Vec<f64>> = HashMap::new();
    for e in compute.iter().copied().filter(in_last_step(last)) {
        let chunk = arg(e, "chunk").unwrap_or(0) as usize;
        if e.stage >= setup.p || chunk >= setup.v {
            return Err(bad(format!(
                "step {last} has stage {} chunk {chunk}, the config has {} stages x {} chunks \
                 (simulate the config the trace was taken with)",
                e.stage, setup.p, setup.v
            )));
        }
        samples.entry((e.stage, chunk, e.category.as_str())).or_default().push(e.dur_s);
    }
    let model = compute_durations(setup, hw, None);
    let mut chunks = Vec::with_capacity(setup.p * setup.v);
    for stage in 0..setup.p {
        for chunk in 0..setup.v {
            let get = |cat: &str| samples.get(&(stage, chunk, cat)).cloned().map(median);
            let missing =
                |what: &str| bad(format!("step {last} has no {what} events for stage {stage} chunk {chunk}"));
            let forward = get(category::FORWARD).ok_or_else(|| missing(category::FORWARD))?;
            let (backward_input, backward_weight) = match (
                get(category::BACKWARD_INPUT),
                get(category::BACKWARD_WEIGHT),
                get(category::BACKWARD),
            ) {
                (Some(input), Some(weight), _) => (input, weight),
                (_, _, Some(whole)) => {
                    let m = model.chunks[stage * setup.v + chunk];
                    // The head alone has no matmul in its backward (the LM head's runs in
                    // forward): all of it is backward-input.
                    let modelled = m.backward_input + m.backward_weight;
                    let share = if modelled > 0.0 { m.backward_input / modelled } else { 1.0 };
                    (whole * share, whole * (1.0 - share))
                }
                _ => return Err(missing("backward")),
            };
            let recompute = get(category::RECOMPUTE).unwrap_or(0.0);
            chunks.push(OpTimes { forward, backward_input, backward_weight, recompute });
        }
    }
    let sends: Vec<f64> = events
        .iter()
        .filter(in_last_step(last))
        .filter(|e| e.category == category::SEND_ACTIVATION || e.category == category::SEND_GRAD)
        .map(|e| e.dur_s)
        .collect();
    let p2p = if sends.is_empty() { 0.0 } else { median(sends) };
    let optimizer = optimizer_times(&events, setup.p, last);
    Ok(with_offload_copies(setup, hw, Durations { chunks, p2p: P2p::PerMessage(p2p), optimizer }))
}

/// Errors, worded to follow the trace's path, where the trace records a run other than
/// `setup`'s or a stage that held other layers, recompute or offload.
fn same_run(trace: &ChromeTrace, setup: &Setup) -> Result<(), String> {
    const ADVICE: &str = "simulate the config the trace was taken with (the schedule may differ)";
    let Some(run) = &trace.run else { return Ok(()) };
    let ours = plan::describe_run(&setup.cfg);
    if *run != ours {
        return Err(format!("the trace timed a run of `{run}`, the config's is `{ours}`: {ADVICE}"));
    }
    for (tid, name) in trace.track_names.iter().filter(|(tid, _)| *tid < setup.p) {
        let Some(held) = name.strip_prefix(&format!("stage {tid}: ")) else { continue };
        let layouts: Vec<_> = (0..setup.v).map(|c| setup.layout(*tid, c).clone()).collect();
        let holds = plan::describe_stage(&setup.cfg, &layouts, *tid);
        if held != holds {
            return Err(format!(
                "the trace's stage {tid} held `{held}`, the config's holds `{holds}`: {ADVICE}"
            ));
        }
    }
    Ok(())
}

/// Per stage, the median of its `reduce` events plus that of its `optimizer` events in
/// step `last` (0 for a kind there is none of).
fn optimizer_times(events: &[TraceEvent], stages: usize, last: u64) -> Vec<f64> {
    let of_stage = |stage: usize, kind: &str| -> f64 {
        let xs: Vec<f64> = events
            .iter()
            .filter(in_last_step(last))
            .filter(|e| e.stage == stage && e.category == kind)
            .map(|e| e.dur_s)
            .collect();
        if xs.is_empty() {
            0.0
        } else {
            median(xs)
        }
    };
    (0..stages).map(|s| of_stage(s, category::REDUCE) + of_stage(s, category::OPTIMIZER)).collect()
}

fn in_last_step(last: u64) -> impl Fn(&&TraceEvent) -> bool {
    move |e| arg(e, "step") == Some(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::setup::tests::gpt2_small;
    use crate::trace::write_chrome_trace;
    use serde_json::json;

    fn event(stage: usize, cat: &str, step: u64, mb: u64, dur_ms: f64) -> TraceEvent {
        TraceEvent {
            stage,
            name: String::new(),
            category: cat.into(),
            start_s: 0.0,
            dur_s: dur_ms / 1e3,
            args: json!({"chunk": 0, "microbatch": mb, "step": step}),
        }
    }

    #[test]
    fn medians_of_the_last_step_and_sends_for_the_link() {
        let dir = std::env::temp_dir().join(format!("pipetrain-measured-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json");
        let mut events = vec![event(0, "forward", 0, 0, 100.0)]; // step 0: ignored
        for (mb, ms) in [(0, 3.0), (1, 1.0), (2, 2.0)] {
            for stage in 0..2 {
                events.push(event(stage, "forward", 1, mb, ms));
                events.push(event(stage, "backward-input", 1, mb, 2.0 * ms));
                events.push(event(stage, "backward-weight", 1, mb, ms));
            }
        }
        events.push(event(0, "send-activation", 1, 0, 0.5));
        events.push(event(1, "send-grad", 1, 0, 0.25));
        events.push(event(1, "recv-activation", 1, 0, 9.0));
        events.push(event(0, "optimizer", 0, 0, 100.0)); // step 0: ignored
        events.push(event(0, "optimizer", 1, 0, 5.0));
        events.push(event(0, "reduce", 1, 0, 0.75)); // stage 0: 0.75 + 5 ms
        events.push(event(1, "reduce", 1, 0, 1.5)); // stage 1 has no update: 1.5 ms
        write_chrome_trace(&path, None, &events, &["stage 0".into(), "stage 1".into()]).unwrap();

        let setup = Setup::new(&gpt2_small(2, "zb-h1", 1, 3)).unwrap();
        let hw = Hardware::lookup("h100-sxm", crate::config::Precision::Fp32).unwrap();
        let d = durations(&path, &setup, &hw).unwrap();
        assert_eq!(
            d.chunks[1],
            OpTimes { forward: 0.002, backward_input: 0.004, backward_weight: 0.002, recompute: 0.0 }
        );
        let P2p::PerMessage(p2p) = d.p2p else { panic!("{:?}", d.p2p) };
        assert!((p2p - 0.375e-3).abs() < 1e-15, "{p2p}");
        assert_eq!(d.optimizer, [0.00575, 0.0015]);

        let four = Setup::new(&gpt2_small(4, "1f1b", 1, 4)).unwrap();
        let err = durations(&path, &four, &hw).unwrap_err().to_string();
        assert!(err.ends_with("step 1 has no forward events for stage 2 chunk 0"), "{err}");
    }
}
