//! `train --trace` records every stage's actions in the simulator's trace format, the report
//! carries each stage's measured bubble rate, and `simulate --measured` calibrates from it.

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

    for s in report(&run)["stages"].as_array().unwrap() {
        let b = s["bubble_rate"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&b), "{s}");
    }

    let cfg = dir.join("model.yaml");
    let mut sim = bin();
    sim.args(["simulate", "--json", "--config"]).arg(&cfg).args(&f).arg("--measured").arg(&trace);
    let out = sim.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["iteration_time_ms"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["stages"].as_array().unwrap().len(), 2);
}
