//! Rotary position embedding, forward and backward, in place on qkv, launched as the CUDA
//! backend launches it (one thread per row and rotated pair), against the CPU's op.

use crate::harness::{Arg, Family, Rng, Run, Storage, Tolerance};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::per_rope_thread;
use kernels::{Category, Device, RopeFrequencies};

/// One qkv [B,T,(NH+2*KV)*hs] and the position of its first token.
struct Case {
    b: usize,
    t: usize,
    nh: usize,
    kv: usize,
    hs: usize,
    first: usize,
    freqs: RopeFrequencies,
}

impl Case {
    fn shape(&self) -> [usize; 3] {
        [self.b, self.t, (self.nh + 2 * self.kv) * self.hs]
    }

    fn len(&self) -> usize {
        self.shape().iter().product()
    }
}

/// The CPU's forward (at `first`) and backward of `x` and `dx`.
fn cpu_rope(case: &Case, x: &[f32], dx: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let dev = CpuDevice::new(2);
    let mut qkv = dev.from_host(x, &case.shape(), Category::Workspace);
    dev.rope_forward(&mut qkv, case.nh, case.kv, case.freqs, case.first);
    let mut dqkv = dev.from_host(dx, &case.shape(), Category::Workspace);
    dev.rope_backward(&mut dqkv, case.nh, case.kv, case.freqs);
    (dev.to_host(&qkv), dev.to_host(&dqkv))
}

/// The CPU's bits in f32, and in bf16 the rounding of the CPU's value on the same rounded
/// inputs: the emulator's powf, cos and sin are the host's libm, which the CPU backend
/// calls too, and every other operation is the CPU's, in its order. (A real GPU's may
/// differ by an ulp: the GPU tests allow for it.)
#[test]
fn rope_matches_the_cpu_bit_for_bit_in_f32_and_bf16() {
    let Some(family) = Family::of("rope_matches_the_cpu_bit_for_bit_in_f32_and_bf16", "rope.cu") else {
        return;
    };
    let plain = RopeFrequencies::plain;
    let llama3 = |llama3_factor| RopeFrequencies { llama3_factor: Some(llama3_factor), ..plain(500_000.0) };
    let partial = |rotary_dims| RopeFrequencies { rotary_dims: Some(rotary_dims), ..plain(10_000.0) };
    let cases = [
        // Llama-3-8B's attention: 32 query heads on 8 key/value heads of 128, base 500000;
        // 2 sequences of 48 tokens rather than 8192, the forward's placed at the end of an
        // 8192-token context, where the angles are largest.
        Case { b: 2, t: 48, nh: 32, kv: 8, hs: 128, first: 8192 - 48, freqs: plain(500_000.0) },
        // Llama-3.1-8B's: the same with its long wavelengths slowed by 8.
        Case { b: 1, t: 48, nh: 32, kv: 8, hs: 128, first: 100_000, freqs: llama3(8.0) },
        // Llama-3.2-1B's: heads of 64, slowed by 32.
        Case { b: 1, t: 16, nh: 32, kv: 8, hs: 64, first: 4000, freqs: llama3(32.0) },
        // Odd sizes: 3 query heads on 1 key/value head of 6, 3 sequences of 7 tokens
        // (21 rows of 3 pairs: one block, partly idle).
        Case { b: 3, t: 7, nh: 3, kv: 1, hs: 6, first: 5, freqs: plain(10_000.0) },
        // Heads of 8: in f32 a thread's 4 pairs are one pack, in bf16 (8 a pack) one pair.
        Case { b: 1, t: 5, nh: 2, kv: 1, hs: 8, first: 0, freqs: plain(10_000.0) },
        // Nemotron's half: 64 of 128 channels turn, 32 pairs (packs in f32 and bf16), the
        // second pack of a pair's halves 16 elements past the first, not 64.
        Case { b: 1, t: 9, nh: 4, kv: 2, hs: 128, first: 3000, freqs: partial(64) },
        // GPT-NeoX's quarter of a head of 24: 6 channels, 3 pairs (one each, unaligned).
        Case { b: 2, t: 5, nh: 3, kv: 1, hs: 24, first: 7, freqs: partial(6) },
    ];
    for storage in Storage::BOTH {
        let mut rng = Rng::new(11);
        for case in &cases {
            let (x, dx) =
                (storage.round(rng.uniform(case.len(), 2.0)), storage.round(rng.uniform(case.len(), 1.0)));
            let mut run = Run::new(case.len() as u64);
            let (qkv, dqkv) = (storage.buffer(&mut run, &x), storage.buffer(&mut run, &dx));
            let rows = case.b * case.t;
            let rot = case.freqs.rotated(case.hs);
            let cfg = || per_rope_thread(rows, rot / 2, storage.dtype());
            let dims = || {
                [
                    (rows as u64).into(),
                    (case.t as i32).into(),
                    (case.nh as i32).into(),
                    (case.kv as i32).into(),
                    (case.hs as i32).into(),
                    (rot as i32).into(),
                ]
            };
            let mut forward: Vec<_> = vec![qkv.into()];
            forward.extend(dims());
            let freqs: [Arg; 2] = [case.freqs.base.into(), case.freqs.llama3_factor.unwrap_or(0.0).into()];
            forward.push((case.first as u64).into());
            forward.extend(freqs.clone());
            run.launch(storage.kernel("rope_forward"), cfg(), &forward);
            let mut backward: Vec<_> = vec![dqkv.into()];
            backward.extend(dims());
            backward.extend(freqs);
            run.launch(storage.kernel("rope_backward"), cfg(), &backward);
            run.read(qkv);
            run.read(dqkv);
            let got = family.run(run).unwrap();
            let (want, dwant) = cpu_rope(case, &x, &dx);
            let what = |part: &str| {
                format!("{part} in {storage}, {} heads on {} of {}, {rot} turning", case.nh, case.kv, case.hs)
            };
            storage.check(&what("rope"), &storage.read(&got, qkv), &want, Tolerance::Exact).unwrap();
            storage.check(&what("drope"), &storage.read(&got, dqkv), &dwant, Tolerance::Exact).unwrap();
        }
    }
}
