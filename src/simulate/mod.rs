//! `pipetrain simulate`: predicted time and memory per stage for a config's schedule and
//! recompute plan.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// The run config (YAML, Megatron-LM key names).
    #[arg(long)]
    pub config: PathBuf,
}

pub fn run(_args: &SimulateArgs, _overrides: &[(String, String)]) -> anyhow::Result<()> {
    Err(crate::error::user_error("simulate: not built yet"))
}
