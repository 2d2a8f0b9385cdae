//! `pipetrain simulate` end to end: the report, its JSON, the Chrome trace, the SVG chart,
//! the sweep and plan, calibration from a trace, and one-line errors for bad input.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// GPT-2 small (the config defaults) on 4 stages, 8 microbatches of 1, bf16 on GPUs.
const GPT2_P4: &str = "\
pipeline_model_parallel_size: 4
pipeline_schedule: 1f1b
micro_batch_size: 1
global_batch_size: 8
device: cuda
precision: bf16
";

fn simulate(config: &Path, extra: &[&str]) -> Output {
    bin().args(["simulate", "--config"]).arg(config).args(extra).output().unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), stderr(o));
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn json_of(config: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&stdout(&simulate(config, &args))).unwrap()
}

fn gpt2_config(name: &str, extra_yaml: &str) -> (PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let cfg = write_config(&dir, "c.yaml", &format!("{GPT2_P4}{extra_yaml}"));
    (dir, cfg)
}

#[test]
fn report_lists_every_stage_and_the_totals() {
    let (_dir, cfg) = gpt2_config("sim-report", "");
    let out = stdout(&simulate(&cfg, &["--hardware", "h100-sxm", "--memory-limit", "1.25GiB"]));
    assert!(
        out.contains(
            "pipeline  1f1b: 4 stages x 1 chunk(s), 8 microbatches of 1 per replica (global batch 8)"
        ),
        "{out}"
    );
    assert!(out.contains("hardware  h100-sxm: 989 TFLOP/s peak x 0.50 efficiency"), "{out}");
    let rows: Vec<&str> =
        out.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).collect();
    assert_eq!(rows.len(), 4, "{out}");
    for (row, layers) in rows.iter().zip(["h.0-h.3 + embedding", "h.4-h.7", "h.8-h.11", "head"]) {
        assert!(
            row.contains(layers) && row.contains("none") && row.contains("iB ") && row.contains('%'),
            "{row}"
        );
    }
    for total in ["iteration ", "bubble ", "tokens/s ", "MFU "] {
        assert!(out.contains(total), "no {total} in {out}");
    }
    // Stage 0 holds 4 microbatches in flight: over 1.25 GiB (stage 1's 3 fit, the fused
    // attention core keeping no T x T tensor).
    assert!(out.contains("memory    stage(s) 0 exceed 1.25 GiB"), "{out}");
}

/// bf16 is stored as the trainer stores it, so the report has one peak per stage: stage 1
/// (h.4-h.7) holds a 2-byte copy of its four blocks' parameters beside the fp32 ones,
/// and keeps each layer's activations at half fp32's bytes but the row statistics, which
/// stay fp32.
#[test]
fn json_report_stores_bf16_as_the_trainer_does() {
    let (_dir, cfg) = gpt2_config("sim-json-storage", "");
    let bf16 = json_of(&cfg, &["--hardware", "h100-sxm"]);
    let fp32 = json_of(&cfg, &["--hardware", "h100-sxm", "--precision", "fp32"]);
    for v in [&bf16, &fp32] {
        assert!(v.get("models_16bit_storage").is_none(), "{v}");
        let stages = v["stages"].as_array().unwrap();
        assert!(stages.iter().all(|s| s.get("trainer_peak_memory_bytes").is_none()), "{v}");
    }
    let static_bytes = |v: &Value| v["stages"][1]["static_bytes"].as_u64().unwrap();
    let c = 768;
    // [C,3C], [C,C], [C,4C] and [4C,C] per block, and its vectors: the biases (3C, C, 4C,
    // C) and two LayerNorms' weights and biases.
    assert_eq!(static_bytes(&bf16) - static_bytes(&fp32), 2 * 4 * (12 * c * c + 13 * c));
    // Per token: two LayerNorms' mean and rstd and 12 heads' log-sum-exp, 4 bytes each.
    let statistics = 1024.0 * 16.0 * 4.0;
    let layer = |v: &Value| v["stages"][1]["layer_activation_bytes"].as_f64().unwrap();
    assert_eq!(layer(&bf16), (layer(&fp32) - statistics) / 2.0 + statistics);
}

#[test]
fn json_report_has_the_closed_form_of_1f1b() {
    let (_dir, cfg) = gpt2_config("sim-json", "");
    let v = json_of(
        &cfg,
        &["--hardware", "h100-sxm", "--op-times", "forward=1,backward-input=1,backward-weight=1"],
    );
    // (m + p - 1) * (F + B) with B = I + W, and bubble (p - 1) / (m + p - 1).
    assert!((v["iteration_time_ms"].as_f64().unwrap() - 33.0).abs() < 1e-9, "{v}");
    assert!((v["bubble_rate"].as_f64().unwrap() - 3.0 / 11.0).abs() < 1e-12, "{v}");
    assert!((v["tokens_per_s"].as_f64().unwrap() - 8.0 * 1024.0 / 0.033).abs() < 1e-6, "{v}");
    assert!(v["mfu"].as_f64().unwrap() > 0.0);
    assert_eq!(v["times_from"], "op-times");
    assert_eq!(v["pipeline_model_parallel_size"], 4);
    let stages = v["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4);
    assert_eq!(stages[0]["layers"], "h.0-h.3 + embedding");
    assert_eq!(stages[3]["layers"], "head");
    for s in stages {
        let (busy, idle) = (s["busy_ms"].as_f64().unwrap(), s["idle_ms"].as_f64().unwrap());
        assert!((busy - 24.0).abs() < 1e-9 && (idle - 9.0).abs() < 1e-9, "{s}");
        assert_eq!(s["optimizer_ms"].as_f64(), Some(0.0), "{s}");
        assert!(s["peak_memory_bytes"].as_u64().unwrap() > s["static_bytes"].as_u64().unwrap());
    }
    // 1F1B: stage 0 holds 4 microbatches, stage 3 one.
    let peak = |r: usize| stages[r]["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak(1) > peak(2), "{v}");
}

#[test]
fn free_transfers_give_the_textbook_bubbles() {
    // Equal op times and p2p=0: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(3m+p-1) for ZB-H1,
    // (p-1)/(6m+p-1) for DualPipeV (two chunks per stage; m >= 2p).
    let (_dir, cfg) = gpt2_config("sim-free-p2p", "");
    let times = "forward=1,backward-input=1,backward-weight=1,p2p=0";
    for (p, m) in [(2, 3), (4, 8), (3, 12)] {
        let dualpipe = if m >= 2 * p { vec![("dualpipe-v", 6 * m)] } else { vec![] };
        for (kind, work) in [("gpipe", m), ("1f1b", m), ("zb-h1", 3 * m)].into_iter().chain(dualpipe) {
            let (ps, ms) = (p.to_string(), m.to_string());
            let args = ["--op-times", times, "--pipeline-schedule", kind];
            let v = json_of(
                &cfg,
                &[&args[..], &["--pipeline-model-parallel-size", &ps, "--global-batch-size", &ms]].concat(),
            );
            let want = (p - 1) as f64 / (work + p - 1) as f64;
            let got = v["bubble_rate"].as_f64().unwrap();
            assert!((got - want).abs() < 1e-9, "{kind} p={p} m={m}: bubble {got}, expected {want}");
        }
    }
}

#[test]
fn the_optimizer_phase_ends_the_step() {
    let (_dir, cfg) = gpt2_config("sim-optimizer", "");
    let times = "forward=1,backward-input=1,backward-weight=1,optimizer=2";
    let v = json_of(&cfg, &["--hardware", "h100-sxm", "--op-times", times]);
    // The lists end at 33 ms (the closed form above), then every stage takes 2 ms more,
    // which is not compute: the bubble grows by it.
    assert!((v["iteration_time_ms"].as_f64().unwrap() - 35.0).abs() < 1e-9, "{v}");
    assert!((v["bubble_rate"].as_f64().unwrap() - 11.0 / 35.0).abs() < 1e-12, "{v}");
    for s in v["stages"].as_array().unwrap() {
        let ms = |key: &str| s[key].as_f64().unwrap();
        assert!((ms("optimizer_ms") - 2.0).abs() < 1e-12, "{s}");
        assert!((ms("busy_ms") - 24.0).abs() < 1e-9 && (ms("idle_ms") - 9.0).abs() < 1e-9, "{s}");
    }
}

#[test]
fn chrome_trace_has_a_track_per_stage_and_distinct_categories() {
    let (dir, cfg) = gpt2_config(
        "sim-trace",
        "recompute_granularity: full\nrecompute_method: uniform\nrecompute_num_layers: 2\n",
    );
    let trace = dir.join("t.json");
    stdout(&simulate(
        &cfg,
        &["--hardware", "a100-80gb", "--pipeline-schedule", "zb-h1", "--trace", trace.to_str().unwrap()],
    ));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    let tids = |cat: &str| {
        let mut t: Vec<u64> =
            complete.iter().filter(|e| e["cat"] == cat).map(|e| e["tid"].as_u64().unwrap()).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    assert_eq!(tids("forward"), [0, 1, 2, 3]);
    assert_eq!(tids("backward-input"), [0, 1, 2, 3]);
    assert_eq!(tids("backward-weight"), [0, 1, 2, 3]);
    assert_eq!(tids("recompute"), [0, 1, 2]); // the head-only stage has no blocks to recompute
    assert_eq!(tids("transfer"), [4, 5, 6, 7]); // each stage's sends, beside its compute
    assert_eq!(tids("optimizer"), [0, 1, 2, 3]);
    let count = |cat: &str| complete.iter().filter(|e| e["cat"] == cat).count();
    assert_eq!((count("forward"), count("backward-input"), count("backward-weight")), (32, 32, 32));
    assert_eq!((count("transfer"), count("optimizer")), (2 * 3 * 8, 4));
    let optimizer = complete.iter().find(|e| e["cat"] == "optimizer").unwrap();
    assert_eq!(optimizer["name"], "optimizer");
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[..4],
        ["stage 0: h.0-h.3 + embedding", "stage 1: h.4-h.7", "stage 2: h.8-h.11", "stage 3: head"]
    );
    assert_eq!(names[4], "stage 0 sends");
    let f = complete.iter().find(|e| e["cat"] == "forward").unwrap();
    assert_eq!((f["pid"].as_u64(), f["args"]["step"].as_u64()), (Some(0), Some(0)));
    assert!(f["dur"].as_f64().unwrap() > 0.0);
}

#[test]
fn svg_chart_has_a_row_per_stage_a_legend_and_an_axis() {
    let (dir, cfg) = gpt2_config("sim-svg", "");
    let svg = dir.join("p.svg");
    let p16 = ["--pipeline-model-parallel-size", "16", "--num-layers", "48", "--global-batch-size", "32"];
    stdout(&simulate(&cfg, &[&["--hardware", "h200", "--svg", svg.to_str().unwrap()][..], &p16].concat()));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(text.trim_end().ends_with("</svg>"));
    for r in 0..16 {
        assert!(text.contains(&format!(">stage {r}</text>")), "no row for stage {r}");
    }
    for word in
        ["forward", "backward / backward-input", "backward-weight", "recompute", "optimizer", ">time</text>"]
    {
        assert!(text.contains(word), "no {word}");
    }
    assert!(text.contains("1f1b, p=16, v=1, m=32: iteration"));
}

#[test]
fn print_schedule_is_the_lowered_ir() {
    let (_dir, cfg) = gpt2_config("sim-ir", "");
    let out = stdout(&simulate(&cfg, &["--print-schedule", "--pipeline-schedule", "zb-h1"]));
    let schedule: schedules::Schedule = out.parse().unwrap();
    let shape = schedule.shape();
    assert_eq!((shape.stages, shape.chunks, shape.microbatches), (4, 1, 8));
    assert!(out.lines().nth(1).unwrap().starts_with("stage 0: F0 SA0@1"), "{out}");
}

#[test]
fn measured_trace_calibrates_the_op_times() {
    let (dir, cfg) = gpt2_config("sim-measured", "");
    let mut events = Vec::new();
    for step in [1, 2] {
        for stage in 0..4 {
            for mb in 0..8 {
                let ms = if step == 2 { 2.0 } else { 50.0 }; // only the last step counts
                for (cat, dur) in [("forward", ms), ("backward", 2.0 * ms), ("send-activation", 0.5)] {
                    events.push(serde_json::json!({
                        "ph": "X", "pid": 0, "tid": stage, "name": "x", "cat": cat, "ts": 0.0,
                        "dur": dur * 1e3, "args": {"chunk": 0, "microbatch": mb, "step": step}
                    }));
                }
            }
        }
    }
    let trace = dir.join("measured.json");
    std::fs::write(&trace, serde_json::json!({"traceEvents": events}).to_string()).unwrap();
    let v = json_of(&cfg, &["--hardware", "h100-sxm", "--measured", trace.to_str().unwrap()]);
    assert_eq!(v["times_from"], "measured");
    assert!((v["p2p_ms"].as_f64().unwrap() - 0.5).abs() < 1e-12, "{v}");
    let s1 = &v["stages"][1];
    assert!((s1["forward_ms"].as_f64().unwrap() - 2.0).abs() < 1e-12, "{s1}");
    let backward = s1["backward_input_ms"].as_f64().unwrap() + s1["backward_weight_ms"].as_f64().unwrap();
    assert!((backward - 4.0).abs() < 1e-12, "{s1}");
}

#[test]
fn sweep_ranks_every_candidate_by_iteration_time() {
    let (_dir, cfg) = gpt2_config("sim-sweep", "");
    let v = json_of(&cfg, &["--sweep", "--hardware", "h100-sxm", "--memory-limit", "2GiB"]);
    let c = v["candidates"].as_array().unwrap();
    let times: Vec<f64> = c.iter().map(|x| x["iteration_time_ms"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    for schedule in ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"] {
        assert!(c.iter().any(|x| x["pipeline_schedule"] == schedule), "no {schedule}");
    }
    for recompute in
        ["none", "selective core_attn", "selective core_attn+mlp", "full/uniform N=3", "full/block N=1"]
    {
        assert!(c.iter().any(|x| x["memory_lever"] == recompute), "no {recompute}");
    }
    let sizes: Vec<u64> = c.iter().map(|x| x["micro_batch_size"].as_u64().unwrap()).collect();
    assert!([1, 2, 4, 8].iter().all(|b| sizes.contains(b)));
    for x in c {
        assert_eq!(x["fits"].as_bool().unwrap(), x["peak_memory_bytes"].as_u64().unwrap() <= 2 << 30, "{x}");
    }
    assert!(c.iter().any(|x| x["fits"] == true) && c.iter().any(|x| x["fits"] == false));
}

#[test]
fn plan_is_yaml_that_fits_when_applied() {
    let (dir, cfg) = gpt2_config("sim-plan", "");
    let limit = "1400MiB";
    let plan = stdout(&simulate(&cfg, &["--plan", "--hardware", "h100-sxm", "--memory-limit", limit]));
    let lines: serde_norway::Mapping = serde_norway::from_str(&plan).unwrap();
    let keys: Vec<&str> = lines.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "tensor_model_parallel_size",
            "sequence_parallel",
            "pipeline_model_parallel_size",
            "data_parallel_size",
            "use_distributed_optimizer",
            "pipeline_schedule",
            "virtual_pipeline_model_parallel_size",
            "micro_batch_size",
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
            "recompute_modules",
            "recompute_num_layers_per_stage",
            "fine_grained_activation_offloading",
            "offload_modules",
            "cpu_offloading_activations",
            "offload_num_layers_per_stage"
        ]
    );
    // The config as given does not fit; with the plan's lines pasted over it, it does.
    let before = json_of(&cfg, &["--hardware", "h100-sxm", "--memory-limit", limit]);
    assert_eq!(before["fits"], false);
    let mut merged: serde_norway::Mapping = serde_norway::from_str(GPT2_P4).unwrap();
    for (k, v) in lines {
        merged.insert(k, v);
    }
    let planned = write_config(&dir, "planned.yaml", &serde_norway::to_string(&merged).unwrap());
    let after = json_of(&planned, &["--hardware", "h100-sxm", "--memory-limit", limit]);
    assert_eq!(after["fits"], true, "{plan}\n{after}");
    for s in after["stages"].as_array().unwrap() {
        assert!(s["peak_memory_bytes"].as_u64().unwrap() <= 1400 << 20);
    }
    assert!(plan.starts_with(
        "# pipetrain simulate --plan: the fastest of the sweep that fits 1.37 GiB per device\n"
    ));
}

/// The published runs of Korthikanti et al. 2022 (Table 3) on A100s: t = 8 with sequence
/// parallelism, and the per-layer bytes equal to the paper's once masks and statistics are
/// accounted for (docs/simulate.md has the times against the paper's).
/// Over a cluster the planner picks t, p and dp too, and whether the replicas share the
/// optimizer state (saying what the other choice would cost), lists the runners-up, and its lines
/// applied make a config that the simulator reports as fitting, on every GPU of the world.
#[test]
fn plan_over_gpus_fits_when_applied() {
    let (dir, cfg) = gpt2_config("sim-plan-gpus", "");
    let args = [
        "--plan",
        "--gpus",
        "8",
        "--hardware",
        "h100-sxm",
        "--memory-limit",
        "1GiB",
        "--global-batch-size",
        "16",
    ];
    let plan = stdout(&simulate(&cfg, &args));
    assert!(plan.contains("# the runners-up that fit:\n# rank   t   p   dp dist-opt  schedule"), "{plan}");
    // Its replicas share the optimizer state (and, under bf16, the fp32 masters of the
    // blocks' matrices): whole, stage 0 of the same shape holds 1.22 GB all along.
    assert!(
        plan.contains(
            "\n# optimizer: distributed over the replicas; whole, a stage's parameters, gradients and AdamW \
             moments alone would exceed 1.00 GiB\n"
        ),
        "{plan}"
    );
    assert!(plan.contains("\nuse_distributed_optimizer: true\n"), "{plan}");
    assert!(plan.contains("\n#    2  "), "{plan}");
    let lines: serde_norway::Mapping = serde_norway::from_str(&plan).unwrap();
    let mut merged: serde_norway::Mapping = serde_norway::from_str(GPT2_P4).unwrap();
    for (k, v) in lines {
        merged.insert(k, v);
    }
    merged.insert("global_batch_size".into(), 16.into());
    let planned = write_config(&dir, "planned.yaml", &serde_norway::to_string(&merged).unwrap());
    let after = json_of(&planned, &["--hardware", "h100-sxm", "--memory-limit", "1GiB"]);
    assert_eq!(
        (after["fits"].as_bool(), after["world_size"].as_u64()),
        (Some(true), Some(8)),
        "{plan}\n{after}"
    );
    assert_user_error(&simulate(&cfg, &["--gpus", "8"]), "--gpus applies to --plan and --sweep");
    // The sweep shows the same space: every t x p x dp = 8 the model and batch allow.
    let v = json_of(&cfg, &["--sweep", "--gpus", "8", "--hardware", "h100-sxm", "--global-batch-size", "16"]);
    let mut layouts: Vec<(u64, u64, u64)> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().unwrap();
            (n("tensor_model_parallel_size"), n("pipeline_model_parallel_size"), n("data_parallel_size"))
        })
        .collect();
    layouts.sort_unstable();
    layouts.dedup();
    assert_eq!(
        layouts,
        [(1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 1, 4), (2, 2, 2), (2, 4, 1), (4, 1, 2), (4, 2, 1)]
    );
}

/// Where a V schedule is the fastest that fits, the plan picks it: GPT-3 175B on its 64
/// A100s plans DualPipeV. The config with the plan's lines pasted over it simulates as
/// fitting, to the very time and peak the sweep gives that candidate, and its report
/// prints the iteration time the plan's comment line does.
#[test]
fn plan_picks_a_v_whose_lines_simulate_to_the_same_figures() {
    let dir = temp_dir("sim-plan-v");
    let config = Path::new("configs/gpt3-175b.yaml");
    let plan = stdout(&simulate(config, &["--plan", "--hardware", "a100-80gb"]));
    assert!(
        plan.contains("\npipeline_schedule: dualpipe-v\nvirtual_pipeline_model_parallel_size: null\n"),
        "{plan}"
    );
    assert!(plan.contains("\nmicro_batch_size: 1\nrecompute_granularity: null\n"), "{plan}");
    let mut merged: serde_norway::Mapping =
        serde_norway::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    merged.extend(serde_norway::from_str::<serde_norway::Mapping>(&plan).unwrap());
    let planned = write_config(&dir, "planned.yaml", &serde_norway::to_string(&merged).unwrap());
    let after = json_of(&planned, &["--hardware", "a100-80gb"]);
    assert_eq!(
        (after["pipeline_schedule"].as_str(), after["fits"].as_bool()),
        (Some("dualpipe-v"), Some(true))
    );

    let sweep = json_of(config, &["--sweep", "--hardware", "a100-80gb"]);
    let candidates = sweep["candidates"].as_array().unwrap();
    let planned_candidate = candidates
        .iter()
        .find(|c| {
            c["pipeline_schedule"] == "dualpipe-v"
                && c["micro_batch_size"] == 1
                && c["memory_lever"] == "none"
        })
        .unwrap();
    assert_eq!(candidates.iter().find(|c| c["fits"] == true), Some(planned_candidate));
    assert_eq!(after["iteration_time_ms"], planned_candidate["iteration_time_ms"]);
    let peaks: Vec<Value> =
        after["stages"].as_array().unwrap().iter().map(|s| s["peak_memory_bytes"].clone()).collect();
    assert_eq!(Value::from(peaks), planned_candidate["stage_peak_memory_bytes"]);
    // `--plan --json` lists what the planner simulated: the plan, first of those that fit,
    // with the same figures.
    let weighed = json_of(config, &["--plan", "--hardware", "a100-80gb"]);
    let plan_candidate =
        weighed["candidates"].as_array().unwrap().iter().find(|c| c["fits"] == true).unwrap();
    for figure in ["pipeline_schedule", "memory_lever", "iteration_time_ms", "stage_peak_memory_bytes"] {
        assert_eq!(plan_candidate[figure], planned_candidate[figure], "{figure}");
    }

    let report = stdout(&simulate(&planned, &["--hardware", "a100-80gb"]));
    let said = plan.lines().nth(1).unwrap();
    let iteration = said.split(": iteration ").nth(1).unwrap().split(',').next().unwrap();
    assert!(report.contains(&format!("\niteration {iteration}   ")), "{said}\n{report}");
}

#[test]
fn shipped_configs_simulate() {
    let published = [
        ("configs/22b.yaml", 1, 1, 8),
        ("configs/gpt3-175b.yaml", 8, 64, 64),
        ("configs/530b.yaml", 35, 280, 280),
        ("configs/1t.yaml", 64, 512, 512),
    ];
    for (config, p, m, gpus) in published {
        let v = json_of(Path::new(config), &["--hardware", "a100-80gb"]);
        assert_eq!(v["tensor_model_parallel_size"], 8, "{config}");
        assert_eq!(v["sequence_parallel"], true, "{config}");
        assert_eq!(
            (v["pipeline_model_parallel_size"].as_u64(), v["microbatches"].as_u64()),
            (Some(p), Some(m))
        );
        assert_eq!(v["world_size"].as_u64(), Some(gpus), "{config}");
        assert_eq!(v["fits"], true, "{config}");
        let stage = &v["stages"][0];
        assert!(stage["korthikanti_layer_bytes"].as_f64().is_some(), "{config}");
    }
    let v = json_of(Path::new("configs/gpt3-175b.yaml"), &["--hardware", "a100-80gb"]);
    assert_eq!(v["parameters"].as_u64().unwrap(), 174_615_846_912);
    // 34 sbh / t bytes at s = 2048, h = 12288, t = 8, less the 1-byte residual masks (sbh / 4)
    // and plus the LayerNorm statistics (2 x 2 x 2048 / 8 values, kept in fp32) and the
    // attention's log-sum-exp (96 / 8 heads x 2048 rows in fp32: at bf16 the fused tensor-core
    // core keeps it in place of the probabilities).
    let sbh = 2048.0 * 12288.0;
    let lse = 96.0 / 8.0 * 2048.0 * 4.0;
    assert_eq!(v["stages"][0]["layer_activation_bytes"].as_f64().unwrap(), sbh * 32.0 / 8.0 + 4096.0 + lse);
    assert_eq!(v["stages"][0]["korthikanti_layer_bytes"].as_f64().unwrap(), sbh * 34.0 / 8.0);
}

/// The report names the parallel layout and prints the paper's per-layer figure beside ours.
#[test]
fn tensor_and_data_parallel_report() {
    let (_dir, cfg) = gpt2_config(
        "sim-tp",
        "tensor_model_parallel_size: 4\nsequence_parallel: true\ndata_parallel_size: 2\n",
    );
    let out = stdout(&simulate(&cfg, &["--hardware", "h100-sxm", "--global-batch-size", "16"]));
    assert!(
        out.contains("parallel  tensor 4 (sequence parallel) x pipeline 4 x data 2 = 32 GPUs; time and memory below are one GPU's"),
        "{out}"
    );
    assert!(
        out.contains(
            "pipeline  1f1b: 4 stages x 1 chunk(s), 8 microbatches of 1 per replica (global batch 16)"
        ),
        "{out}"
    );
    // GPT-2 small's layer at 16 bits over 4 GPUs: sbh/t (34 + 5as/h) = 21.375 MiB in the paper,
    // of which 5as/h sbh/t = 15 MiB is the attention core the fused kernel never stores; our
    // LayerNorm statistics and log-sum-exp are fp32.
    assert!(
        out.contains(
            "  stage 0-2: 6.02 MiB + masks 384.00 KiB - statistics 4.00 KiB - log-sum-exp 12.00 KiB + attention core 15.00 MiB (fused: never stored) = 21.38 MiB; paper 21.38 MiB"
        ),
        "{out}"
    );
    assert!(out.contains("  stage 3: no transformer layer"), "{out}");
    assert!(out.contains("MFU ") && out.contains(" of 32 x 989 TFLOP/s"), "{out}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let (dir, cfg) = gpt2_config("sim-bad", "");
    let cases: [(&[&str], &str); 11] = [
        (
            &["--pipeline-schedule", "interleaved-1f1b", "--virtual-pipeline-model-parallel-size", "2", "--global-batch-size", "6"],
            "command line: --pipeline-schedule interleaved-1f1b: interleaved-1f1b with p=4, v=2, m=6: interleaved-1f1b: the number of microbatches (6) must be a multiple of pipeline_model_parallel_size (4)",
        ),
        (
            &["--pipeline-schedule", "interleaved-1f1b", "--virtual-pipeline-model-parallel-size", "2", "--global-batch-size", "2"],
            "interleaved-1f1b with p=4, v=2, m=2",
        ),
        (&["--num-layers", "2"], "c.yaml: key `pipeline_model_parallel_size`: cannot split 2 layers over 4 pipeline stages (chunks)"),
        (&["--op-times", "forward=0,backward=1"], "command line: --op-times forward=0,backward=1: forward=0: a time must be > 0 ms"),
        (&["--op-times", "forward=1,backward=-3"], "command line: --op-times forward=1,backward=-3: backward=-3: a time must be > 0 ms"),
        (&["--op-times", "forward=1,backward=1,p2p=-1"], "command line: --op-times forward=1,backward=1,p2p=-1: p2p=-1: a time must be >= 0 ms"),
        (&["--op-times", "forward=1,backward=1,p2p=nan"], "command line: --op-times forward=1,backward=1,p2p=nan: p2p=nan: a time must be >= 0 ms"),
        (&["--hardware", "tpu-v9"], "command line: --hardware tpu-v9: unknown hardware (expected one of: a100-80gb, h100-sxm, h200, cpu-measured)"),
        (&["--memory-limit", "80XB"], "command line: --memory-limit 80XB: give a size with a unit"),
        (&["--measured", "no-such-trace.json"], "no-such-trace.json: cannot read the trace"),
        (&["--sweep", "--op-times", "forward=1,backward=1"], "command line: --op-times with --sweep"),
    ];
    let svg = dir.join("never.svg");
    for (extra, needle) in cases {
        let o = simulate(&cfg, &[extra, &["--svg", svg.to_str().unwrap()][..]].concat());
        assert_user_error(&o, needle);
        assert!(!svg.exists(), "a failed simulation wrote its chart");
    }
    // A sweep of no rows would print only its header.
    assert_user_error(
        &simulate(&cfg, &["--sweep", "--top", "0"]),
        "error: command line: --top 0: give 1 or more rows\n",
    );
}

#[test]
fn a_recompute_alias_shows_as_its_canonical_form() {
    let (_dir, cfg) = gpt2_config("sim-alias", "");
    let out = stdout(&simulate(&cfg, &["--recompute-activations"]));
    assert!(
        out.contains("config    recompute_granularity: selective (given as recompute_activations: true)"),
        "{out}"
    );
    let v = json_of(&cfg, &["--use-activation-checkpoint", "true"]);
    assert_eq!(
        v["config_aliases"],
        serde_json::json!([{
            "given": "use_activation_checkpoint: true",
            "means": "recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1"
        }])
    );
    assert_eq!(
        v["stages"][0]["recompute"],
        json_of(
            &cfg,
            &[
                "--recompute-granularity",
                "full",
                "--recompute-method",
                "uniform",
                "--recompute-num-layers",
                "1"
            ]
        )["stages"][0]["recompute"]
    );
    for alias in [
        "checkpoint_num_layers",
        "checkpoint_activations",
        "recompute_activations",
        "use_activation_checkpoint",
    ] {
        for command in ["train", "simulate"] {
            let help = bin().args([command, "--help"]).output().unwrap();
            assert!(
                String::from_utf8_lossy(&help.stdout).contains(&format!("  {alias}: ")),
                "{command} --help: {alias}"
            );
        }
    }
}

#[test]
fn an_alias_that_disagrees_with_its_canonical_key_exits_2() {
    let (dir, cfg) = gpt2_config("sim-alias-conflict", "");
    assert_user_error(
        &simulate(&cfg, &["--checkpoint-activations", "--recompute-granularity", "selective"]),
        "command line: --checkpoint-activations true and command line: --recompute-granularity selective disagree on recompute_granularity: full vs selective",
    );
    let both = write_config(
        &dir,
        "both.yaml",
        &format!(
            "{GPT2_P4}checkpoint_activations: true\ncheckpoint_num_layers: 2\nrecompute_num_layers: 3\n"
        ),
    );
    let shown = both.display();
    assert_user_error(
        &simulate(&both, &[]),
        &format!("{shown}: `checkpoint_num_layers: 2` and {shown}: `recompute_num_layers: 3` disagree on recompute_num_layers: 2 vs 3"),
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_report_quietly() {
    // `simulate ... | head`: the reader has gone before the first line is written.
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let (_dir, cfg) = gpt2_config("sim-pipe", "");
    let mut child = bin()
        .args(["simulate", "--config"])
        .arg(&cfg)
        .args(["--sweep", "--hardware", "h100-sxm"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

/// Every shipped config fits, on every stage, an 80 GB H100 (the CPU quick starts with room
/// to spare; named, so that the test does not depend on this machine's memory): a config we
/// ship as a layout to copy must be one that could run. Llama 3 405B does so only with
/// Meta's own balance, a layer fewer on each end stage, and its optimizer state sharded over
/// 64 replicas.
#[test]
fn every_shipped_config_fits_an_h100() {
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&configs).unwrap() {
        let cfg = entry.unwrap().path();
        let report = json_of(&cfg, &["--hardware", "h100-sxm"]);
        let over: Vec<_> = report["stages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|stage| stage["fits"] != Value::Bool(true))
            .map(|stage| stage["stage"].clone())
            .collect();
        assert!(over.is_empty(), "{}: stages {over:?} exceed the GPU's memory", cfg.display());
        assert_eq!(report["fits"], Value::Bool(true), "{}", cfg.display());
        checked.push(cfg.file_name().unwrap().to_string_lossy().into_owned());
    }
    assert!(checked.contains(&"llama3-405b.yaml".to_string()), "{checked:?}");
}

/// The shipped Llama 3 configs simulate with the model cards' parameter counts (8.03B,
/// 70.6B, 405.9B, each within 0.5%), name their architecture (405B is Llama 3.1's, its rope
/// scaled), and print the Korthikanti line at their own widths, saying what differs from the
/// paper's GPT formula.
#[test]
fn llama3_configs_have_the_model_cards_parameter_counts() {
    let rope = |scaled: bool| match scaled {
        true => "rope (base 500000, Llama 3.1 scaling by 8)",
        false => "rope (base 500000)",
    };
    for (name, card) in [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)] {
        let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("configs/{name}.yaml"));
        let report = json_of(&cfg, &["--hardware", "h100-sxm"]);
        let params = report["parameters"].as_f64().unwrap();
        assert!((params / card - 1.0).abs() < 0.005, "{name}: {params} parameters, the card says {card}");
        let text = stdout(&simulate(&cfg, &["--hardware", "h100-sxm"]));
        let architecture = format!(
            "RMSNorm (eps 1e-5), {}, SwiGLU, 8 query groups, no linear biases, untied output layer",
            rope(name == "llama3-405b")
        );
        assert!(text.contains(&architecture), "{name}: {text}");
        assert!(
            text.contains("(the paper's GPT formula at this model's widths: k, v over 8 groups"),
            "{name}: {text}"
        );
    }
    let exact = |name: &str| {
        let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("configs/{name}.yaml"));
        json_of(&cfg, &["--hardware", "h100-sxm"])["parameters"].as_u64().unwrap()
    };
    assert_eq!(exact("llama3-8b"), 8_030_261_248);
}

/// The shipped Qwen2.5 7B, Qwen3 8B, Mistral Nemo 12B, Phi-4, Gemma 7B and Nemotron-4 15B configs have
/// the model cards' parameter counts to the one (Qwen2.5's q, k and v biases, 4608 a layer,
/// counted and no other bias; Qwen3's QK-norm weights, 256 a layer; Nemo's output projections
/// [5120, 4096], its heads of 128 not 5120 / 32; Phi-4's 14.7B; Gemma 7B's 8.54B, its heads
/// of 256 not 3072 / 16 and its output layer the embedding; Nemotron-4's 3.15B in the
/// embedding and the output layer and 12.48B in the blocks, its LayerNorms' biases among
/// them, which its report gives as 3.2B and 12.5B) and say what they are.
#[test]
fn qwen_mistral_nemo_phi_4_gemma_and_nemotron_configs_have_the_model_cards_parameter_counts() {
    for (name, parameters, architecture) in [
        (
            "qwen2.5-7b",
            7_615_616_512u64,
            "RMSNorm (eps 1e-6), rope (base 1000000), SwiGLU, 4 query groups, biases on q, k and v alone, untied \
             output layer",
        ),
        (
            "qwen3-8b",
            8_190_735_360,
            "RMSNorm (eps 1e-6), rope (base 1000000), SwiGLU, 8 query groups, no linear biases, QK-norm, untied \
             output layer",
        ),
        (
            "mistral-nemo-12b",
            12_247_782_400,
            "RMSNorm (eps 1e-5), rope (base 1000000), SwiGLU, 8 query groups, heads of 128, no linear biases, \
             untied output layer",
        ),
        (
            "phi4-14b",
            14_659_507_200,
            "RMSNorm (eps 1e-5), rope (base 250000), SwiGLU, 10 query groups, no linear biases, untied output layer",
        ),
        (
            "gemma-7b",
            8_537_680_896,
            "RMSNorm (eps 1e-6, 1 + weight), rope (base 10000), GeGLU, heads of 256, no linear biases, tied output \
             layer, embeddings x 55.425625",
        ),
        (
            "nemotron4-15b",
            15_628_775_424,
            "LayerNorm (eps 1e-5, 1 + weight), rope (base 10000, on 64 of 128 channels), squared ReLU, 8 query \
             groups, no linear biases, untied output layer",
        ),
        (
            "olmo2-7b",
            7_298_617_344,
            "RMSNorm (eps 1e-6, on the branches' outputs), rope (base 500000), SwiGLU, no linear biases, QK-norm over \
             the projections, untied output layer",
        ),
        // OLMo 2 32B: grouped-query attention under QK-norm over the projections.
        (
            "olmo2-32b",
            32_234_279_936,
            "RMSNorm (eps 1e-6, on the branches' outputs), rope (base 500000), SwiGLU, 8 query groups, no linear \
             biases, QK-norm over the projections, untied output layer",
        ),
        // OLMo 3 7B: OLMo 2 7B's layers and vocabulary, so its count, with the window.
        (
            "olmo3-7b",
            7_298_617_344,
            "RMSNorm (eps 1e-6, on the branches' outputs), rope (base 500000), SwiGLU, no linear biases, QK-norm over \
             the projections, a window of 4096 keys but on every 4th layer, untied output layer",
        ),
        // OLMo 3 32B: OLMo 2 32B's layers, so its count, with the window.
        (
            "olmo3-32b",
            32_234_279_936,
            "RMSNorm (eps 1e-6, on the branches' outputs), rope (base 500000), SwiGLU, 8 query groups, no linear \
             biases, QK-norm over the projections, a window of 4096 keys but on every 4th layer, untied output layer",
        ),
    ] {
        let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("configs/{name}.yaml"));
        let report = json_of(&cfg, &["--hardware", "h100-sxm"]);
        assert_eq!(report["parameters"].as_u64(), Some(parameters), "{name}");
        let text = stdout(&simulate(&cfg, &["--hardware", "h100-sxm"]));
        assert!(text.contains(architecture), "{name}: {text}");
        assert!(text.contains("every stage fits"), "{name}: {text}");
    }
}

/// The planner searches a Llama as it does a GPT: the plan for Llama 3 8B over 16 GPUs,
/// pasted over the config, simulates and fits.
#[test]
fn plan_works_on_a_llama_config() {
    let dir = temp_dir("sim-plan-llama");
    let base = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/llama3-8b.yaml"))
        .unwrap();
    let cfg = write_config(&dir, "c.yaml", &base);
    let args = ["--plan", "--gpus", "16", "--hardware", "h100-sxm"];
    let plan = stdout(&simulate(&cfg, &args));
    assert!(plan.starts_with("# pipetrain simulate --plan: the fastest of the sweep that fits"), "{plan}");
    let lines: serde_norway::Mapping = serde_norway::from_str(&plan).unwrap();
    let mut merged: serde_norway::Mapping = serde_norway::from_str(&base).unwrap();
    for (k, v) in lines {
        merged.insert(k, v);
    }
    let planned = write_config(&dir, "planned.yaml", &serde_norway::to_string(&merged).unwrap());
    let after = json_of(&planned, &["--hardware", "h100-sxm"]);
    assert_eq!(after["fits"], true, "{plan}\n{after}");
}

/// Offloading the attention core's saves (q, k, v at bf16 and the fused core's f32
/// log-sum-exp, three blocks per stage) moves their bytes to each stage's host peak, once per
/// microbatch in flight, and from its device peak but for the blocks' whose copies are on the
/// device where the peak falls: two in a backward (a block's, back while its backward reads
/// them, beside the previous block's, which start back a block early), one in the last
/// stage's forward, where the head's logits put its peak (a block's, on the device until
/// its forward ends); a PCIe link
/// too slow to hide the copy behind a forward makes the forward the copy; a host too small
/// is a one-line error.
#[test]
fn offload_moves_the_predicted_bytes_to_the_host_and_the_copy_shows_where_pcie_is_slow() {
    let (_dir, cfg) = gpt2_config("sim-offload", "num_layers_per_stage: [3, 3, 3, 3]\n");
    let offload = ["--fine-grained-activation-offloading", "true", "--offload-modules", "core_attn"];
    let hw = ["--hardware", "h100-sxm"];
    let without = json_of(&cfg, &hw);
    let with = json_of(&cfg, &[&hw[..], &offload[..]].concat());
    let per_microbatch: u64 = 3 * (1024 * 3 * 768 * 2 + 12 * 1024 * 4);
    for (r, (a, b)) in
        without["stages"].as_array().unwrap().iter().zip(with["stages"].as_array().unwrap()).enumerate()
    {
        let in_flight = 4 - r as u64;
        let on_device = if r == 3 { per_microbatch / 3 } else { 2 * per_microbatch / 3 };
        assert_eq!(a["host_peak_bytes"], 0, "stage {r}");
        assert_eq!(b["host_peak_bytes"].as_u64(), Some(in_flight * per_microbatch), "stage {r}");
        let groups = serde_json::json!([{"group": "core_attn", "bytes": per_microbatch}]);
        assert_eq!(
            (&a["offloaded_bytes_by_group"], &b["offloaded_bytes_by_group"]),
            (&serde_json::json!([]), &groups)
        );
        assert_eq!(
            a["peak_memory_bytes"].as_u64().unwrap() - b["peak_memory_bytes"].as_u64().unwrap(),
            in_flight * per_microbatch - on_device,
            "stage {r}"
        );
    }
    let slow = json_of(
        &cfg,
        &["--hardware", "h100-sxm,pcie-gb-s=1", offload[0], offload[1], offload[2], offload[3]],
    );
    let copy_ms = per_microbatch as f64 / 0.8e9 * 1e3;
    for r in [1, 2] {
        let stage = &slow["stages"][r];
        assert_eq!(stage["forward_ms"].as_f64(), Some(copy_ms), "stage {r}");
        assert_eq!(stage["backward_input_ms"].as_f64(), Some(copy_ms), "stage {r}");
        assert!(without["stages"][r]["forward_ms"].as_f64().unwrap() < copy_ms);
    }
    // Given op times hide the same copies: a forward of 1 ms takes the 17.88 ms copy, a
    // backward-input of 20 ms hides it.
    let given = ["--op-times", "forward=1,backward-input=20,backward-weight=1"];
    let given = json_of(
        &cfg,
        &[
            &["--hardware", "h100-sxm,pcie-gb-s=1", offload[0], offload[1], offload[2], offload[3]],
            &given[..],
        ]
        .concat(),
    );
    for r in [1, 2] {
        let stage = &given["stages"][r];
        assert_eq!(stage["forward_ms"].as_f64(), Some(copy_ms), "stage {r}");
        assert_eq!(stage["backward_input_ms"].as_f64(), Some(20.0), "stage {r}");
    }
    assert_user_error(
        &simulate(&cfg, &["--hardware", "h100-sxm,host-memory-gib=0.01", offload[0], offload[1], offload[2], offload[3]]),
        "error: command line: --fine-grained-activation-offloading true: stage 0 would keep 54.56 MiB of offloaded \
         activations in host memory, more than the 10.24 MiB per GPU of --hardware h100-sxm (its host-memory-gib)",
    );
}

/// GPT-3 175B planned at 50 GiB per GPU on `hardware`: the plan's text, its config lines,
/// and the report of the config with those lines pasted over it, which must fit.
fn planned_gpt3(dir: &str, hardware: &str) -> (String, serde_norway::Mapping, Value) {
    let dir = temp_dir(dir);
    let base = std::fs::read_to_string("configs/gpt3-175b.yaml").unwrap();
    let cfg = write_config(&dir, "gpt3.yaml", &base);
    let args = ["--hardware", hardware, "--memory-limit", "50GiB"];
    let plan = stdout(&simulate(&cfg, &[&["--plan"], &args[..]].concat()));
    let lines: serde_norway::Mapping = serde_norway::from_str(&plan).unwrap();
    let mut merged: serde_norway::Mapping = serde_norway::from_str(&base).unwrap();
    for (k, v) in lines.clone() {
        merged.insert(k, v);
    }
    let planned = write_config(&dir, "planned.yaml", &serde_norway::to_string(&merged).unwrap());
    let after = json_of(&planned, &args);
    assert_eq!(after["fits"], true, "{plan}\n{after}");
    (plan, lines, after)
}

/// A YAML value, for comparing a plan's lines.
fn yaml(text: &str) -> serde_norway::Value {
    serde_norway::from_str(text).unwrap()
}

/// Over PCIe Gen4 (32 GB/s) offloading every module of GPT-3 175B's blocks no longer hides
/// behind their compute, and full recompute costs a third more work. The planner finds the
/// pairing between them: selective recompute of the attention core with the other modules
/// offloaded, per stage (1F1B's early stages hold more microbatches, the last three need
/// the recompute alone). Its lines applied fit, at the planned time.
#[test]
fn plan_pairs_selective_recompute_with_offload_of_the_rest_where_pcie_is_slower() {
    let (plan, lines, after) = planned_gpt3("sim-plan-offload-mix", "h100-sxm,pcie-gb-s=32");
    assert!(
        plan.contains(
            "\n# 1f1b, v=1, micro batch 1, memory lever selective core_attn + offload of the rest N per stage \
             11,9,6,6,6,0,0,0: iteration 6.722 s"
        ),
        "{plan}"
    );
    assert!(
        plan.contains(
            "\n# memory levers: stage 0 selective core_attn + offload of the rest N=11 (peak 49.84 GiB, host 6.70 \
             GiB); stage 1 selective core_attn + offload of the rest N=9 (peak 48.88 GiB, host 4.80 GiB); stages \
             2-4 selective core_attn + offload of the rest N=6 (peak 49.81 GiB, host 2.74 GiB); stages 5-7 \
             selective core_attn (peak 49.02 GiB); against neither: none would take iteration 6.267 s and does \
             not fit; recompute: full/block N per stage 10,6,6,6,6,0,0,0 would take iteration 7.657 s\n"
        ),
        "{plan}"
    );
    assert_eq!(lines["recompute_granularity"], yaml("selective"));
    assert_eq!(lines["recompute_modules"], yaml("[core_attn]"));
    assert_eq!(
        lines["offload_modules"],
        yaml("[attn_norm, qkv_linear, attn_proj, mlp_norm, mlp_fc1, mlp_act, mlp_fc2]")
    );
    assert_eq!(lines["offload_num_layers_per_stage"], yaml("[11, 9, 6, 6, 6, 0, 0, 0]"));
    assert_eq!(after["iteration_time_ms"].as_f64().map(|t| t.round()), Some(6722.0));
}

/// With 6 GiB of host memory per GPU the early stages of GPT-3 175B (holding the most
/// microbatches) cannot offload enough: the plan recomputes there and offloads on the later
/// stages, faster than recomputing everywhere, and its lines applied fit at that time.
#[test]
fn plan_recomputes_where_the_host_is_full_and_offloads_elsewhere() {
    let (plan, lines, after) = planned_gpt3("sim-plan-block-or-offload", "h100-sxm,host-memory-gib=6");
    assert!(
        plan.contains(
            "\n# interleaved-1f1b, v=4, micro batch 1, memory lever full/block N per stage 3,2,2,2,0,0,0,0 or \
             offload N per stage 0,0,0,0,2,2,2,2: iteration 7.509 s"
        ),
        "{plan}"
    );
    assert!(
        plan.contains(
            "\n# memory levers: stage 0 full block N=3 (peak 48.16 GiB); stages 1-3 full block N=2 (peak 49.64 \
             GiB); stages 4-7 offload N=2 (peak 49.50 GiB, host 5.82 GiB); against neither: none would take \
             iteration 5.824 s and does not fit; recompute: full/block N per stage 3,2,2,2,2,2,2,2 would take \
             iteration 7.574 s\n"
        ),
        "{plan}"
    );
    assert_eq!(lines["recompute_num_layers_per_stage"], yaml("[3, 2, 2, 2, 0, 0, 0, 0]"));
    assert_eq!(lines["offload_num_layers_per_stage"], yaml("[0, 0, 0, 0, 2, 2, 2, 2]"));
    assert_eq!(after["iteration_time_ms"].as_f64().map(|t| t.round()), Some(7509.0));
}

/// Where the model is wide enough for PCIe to hide its copies, the planner offloads rather
/// than recompute, says why in its comment lines (each stage's lever and peaks, and what
/// recompute and neither would take), and its lines applied fit, with each stage's host
/// peak in the report.
#[test]
fn plan_offloads_where_the_copies_hide_and_says_why() {
    let (plan, lines, after) = planned_gpt3("sim-plan-offload", "h100-sxm");
    assert!(
        plan.contains(
            "\n# interleaved-1f1b, v=4, micro batch 1, memory lever offload N=3: iteration 5.824 s"
        ),
        "{plan}"
    );
    assert!(
        plan.contains(
            "\n# memory levers: stages 0-7 offload N=3 (peak 47.61 GiB, host 10.98 GiB); against neither: none \
             would take iteration 5.824 s and does not fit; recompute: full/block N per stage 3,2,2,2,2,2,2,2 would \
             take iteration 7.574 s\n"
        ),
        "{plan}"
    );
    assert_eq!(lines["fine_grained_activation_offloading"], true);
    assert_eq!(lines["offload_num_layers_per_stage"], yaml("[3, 3, 3, 3, 3, 3, 3, 3]"));
    assert_eq!(after["iteration_time_ms"].as_f64().map(|t| (t * 1e-3 * 1e3).round() / 1e3), Some(5.824));
    assert!(after["stages"].as_array().unwrap().iter().all(|s| s["host_peak_bytes"].as_u64().unwrap() > 0));
}
