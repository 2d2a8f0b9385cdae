//! Offloaded activations must fit the host. Before any rank starts, the memory model's host
//! peaks of the ranks this process runs are weighed against what the host has available, so
//! a run the kernel would kill mid-step for want of memory is one line and exit 2 instead.
//!
//! Under threads every rank is this process's: their peaks add up. Under a launcher each
//! process is one rank, and it checks the largest peak any rank keeps, which that rank's
//! host must hold at least (the ranks sharing a host are the launcher's to know).

use super::summary::human_bytes;
use crate::config::Config;
use crate::plan;

/// The offloaded bytes this process's ranks would keep at their peaks, if more than the
/// host has available: (those bytes, what is available).
pub fn shortfall(cfg: &Config, one_rank: bool) -> anyhow::Result<Option<(u64, u64)>> {
    let offloads = cfg.fine_grained_activation_offloading || cfg.cpu_offloading_activations;
    let Some(available) = offloads.then(available_bytes).flatten() else { return Ok(None) };
    let (_, schedule) = plan::lowered_schedule(cfg)?;
    let peaks = plan::predicted_activation_peaks(cfg, &schedule, true)?.host;
    let ranks_per_stage = (cfg.tensor_model_parallel_size * cfg.data_parallel()) as u64;
    let needed = match one_rank {
        true => peaks.iter().copied().max().unwrap_or(0),
        false => peaks.iter().sum::<u64>() * ranks_per_stage,
    };
    Ok((needed > available).then_some((needed, available)))
}

/// What is wrong with a [`shortfall`], for an error on the key that asked for the offload.
pub fn message((needed, available): (u64, u64)) -> String {
    format!(
        "the offloaded activations would take {} of host memory at their peak, more than the {} \
         this host has available (MemAvailable); offload fewer layers (offload_num_layers_per_stage) or modules",
        human_bytes(needed as usize),
        human_bytes(available as usize)
    )
}

/// MemAvailable of /proc/meminfo, in bytes; None where the file does not say.
fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}
