//! The elementwise kernels: residual add and accumulation, GELU, dropout and AdamW. Each
//! kernel with a bf16-storage twin runs in both storages, at a length whose last 128-bit
//! pack is partial where the kernel moves packs, the same test for each: in bf16
//! from inputs rounded to bf16, against the CPU's op on those rounded values.

use crate::harness::{bitwise, close, max_abs, Arg, Buf, Family, Rng, Run, Storage, Tolerance};
use crate::philox::dropout_mask;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::per_pack;
use kernels::{AdamWStep, Category, DType, Device, DropoutKey, DropoutSite, DropoutSpec};

/// GPT-2 124M: B * T * C, the residual stream, and B * T * 4C, the MLP's hidden layer.
const RESIDUAL: usize = 4 * 1024 * 768;
const HIDDEN: usize = 4 * RESIDUAL;

fn cpu() -> CpuDevice {
    CpuDevice::new(2)
}

/// In f32 the CPU's sums bit for bit; in bf16, from the rounded inputs, the CPU's sums
/// rounded once.
#[test]
fn add_and_accumulate_are_exact_in_f32_and_bf16() {
    let Some(family) = Family::of("add_and_accumulate_are_exact_in_f32_and_bf16", "elementwise.cu") else {
        return;
    };
    for storage in Storage::BOTH {
        let mut rng = Rng::new(1);
        // The residual stream, and a length whose last pack is partial in both storages (4
        // f32 or 8 bf16 to a pack).
        for n in [RESIDUAL, 1001] {
            let (a, b) = (storage.round(rng.uniform(n, 2.0)), storage.round(rng.uniform(n, 2.0)));
            let mut run = Run::new(n as u64);
            let (ga, gb, out) =
                (storage.buffer(&mut run, &a), storage.buffer(&mut run, &b), storage.output(&mut run, n));
            run.launch(
                storage.kernel("add"),
                per_pack(n, storage.dtype()),
                &[out.into(), ga.into(), gb.into(), (n as u64).into()],
            );
            run.launch(
                storage.kernel("accumulate"),
                per_pack(n, storage.dtype()),
                &[ga.into(), out.into(), (n as u64).into()],
            );
            run.read(out);
            run.read(ga);
            let got = family.run(run).unwrap();
            let dev = cpu();
            let put = |x: &[f32]| dev.from_host(x, &[n], Category::Workspace);
            let ta = put(&a);
            let mut sum = dev.zeros(&[n], Category::Workspace);
            dev.add(&mut sum, &ta, &put(&b));
            let sum = dev.to_host(&sum);
            let what = |part: &str| format!("{part} in {storage}");
            storage.check(&what("add"), &storage.read(&got, out), &sum, Tolerance::Exact).unwrap();
            // accumulate added the stored sum: the CPU's, as the storage holds it (checked
            // just above).
            let mut acc = ta;
            dev.accumulate(&mut acc, &put(&storage.round(sum)));
            let want = dev.to_host(&acc);
            storage.check(&what("accumulate"), &storage.read(&got, ga), &want, Tolerance::Exact).unwrap();
        }
    }
}

#[test]
fn gelu_matches_the_cpu_in_f32_and_bf16() {
    let Some(family) = Family::of("gelu_matches_the_cpu_in_f32_and_bf16", "gelu.cu") else { return };
    for storage in Storage::BOTH {
        let mut rng = Rng::new(2);
        // The MLP's hidden layer, and a length whose last pack is partial in both storages.
        for n in [HIDDEN, 777] {
            // Wide enough to reach both saturated tails.
            let (x, dout) = (storage.round(rng.uniform(n, 12.0)), storage.round(rng.uniform(n, 1.0)));
            let mut run = Run::new(n as u64);
            let (gx, gd) = (storage.buffer(&mut run, &x), storage.buffer(&mut run, &dout));
            let (out, dinp) = (storage.output(&mut run, n), storage.output(&mut run, n));
            run.launch(
                storage.kernel("gelu_forward"),
                per_pack(n, storage.dtype()),
                &[out.into(), gx.into(), (n as u64).into()],
            );
            run.launch(
                storage.kernel("gelu_backward"),
                per_pack(n, storage.dtype()),
                &[dinp.into(), gx.into(), gd.into(), (n as u64).into()],
            );
            run.read(out);
            run.read(dinp);
            let got = family.run(run).unwrap();
            let dev = cpu();
            let put = |v: &[f32]| dev.from_host(v, &[n], Category::Workspace);
            let (tx, td) = (put(&x), put(&dout));
            let (mut want_out, mut want_dinp) =
                (dev.zeros(&[n], Category::Workspace), dev.zeros(&[n], Category::Workspace));
            dev.gelu_forward(&mut want_out, &tx);
            dev.gelu_backward(&mut want_dinp, &tx, &td);
            let (want_out, want_dinp) = (dev.to_host(&want_out), dev.to_host(&want_dinp));
            let what = |part: &str| format!("{part} in {storage}");
            // Far in the negative tail the GPU's sigmoid underflows to 0 where the CPU's exp
            // stops at e^-87.3: outputs below 1e-30 are judged against 1e-30.
            let tail = Tolerance::Close { rtol: 1e-5, floor: 1e-30 };
            storage.check(&what("gelu"), &storage.read(&got, out), &want_out, tail).unwrap();
            // gelu' crosses zero near x = -0.75, where its two terms cancel: there the error is
            // judged against the largest gradient, as in the GPU tests.
            let cancelling = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want_dinp) };
            storage.check(&what("dgelu"), &storage.read(&got, dinp), &want_dinp, cancelling).unwrap();
        }
    }
}

fn spec(p: f32, layer: u32, site: DropoutSite) -> DropoutSpec {
    DropoutSpec {
        p,
        key: DropoutKey { seed: 0x1234_5678_9abc, step: 7, microbatch: 2, layer, site },
        first: 0,
        heads: None,
    }
}

/// The CPU's dropout bit for bit in f32; in bf16 the same mask, element for element, over
/// the rounded inputs, rounded (one product each, so exactly).
#[test]
fn dropout_draws_the_cpus_mask_bit_for_bit_in_f32_and_bf16() {
    let test = "dropout_draws_the_cpus_mask_bit_for_bit_in_f32_and_bf16";
    let Some(family) = Family::of(test, "dropout.cu") else { return };
    for storage in Storage::BOTH {
        let mut rng = Rng::new(3);
        // The residual stream of GPT-2 124M, and an odd length whose last Philox block is
        // partial.
        for (n, spec) in [
            (RESIDUAL, spec(0.1, 11, DropoutSite::MlpResidual)),
            (1003, spec(0.5, 0, DropoutSite::Embedding)),
        ] {
            let x = storage.round(rng.uniform(n, 1.0));
            let mut run = Run::new(n as u64);
            let (gx, out) = (storage.buffer(&mut run, &x), storage.output(&mut run, n));
            run.launch(
                storage.kernel("dropout_apply"),
                per_pack(n, storage.dtype()),
                &[out.into(), gx.into(), (n as u64).into(), dropout_mask(&spec)],
            );
            run.read(out);
            // The in-place form is f32 only: it serves the unfused attention, which bf16
            // activations do not use.
            let in_place = storage == Storage::F32;
            if in_place {
                run.launch(
                    "dropout_apply_inplace",
                    per_pack(n, DType::F32),
                    &[gx.into(), (n as u64).into(), dropout_mask(&spec)],
                );
                run.read(gx);
            }
            let got = family.run(run).unwrap();
            let dev = cpu();
            let mut want = dev.zeros(&[n], Category::Workspace);
            dev.dropout_forward(&mut want, &dev.from_host(&x, &[n], Category::Workspace), spec);
            let want = dev.to_host(&want);
            let what = format!("dropout_apply in {storage}");
            storage.check(&what, &storage.read(&got, out), &want, Tolerance::Exact).unwrap();
            if in_place {
                bitwise("dropout_apply_inplace", &got.get(gx), &want).unwrap();
            }
        }
    }
}

#[test]
fn adamw_matches_the_cpu() {
    let Some(family) = Family::of("adamw_matches_the_cpu", "adamw.cu") else { return };
    let mut rng = Rng::new(4);
    // wte, GPT-2 124M's largest parameter (V * C), and an odd length.
    for n in [50257 * 768, 1001] {
        let (p0, m0, v0, g) =
            (rng.uniform(n, 1.0), rng.uniform(n, 0.01), rng.uniform(n, 1e-4), rng.uniform(n, 0.1));
        let v0: Vec<f32> = v0.iter().map(|v| v.abs()).collect();
        let hp = AdamWStep {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: 3,
            grad_scale: 0.5,
        };
        // The per-step constants, computed on the host as the CUDA backend computes them.
        let t = hp.step as i32;
        let step_size = (hp.lr as f64 / (1.0 - (hp.beta1 as f64).powi(t))) as f32;
        let bias2_sqrt = (1.0 - (hp.beta2 as f64).powi(t)).sqrt() as f32;
        let decay = 1.0 - hp.lr * hp.weight_decay;
        let mut run = Run::new(n as u64);
        let scalars = [hp.beta1, hp.beta2, hp.eps, hp.grad_scale, decay, step_size, bias2_sqrt];
        let args = |bufs: &[Buf]| -> Vec<Arg> {
            bufs.iter()
                .map(|&b| Arg::from(b))
                .chain([(n as u64).into()])
                .chain(scalars.map(Arg::from))
                .collect()
        };
        // The fp32 step, and the step that also writes the bf16 copy, on copies of the same
        // inputs.
        let (p, gg, m, v) = (run.buffer(&p0), run.buffer(&g), run.buffer(&m0), run.buffer(&v0));
        run.launch("adamw", per_pack(n, DType::F32), &args(&[p, gg, m, v]));
        let (p2, m2, v2) = (run.buffer(&p0), run.buffer(&m0), run.buffer(&v0));
        let copy = run.buffer(&vec![0xffffu16; n]);
        run.launch("adamw_with_bf16_copy", per_pack(n, DType::Bf16), &args(&[p2, copy, gg, m2, v2]));
        for buf in [p, m, v, p2, m2, v2, copy] {
            run.read(buf);
        }
        let got = family.run(run).unwrap();
        let dev = cpu();
        let put = |x: &[f32]| dev.from_host(x, &[n], Category::Workspace);
        let (mut tp, mut tm, mut tv) = (put(&p0), put(&m0), put(&v0));
        dev.adamw(&mut tp, &put(&g), &mut tm, &mut tv, hp);
        for (what, buf, want) in [("param", p, &tp), ("m", m, &tm), ("v", v, &tv)] {
            let want = dev.to_host(want);
            close(what, &got.get(buf), &want, 1e-5, 0.0).unwrap();
        }
        // The same fp32 arithmetic, so the same bits as adamw's; the copy is exactly the
        // `half` crate's rounding of the updated weights (the rounding of a given f32 has
        // one right answer, so no tolerance).
        for (what, fp32, with_copy) in [("param", p, p2), ("m", m, m2), ("v", v, v2)] {
            bitwise(&format!("{what} beside a bf16 copy"), &got.get(with_copy), &got.get(fp32)).unwrap();
        }
        let (copy, updated) = (got.get::<u16>(copy), got.get::<f32>(p));
        assert_eq!(copy.len(), n);
        for (i, (&bits, &x)) in copy.iter().zip(&updated).enumerate() {
            assert_eq!(bits, half::bf16::from_f32(x).to_bits(), "bf16 copy of element {i}, {x:e}");
        }
    }
}
