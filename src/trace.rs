//! Chrome trace event JSON, the timeline format of measured (`train --trace`) and simulated
//! (`simulate --trace`) runs alike; it opens in Perfetto and chrome://tracing.
//!
//! Every event is a complete ("X") event of process 0 on thread `stage`, with `ts` and `dur`
//! in microseconds; each thread is named by a metadata event. A measured trace also says
//! which run it timed: the process's metadata carries `run` (`plan::describe_run`) and each
//! stage's thread name what the stage held (`plan::describe_stage`). [`read_chrome_trace`]
//! reads back what [`write_chrome_trace`] writes (the simulator calibrates from measured
//! traces).

use crate::error::user_error;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;

/// The categories both writers use, so a measured and a simulated trace read alike.
pub mod category {
    pub const FORWARD: &str = "forward";
    pub const BACKWARD: &str = "backward";
    pub const BACKWARD_INPUT: &str = "backward-input";
    pub const BACKWARD_WEIGHT: &str = "backward-weight";
    /// Simulated only: the trainer's recompute runs inside its backward.
    pub const RECOMPUTE: &str = "recompute";
    pub const SEND_ACTIVATION: &str = "send-activation";
    pub const SEND_GRAD: &str = "send-grad";
    /// Measured only: a stage waiting for, then copying in, a tensor from its neighbour.
    pub const RECV_ACTIVATION: &str = "recv-activation";
    pub const RECV_GRAD: &str = "recv-grad";
    /// Simulated only: a message on the link, from departure to arrival.
    pub const TRANSFER: &str = "transfer";
    /// One per stage and step. Simulated: from the end of the step's last action to the
    /// end of the stage's optimizer step (the tied-gradient exchange and the global grad
    /// norm, which every stage waits for, then its AdamW). Measured: the AdamW update alone,
    /// which the trainer runs at the start of the next step (so a step waits for its device
    /// once); the rest of the phase is `reduce`.
    pub const OPTIMIZER: &str = "optimizer";
    /// Measured only, one per stage and step: from the end of the step's last action to the
    /// end of the stage's gradient reductions and its grad norm's readout.
    pub const REDUCE: &str = "reduce";
}

/// One interval on one track.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// The track (thread id); stages are tracks 0..p.
    pub stage: usize,
    pub name: String,
    pub category: String,
    pub start_s: f64,
    pub dur_s: f64,
    /// The event's `args` object (the trainer's: chunk, microbatch, step).
    pub args: Value,
}

/// What a trace holds: its complete events, its tracks' names and the run it timed (None in
/// a simulated trace, or one from elsewhere).
#[derive(Clone, Debug, PartialEq)]
pub struct ChromeTrace {
    pub run: Option<String>,
    pub track_names: Vec<(usize, String)>,
    pub events: Vec<TraceEvent>,
}

/// Errors unless `path` (given as `--trace`) can be where a trace is written: not a
/// directory, in one that exists. A run checks it before its first step, so that a slip in
/// the flag does not cost the trace of the whole run at its end.
pub fn check_trace_path(path: &Path) -> anyhow::Result<()> {
    let shown = path.display();
    if path.is_dir() {
        return Err(user_error(format!(
            "command line: --trace {shown}: a directory; give the file to write"
        )));
    }
    let absolute =
        std::path::absolute(path).map_err(|e| user_error(format!("command line: --trace {shown}: {e}")))?;
    let dir = absolute.parent().unwrap_or(&absolute);
    if !dir.is_dir() {
        return Err(user_error(format!(
            "command line: --trace {shown}: no directory {} to write it in",
            dir.display()
        )));
    }
    Ok(())
}

/// Writes `events` as a Chrome trace of `run` (None for a simulation); `stage_names[i]`
/// names track i. The file appears whole or not at all (written beside it, then renamed).
pub fn write_chrome_trace(
    path: &Path,
    run: Option<&str>,
    events: &[TraceEvent],
    stage_names: &[String],
) -> anyhow::Result<()> {
    let fail = |e: std::io::Error| user_error(format!("{}: cannot write the trace: {e}", path.display()));
    let tmp = path.with_extension("json.partial");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(fail)?);
    let mut write = || -> std::io::Result<()> {
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")?;
        let mut first = true;
        let mut emit = |v: Value, out: &mut std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut *out, &v).map_err(std::io::Error::other)
        };
        let mut process = json!({"name": "pipetrain"});
        if let Some(run) = run {
            process["run"] = json!(run);
        }
        emit(json!({"ph": "M", "pid": 0, "name": "process_name", "args": process}), &mut out)?;
        for (tid, name) in stage_names.iter().enumerate() {
            emit(
                json!({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": name}}),
                &mut out,
            )?;
            let order = json!({"ph": "M", "pid": 0, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}});
            emit(order, &mut out)?;
        }
        for e in events {
            let event = json!({
                "ph": "X",
                "pid": 0,
                "tid": e.stage,
                "name": e.name,
                "cat": e.category,
                "ts": e.start_s * 1e6,
                "dur": e.dur_s * 1e6,
                "args": e.args,
            });
            emit(event, &mut out)?;
        }
        out.write_all(b"\n]}\n")?;
        out.flush()
    };
    write().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// The complete events of a Chrome trace (a `{"traceEvents": [...]}` object or a bare
/// array), in file order, with the names of its tracks and its process's `run`; other
/// phases are skipped.
pub fn read_chrome_trace(path: &Path) -> anyhow::Result<ChromeTrace> {
    let bad = |msg: String| user_error(format!("{}: {msg}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read the trace: {e}")))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let list = match &doc {
        Value::Array(list) => list,
        Value::Object(o) => match o.get("traceEvents") {
            Some(Value::Array(list)) => list,
            _ => return Err(bad("no \"traceEvents\" array: not a Chrome trace".into())),
        },
        _ => return Err(bad("not a Chrome trace (an object or an array of events)".into())),
    };
    let mut trace = ChromeTrace { run: None, track_names: Vec::new(), events: Vec::new() };
    for (i, e) in list.iter().enumerate() {
        let arg =
            |key: &str| e.get("args").and_then(|a| a.get(key)).and_then(Value::as_str).map(str::to_string);
        match (e.get("ph").and_then(Value::as_str), e.get("name").and_then(Value::as_str)) {
            (Some("X"), _) => {}
            (Some("M"), Some("process_name")) => {
                trace.run = arg("run");
                continue;
            }
            (Some("M"), Some("thread_name")) => {
                if let (Some(tid), Some(name)) = (e.get("tid").and_then(Value::as_u64), arg("name")) {
                    trace.track_names.push((tid as usize, name));
                }
                continue;
            }
            _ => continue,
        }
        let number = |key: &str| e.get(key).and_then(Value::as_f64);
        let (Some(tid), Some(ts), Some(dur)) =
            (e.get("tid").and_then(Value::as_u64), number("ts"), number("dur"))
        else {
            return Err(bad(format!("event {i}: a complete event needs a numeric tid, ts and dur")));
        };
        let text = |key: &str| e.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        trace.events.push(TraceEvent {
            stage: tid as usize,
            name: text("name"),
            category: text("cat"),
            start_s: ts / 1e6,
            dur_s: dur / 1e6,
            args: e.get("args").cloned().unwrap_or(Value::Null),
        });
    }
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_complete_events_in_microseconds_and_reads_them_back() {
        let dir = std::env::temp_dir().join(format!("pipetrain-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json");
        let events = vec![TraceEvent {
            stage: 1,
            name: "F0c0".into(),
            category: category::FORWARD.into(),
            start_s: 0.5,
            dur_s: 0.25,
            args: json!({"chunk": 0, "microbatch": 0, "step": 3}),
        }];
        let tracks = ["stage 0: embedding + h.0".to_string(), "stage 1: h.1 + head".into()];
        write_chrome_trace(&path, Some("the run"), &events, &tracks).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let list = doc["traceEvents"].as_array().unwrap();
        let x = list.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!(
            (x["ts"].as_f64(), x["dur"].as_f64(), x["tid"].as_u64()),
            (Some(5e5), Some(2.5e5), Some(1))
        );
        let names: Vec<&str> = list
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["stage 0: embedding + h.0", "stage 1: h.1 + head"]);
        let read = read_chrome_trace(&path).unwrap();
        assert_eq!(read.events, events);
        assert_eq!(read.run.as_deref(), Some("the run"));
        assert_eq!(read.track_names, [(0, tracks[0].clone()), (1, tracks[1].clone())]);
        assert!(!dir.join("t.json.partial").exists());
    }

    #[test]
    fn unreadable_traces_are_user_errors() {
        let dir = std::env::temp_dir().join(format!("pipetrain-trace-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.json");
        std::fs::write(&path, "{\"events\": []}").unwrap();
        let e = read_chrome_trace(&path).unwrap_err();
        assert!(crate::error::is_user_error(&e));
        assert!(e.to_string().ends_with("bad.json: no \"traceEvents\" array: not a Chrome trace"), "{e}");
        let e = write_chrome_trace(&dir.join("missing/t.json"), None, &[], &[]).unwrap_err();
        assert!(e.to_string().contains("cannot write the trace"), "{e}");
        let missing = dir.join("missing/t.json");
        assert_eq!(
            check_trace_path(&missing).unwrap_err().to_string(),
            format!(
                "command line: --trace {}: no directory {} to write it in",
                missing.display(),
                dir.join("missing").display()
            )
        );
        assert_eq!(
            check_trace_path(&dir).unwrap_err().to_string(),
            format!("command line: --trace {}: a directory; give the file to write", dir.display())
        );
        check_trace_path(&dir.join("t.json")).unwrap();
        check_trace_path(Path::new("t.json")).unwrap();
    }
}
