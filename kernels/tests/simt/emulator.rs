//! The emulator's own promises, on small kernels written to break them: a wrong program
//! must fail the harness, not pass by luck.

use crate::harness::{Family, Run};
use cudarc::driver::LaunchConfig;

fn blocks(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Runs `kernel(out)` of `code` over `cfg` on a buffer of `len` floats.
fn run(test: &str, code: &str, cfg: LaunchConfig, len: usize) -> Option<Result<Vec<f32>, String>> {
    let family = Family::custom(test, code, &["kernel"])?;
    let mut run = Run::new(1);
    let out = run.buffer(&vec![0.0f32; len]);
    run.launch("kernel", cfg, &[out.into()]);
    run.read(out);
    Some(family.run(run).map(|o| o.get(out)))
}

#[test]
fn shuffles_exchange_values_and_barriers_order_shared_memory() {
    // Each warp reverses its lanes' ids through shared memory, then sums them with a
    // butterfly of shuffles; thread 0 of each block adds the warps' sums.
    let code = r#"
extern "C" __global__ void kernel(float* out) {
    __shared__ float ids[256];
    __shared__ float sums[8];
    ids[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    float v = ids[blockDim.x - 1 - threadIdx.x] * (blockIdx.x + 1);
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = v;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < 8; ++w) total += sums[w];
        out[blockIdx.x * blockDim.x] = total;
    }
}
"#;
    let Some(got) = run("shuffles_exchange_values", code, blocks(3, 256), 3 * 256) else { return };
    let got = got.unwrap();
    for b in 0..3 {
        let scale = (b + 1) as f32;
        assert_eq!(got[b * 256], 255.0 * 256.0 / 2.0 * scale, "block {b}: the sum of all 256 ids");
        for t in 1..256 {
            // A warp's lanes hold ids 255 - t of one aligned group of 32: the group's sum.
            let group = (255 - t) / 32 * 32;
            assert_eq!(got[b * 256 + t], (group * 32 + 496) as f32 * scale, "block {b}, thread {t}");
        }
    }
}

#[test]
fn a_barrier_some_threads_skip_is_an_error() {
    let code = r#"
extern "C" __global__ void kernel(float* out) {
    if (threadIdx.x >= 64) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
"#;
    let Some(got) = run("a_barrier_some_threads_skip_is_an_error", code, blocks(1, 128), 128) else { return };
    let err = got.expect_err("a barrier half the block never reaches");
    assert!(err.contains("some threads of the block never reach"), "{err}");
}

#[test]
fn a_shuffle_some_lanes_skip_is_an_error() {
    let code = r#"
extern "C" __global__ void kernel(float* out) {
    float v = 1.0f;
    if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
"#;
    let Some(got) = run("a_shuffle_some_lanes_skip_is_an_error", code, blocks(1, 64), 64) else { return };
    let err = got.expect_err("a full-warp shuffle half the lanes skip");
    assert!(err.contains("only 16 of the warp's 32 lanes reach"), "{err}");
}

#[test]
fn a_race_on_shared_memory_is_reported() {
    // Warp 1 reads what warp 0 writes, with no barrier between.
    let code = r#"
extern "C" __global__ void kernel(float* out) {
    __shared__ float x[64];
    x[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = x[(threadIdx.x + 32) % 64];
}
"#;
    let Some(got) = run("a_race_on_shared_memory_is_reported", code, blocks(1, 64), 64) else { return };
    let err = got.expect_err("a read of another warp's write without a barrier");
    assert!(err.contains("depends on the order of the warps"), "{err}");
}

#[test]
fn a_write_past_the_end_of_a_buffer_faults() {
    let code = r#"
extern "C" __global__ void kernel(float* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
"#;
    // 1000 floats, and a grid of 1024 threads with no bounds check.
    let Some(got) = run("a_write_past_the_end_of_a_buffer_faults", code, blocks(4, 256), 1000) else {
        return;
    };
    let err = got.expect_err("a write past the end");
    assert!(err.contains("signal: 11"), "{err}");
}
