//! `pipetrain train`: ranks (threads of this process, or MPI processes), each running the
//! training loop over its own pipeline stage.

mod launch;
mod loss_chart;
mod lr;
mod metrics;
pub mod model;
pub mod rank;
mod report;
mod shards;
pub mod summary;
mod timeline;
mod worker;

use crate::cli::TrainArgs;
use crate::config;

pub fn run(args: &TrainArgs, overrides: &[(String, String)]) -> anyhow::Result<()> {
    let cfg = config::load(&args.config, overrides).map_err(launch::quiet_unless_root)?;
    launch::run(args, cfg)
}
