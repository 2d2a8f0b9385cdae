//! What a launcher (`mpirun`, Slurm's `srun`) tells a process and does to it: the world it
//! announced in the environment, the GPU it gives the process, and the signals it sends.

use crate::error::{is_user_error, Quiet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Set by Ctrl-C or SIGTERM: the run stops at the next step boundary, with a checkpoint.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Milliseconds the last training step took on this process.
static LAST_STEP_MS: AtomicU64 = AtomicU64::new(0);

/// Records how long a step took, for the grace a signalled rank gets.
pub fn note_step(seconds: f64) {
    LAST_STEP_MS.store((seconds * 1e3) as u64, Ordering::Relaxed);
}

/// What a signal does. Without a launcher: stop at the next step boundary and save, however
/// long the step takes. Under a launcher the same, but a launcher sends the same SIGTERM
/// when it ends a job because a rank died, and then the survivors wait on a peer that will
/// never answer: a rank that has not stopped within 5 s plus two steps exits on its own.
pub fn on_signal() {
    STOP.store(true, Ordering::SeqCst);
    if launched().is_some_and(|(world, _)| world > 1) {
        let grace = Duration::from_millis(5000 + 2 * LAST_STEP_MS.load(Ordering::Relaxed));
        std::thread::sleep(grace);
        crate::error::print_line(&format!(
            "stopped by a signal; no step boundary within {grace:?} (a peer is gone)"
        ));
        std::process::exit(143);
    }
}

/// What a launcher announced in the environment: (world size, this process's rank).
pub fn launched() -> Option<(usize, usize)> {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    [
        ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
        ("PMI_SIZE", "PMI_RANK"),
        ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
    ]
    .iter()
    .find_map(|(size, rank)| Some((var(size)?, var(rank)?)))
}

/// Under a launcher, only rank 0 reports a mistake every rank makes alike.
pub fn quiet_unless_root(e: anyhow::Error) -> anyhow::Error {
    match launched() {
        Some((world, rank)) if world > 1 && rank != 0 && is_user_error(&e) => anyhow::Error::new(Quiet(2)),
        _ => e,
    }
}

/// The GPU of this process: its rank on this machine, as the launcher numbers them, modulo
/// the GPUs there are (more ranks than GPUs share them, through the MPI transport).
#[cfg(feature = "cuda")]
pub fn local_gpu() -> usize {
    let local: usize = ["OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .unwrap_or(0);
    local % kernels::cuda::gpu_count().max(1)
}
