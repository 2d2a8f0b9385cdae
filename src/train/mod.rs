//! `pipetrain train`: ranks (threads of this process, or MPI processes), each running the
//! training loop over its own pipeline stage.

mod launch;
mod loss_chart;
mod lr;
#[cfg(test)]
mod memory_truth;
mod metrics;
mod non_finite;
mod peak;
pub mod rank;
mod report;
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
    let cfg = config::load(&args.config, overrides).map_err(launch::quiet_unless_root)?;
    if cfg.tensor_model_parallel_size > 1 {
        return Err(launch::quiet_unless_root(user_error(format!(
            "{}: key `tensor_model_parallel_size`: {}: the trainer runs 1; tensor parallelism is simulated only (pipetrain simulate)",
            args.config.display(),
            cfg.tensor_model_parallel_size
        ))));
    }
    let head_size = cfg.hidden_size / cfg.num_attention_heads;
    // bf16 activations have only the tensor-core attention kernels.
    if cfg.device == config::DeviceKind::Cuda
        && cfg.precision == config::Precision::Bf16
        && !kernels::attention_mma_fits(head_size)
    {
        return Err(launch::quiet_unless_root(user_error(format!(
            "{}: key `precision`: bf16 on cuda needs a head size (hidden_size / num_attention_heads) that is a multiple of {} up to {}, got {head_size}",
            args.config.display(),
            kernels::ATTENTION_MMA_K,
            kernels::ATTENTION_MMA_MAX_HEAD_SIZE
        ))));
    }
    launch::run(args, cfg)
}
