//! `pipetrain train`: ranks (threads of this process, or MPI processes), each running the
//! training loop over its own pipeline stage.

mod launch;
mod loss_chart;
mod lr;
#[cfg(test)]
mod memory_truth;
mod metrics;
pub mod model;
mod peak;
pub mod rank;
mod report;
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
    launch::run(args, cfg)
}
