//! `train --trace` records every stage's actions in the simulator's trace format, the report
//! carries each stage's measured bubble rate, and `simulate --measured` calibrates from it,
//! for the run it timed only: another schedule, but not another model or another stage's
//! layers or recompute.

mod common;
use common::*;

#[test]
fn a_measured_trace_feeds_the_simulator() {
    let dir = temp_dir("measured-trace");
    let trace = dir.join("trace.json");
    let f = flags(&[
        ("pipeline-model-parallel-size", "2".into()),
        ("global-batch-size", "8".into()),
        ("pipeline-schedule", "zb-h1".into()),
    ]);
    let mut extra = f.clone();
    extra.extend(["--trace".to_string(), trace.display().to_string()]);
    let run = run_small(&dir, "run", &extra);

    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events: Vec<&serde_json::Value> =
        t["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
    // 3 steps x 4 microbatches: per stage F, I, W each, one send and one receive of each kind.
    for stage in 0..2u64 {
        for cat in ["forward", "backward-input", "backward-weight"] {
            let n = events.iter().filter(|e| e["tid"] == stage && e["cat"] == cat).count();
            assert_eq!(n, 12, "stage {stage} {cat}");
        }
    }
    let sends = |cat: &str| events.iter().filter(|e| e["cat"] == cat).count();
    assert_eq!((sends("send-activation"), sends("recv-activation")), (12, 12));
    assert_eq!((sends("send-grad"), sends("recv-grad")), (12, 12));
    assert!(events.iter().all(|e| e["dur"].as_f64().unwrap() >= 0.0 && e["args"]["step"].is_u64()));
    // One reduce event per stage and step, from the end of the step's last action; from the
    // second step on, one optimizer event per stage (the previous step's update) before the
    // step's first action. The next step starts after the last reduce ends (times in µs,
    // rounded once each way).
    let end = |e: &serde_json::Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
    let of = |events: &[&serde_json::Value], cat: &str| -> Vec<u64> {
        events.iter().filter(|e| e["cat"] == cat).map(|e| e["tid"].as_u64().unwrap()).collect()
    };
    let mut steps = Vec::new();
    for step in 1..=3u64 {
        let in_step: Vec<&serde_json::Value> =
            events.iter().copied().filter(|e| e["args"]["step"] == step).collect();
        let actions: Vec<&serde_json::Value> =
            in_step.iter().copied().filter(|e| e["cat"] != "reduce" && e["cat"] != "optimizer").collect();
        assert_eq!(of(&in_step, "reduce"), [0, 1], "step {step}");
        let updates: &[u64] = if step == 1 { &[] } else { &[0, 1] };
        assert_eq!(of(&in_step, "optimizer"), updates, "step {step}");
        let last_action = actions.iter().map(|e| end(e)).fold(0.0, f64::max);
        let first = actions.iter().map(|e| e["ts"].as_f64().unwrap()).fold(f64::INFINITY, f64::min);
        for e in in_step.iter().filter(|e| e["cat"] == "reduce") {
            assert!((e["ts"].as_f64().unwrap() - last_action).abs() < 1.0, "step {step}: {e}");
        }
        for e in in_step.iter().filter(|e| e["cat"] == "optimizer") {
            let own_first = actions
                .iter()
                .filter(|a| a["tid"] == e["tid"])
                .map(|a| a["ts"].as_f64().unwrap())
                .fold(f64::INFINITY, f64::min);
            assert!(
                end(e) <= own_first + 1.0,
                "step {step}: the update ends after its stage's first action: {e}"
            );
        }
        let reduced = in_step.iter().filter(|e| e["cat"] == "reduce").map(|e| end(e)).fold(0.0, f64::max);
        steps.push((first, reduced));
    }
    for w in steps.windows(2) {
        let ((_, end), (next, _)) = (w[0], w[1]);
        assert!(end <= next + 1.0, "a step ends at {end} µs, the next starts at {next} µs");
    }

    for s in report(&run)["stages"].as_array().unwrap() {
        let b = s["bubble_rate"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&b), "{s}");
    }

    let track_names: Vec<&str> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        track_names,
        ["stage 0: embedding + h.0-h.3; recompute none", "stage 1: h.4-h.7 + head; recompute none"]
    );

    let cfg = dir.join("model.yaml");
    let simulate = |more: &[&str]| {
        let mut sim = bin();
        sim.args(["simulate", "--json", "--config"])
            .arg(&cfg)
            .args(&f)
            .args(more)
            .arg("--measured")
            .arg(&trace);
        sim.output().unwrap()
    };
    let out = simulate(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["iteration_time_ms"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["stages"].as_array().unwrap().len(), 2);
    for s in r["stages"].as_array().unwrap() {
        assert!(s["optimizer_ms"].as_f64().unwrap() > 0.0, "{s}");
    }
    // Another schedule over the same stages is what a trace is for.
    let one_f_one_b = simulate(&["--pipeline-schedule", "1f1b"]);
    assert!(one_f_one_b.status.success(), "{}", stderr(&one_f_one_b));
    // Recompute the trace's backward did not run, or another width, is another run.
    let path = trace.display();
    let advice = "simulate the config the trace was taken with (the schedule may differ)";
    let recompute = simulate(&["--recompute-granularity", "selective"]);
    assert_user_error(
        &recompute,
        &format!(
            "command line: --measured {path}: the trace's stage 0 held `embedding + h.0-h.3; recompute none`, \
             the config's holds `embedding + h.0-h.3; recompute selective (core_attn)`: {advice}"
        ),
    );
    let wider = simulate(&["--hidden-size", "64"]);
    assert_user_error(
        &wider,
        &format!("command line: --measured {path}: the trace timed a run of `8 layers, hidden 32,"),
    );
    assert!(stderr(&wider).contains("the config's is `8 layers, hidden 64,"), "{}", stderr(&wider));
}
