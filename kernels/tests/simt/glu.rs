//! The gated linear units, SwiGLU and GeGLU, forward and backward, launched as the CUDA
//! backend launches them (one thread per output), against the CPU's op, in f32 and in bf16
//! from inputs rounded to bf16.

use crate::harness::{max_abs, Family, Rng, Run, Storage, Tolerance};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::per_pack;
use kernels::{Category, Device, Gate};

/// The CPU's out [N,F] and dinp [N,2F] from inp [N,2F] and dout [N,F].
fn cpu_glu(n: usize, f: usize, inp: &[f32], dout: &[f32], gate: Gate) -> (Vec<f32>, Vec<f32>) {
    let dev = CpuDevice::new(2);
    let tin = dev.from_host(inp, &[n, 2 * f], Category::Workspace);
    let mut out = dev.zeros(&[n, f], Category::Workspace);
    dev.glu_forward(&mut out, &tin, gate);
    let mut dinp = dev.zeros(&[n, 2 * f], Category::Workspace);
    dev.glu_backward(&mut dinp, &tin, &dev.from_host(dout, &[n, f], Category::Workspace), gate);
    (dev.to_host(&out), dev.to_host(&dinp))
}

/// The gate halves (da) and up halves (db) of the rows of dinp [N,2F].
fn halves(dinp: &[f32], f: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = dinp.chunks_exact(2 * f);
    (rows.clone().flat_map(|r| &r[..f]).copied().collect(), rows.flat_map(|r| &r[f..]).copied().collect())
}

#[test]
fn swiglu_and_geglu_match_the_cpu_in_f32_and_bf16() {
    let Some(family) = Family::of("swiglu_and_geglu_match_the_cpu_in_f32_and_bf16", "glu.cu") else { return };
    // Llama-3-8B's MLP, F = 14336, over 64 of its B * T rows (Gemma 7B's is 24576); and an
    // odd F over 7 rows.
    for (storage, gate) in Storage::BOTH.into_iter().flat_map(|s| [(s, Gate::Silu), (s, Gate::GeluTanh)]) {
        let mut rng = Rng::new(12);
        for (n, f) in [(64, 14_336), (7, 37)] {
            let mut inp = rng.uniform(n * 2 * f, 12.0);
            for row in inp.chunks_exact_mut(2 * f) {
                // Gates far in both tails: the GPU's sigmoid saturates to 0 and 1 there.
                (row[0], row[1]) = (-95.0, 89.0);
            }
            let (inp, dout) = (storage.round(inp), storage.round(rng.uniform(n * f, 1.0)));
            let mut run = Run::new((n * f) as u64);
            let (gin, gd) = (storage.buffer(&mut run, &inp), storage.buffer(&mut run, &dout));
            let (out, dinp) = (storage.output(&mut run, n * f), storage.output(&mut run, n * 2 * f));
            let (items, cols) = ((n * f) as u64, f as u64);
            // The kernels by name, and the device's choice of them for the gate.
            let (forward, backward) = match gate {
                Gate::Silu => (storage.kernel("swiglu_forward"), storage.kernel("swiglu_backward")),
                Gate::GeluTanh => (storage.kernel("geglu_forward"), storage.kernel("geglu_backward")),
            };
            assert_eq!(
                (storage.kernel(gate.kernels().0), storage.kernel(gate.kernels().1)),
                (forward, backward)
            );
            run.launch(
                forward,
                per_pack(n * f, storage.dtype()),
                &[out.into(), gin.into(), items.into(), cols.into()],
            );
            run.launch(
                backward,
                per_pack(n * f, storage.dtype()),
                &[dinp.into(), gin.into(), gd.into(), items.into(), cols.into()],
            );
            run.read(out);
            run.read(dinp);
            let got = family.run(run).unwrap();
            let (want_out, want_dinp) = cpu_glu(n, f, &inp, &dout, gate);
            let what = |part: &str| format!("{gate:?} {part} in {storage}, F = {f}");
            // The sigmoid's exp is expf on the GPU, the CPU's polynomial on the CPU: a few ulp.
            // Far in the negative tail the GPU's sigmoid is 0 where the CPU's exp stops at
            // e^-87.3: outputs below 1e-30 are judged against 1e-30.
            let tail = Tolerance::Close { rtol: 1e-5, floor: 1e-30 };
            storage.check(&what("out"), &storage.read(&got, out), &want_out, tail).unwrap();
            let (da, db) = halves(&storage.read(&got, dinp), f);
            let (want_da, want_db) = halves(&want_dinp, f);
            // silu'(a) crosses zero near a = -1.28 and gelu'(a) near -0.75, where their terms
            // cancel: there da is judged against the largest da.
            let cancelling = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want_da) };
            storage.check(&what("d gate"), &da, &want_da, cancelling).unwrap();
            storage.check(&what("d up"), &db, &want_db, tail).unwrap();
        }
    }
}
