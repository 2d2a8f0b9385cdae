//! The emulated tensor-core product of kernels/cuda/mma.cuh against a plain matrix
//! product: one warp computes d = a * b + c from fragments laid out as the PTX ISA lays
//! out m16n8k16's (kernels/tests/mma_layout.cu), so a wrong lane or register in the
//! emulation, or in that file's reading of the layouts, fails here. cuda_ops.rs runs the
//! same kernel on the GPU's tensor cores against the same product. The same holds for the
//! B fragments that load_b_pair takes with one ldmatrix (kernels/tests/ldmatrix_layout.cu).

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

/// What ldmatrix_layout.cu must write for the 16 x 16 words `x` (row-major, each two bf16,
/// the lower column in the low half), in the PTX ISA's B layout: each lane's fragments of
/// rows [0, 8) and [8, 16) at k steps 0 and 1 (load_b_pair), then of columns [16 c, 16 c + 8)
/// and [16 c + 8, 16 c + 16) down rows [0, 16) for c = 0, 1 (load_bt_pair).
fn ldmatrix_fragments(x: &[u32]) -> Vec<u32> {
    let bf16 = |row: usize, col: usize| x[row * 16 + col / 2] >> (16 * (col % 2)) & 0xffff;
    let mut out = Vec::new();
    for kk in 0..2 {
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            out.extend([g, g + 8].into_iter().flat_map(|row| [0, 4].map(|w| x[row * 16 + 8 * kk + w + t])));
        }
    }
    for c in 0..2 {
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for col in [16 * c + g, 16 * c + 8 + g] {
                out.extend([2 * t, 2 * t + 8].map(|k| bf16(k, col) | bf16(k + 1, col) << 16));
            }
        }
    }
    out
}

#[test]
fn emulated_ldmatrix_gives_the_b_fragments() {
    let code = include_str!("../ldmatrix_layout.cu");
    let Some(family) = Family::custom("emulated_ldmatrix_gives_the_b_fragments", code, &["ldmatrix_layout"])
    else {
        return;
    };
    // Words whose halves all differ.
    let x: Vec<u32> = (1..=256u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let mut run = Run::new(0);
    let out = run.buffer(&vec![0u32; 4 * 32 * 4]);
    let input = run.buffer(&x);
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    run.launch("ldmatrix_layout", cfg, &[out.into(), input.into()]);
    run.read(out);
    assert_eq!(family.run(run).unwrap().get::<u32>(out), ldmatrix_fragments(&x));
}
