//! The elementwise kernels: residual add and accumulation, a scalar's add, GELU, squared
//! ReLU, dropout, AdamW and the
//! zeroing of many tensors at once. Each
//! kernel with a bf16-storage twin runs in both storages, at a length whose last 128-bit
//! pack is partial where the kernel moves packs, the same test for each: in bf16
//! from inputs rounded to bf16, against the CPU's op on those rounded values.

use crate::harness::{bitwise, close, max_abs, Arg, Buf, Family, Rng, Run, Storage, Tolerance, Word};
use crate::philox::dropout_mask;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{first_blocks, per_pack, per_table_chunk, ADAMW_CHUNK, ZERO_CHUNK};
use kernels::{AdamWStep, AdamWTensor, Category, DType, Device, DropoutKey, DropoutSite, DropoutSpec};

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

/// A zero-centred norm weight's 1 + w: the CPU's sums bit for bit in f32, and rounded once
/// in bf16.
#[test]
fn add_scalar_is_exact_in_f32_and_bf16() {
    let Some(family) = Family::of("add_scalar_is_exact_in_f32_and_bf16", "elementwise.cu") else { return };
    for storage in Storage::BOTH {
        let mut rng = Rng::new(4);
        // Llama 3 8B's width, and one whose last pack is partial in both storages.
        for n in [4096, 1001] {
            let a = storage.round(rng.uniform(n, 0.1));
            let mut run = Run::new(n as u64);
            let (ga, out) = (storage.buffer(&mut run, &a), storage.output(&mut run, n));
            run.launch(
                storage.kernel("add_scalar"),
                per_pack(n, storage.dtype()),
                &[out.into(), ga.into(), 1.0f32.into(), (n as u64).into()],
            );
            run.read(out);
            let got = family.run(run).unwrap();
            let dev = cpu();
            let mut want = dev.zeros(&[n], Category::Workspace);
            dev.add_scalar(&mut want, &dev.from_host(&a, &[n], Category::Workspace), 1.0);
            let what = format!("1 + w in {storage}, {n} elements");
            storage.check(&what, &storage.read(&got, out), &dev.to_host(&want), Tolerance::Exact).unwrap();
        }
    }
}

/// Gemma's embedding multiplier, sqrt(3072) in f32, in place: the CPU's products bit for bit
/// in f32, and rounded once in bf16.
#[test]
fn scale_is_exact_in_f32_and_bf16() {
    let Some(family) = Family::of("scale_is_exact_in_f32_and_bf16", "elementwise.cu") else { return };
    let s = (3072f64).sqrt() as f32;
    for storage in Storage::BOTH {
        let mut rng = Rng::new(5);
        for n in [RESIDUAL, 1001] {
            let a = storage.round(rng.uniform(n, 2.0));
            let mut run = Run::new(n as u64);
            let t = storage.buffer(&mut run, &a);
            run.launch(
                storage.kernel("scale"),
                per_pack(n, storage.dtype()),
                &[t.into(), s.into(), (n as u64).into()],
            );
            run.read(t);
            let got = family.run(run).unwrap();
            let dev = cpu();
            let mut want = dev.from_host(&a, &[n], Category::Workspace);
            dev.scale(&mut want, s);
            let what = format!("x sqrt(3072) in {storage}, {n} elements");
            storage.check(&what, &storage.read(&got, t), &dev.to_host(&want), Tolerance::Exact).unwrap();
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

/// Squared ReLU in f32 and bf16: the CPU's bits, forward and backward, NaN passed through.
#[test]
fn squared_relu_matches_the_cpu_bit_for_bit_in_f32_and_bf16() {
    let Some(family) =
        Family::of("squared_relu_matches_the_cpu_bit_for_bit_in_f32_and_bf16", "squared_relu.cu")
    else {
        return;
    };
    for storage in Storage::BOTH {
        let mut rng = Rng::new(3);
        // The MLP's hidden layer, and a length whose last pack is partial in both storages.
        for n in [HIDDEN, 777] {
            let mut x = storage.round(rng.uniform(n, 4.0));
            x[5] = f32::NAN;
            let dout = storage.round(rng.uniform(n, 1.0));
            let mut run = Run::new(n as u64);
            let (gx, gd) = (storage.buffer(&mut run, &x), storage.buffer(&mut run, &dout));
            let (out, dinp) = (storage.output(&mut run, n), storage.output(&mut run, n));
            let cfg = || per_pack(n, storage.dtype());
            run.launch(
                storage.kernel("squared_relu_forward"),
                cfg(),
                &[out.into(), gx.into(), (n as u64).into()],
            );
            run.launch(
                storage.kernel("squared_relu_backward"),
                cfg(),
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
            dev.squared_relu_forward(&mut want_out, &tx);
            dev.squared_relu_backward(&mut want_dinp, &tx, &td);
            let (want_out, want_dinp) = (dev.to_host(&want_out), dev.to_host(&want_dinp));
            let (got_out, got_dinp) = (storage.read(&got, out), storage.read(&got, dinp));
            assert!(got_out[5].is_nan() && want_out[5].is_nan(), "{storage}: relu2(NaN) is {}", got_out[5]);
            let finite = |v: &[f32]| [&v[..5], &v[6..]].concat();
            let what = |part: &str| format!("{part} in {storage}, {n} elements");
            storage.check(&what("relu2"), &finite(&got_out), &finite(&want_out), Tolerance::Exact).unwrap();
            assert!(got_dinp[5].is_nan(), "{storage}: drelu2 at NaN is {}", got_dinp[5]);
            storage
                .check(&what("drelu2"), &finite(&got_dinp), &finite(&want_dinp), Tolerance::Exact)
                .unwrap();
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

/// One launch steps many tensors, each as the CPU steps it alone: fp32 ones and ones with a
/// bf16 copy, with and without weight decay, wte's length (GPT-2 124M's largest parameter),
/// lengths whose last 8 elements are partial, an empty tensor, and parts that start one
/// element into a tensor (so that no pack is 16-byte aligned and every thread takes its
/// elements one by one, and the elements before the part are left as they were). The copy-carrying tensors repeat the fp32 ones' inputs: the same
/// fp32 arithmetic, so the same bits, and the copy exactly the `half` crate's rounding of
/// the updated weights (the rounding of a given f32 has one right answer).
#[test]
fn adamw_steps_every_tensor_of_one_launch_as_the_cpu() {
    let Some(family) = Family::of("adamw_steps_every_tensor_of_one_launch_as_the_cpu", "adamw.cu") else {
        return;
    };
    let mut rng = Rng::new(4);
    let hp = AdamWStep {
        lr: 6e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 3,
        grad_scale: 0.5,
    };
    // (length, first element stepped, weight decay)
    let shapes = [(50257 * 768, 0, true), (1001, 0, false), (768, 1, false), (0, 0, true), (2051, 1, true)];
    struct Case {
        p: Vec<f32>,
        g: Vec<f32>,
        m: Vec<f32>,
        v: Vec<f32>,
        from: usize,
        decay: bool,
    }
    let cases: Vec<Case> = shapes
        .iter()
        .map(|&(n, from, decay)| Case {
            p: rng.uniform(n, 1.0),
            g: rng.uniform(n, 0.1),
            m: rng.uniform(n - from, 0.01),
            v: rng.uniform(n - from, 1e-4).iter().map(|v| v.abs()).collect(),
            from,
            decay,
        })
        .collect();
    // The per-step constants, computed on the host as the CUDA backend computes them.
    let constants = hp.constants();
    let mut run = Run::new(5);
    // Each case twice: fp32 alone, then with a bf16 copy; the table's records are
    // `AdamWTensor`'s fields, each part's pointers offset to its first element.
    let mut bufs = Vec::new();
    let mut words = Vec::new();
    for with_copy in [false, true] {
        for c in &cases {
            let n = c.p.len() - c.from;
            let (p, g, m, v) = (run.buffer(&c.p), run.buffer(&c.g), run.buffer(&c.m), run.buffer(&c.v));
            let copy = with_copy.then(|| run.buffer(&vec![0xffffu16; c.p.len()]));
            // Each pointer at the part's first element, as the device's table has it.
            let at = |b: Buf, bytes: usize| Word::At(b, (c.from * bytes) as u64);
            words.extend([
                at(p, 4),
                copy.map_or(Word::Null, |b| at(b, 2)),
                at(g, 4),
                Word::At(m, 0),
                Word::At(v, 0),
                Word::Value(n as u64),
                Word::Value(u64::from(c.decay)),
            ]);
            bufs.push((p, copy, m, v));
        }
    }
    let lens: Vec<usize> =
        [false, true].iter().flat_map(|_| cases.iter().map(|c| c.p.len() - c.from)).collect();
    let first = first_blocks(&lens, ADAMW_CHUNK);
    let (table, gfirst) = (run.table(&words), run.buffer(&first));
    let scalars = [
        hp.beta1,
        hp.beta2,
        hp.eps,
        hp.grad_scale,
        constants.decay,
        constants.step_size,
        constants.bias2_sqrt,
    ];
    let args: Vec<Arg> = [table.into(), gfirst.into(), (lens.len() as i32).into()]
        .into_iter()
        .chain(scalars.map(Arg::from))
        .collect();
    run.launch("adamw", per_table_chunk(*first.last().unwrap() as usize), &args);
    for &(p, copy, m, v) in &bufs {
        [p, m, v].into_iter().chain(copy).for_each(|b| run.read(b));
    }
    let got = family.run(run).unwrap();
    let dev = cpu();
    let put = |x: &[f32]| dev.from_host(x, &[x.len()], Category::Workspace);
    for (i, c) in cases.iter().enumerate() {
        let (p, _, m, v) = bufs[i];
        let (p2, copy, m2, v2) = bufs[cases.len() + i];
        let what = |x: &str| format!("{x} of case {i} ({} from {})", c.p.len(), c.from);
        let (mut tp, mut tm, mut tv, g) = (put(&c.p), put(&c.m), put(&c.v), put(&c.g));
        let share =
            AdamWTensor { param: &mut tp, grad: &g, m: &mut tm, v: &mut tv, from: c.from, decay: c.decay };
        dev.adamw_tensors(&mut [share], hp);
        let want_p = dev.to_host(&tp);
        for (x, buf, want) in
            [("param", p, &want_p), ("m", m, &dev.to_host(&tm)), ("v", v, &dev.to_host(&tv))]
        {
            close(&what(x), &got.get(buf), want, 1e-5, 0.0).unwrap();
        }
        for (x, fp32, with_copy) in [("param", p, p2), ("m", m, m2), ("v", v, v2)] {
            bitwise(&what(&format!("{x} beside a bf16 copy")), &got.get(with_copy), &got.get(fp32)).unwrap();
        }
        // The copy before the part is as it was.
        let (copy, updated) = (got.get::<u16>(copy.expect("a copy")), got.get::<f32>(p));
        assert_eq!(copy.len(), updated.len());
        assert!(copy[..c.from].iter().all(|&bits| bits == 0xffff), "{}", what("bf16 copy before the part"));
        for (j, (&bits, &x)) in copy.iter().zip(&updated).enumerate().skip(c.from) {
            assert_eq!(bits, half::bf16::from_f32(x).to_bits(), "{}: element {j}, {x:e}", what("bf16 copy"));
        }
    }
}

/// One launch zeroes many tensors: lengths of whole and partial packs, an empty tensor, one
/// of several blocks, and parts that start one element in (so that no pack is 16-byte
/// aligned); what lies outside each part keeps its value.
#[test]
fn zero_tensors_zeroes_each_part_and_nothing_else() {
    let Some(family) = Family::of("zero_tensors_zeroes_each_part_and_nothing_else", "zero.cu") else {
        return;
    };
    // (length of the buffer, first element zeroed, elements zeroed)
    let parts =
        [(1001, 0, 1001), (768, 0, 768), (0, 0, 0), (3 * ZERO_CHUNK + 5, 1, 3 * ZERO_CHUNK + 3), (9, 1, 5)];
    let mut rng = Rng::new(6);
    let mut run = Run::new(7);
    let inputs: Vec<Vec<f32>> = parts.iter().map(|&(len, ..)| rng.uniform(len, 1.0)).collect();
    let bufs: Vec<Buf> = inputs.iter().map(|x| run.buffer(x)).collect();
    let words: Vec<Word> = bufs
        .iter()
        .zip(&parts)
        .flat_map(|(&b, &(_, from, n))| [Word::At(b, 4 * from as u64), Word::Value(n as u64)])
        .collect();
    let lens: Vec<usize> = parts.iter().map(|&(_, _, n)| n).collect();
    let first = first_blocks(&lens, ZERO_CHUNK);
    let (table, gfirst) = (run.table(&words), run.buffer(&first));
    let args = [table.into(), gfirst.into(), (parts.len() as i32).into()];
    run.launch("zero_tensors", per_table_chunk(*first.last().unwrap() as usize), &args);
    bufs.iter().for_each(|&b| run.read(b));
    let got = family.run(run).unwrap();
    for (i, ((&b, x), &(_, from, n))) in bufs.iter().zip(&inputs).zip(&parts).enumerate() {
        let want: Vec<f32> =
            x.iter().enumerate().map(|(j, &v)| if (from..from + n).contains(&j) { 0.0 } else { v }).collect();
        bitwise(&format!("tensor {i}, {n} zeroed from {from}"), &got.get(b), &want).unwrap();
    }
}
