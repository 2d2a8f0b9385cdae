//! The emulated tensor-core product of kernels/cuda/mma.cuh against a plain matrix
//! product: one warp computes d = a * b + c from fragments laid out as the PTX ISA lays
//! out m16n8k16's (kernels/tests/mma_layout.cu), so a wrong lane or register in the
//! emulation, or in that file's reading of the layouts, fails here. cuda_ops.rs runs the
//! same kernel on the GPU's tensor cores against the same product.

use crate::harness::{bitwise, Family, Rng, Run};
use cudarc::driver::LaunchConfig;

/// Multiples of 1/8 up to 2 in magnitude: exact in bf16, their products exact in fp32, and
/// every sum of 16 of them (and c) exact too, so the product is compared bit for bit.
fn eighths(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.uniform(n, 2.0).iter().map(|x| (x * 8.0).round() / 8.0).collect()
}

#[test]
fn emulated_mma_is_a_matrix_product() {
    let code = include_str!("../mma_layout.cu");
    let Some(family) = Family::custom("emulated_mma_is_a_matrix_product", code, &["mma_layout"]) else {
        return;
    };
    let mut rng = Rng::new(41);
    for seed in 0..3 {
        let (a, b, c) = (eighths(&mut rng, 16 * 16), eighths(&mut rng, 16 * 8), eighths(&mut rng, 16 * 8));
        let want: Vec<f32> = (0..16 * 8)
            .map(|e| {
                let (m, n) = (e / 8, e % 8);
                c[e] + (0..16).map(|k| a[m * 16 + k] * b[k * 8 + n]).sum::<f32>()
            })
            .collect();
        let mut run = Run::new(seed);
        let d = run.buffer(&vec![f32::NAN; 16 * 8]);
        let (a, b, c) = (run.buffer(&a), run.buffer(&b), run.buffer(&c));
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        run.launch("mma_layout", cfg, &[d.into(), a.into(), b.into(), c.into()]);
        run.read(d);
        bitwise("emulated mma", &family.run(run).unwrap().get(d), &want).unwrap();
    }
}
