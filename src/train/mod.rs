//! `pipetrain train`: ranks (threads of this process, or MPI processes), each running the
//! training loop over its own pipeline stage.

mod host_memory;
mod launch;
mod launcher;
mod loss_chart;
mod lr;
#[cfg(test)]
mod memory_truth;
mod metrics;
mod non_finite;
mod peak;
pub mod rank;
mod report;
mod resume_changes;
mod run_lock;
mod shards;
pub mod summary;
#[cfg(test)]
mod sync_count;
mod timeline;
mod worker;

pub use report::mean_loss;

use crate::cli::TrainArgs;
use crate::config;
use crate::error::user_error;

pub fn run(args: &TrainArgs, overrides: &[(String, String)]) -> anyhow::Result<()> {
    if let Some(peak) = args.peak_flops.filter(|p| !(p.is_finite() && *p > 0.0)) {
        let why = format!("command line: --peak-flops {peak}: must be a number of FLOP/s > 0");
        return Err(launcher::quiet_unless_root(user_error(why)));
    }
    if let Some(trace) = &args.trace {
        crate::trace::check_trace_path(trace).map_err(launcher::quiet_unless_root)?;
    }
    let cfg = config::load(&args.config, overrides).map_err(launcher::quiet_unless_root)?;
    tensor_parallel_runs(&cfg).map_err(|(key, msg)| launcher::quiet_unless_root(cfg.key_error(key, msg)))?;
    // bf16 activations have only the tensor-core attention kernels.
    if cfg.device == config::DeviceKind::Cuda && cfg.precision == config::Precision::Bf16 {
        if let Err(need) = cfg.tensor_core_head_size() {
            return Err(launcher::quiet_unless_root(
                cfg.key_error("precision", format!("bf16 on cuda needs {need}")),
            ));
        }
    }
    let one_rank = launcher::launched().is_some_and(|(world, _)| world > 1);
    if let Some(short) = host_memory::shortfall(&cfg, one_rank)? {
        return Err(launcher::quiet_unless_root(
            cfg.key_error(cfg.offload_key(), host_memory::message(short)),
        ));
    }
    launch::run(args, cfg)
}

/// What the trainer's tensor parallelism does not run yet, beyond the divisibility rules
/// the config and `simulate` share: the vocabulary must split evenly (no padding).
fn tensor_parallel_runs(cfg: &config::Config) -> Result<(), (&'static str, String)> {
    let t = cfg.tensor_model_parallel_size;
    if !cfg.vocab_size.is_multiple_of(t) {
        return Err((
            "vocab_size",
            format!("{}: tensor_model_parallel_size {t} does not divide it", cfg.vocab_size),
        ));
    }
    Ok(())
}
