//! RMSNorm (rmsnorm.cu) forward and backward, replaying the launches of the CUDA op
//! (kernels/src/cuda/rowwise.rs) and comparing with the CPU op, in both storages: in bf16
//! from inputs rounded to bf16, against the CPU's op on those rounded values.

use crate::harness::{close, max_abs, Family, Rng, Run, Storage, Tolerance};
use crate::rowwise::add_partials;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_column_chunk, per_row_warp, ROWS_PER_CHUNK};
use kernels::{Category, Device};

/// Llama-3-8B's width and its RMSNorm epsilon (`rms_norm_eps`).
const C: usize = 4096;
const EPS: f32 = 1e-5;
/// Rows of its B * T (8192 per sequence): two full chunks of the weight gradient's column
/// sums and a partial one, and a block of warps that ends inside the grid. All 8192 would
/// take minutes to emulate; every row is the same code on its own warp.
const N: usize = 2 * ROWS_PER_CHUNK + 5;

/// RMSNorm forward and backward at (n, c) with `eps`, input, output, dout and dinp in
/// `storage` (rstd and the weight gradient f32); Err on the first difference from the CPU.
pub fn rmsnorm(
    family: &Family,
    bias_family: &Family,
    storage: Storage,
    n: usize,
    c: usize,
    eps: f32,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let inp = storage.round(rng.uniform(n * c, 2.0));
    let (w, dout, dw0) = (rng.uniform(c, 1.0), storage.round(rng.uniform(n * c, 1.0)), rng.uniform(c, 1.0));
    let (ni, ci) = (n as i32, c as i32);

    let mut run = Run::new(seed);
    let (gi, gw, gd) = (storage.buffer(&mut run, &inp), run.buffer(&w), storage.buffer(&mut run, &dout));
    let (out, rstd) = (storage.output(&mut run, n * c), run.buffer(&vec![f32::NAN; n]));
    run.launch(
        storage.kernel("rmsnorm_forward"),
        per_row_warp(n),
        &[out.into(), rstd.into(), gi.into(), gw.into(), ni.into(), ci.into(), eps.into()],
    );
    let dinp = storage.output(&mut run, n * c);
    run.launch(
        storage.kernel("rmsnorm_backward_input"),
        per_row_warp(n),
        &[dinp.into(), gd.into(), gi.into(), gw.into(), rstd.into(), ni.into(), ci.into()],
    );
    let (cfg, chunks) = per_column_chunk(n, c);
    let pw = run.buffer(&vec![f32::NAN; chunks * c]);
    run.launch(
        storage.kernel("rmsnorm_backward_weight_partial"),
        cfg,
        &[pw.into(), gd.into(), gi.into(), rstd.into(), ni.into(), ci.into(), (ROWS_PER_CHUNK as i32).into()],
    );
    for buf in [out, rstd, dinp, pw] {
        run.read(buf);
    }
    let got = family.run(run)?;

    // Stage two is bias.cu's `add_partials`, from the f32 partial sums: one kernel for both
    // storages.
    let mut run = Run::new(seed + 1);
    let (pw, dw) = (run.buffer(&got.get::<f32>(pw)), run.buffer(&dw0));
    add_partials(&mut run, dw, pw, chunks, c);
    run.read(dw);
    let dweight = bias_family.run(run)?.get::<f32>(dw);

    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let (ti, tw) = (put(&inp, &[n, c]), put(&w, &[c]));
    let (mut tout, mut trstd) =
        (dev.zeros(&[n, c], Category::Workspace), dev.zeros(&[n], Category::Workspace));
    dev.rmsnorm_forward(&mut tout, &mut trstd, &ti, &tw, eps);
    let (mut tdinp, mut tdw) = (dev.zeros(&[n, c], Category::Workspace), put(&dw0, &[c]));
    dev.rmsnorm_backward(&mut tdinp, &mut tdw, &put(&dout, &[n, c]), &ti, &tw, &trstd);
    let what = |part: &str| format!("rmsnorm {part} at N = {n}, C = {c} in {storage}");
    // rstd and out = w * (x * rstd) are products of one sum of squares (no cancellation):
    // elementwise. dinp and dweight cancel terms of either sign: judged against the largest
    // magnitude (as in the GPU tests).
    close(&what("rstd"), &got.get(rstd), &dev.to_host(&trstd), 1e-5, 0.0)?;
    let elementwise = Tolerance::Close { rtol: 1e-5, floor: 0.0 };
    storage.check(&what("out"), &storage.read(&got, out), &dev.to_host(&tout), elementwise)?;
    let want = dev.to_host(&tdinp);
    let largest = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) };
    storage.check(&what("dinp"), &storage.read(&got, dinp), &want, largest)?;
    let want = dev.to_host(&tdw);
    close(&what("dweight"), &dweight, &want, 1e-5, max_abs(&want))
}

#[test]
fn rmsnorm_matches_the_cpu_in_f32_and_bf16() {
    let test = "rmsnorm_matches_the_cpu_in_f32_and_bf16";
    let (Some(family), Some(bias)) = (Family::of(test, "rmsnorm.cu"), Family::of(test, "bias.cu")) else {
        return;
    };
    for storage in Storage::BOTH {
        rmsnorm(&family, &bias, storage, N, C, EPS, 21).unwrap();
        // C not a multiple of 32, rows that end inside a block and a chunk; an epsilon large
        // beside mean(x^2) (about 1.3), so one the kernel did not add would fail rstd.
        rmsnorm(&family, &bias, storage, 37, 100, 0.5, 22).unwrap();
    }
}
