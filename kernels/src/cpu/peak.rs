//! The matmul peak of a device: the FLOP/s that MFU is measured against.

use super::matmul::{gemm_strided, Strided};
use super::CpuDevice;
use std::time::{Duration, Instant};

/// Side of the square fp32 gemm that is timed: large enough to run at full speed on any
/// core count, small enough (3 x 16 MiB) to take well under a second a rep.
const SIZE: usize = 2048;
const MIN_REPS: usize = 3;
const MAX_REPS: usize = 10;
/// Timed reps stop once they have taken this long (after at least MIN_REPS).
const BUDGET: Duration = Duration::from_secs(1);

/// FLOP/s of a 2048³ fp32 gemm on the device's pool, threaded as the device's matmuls are:
/// one warm-up, then the best of 3 to 10 timed reps (about a second in all). The buffers
/// are not the model's memory and are left out of the device's ledger.
pub fn measure_matmul_peak(device: &CpuDevice) -> f64 {
    let a: Vec<f32> = (0..SIZE * SIZE).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
    let b: Vec<f32> = (0..SIZE * SIZE).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
    let mut c = vec![0.0f32; SIZE * SIZE];
    let par = device.gemm_parallelism();
    let mut run = || {
        let start = Instant::now();
        // SAFETY: three distinct SIZE x SIZE row-major buffers.
        unsafe {
            gemm_strided(
                (SIZE, SIZE, SIZE),
                Strided { ptr: c.as_mut_ptr(), rs: SIZE, cs: 1 },
                Strided { ptr: a.as_ptr(), rs: SIZE, cs: 1 },
                Strided { ptr: b.as_ptr(), rs: SIZE, cs: 1 },
                false,
                1.0,
                par,
            )
        };
        start.elapsed()
    };
    device.pool.install(|| {
        run();
        let (mut best, mut spent, mut reps) = (Duration::MAX, Duration::ZERO, 0);
        while reps < MIN_REPS || (reps < MAX_REPS && spent < BUDGET) {
            let took = run();
            best = best.min(took);
            spent += took;
            reps += 1;
        }
        2.0 * (SIZE as f64).powi(3) / best.as_secs_f64()
    })
}
