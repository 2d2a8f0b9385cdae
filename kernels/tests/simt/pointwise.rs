//! The elementwise kernels: residual add and accumulation, GELU, dropout and AdamW. Each
//! kernel with a bf16-storage twin is also run with bf16 buffers, from inputs rounded to
//! bf16, against the CPU's op on those rounded values.

use crate::harness::{
    bf16_bits, bf16_values, bitwise, close, max_abs, rounds_from, Arg, Buf, Family, Rng, Run,
};
use crate::philox::dropout_mask;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::per_item;
use kernels::{AdamWStep, Category, Device, DropoutKey, DropoutSite, DropoutSpec};

/// GPT-2 124M: B * T * C, the residual stream, and B * T * 4C, the MLP's hidden layer.
const RESIDUAL: usize = 4 * 1024 * 768;
const HIDDEN: usize = 4 * RESIDUAL;

fn cpu() -> CpuDevice {
    CpuDevice::new(2)
}

#[test]
fn add_and_accumulate_are_exact() {
    let Some(family) = Family::of("add_and_accumulate_are_exact", "elementwise.cu") else { return };
    let mut rng = Rng::new(1);
    for n in [RESIDUAL, 1001] {
        let (a, b) = (rng.uniform(n, 2.0), rng.uniform(n, 2.0));
        let mut run = Run::new(n as u64);
        let (ga, gb, out) = (run.buffer(&a), run.buffer(&b), run.buffer(&vec![f32::NAN; n]));
        run.launch("add", per_item(n), &[out.into(), ga.into(), gb.into(), (n as u64).into()]);
        run.launch("accumulate", per_item(n), &[ga.into(), out.into(), (n as u64).into()]);
        run.read(out);
        run.read(ga);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let (ta, tb) =
            (dev.from_host(&a, &[n], Category::Workspace), dev.from_host(&b, &[n], Category::Workspace));
        let mut sum = dev.zeros(&[n], Category::Workspace);
        dev.add(&mut sum, &ta, &tb);
        let mut acc = ta;
        dev.accumulate(&mut acc, &sum);
        bitwise("add", &got.get(out), &dev.to_host(&sum)).unwrap();
        bitwise("accumulate", &got.get(ga), &dev.to_host(&acc)).unwrap();
    }
}

/// The bf16 twins compute the f32 kernels' sums from the rounded inputs and round them once:
/// exactly the CPU's sums, rounded.
#[test]
fn add_and_accumulate_bf16_round_the_cpus_sums() {
    let Some(family) = Family::of("add_and_accumulate_bf16_round_the_cpus_sums", "elementwise.cu") else {
        return;
    };
    let mut rng = Rng::new(1);
    for n in [RESIDUAL, 1001] {
        let (a, b) = (bf16_bits(&rng.uniform(n, 2.0)), bf16_bits(&rng.uniform(n, 2.0)));
        let mut run = Run::new(n as u64);
        let (ga, gb, out) = (run.buffer(&a), run.buffer(&b), run.buffer(&vec![0xffffu16; n]));
        run.launch("add_bf16", per_item(n), &[out.into(), ga.into(), gb.into(), (n as u64).into()]);
        run.launch("accumulate_bf16", per_item(n), &[ga.into(), out.into(), (n as u64).into()]);
        run.read(out);
        run.read(ga);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let put = |x: &[f32]| dev.from_host(x, &[n], Category::Workspace);
        let (ta, tb) = (put(&bf16_values(&a)), put(&bf16_values(&b)));
        let mut sum = dev.zeros(&[n], Category::Workspace);
        dev.add(&mut sum, &ta, &tb);
        let sum = dev.to_host(&sum);
        rounds_from("add_bf16", &got.get(out), &sum, 0.0, 0.0).unwrap();
        // accumulate_bf16 added the stored sum, the CPU's rounded (checked just above).
        let mut acc = ta;
        dev.accumulate(&mut acc, &put(&bf16_values(&bf16_bits(&sum))));
        rounds_from("accumulate_bf16", &got.get(ga), &dev.to_host(&acc), 0.0, 0.0).unwrap();
    }
}

#[test]
fn gelu_matches_the_cpu() {
    let Some(family) = Family::of("gelu_matches_the_cpu", "gelu.cu") else { return };
    let mut rng = Rng::new(2);
    for n in [HIDDEN, 777] {
        // Wide enough to reach both saturated tails.
        let (x, dout) = (rng.uniform(n, 12.0), rng.uniform(n, 1.0));
        let mut run = Run::new(n as u64);
        let (gx, gd) = (run.buffer(&x), run.buffer(&dout));
        let (out, dinp) = (run.buffer(&vec![f32::NAN; n]), run.buffer(&vec![f32::NAN; n]));
        run.launch("gelu_forward", per_item(n), &[out.into(), gx.into(), (n as u64).into()]);
        run.launch("gelu_backward", per_item(n), &[dinp.into(), gx.into(), gd.into(), (n as u64).into()]);
        run.read(out);
        run.read(dinp);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let (tx, td) =
            (dev.from_host(&x, &[n], Category::Workspace), dev.from_host(&dout, &[n], Category::Workspace));
        let (mut want_out, mut want_dinp) =
            (dev.zeros(&[n], Category::Workspace), dev.zeros(&[n], Category::Workspace));
        dev.gelu_forward(&mut want_out, &tx);
        dev.gelu_backward(&mut want_dinp, &tx, &td);
        let (want_out, want_dinp) = (dev.to_host(&want_out), dev.to_host(&want_dinp));
        // Far in the negative tail the GPU's sigmoid underflows to 0 where the CPU's exp
        // stops at e^-87.3: outputs below 1e-30 are judged against 1e-30.
        close("gelu", &got.get(out), &want_out, 1e-5, 1e-30).unwrap();
        // gelu' crosses zero near x = -0.75, where its two terms cancel: there the error is
        // judged against the largest gradient, as in the GPU tests.
        close("dgelu", &got.get(dinp), &want_dinp, 1e-5, max_abs(&want_dinp)).unwrap();
    }
}

#[test]
fn gelu_bf16_rounds_the_cpus() {
    let Some(family) = Family::of("gelu_bf16_rounds_the_cpus", "gelu.cu") else { return };
    let mut rng = Rng::new(2);
    for n in [HIDDEN, 777] {
        let (x, dout) = (bf16_bits(&rng.uniform(n, 12.0)), bf16_bits(&rng.uniform(n, 1.0)));
        let mut run = Run::new(n as u64);
        let (gx, gd) = (run.buffer(&x), run.buffer(&dout));
        let (out, dinp) = (run.buffer(&vec![0xffffu16; n]), run.buffer(&vec![0xffffu16; n]));
        run.launch("gelu_forward_bf16", per_item(n), &[out.into(), gx.into(), (n as u64).into()]);
        run.launch(
            "gelu_backward_bf16",
            per_item(n),
            &[dinp.into(), gx.into(), gd.into(), (n as u64).into()],
        );
        run.read(out);
        run.read(dinp);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let put = |v: &[f32]| dev.from_host(v, &[n], Category::Workspace);
        let (tx, td) = (put(&bf16_values(&x)), put(&bf16_values(&dout)));
        let (mut want_out, mut want_dinp) =
            (dev.zeros(&[n], Category::Workspace), dev.zeros(&[n], Category::Workspace));
        dev.gelu_forward(&mut want_out, &tx);
        dev.gelu_backward(&mut want_dinp, &tx, &td);
        let (want_out, want_dinp) = (dev.to_host(&want_out), dev.to_host(&want_dinp));
        // The fp32 test's allowances as absolute floors (`close`'s floor is a magnitude the
        // relative tolerance applies to): 1e-5 of 1e-30 in the tail where the GPU's sigmoid
        // underflows, 1e-5 of the largest gradient where gelu' crosses zero.
        rounds_from("gelu_bf16", &got.get(out), &want_out, 1e-5, 1e-5 * 1e-30).unwrap();
        rounds_from("dgelu_bf16", &got.get(dinp), &want_dinp, 1e-5, 1e-5 * max_abs(&want_dinp)).unwrap();
    }
}

fn spec(p: f32, layer: u32, site: DropoutSite) -> DropoutSpec {
    DropoutSpec { p, key: DropoutKey { seed: 0x1234_5678_9abc, step: 7, microbatch: 2, layer, site } }
}

#[test]
fn dropout_draws_the_cpus_mask_bit_for_bit() {
    let Some(family) = Family::of("dropout_draws_the_cpus_mask_bit_for_bit", "dropout.cu") else { return };
    let mut rng = Rng::new(3);
    // The residual stream of GPT-2 124M, and an odd length whose last Philox block is partial.
    for (n, spec) in
        [(RESIDUAL, spec(0.1, 11, DropoutSite::MlpResidual)), (1003, spec(0.5, 0, DropoutSite::Embedding))]
    {
        let x = rng.uniform(n, 1.0);
        let mut run = Run::new(n as u64);
        let (gx, out) = (run.buffer(&x), run.buffer(&vec![f32::NAN; n]));
        run.launch(
            "dropout_apply",
            per_item(n.div_ceil(4)),
            &[out.into(), gx.into(), (n as u64).into(), dropout_mask(&spec)],
        );
        run.read(out);
        run.launch(
            "dropout_apply_inplace",
            per_item(n.div_ceil(4)),
            &[gx.into(), (n as u64).into(), dropout_mask(&spec)],
        );
        run.read(gx);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let mut want = dev.zeros(&[n], Category::Workspace);
        dev.dropout_forward(&mut want, &dev.from_host(&x, &[n], Category::Workspace), spec);
        let want = dev.to_host(&want);
        bitwise("dropout_apply", &got.get(out), &want).unwrap();
        bitwise("dropout_apply_inplace", &got.get(gx), &want).unwrap();
    }
}

/// The same mask as the f32 kernels, element for element: the CPU's dropout of the rounded
/// inputs, rounded (one product each, so exactly).
#[test]
fn dropout_bf16_draws_the_cpus_mask() {
    let Some(family) = Family::of("dropout_bf16_draws_the_cpus_mask", "dropout.cu") else { return };
    let mut rng = Rng::new(3);
    for (n, spec) in
        [(RESIDUAL, spec(0.1, 11, DropoutSite::MlpResidual)), (1003, spec(0.5, 0, DropoutSite::Embedding))]
    {
        let x = bf16_bits(&rng.uniform(n, 1.0));
        let mut run = Run::new(n as u64);
        let (gx, out) = (run.buffer(&x), run.buffer(&vec![0xffffu16; n]));
        run.launch(
            "dropout_apply_bf16",
            per_item(n.div_ceil(4)),
            &[out.into(), gx.into(), (n as u64).into(), dropout_mask(&spec)],
        );
        run.read(out);
        let got = family.run(run).unwrap();
        let dev = cpu();
        let mut want = dev.zeros(&[n], Category::Workspace);
        dev.dropout_forward(&mut want, &dev.from_host(&bf16_values(&x), &[n], Category::Workspace), spec);
        let want = dev.to_host(&want);
        rounds_from("dropout_apply_bf16", &got.get(out), &want, 0.0, 0.0).unwrap();
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
        run.launch("adamw", per_item(n), &args(&[p, gg, m, v]));
        let (p2, m2, v2) = (run.buffer(&p0), run.buffer(&m0), run.buffer(&v0));
        let copy = run.buffer(&vec![0xffffu16; n]);
        run.launch("adamw_with_bf16_copy", per_item(n), &args(&[p2, copy, gg, m2, v2]));
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
