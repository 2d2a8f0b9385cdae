//! `pipetrain simulate`: predicted time and memory per stage for a config's schedule and
//! recompute plan, from the very action lists the trainer executes.
//!
//! setup.rs (config to schedule, split and policies), durations.rs / measured.rs /
//! hardware.rs (op times), memory.rs (bytes per stage), korthikanti.rs (the published
//! per-layer bytes, for comparison), input.rs (the schedule simulator's input), report.rs,
//! timeline.rs (Chrome trace), svg.rs (chart), sweep.rs (sweep and plan).

mod cluster;
mod durations;
mod hardware;
mod input;
mod korthikanti;
mod lever;
mod measured;
mod memory;
mod report;
mod setup;
mod svg;
mod sweep;
mod timeline;
mod units;

pub use hardware::{gpu_peak_flops, gpu_profile, profile_peak_flops};

use crate::config::{Config, DeviceKind};
use crate::error::user_error;
use clap::Args;
use durations::GivenTimes;
use hardware::Hardware;
use report::Report;
use setup::Setup;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// The run config (YAML, Megatron-LM key names).
    #[arg(long)]
    pub config: PathBuf,
    /// Hardware profile for op times, MFU and the default memory limit: a100-80gb, h100-sxm,
    /// h200 or cpu-measured [default: h100-sxm with device cuda, cpu-measured with cpu];
    /// figures may follow, e.g. a100-80gb,efficiency=0.65,network-gb-s=12.5 (peak-tflops,
    /// efficiency, hbm-tb-s, nvlink-gb-s, network-gb-s, gpus-per-node, memory-gib).
    #[arg(long, value_name = "NAME[,FIGURE=VALUE..]")]
    pub hardware: Option<String>,
    /// Op times given directly, in ms per stage and microbatch, instead of the hardware model,
    /// e.g. forward=18.5,backward-input=18.1,backward-weight=9.3,p2p=0.6; optionally
    /// optimizer=MS, each stage's time after its list (exchange, grad norm, AdamW), and
    /// dp-allreduce=MS, its gradient all-reduce across data-parallel replicas (else modelled).
    /// backward-weight, recompute, p2p, optimizer and dp-allreduce may be 0 (free)
    #[arg(long, value_name = "OP=MS,..")]
    pub op_times: Option<String>,
    /// Op times calibrated from a `pipetrain train --trace` Chrome trace: medians per stage,
    /// chunk and op over its last step, and each stage's optimizer phase in it.
    #[arg(long, value_name = "TRACE.json")]
    pub measured: Option<PathBuf>,
    /// Device memory per stage, e.g. 80GiB or 40GB [default: the hardware's memory].
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Write the simulated timeline as a Chrome trace (opens in Perfetto).
    #[arg(long, value_name = "OUT.json")]
    pub trace: Option<PathBuf>,
    /// Write the pipeline chart (one row per stage) as SVG.
    #[arg(long, value_name = "OUT.svg")]
    pub svg: Option<PathBuf>,
    /// Print the report as one JSON object; with --sweep the candidates, with --plan those the
    /// planner simulated (the plan is the first that fits).
    #[arg(long)]
    pub json: bool,
    /// Print the lowered schedule, the per-stage action lists the trainer runs, and stop.
    #[arg(long)]
    pub print_schedule: bool,
    /// Rank every schedule x recompute setting x micro batch size by iteration time.
    #[arg(long)]
    pub sweep: bool,
    /// Print the fastest sweep candidate that fits the memory limit, as config lines, and
    /// the runners-up.
    #[arg(long)]
    pub plan: bool,
    /// With --plan or --sweep: search the layout over N GPUs too, tensor x pipeline x data
    /// parallel sizes (t within a node, sequence parallelism with t > 1).
    #[arg(long, value_name = "N")]
    pub gpus: Option<usize>,
    /// Show only the first N rows of the sweep.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
}

/// Flags that cannot go together, as one line.
fn check_flags(args: &SimulateArgs) -> anyhow::Result<()> {
    let given_times = if args.op_times.is_some() {
        Some("--op-times")
    } else {
        args.measured.as_ref().map(|_| "--measured")
    };
    if args.op_times.is_some() && args.measured.is_some() {
        return Err(user_error("command line: --op-times and --measured: give the op times one way"));
    }
    if args.sweep || args.plan {
        let mode = if args.plan { "--plan" } else { "--sweep" };
        if let Some(flag) = given_times {
            return Err(user_error(format!(
                "command line: {flag} with {mode}: given times fit one configuration; the sweep times each from the hardware model"
            )));
        }
        if args.trace.is_some() || args.svg.is_some() || args.print_schedule {
            return Err(user_error(format!(
                "command line: {mode}: --trace, --svg and --print-schedule show one simulation"
            )));
        }
    }
    match args.top {
        Some(_) if !args.sweep => return Err(user_error("command line: --top applies to --sweep")),
        Some(0) => return Err(user_error("command line: --top 0: give 1 or more rows")),
        _ => {}
    }
    match args.gpus {
        Some(_) if !(args.sweep || args.plan) => {
            return Err(user_error("command line: --gpus applies to --plan and --sweep"))
        }
        Some(0) => return Err(user_error("command line: --gpus 0: give at least 1 GPU")),
        _ => {}
    }
    Ok(())
}

/// A stage whose offloaded activations need more host memory than the host holds per GPU is
/// a user error, as no run of it could start.
fn check_host_memory(cfg: &Config, sim: &schedules::SimReport, hw: &Hardware) -> anyhow::Result<()> {
    let peaks = sim.stages.iter().map(|s| s.peak_host);
    if let (Some(limit), Some((stage, peak))) =
        (hw.host_memory_bytes, peaks.enumerate().max_by_key(|&(_, b)| b))
    {
        if peak > limit {
            return Err(cfg.key_error(
                cfg.offload_key(),
                format!(
                    "stage {stage} would keep {} of offloaded activations in host memory, more than the {} per \
                     GPU of --hardware {} (its host-memory-gib); offload fewer layers (offload_num_layers_per_stage)",
                    units::format_bytes(peak),
                    units::format_bytes(limit),
                    hw.name
                ),
            ));
        }
    }
    Ok(())
}

pub fn run(args: &SimulateArgs, overrides: &[(String, String)]) -> anyhow::Result<()> {
    check_flags(args)?;
    let cfg = crate::config::load(&args.config, overrides)?;
    let given = args.op_times.as_deref().map(GivenTimes::parse).transpose()?;
    let explicit_limit =
        args.memory_limit.as_deref().map(|s| units::parse_bytes("--memory-limit", s)).transpose()?;
    let hardware_name = args.hardware.as_deref().unwrap_or(if cfg.device == DeviceKind::Cuda {
        "h100-sxm"
    } else {
        "cpu-measured"
    });

    if args.sweep || args.plan {
        let hw = Hardware::lookup(hardware_name, cfg.precision)?;
        let limit = explicit_limit.or(hw.memory_bytes);
        let layouts = match args.gpus {
            Some(n) => cluster::layouts(&cfg, n, hw.gpus_per_node),
            None => vec![cfg.clone()],
        };
        if layouts.is_empty() {
            return Err(user_error(format!(
                "command line: --gpus {}: no tensor x pipeline x data parallel layout fits the model and global batch",
                args.gpus.unwrap_or(0)
            )));
        }
        let search = if args.plan {
            sweep::Search::Plan { fitting: 1 + RUNNERS_UP }
        } else {
            sweep::Search::Everything
        };
        let outcomes = sweep::sweep(&layouts, &hw, limit, search);
        if args.plan {
            let plan = sweep::plan_yaml(&outcomes, &cfg, limit, RUNNERS_UP)
                .ok_or_else(|| no_plan(&outcomes, limit))?;
            if args.json {
                println!("{}", sweep::json(&outcomes, limit));
            } else {
                print!("{plan}");
            }
        } else if args.json {
            println!("{}", sweep::json(&outcomes, limit));
        } else {
            sweep::print(&outcomes, limit, args.top);
        }
        return Ok(());
    }

    let setup = Setup::new(&cfg)?;
    if args.print_schedule {
        print!("{}", setup.schedule()?);
        return Ok(());
    }
    let hw = Hardware::lookup(hardware_name, cfg.precision)?;
    let (durations, times_from) = match (&given, &args.measured) {
        (Some(g), _) => (g.durations(&setup, &hw)?, "op-times"),
        (None, Some(trace)) => (measured::durations(trace, &setup, &hw)?, "measured"),
        (None, None) => (durations::from_hardware(&setup, &hw), "hardware"),
    };
    let sim = input::run(&setup, &durations)?;
    let memory_limit = explicit_limit.or(hw.memory_bytes);
    check_host_memory(&cfg, &sim, &hw)?;
    let report =
        Report { setup: &setup, hw: &hw, durations: &durations, sim: &sim, times_from, memory_limit };
    if let Some(path) = &args.trace {
        timeline::write(path, &setup, &sim)?;
    }
    if let Some(path) = &args.svg {
        svg::write(path, &setup, &sim)?;
    }
    if args.json {
        println!("{}", report.json());
    } else {
        println!("pipetrain simulate: {}", args.config.display());
        report.print();
    }
    Ok(())
}

/// Each stage's whole peak (static, activations, working and transfer bytes) for `cfg`'s
/// schedule, every pass taking the same time and messages none: what the trainer's ledger
/// must measure, from the same memory model `simulate` reports.
pub fn predicted_stage_peaks(cfg: &Config) -> anyhow::Result<Vec<u64>> {
    let setup = Setup::new(cfg)?;
    let unit = durations::OpTimes { forward: 1.0, backward_input: 1.0, backward_weight: 1.0, recompute: 0.0 };
    let durations = durations::Durations {
        chunks: vec![unit; setup.p * setup.v],
        p2p: durations::P2p::PerMessage(0.0),
        optimizer: vec![1.0; setup.p],
    };
    Ok(input::run(&setup, &durations)?.stages.iter().map(|s| s.peak_memory).collect())
}

/// Plans printed after the best.
const RUNNERS_UP: usize = 5;

/// Why there is no plan, in one line.
fn no_plan(outcomes: &[sweep::Outcome], limit: Option<u64>) -> anyhow::Error {
    let limit = limit.map_or("the limit".into(), units::format_bytes);
    match outcomes.iter().min_by_key(|o| o.max_peak()) {
        Some(o) => user_error(format!(
            "command line: --plan: nothing fits {limit} per device; the least memory is {} (t={}, p={}, dp={}, {}, v={}, micro batch {}, memory lever {})",
            units::format_bytes(o.max_peak()),
            o.cfg.tensor_model_parallel_size,
            o.cfg.pipeline_model_parallel_size,
            o.cfg.data_parallel(),
            o.kind,
            o.v,
            o.micro_batch_size,
            o.lever.describe()
        )),
        None => user_error(format!(
            "command line: --plan: no schedule suits this config's shape, or its parameters and optimizer state alone exceed {limit} per device"
        )),
    }
}
