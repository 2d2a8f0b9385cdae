//! The CUDA backend against the CPU backend: every op runs on fresh random inputs on both
//! devices, and the fp32 results agree to 1e-5 of the largest magnitude (exactly, where
//! both compute the same single rounding). Each test skips, and says so, where there is no
//! usable GPU; set PIPETRAIN_REQUIRE_GPU=1 on a GPU machine to make that a failure instead.
#![cfg(feature = "cuda")]

use kernels::cpu::CpuDevice;
use kernels::cuda::compile::compile;
use kernels::cuda::sources::KernelSource;
use kernels::cuda::{CudaDevice, MatmulPrecision};
use kernels::{
    AdamWStep, AdamWTensor, AttentionSaved, AttentionSaves, Category, CausalMask, ClassifierGrad, DType,
    Device, DropoutKey, DropoutSite, DropoutSpec, Gate, HeadRange, QkNormHeads, QkNormSpan, RopeFrequencies,
    SplitMix64, Tensor, WeightLayout, OTHER_SHARD,
};
use std::sync::atomic::{AtomicU64, Ordering};

const TOL: f64 = 1e-5;

fn gpu(test: &str) -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(device) => Some(device),
        Err(e) if std::env::var_os("PIPETRAIN_REQUIRE_GPU").is_some() => {
            panic!("{test}: PIPETRAIN_REQUIRE_GPU is set, but there is no usable GPU: {e}")
        }
        Err(e) => {
            eprintln!("SKIP {test}: no usable GPU: {e}");
            None
        }
    }
}

fn cpu() -> CpuDevice {
    CpuDevice::new(4)
}

/// SplitMix64, seeded afresh for every test from the clock; the seed is printed so a
/// failure can be replayed with PIPETRAIN_TEST_SEED.
fn seeded(test: &str) -> SplitMix64 {
    static SALT: AtomicU64 = AtomicU64::new(0);
    let seed = match std::env::var("PIPETRAIN_TEST_SEED") {
        Ok(s) => s.parse().expect("PIPETRAIN_TEST_SEED is a u64"),
        Err(_) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            now.as_nanos() as u64 ^ SALT.fetch_add(0x9E37_79B9, Ordering::Relaxed)
        }
    };
    eprintln!("{test}: seed {seed}");
    SplitMix64::new(seed)
}

/// max |got - want| <= rtol * max |want|, and no NaN.
fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f64, |m, &w| m.max((w as f64).abs())).max(f64::MIN_POSITIVE);
    let (worst, err) = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| if g.is_nan() || w.is_nan() { f64::INFINITY } else { (g as f64 - w as f64).abs() })
        .enumerate()
        .fold((0, 0.0f64), |best, (i, e)| if e > best.1 { (i, e) } else { best });
    assert!(
        err <= rtol * scale,
        "{what}: error {err:e} at {worst} (gpu {} vs cpu {}) exceeds {rtol:e} of {scale:e}",
        got[worst],
        want[worst]
    );
}

fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        panic!("{what}: element {i} differs: {} vs {}", got[i], want[i]);
    }
}

/// An activation (or activation gradient) in the device's dtype: bf16 on a bf16 GPU.
fn put(dev: &dyn Device, data: &[f32], shape: &[usize]) -> Tensor {
    dev.from_host_of(dev.activation_dtype(), data, shape, Category::Workspace)
}

/// A zeroed activation in the device's dtype.
fn act_zeros(dev: &dyn Device, shape: &[usize]) -> Tensor {
    dev.zeros_of(dev.activation_dtype(), shape, Category::Workspace)
}

/// A parameter: f32, with its bf16 copy on a bf16 GPU when it is a matrix.
fn param(dev: &dyn Device, data: &[f32], shape: &[usize]) -> Tensor {
    dev.from_host(data, shape, Category::Parameters)
}

/// A parameter gradient: f32 on every device.
fn grad(dev: &dyn Device, data: &[f32], shape: &[usize]) -> Tensor {
    dev.from_host(data, shape, Category::Gradients)
}

/// The GPU of `test` storing activations in bf16.
fn bf16_gpu(test: &str) -> Option<CudaDevice> {
    let gpu = gpu(test)?.with_matmul_precision(MatmulPrecision::Bf16);
    match gpu {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

fn dropout(p: f32, layer: u32, site: DropoutSite) -> DropoutSpec {
    DropoutSpec {
        p,
        key: DropoutKey { seed: 0x1234_5678_9abc, step: 7, microbatch: 2, layer, site },
        first: 0,
        heads: None,
    }
}

// Shapes chosen to exercise every loop of the kernels: T above a warp, C above a warp and
// not a multiple of it, rows spanning several chunks of the column sums.
const B: usize = 2;
const T: usize = 37;
const C: usize = 96;
const NH: usize = 4;
const N: usize = B * T;

#[test]
fn new_without_a_usable_gpu_is_an_error_not_a_panic() {
    assert!(CudaDevice::new(1 << 20).is_err(), "GPU 1048576 cannot exist");
}

/// The turn of the tests that open GPU 0's sole device, one at a time.
fn sole_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A rank alone in its process opens its GPU as the sole device, without cudarc's event
/// tracking; a second live sole device on that GPU is an error, not a silent race, while
/// shared devices still open beside it (bench gpu's probe beside its training runs).
#[test]
fn a_gpu_has_one_sole_device() {
    let Some(_shared) = gpu("a_gpu_has_one_sole_device") else { return };
    let _turn = sole_turn();
    let sole = CudaDevice::sole(0).expect("the first sole device");
    let again = CudaDevice::sole(0).err().expect("a second sole device is refused");
    assert_eq!(again, "GPU 0 already has its sole device in this process");
    assert!(CudaDevice::new(0).is_ok(), "shared devices open beside it");
    // It computes as any device does.
    let t = sole.from_host(&[1.0, 2.0], &[2], Category::Workspace);
    assert_eq!(sole.to_host(&t), [1.0, 2.0]);
    drop((t, sole));
    assert!(CudaDevice::sole(0).is_ok(), "once the sole device has gone, another may open");
}

#[test]
fn buffers_round_trip_and_are_counted() {
    let Some(gpu) = gpu("buffers_round_trip_and_are_counted") else { return };
    let data = seeded("buffers").uniform(1000, 3.0);
    let mut a = gpu.from_host(&data, &[10, 100], Category::Activations);
    assert_bitwise("from_host/to_host", &gpu.to_host(&a), &data);
    let mut b = gpu.zeros(&[1000], Category::Gradients);
    assert!(gpu.to_host(&b).iter().all(|&x| x == 0.0));
    gpu.copy(&mut b, &a);
    assert_bitwise("copy", &gpu.to_host(&b), &data);
    gpu.fill_zero(&mut a);
    assert!(gpu.to_host(&a).iter().all(|&x| x == 0.0));
    let empty = gpu.zeros(&[0, 5], Category::Workspace);
    assert!(gpu.to_host(&empty).is_empty());
    let ledger = gpu.ledger();
    assert_eq!(ledger.live(Category::Activations), 4000);
    assert_eq!(ledger.live(Category::Gradients), 4000);
    drop((a, b, empty));
    assert_eq!(ledger.live_bytes(), 0);
}

#[test]
fn elementwise_ops_match_exactly() {
    let Some(gpu) = gpu("elementwise_ops_match_exactly") else { return };
    let mut rng = seeded("elementwise");
    let (x, y) = (rng.uniform(70_001, 2.0), rng.uniform(70_001, 2.0));
    let run = |dev: &dyn Device| {
        let (a, b) = (put(dev, &x, &[x.len()]), put(dev, &y, &[y.len()]));
        let mut out = dev.zeros(&[x.len()], Category::Workspace);
        dev.add(&mut out, &a, &b);
        let mut acc = put(dev, &x, &[x.len()]);
        dev.accumulate(&mut acc, &b);
        dev.accumulate(&mut acc, &out);
        (dev.to_host(&out), dev.to_host(&acc), dev.sum_squares(&a))
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    assert_bitwise("add", &got.0, &want.0);
    assert_bitwise("accumulate", &got.1, &want.1);
    assert!((got.2 - want.2).abs() <= 1e-12 * want.2, "sum_squares {} vs {}", got.2, want.2);
}

/// A step's readout: two losses and three gradients' sums of squares (one empty, one of
/// several chunks) in one fused pass, read with one host sync and reused by a second step
/// with no allocation.
#[test]
fn readout_matches_with_one_sync_per_read() {
    let Some(gpu) = gpu("readout_matches_with_one_sync_per_read") else { return };
    let mut rng = seeded("readout");
    let losses: Vec<Vec<f32>> =
        (0..2).map(|_| rng.uniform(N, 3.0).iter().map(|x| x.abs()).collect()).collect();
    let grads = [rng.uniform(3 * 65_536 + 7, 1.0), Vec::new(), rng.uniform(1001, 1.0)];
    let run = |dev: &dyn Device| {
        let l: Vec<Tensor> = losses.iter().map(|x| put(dev, x, &[x.len()])).collect();
        let g: Vec<Tensor> = grads.iter().map(|x| put(dev, x, &[x.len()])).collect();
        let mut out = dev.readout(5);
        let mut step = || {
            let before = dev.counters();
            dev.loss_mean(&mut out, 0, &l[0]);
            dev.loss_mean(&mut out, 1, &l[1]);
            dev.sum_squares_into(&mut out, 2, &g.iter().collect::<Vec<_>>());
            let values = dev.read(&out);
            (values, dev.counters() - before)
        };
        let first = step();
        let second = step();
        assert_eq!(first.0, second.0, "a second step gives the same values");
        assert_eq!(
            second.1,
            kernels::DeviceCounters { host_syncs: 1, backing_allocations: 0, zero_fills: 0 }
        );
        first.0
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    assert_eq!(got[..2], want[..2], "losses, added in the same order");
    assert_eq!(got[3], 0.0, "an empty tensor");
    for i in [2, 4] {
        assert!((got[i] - want[i]).abs() <= 1e-12 * want[i], "sum of squares {i}: {} vs {}", got[i], want[i]);
    }
}

#[test]
fn embedding_matches() {
    let Some(gpu) = gpu("embedding_matches") else { return };
    let mut rng = seeded("embedding");
    let (vocab, max_t) = (50, T + 3); // few tokens, so many repeat
    let tokens = rng.below(N, vocab as u32);
    let (wte, wpe, dout) =
        (rng.uniform(vocab * C, 1.0), rng.uniform(max_t * C, 1.0), rng.uniform(N * C, 1.0));
    let (dwte0, dwpe0) = (rng.uniform(vocab * C, 1.0), rng.uniform(max_t * C, 1.0));
    let run = |dev: &dyn Device| {
        let (wte, wpe) = (put(dev, &wte, &[vocab, C]), put(dev, &wpe, &[max_t, C]));
        let mut out = dev.zeros(&[B, T, C], Category::Workspace);
        dev.embedding_forward(&mut out, &tokens, &wte, Some(&wpe));
        let (mut dwte, mut dwpe) = (put(dev, &dwte0, &[vocab, C]), put(dev, &dwpe0, &[max_t, C]));
        dev.embedding_backward(&mut dwte, Some(&mut dwpe), &put(dev, &dout, &[B, T, C]), &tokens);
        [dev.to_host(&out), dev.to_host(&dwte), dev.to_host(&dwpe)]
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    // One add per output, and the gradients summed in the CPU's row order: exact.
    for (what, (g, w)) in ["out", "dwte", "dwpe"].iter().zip(got.iter().zip(&want)) {
        assert_bitwise(what, g, w);
    }
}

#[test]
fn layernorm_matches() {
    let Some(gpu) = gpu("layernorm_matches") else { return };
    let mut rng = seeded("layernorm");
    let inp: Vec<f32> = rng.uniform(N * C, 2.0).iter().map(|x| x + 0.5).collect();
    let (w, b, dout) = (rng.uniform(C, 1.0), rng.uniform(C, 1.0), rng.uniform(N * C, 1.0));
    let (dw0, db0) = (rng.uniform(C, 1.0), rng.uniform(C, 1.0));
    let run = |dev: &dyn Device| {
        let (inp, w, b) = (put(dev, &inp, &[B, T, C]), put(dev, &w, &[C]), put(dev, &b, &[C]));
        let mut out = dev.zeros(&[B, T, C], Category::Workspace);
        let (mut mean, mut rstd) =
            (dev.zeros(&[N], Category::Workspace), dev.zeros(&[N], Category::Workspace));
        dev.layernorm_forward(&mut out, &mut mean, &mut rstd, &inp, &w, &b, 1e-5);
        let mut dinp = put(dev, &vec![f32::NAN; N * C], &[B, T, C]); // overwritten
        let (mut dw, mut db) = (put(dev, &dw0, &[C]), put(dev, &db0, &[C]));
        let dout = put(dev, &dout, &[B, T, C]);
        dev.layernorm_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &w, &mean, &rstd);
        [out, mean, rstd, dinp, dw, db].map(|t| dev.to_host(&t))
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    for (what, (g, w)) in
        ["out", "mean", "rstd", "dinp", "dweight", "dbias"].iter().zip(got.iter().zip(&want))
    {
        assert_close(what, g, w, TOL);
    }
}

/// RMSNorm at Llama 2's epsilon (1e-6, not LayerNorm's 1e-5: the kernel is given it), in
/// f32, then with bf16 activations from the same values rounded to bf16: there rstd and the
/// f32 weight gradient are the CPU's on those values to 1e-5, and out and dinp its values
/// rounded once to bf16 (half a bf16 step: 2^-8 of the largest, and 1e-5 more).
#[test]
fn rmsnorm_matches() {
    let Some(gpu) = gpu("rmsnorm_matches") else { return };
    let mut rng = seeded("rmsnorm");
    let (inp, w, dout, dw0) =
        (rng.uniform(N * C, 2.0), rng.uniform(C, 1.0), rng.uniform(N * C, 1.0), rng.uniform(C, 1.0));
    let run = |dev: &dyn Device, inp: &[f32], dout: &[f32]| {
        let (inp, w) = (put(dev, inp, &[B, T, C]), param(dev, &w, &[C]));
        let (mut out, mut rstd) = (act_zeros(dev, &[B, T, C]), dev.zeros(&[N], Category::Workspace));
        dev.rmsnorm_forward(&mut out, &mut rstd, &inp, &w, 1e-6);
        let mut dinp = put(dev, &vec![f32::NAN; N * C], &[B, T, C]); // overwritten
        let (mut dw, dout) = (grad(dev, &dw0, &[C]), put(dev, dout, &[B, T, C]));
        dev.rmsnorm_backward(&mut dinp, &mut dw, &dout, &inp, &w, &rstd);
        [out, rstd, dinp, dw].map(|t| dev.to_host(&t))
    };
    let names = ["out", "rstd", "dinp", "dweight"];
    let (want, got) = (run(&cpu(), &inp, &dout), run(&gpu, &inp, &dout));
    for (what, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
        assert_close(what, g, w, TOL);
    }
    let Some(gpu) = bf16_gpu("rmsnorm_matches") else { return };
    let round = |x: &[f32]| x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect::<Vec<_>>();
    let (inp, dout) = (round(&inp), round(&dout));
    let (want, got) = (run(&cpu(), &inp, &dout), run(&gpu, &inp, &dout));
    for (what, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
        let rounded = matches!(*what, "out" | "dinp");
        assert_close(&format!("bf16 {what}"), g, w, if rounded { 2f64.powi(-8) + TOL } else { TOL });
    }
}

/// QK-norm in place on 4 query heads sharing 2 key/value heads, at Qwen3's epsilon, in f32
/// and then with bf16 activations, judged as `rmsnorm_matches`: heads of 24 (whole 128-bit
/// runs in either storage) and of 10 (element by element), each head normalised and then
/// the whole projections (OLMo 2's; rows of 4 hs and 2 hs). The value heads and their
/// gradients come through bit for bit.
#[test]
fn qk_norm_matches() {
    let Some(gpu) = gpu("qk_norm_matches") else { return };
    let bf16 = bf16_gpu("qk_norm_matches");
    let mut rng = seeded("qk_norm");
    let kv = 2;
    for (hs, span) in [C / NH, 10].into_iter().flat_map(|hs| QkNormSpan::ALL.map(|span| (hs, span))) {
        let shape = [B, T, (NH + 2 * kv) * hs];
        let r = span.rows(NH, kv, hs);
        let (x, dx) = (rng.uniform(N * shape[2], 2.0), rng.uniform(N * shape[2], 1.0));
        let [wq, dwq0] = [(); 2].map(|()| rng.uniform(r.q_width, 1.0));
        let [wk, dwk0] = [(); 2].map(|()| rng.uniform(r.k_width, 1.0));
        let run = |dev: &dyn Device, x: &[f32], dx: &[f32]| {
            let (mut qkv, inp, mut dqkv) = (put(dev, x, &shape), put(dev, x, &shape), put(dev, dx, &shape));
            let (wq, wk) = (param(dev, &wq, &[r.q_width]), param(dev, &wk, &[r.k_width]));
            let mut rstd = dev.zeros(&[N * r.rows()], Category::Workspace);
            let h = QkNormHeads { heads: NH, kv_heads: kv, span };
            dev.qk_norm_forward(&mut qkv, &mut rstd, [&wq, &wk], h, 1e-6);
            let (mut dwq, mut dwk) = (grad(dev, &dwq0, &[r.q_width]), grad(dev, &dwk0, &[r.k_width]));
            dev.qk_norm_backward(&mut dqkv, [&mut dwq, &mut dwk], &inp, [&wq, &wk], &rstd, h);
            [qkv, rstd, dqkv, dwq, dwk].map(|t| dev.to_host(&t))
        };
        let values = |qkv: &[f32]| -> Vec<f32> {
            qkv.chunks(shape[2]).flat_map(|token| token[(NH + kv) * hs..].to_vec()).collect()
        };
        let names = ["out", "rstd", "dinp", "dq_weight", "dk_weight"];
        let (want, got) = (run(&cpu(), &x, &dx), run(&gpu, &x, &dx));
        for (what, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
            assert_close(&format!("{what} of heads of {hs} over each {span:?}"), g, w, TOL);
        }
        assert_bitwise("value heads", &values(&got[0]), &values(&x));
        assert_bitwise("value heads' gradient", &values(&got[2]), &values(&dx));
        let Some(bf16) = &bf16 else { continue };
        let round = |x: &[f32]| x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect::<Vec<_>>();
        let (x, dx) = (round(&x), round(&dx));
        let (want, got) = (run(&cpu(), &x, &dx), run(bf16, &x, &dx));
        for (what, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
            let rounded = matches!(*what, "out" | "dinp");
            let tol = if rounded { 2f64.powi(-8) + TOL } else { TOL };
            assert_close(&format!("bf16 {what} of heads of {hs} over each {span:?}"), g, w, tol);
        }
        assert_bitwise("bf16 value heads", &values(&got[0]), &values(&x));
        assert_bitwise("bf16 value heads' gradient", &values(&got[2]), &values(&dx));
    }
}

/// QK-norm over the whole projections in its two halves, as a rank of a tensor-parallel
/// group of 2 runs it (the group's sums given as twice this rank's, the CPU's), in f32:
/// each half against the CPU's, judged as `rmsnorm_matches`.
#[test]
fn qk_norm_halves_match() {
    let Some(gpu) = gpu("qk_norm_halves_match") else { return };
    let mut rng = seeded("qk_norm_halves");
    let (kv, hs, parts) = (2, C / NH, 2);
    let h = QkNormHeads { heads: NH, kv_heads: kv, span: QkNormSpan::Projection };
    let r = h.span.rows(NH, kv, hs);
    let shape = [B, T, r.token_width()];
    let (x, dx) = (rng.uniform(N * shape[2], 2.0), rng.uniform(N * shape[2], 1.0));
    let (wq, wk) = (rng.uniform(r.q_width, 1.0), rng.uniform(r.k_width, 1.0));
    let stats = [N * r.rows()];
    // The group's sums: this rank's twice, the CPU's, so both devices start each half alike.
    let twice = |t: &Tensor, dev: &dyn Device| dev.to_host(t).iter().map(|v| 2.0 * v).collect::<Vec<f32>>();
    let cpu = cpu();
    let (group_sums, group_dots) = {
        let (xs, ws) =
            (put(&cpu, &x, &shape), [param(&cpu, &wq, &[r.q_width]), param(&cpu, &wk, &[r.k_width])]);
        let mut sums = cpu.zeros(&stats, Category::Workspace);
        cpu.qk_norm_sum_squares(&xs, &mut sums, h);
        let (mut y, mut rstd) = (put(&cpu, &x, &shape), put(&cpu, &twice(&sums, &cpu), &stats));
        cpu.qk_norm_forward_summed(&mut y, &mut rstd, [&ws[0], &ws[1]], h, parts, 1e-6);
        let mut dots = cpu.zeros(&stats, Category::Workspace);
        cpu.qk_norm_backward_dots(&put(&cpu, &dx, &shape), &xs, [&ws[0], &ws[1]], &rstd, &mut dots, h);
        (twice(&sums, &cpu), twice(&dots, &cpu))
    };
    let run = |dev: &dyn Device| {
        let (xs, ws) = (put(dev, &x, &shape), [param(dev, &wq, &[r.q_width]), param(dev, &wk, &[r.k_width])]);
        let w = [&ws[0], &ws[1]];
        let (mut sums, mut dots) =
            (dev.zeros(&stats, Category::Workspace), dev.zeros(&stats, Category::Workspace));
        dev.qk_norm_sum_squares(&xs, &mut sums, h);
        let (mut y, mut rstd) = (put(dev, &x, &shape), put(dev, &group_sums, &stats));
        dev.qk_norm_forward_summed(&mut y, &mut rstd, w, h, parts, 1e-6);
        let mut d = put(dev, &dx, &shape);
        dev.qk_norm_backward_dots(&d, &xs, w, &rstd, &mut dots, h);
        let mut dw =
            [grad(dev, &vec![0.0; r.q_width], &[r.q_width]), grad(dev, &vec![0.0; r.k_width], &[r.k_width])];
        let [dq, dk] = &mut dw;
        dev.qk_norm_backward_summed(
            &mut d,
            [dq, dk],
            &xs,
            w,
            &rstd,
            (&put(dev, &group_dots, &stats), parts),
            h,
        );
        let [dwq, dwk] = dw;
        [sums, y, rstd, dots, d, dwq, dwk].map(|t| dev.to_host(&t))
    };
    let names = ["sums of squares", "out", "rstd", "dots", "dinp", "dq_weight", "dk_weight"];
    let (want, got) = (run(&cpu), run(&gpu));
    for (what, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
        assert_close(&format!("{what} over {parts} parts"), g, w, TOL);
    }
}

/// The norm fused with the residual stream (LayerNorm, then RMSNorm), in f32 and then with
/// bf16 activations from the same values rounded to bf16, on one GPU: residual = a + b and
/// the norm of it are bitwise `add` and then the unfused norm there (what a recompute of the
/// norm from the stored residual gives), as are the parameter gradients, and in f32 the
/// input gradient with the residual gradient folded in is bitwise the unfused gradient and
/// then `accumulate`. Against the
/// CPU's fused op: as `layernorm_matches` and `rmsnorm_matches` (bf16 activations half a
/// bf16 step further).
#[test]
fn residual_norms_match() {
    let Some(gpu) = gpu("residual_norms_match") else { return };
    let mut rng = seeded("residual_norms");
    let (a, b): (Vec<f32>, _) =
        (rng.uniform(N * C, 2.0).iter().map(|x| x + 0.5).collect(), rng.uniform(N * C, 1.0));
    let (w, bias, dout, dres) =
        (rng.uniform(C, 1.0), rng.uniform(C, 1.0), rng.uniform(N * C, 1.0), rng.uniform(N * C, 1.0));
    let (dw0, db0) = (rng.uniform(C, 1.0), rng.uniform(C, 1.0));
    // [residual, out, the statistics, dinp, dweight (, dbias)], fused and unfused.
    let run = |dev: &dyn Device, rms: bool, xs: [&[f32]; 4]| {
        let [a, b, dout, dres] = xs.map(|x| put(dev, x, &[B, T, C]));
        let (w, bias) = (param(dev, &w, &[C]), param(dev, &bias, &[C]));
        let stats = |n| (0..n).map(|_| dev.zeros(&[N], Category::Workspace)).collect::<Vec<_>>();
        let nstats = if rms { 1 } else { 2 };
        let ([mut residual, mut out, mut plain_res, mut plain_out], mut st, mut plain_st) =
            ([(); 4].map(|_| act_zeros(dev, &[B, T, C])), stats(nstats), stats(nstats));
        let [mut dinp, mut plain_dinp] = [(); 2].map(|_| put(dev, &vec![f32::NAN; N * C], &[B, T, C]));
        let [mut dw, mut plain_dw] = [(); 2].map(|_| grad(dev, &dw0, &[C]));
        let [mut db, mut plain_db] = [(); 2].map(|_| grad(dev, &db0, &[C]));
        dev.add(&mut plain_res, &a, &b);
        match (&mut st[..], &mut plain_st[..]) {
            ([rstd], [prstd]) => {
                dev.rmsnorm_residual_forward(&mut residual, &mut out, rstd, &a, &b, &w, 1e-6);
                dev.rmsnorm_forward(&mut plain_out, prstd, &plain_res, &w, 1e-6);
                dev.rmsnorm_residual_backward(&mut dinp, &dres, &mut dw, &dout, &residual, &w, rstd);
                dev.rmsnorm_backward(&mut plain_dinp, &mut plain_dw, &dout, &plain_res, &w, prstd);
            }
            ([mean, rstd], [pmean, prstd]) => {
                dev.layernorm_residual_forward(&mut residual, &mut out, mean, rstd, &a, &b, &w, &bias, 1e-5);
                dev.layernorm_forward(&mut plain_out, pmean, prstd, &plain_res, &w, &bias, 1e-5);
                dev.layernorm_residual_backward(
                    &mut dinp, &dres, &mut dw, &mut db, &dout, &residual, &w, mean, rstd,
                );
                dev.layernorm_backward(
                    &mut plain_dinp,
                    &mut plain_dw,
                    &mut plain_db,
                    &dout,
                    &plain_res,
                    &w,
                    pmean,
                    prstd,
                );
            }
            _ => unreachable!(),
        }
        dev.accumulate(&mut plain_dinp, &dres);
        let host = |ts: Vec<&Tensor>| ts.into_iter().map(|t| dev.to_host(t)).collect::<Vec<_>>();
        let fused = [vec![&residual, &out], st.iter().collect(), vec![&dinp, &dw, &db]].concat();
        let plain = [
            vec![&plain_res, &plain_out],
            plain_st.iter().collect(),
            vec![&plain_dinp, &plain_dw, &plain_db],
        ]
        .concat();
        (host(fused), host(plain))
    };
    let round = |x: &[f32]| x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect::<Vec<_>>();
    let rounded = [round(&a), round(&b), round(&dout), round(&dres)];
    let bf16 = bf16_gpu("residual_norms_match");
    for rms in [false, true] {
        let mut names = vec!["residual", "out", "rstd", "dinp", "dweight", "dbias"];
        if !rms {
            names.insert(2, "mean");
        }
        let what = |part: &str| format!("{} {part}", if rms { "RMSNorm" } else { "LayerNorm" });
        let ((want, _), (got, plain)) =
            (run(&cpu(), rms, [&a, &b, &dout, &dres]), run(&gpu, rms, [&a, &b, &dout, &dres]));
        for (name, ((g, w), p)) in names.iter().zip(got.iter().zip(&want).zip(&plain)) {
            assert_close(&what(name), g, w, TOL);
            assert_bitwise(&what(&format!("{name} vs the unfused ops")), g, p);
        }
        let Some(bf16) = &bf16 else { continue };
        let xs = [&rounded[0][..], &rounded[1], &rounded[2], &rounded[3]];
        let (got, plain) = run(bf16, rms, xs);
        // The residual against the CPU's a + b; the rest against the CPU's op on the residual
        // as stored (plus zero, which changes no value), which the norm reads.
        let residual_want = run(&cpu(), rms, xs).0.swap_remove(0);
        let zero = vec![0.0; N * C];
        let (want, _) = run(&cpu(), rms, [&got[0], &zero, xs[2], xs[3]]);
        for (i, (name, ((g, w), p))) in names.iter().zip(got.iter().zip(&want).zip(&plain)).enumerate() {
            let w = if i == 0 { &residual_want } else { w };
            // residual, out and dinp are bf16, each rounded once (the input gradient where
            // the unfused pair rounded twice).
            let bf16_out = matches!(*name, "residual" | "out" | "dinp");
            assert_close(
                &format!("bf16 {}", what(name)),
                g,
                w,
                if bf16_out { 2f64.powi(-8) + TOL } else { TOL },
            );
            if *name != "dinp" {
                assert_bitwise(&what(&format!("bf16 {name} vs the unfused ops")), g, p);
            }
        }
    }
}

#[test]
fn matmul_matches_in_both_layouts() {
    let Some(gpu) = gpu("matmul_matches_in_both_layouts") else { return };
    let mut rng = seeded("matmul");
    let (ic, oc) = (C, 3 * C + 5);
    let (inp, w, bias, dout) =
        (rng.uniform(N * ic, 1.0), rng.uniform(ic * oc, 1.0), rng.uniform(oc, 1.0), rng.uniform(N * oc, 1.0));
    let (dw0, db0) = (rng.uniform(ic * oc, 1.0), rng.uniform(oc, 1.0));
    for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
        let w_shape = match layout {
            WeightLayout::InOut => [ic, oc],
            WeightLayout::OutIn => [oc, ic],
        };
        let run = |dev: &dyn Device| {
            let (x, wt, bias) = (put(dev, &inp, &[B, T, ic]), put(dev, &w, &w_shape), put(dev, &bias, &[oc]));
            let mut out = dev.zeros(&[B, T, oc], Category::Workspace);
            dev.matmul_forward(&mut out, &x, &wt, layout, Some(&bias));
            let mut out_nobias = dev.zeros(&[B, T, oc], Category::Workspace);
            dev.matmul_forward(&mut out_nobias, &x, &wt, layout, None);
            let dout = put(dev, &dout, &[B, T, oc]);
            let mut dinp = put(dev, &vec![f32::NAN; N * ic], &[B, T, ic]);
            dev.matmul_backward_input(&mut dinp, &dout, &wt, layout);
            let (mut dw, mut db) = (put(dev, &dw0, &w_shape), put(dev, &db0, &[oc]));
            dev.matmul_backward_weight(&mut dw, Some(&mut db), &dout, &x, layout);
            [out, out_nobias, dinp, dw, db].map(|t| dev.to_host(&t))
        };
        let (want, got) = (run(&cpu()), run(&gpu));
        for (what, (g, w)) in
            ["out", "out without bias", "dinp", "dweight", "dbias"].iter().zip(got.iter().zip(&want))
        {
            assert_close(&format!("{what} ({layout:?})"), g, w, TOL);
        }
    }
}

#[test]
fn bf16_matmul_is_close_to_fp32() {
    let Some(gpu) = bf16_gpu("bf16_matmul_is_close_to_fp32") else { return };
    let mut rng = seeded("bf16 matmul");
    let (inp, w, bias, dout) =
        (rng.uniform(N * C, 1.0), rng.uniform(C * C, 1.0), rng.uniform(C, 1.0), rng.uniform(N * C, 1.0));
    let dw0 = rng.uniform(C * C, 0.1);
    let run = |dev: &dyn Device| {
        // bf16 activations and the weight's bf16 copy as operands, nothing cast per call.
        let (x, w, bias) = (put(dev, &inp, &[N, C]), param(dev, &w, &[C, C]), param(dev, &bias, &[C]));
        let mut out = act_zeros(dev, &[N, C]);
        dev.matmul_forward(&mut out, &x, &w, WeightLayout::InOut, Some(&bias));
        let (dout, mut dinp) = (put(dev, &dout, &[N, C]), act_zeros(dev, &[N, C]));
        dev.matmul_backward_input(&mut dinp, &dout, &w, WeightLayout::InOut);
        let mut dw = grad(dev, &dw0, &[C, C]);
        dev.matmul_backward_weight(&mut dw, None, &dout, &x, WeightLayout::InOut);
        [out, dinp, dw].map(|t| dev.to_host(&t))
    };
    // bf16 keeps 8 significant bits: a few parts in a thousand of each product.
    let (got, want) = (run(&gpu), run(&cpu()));
    for (what, (g, w)) in ["out", "dinp", "dweight"].iter().zip(got.iter().zip(&want)) {
        assert_close(&format!("bf16 matmul {what}"), g, w, 2e-2);
    }
}

/// The products whose epilogue does the next op's work (cuBLASLt): the forward with its
/// bias, and the input gradient through GELU. At widths cuBLASLt takes (multiples of 8)
/// they launch no kernel of ours; at an odd width the input gradient falls back to the
/// product and `gelu_backward`, one launch. With the fusion off, the bias add and the GELU
/// backward are a launch each at any width. Each path matches the CPU, in fp32 to TOL and
/// under bf16 to bf16's precision, in both weight layouts.
#[test]
fn epilogue_products_match_and_launch_no_kernel_of_ours() {
    let test = "epilogue_products_match_and_launch_no_kernel_of_ours";
    let Some(fp32) = gpu(test) else { return };
    let Some(bf16) = bf16_gpu(test) else { return };
    let Some(unfused) = bf16_gpu(test).map(|gpu| gpu.with_epilogue_fusion(false)) else { return };
    let mut rng = seeded(test);
    // Each case whose launches were not the expected ones, said at the end, all of them.
    let mut unexpected = Vec::new();
    for (gpu, tol, fused) in [(&fp32, TOL, true), (&bf16, 2e-2, true), (&unfused, 2e-2, false)] {
        // (IC, kernels of ours the forward and the input gradient launch): 96 suits
        // cuBLASLt's aux matrix, 99 does not.
        let per_op = u64::from(!fused);
        for (ic, launches) in [(C, [per_op, per_op]), (C + 3, [per_op, 1])] {
            let oc = C + 8;
            let (inp, w, bias, dout) = (
                rng.uniform(N * ic, 2.0),
                rng.uniform(ic * oc, 1.0),
                rng.uniform(oc, 1.0),
                rng.uniform(N * oc, 1.0),
            );
            for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
                let w_shape = match layout {
                    WeightLayout::InOut => [ic, oc],
                    WeightLayout::OutIn => [oc, ic],
                };
                // The results, and how many kernels of ours each op launched (the uploads'
                // casts to bf16 are not counted).
                let run = |dev: &dyn Device, launches: &dyn Fn() -> u64| {
                    let (x, wt, bias) =
                        (put(dev, &inp, &[N, ic]), param(dev, &w, &w_shape), param(dev, &bias, &[oc]));
                    let (mut out, dout) = (act_zeros(dev, &[N, oc]), put(dev, &dout, &[N, oc]));
                    let mut dinp = put(dev, &vec![f32::NAN; N * ic], &[N, ic]);
                    let before = launches();
                    dev.matmul_forward(&mut out, &x, &wt, layout, Some(&bias));
                    let between = launches();
                    dev.matmul_backward_input_gelu(&mut dinp, &dout, &wt, layout, &x);
                    let launched = [between - before, launches() - between];
                    ([out, dinp].map(|t| dev.to_host(&t)), launched)
                };
                let (got, launched) = run(gpu, &|| gpu.launches());
                let what = format!("{:?}, IC {ic}, {layout:?}", gpu.activation_dtype());
                if launched != launches {
                    unexpected.push(format!("{what}: {launched:?} where {launches:?} were due"));
                }
                let (want, _) = run(&cpu(), &|| 0);
                assert_close(&format!("out with bias, {what}"), &got[0], &want[0], tol);
                assert_close(&format!("dinp through gelu, {what}"), &got[1], &want[1], tol);
            }
        }
    }
    assert!(unexpected.is_empty(), "kernels of ours launched by [forward, dinp]:\n{}", unexpected.join("\n"));
}

#[test]
fn bf16_tensors_round_as_the_half_crate() {
    let Some(gpu) = gpu("bf16_tensors_round_as_the_half_crate") else { return };
    let mut values = seeded("bf16 rounding").uniform(10_000, 1e4);
    // Ties to even both ways, the largest finite values, subnormals, infinities.
    values.extend([1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, f32::MAX, -f32::MAX, 1e-40, -1e-40, 0.0, -0.0]);
    values.extend([f32::INFINITY, f32::NEG_INFINITY]);
    let t = gpu.from_host_of(DType::Bf16, &values, &[values.len()], Category::Workspace);
    assert_eq!(t.bytes(), 2 * values.len(), "two bytes an element");
    let want: Vec<f32> = values.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
    assert_bitwise("bf16 round trip", &gpu.to_host(&t), &want);
    // A copy on the GPU keeps the bits.
    let mut copy = gpu.zeros_of(DType::Bf16, &[values.len()], Category::Workspace);
    gpu.copy(&mut copy, &t);
    assert_bitwise("bf16 copy", &gpu.to_host(&copy), &want);
    let nan = gpu.from_host_of(DType::Bf16, &[f32::NAN], &[1], Category::Workspace);
    assert!(gpu.to_host(&nan)[0].is_nan());
}

/// The GPU's attention core keeping `kind` against the CPU's, which keeps probabilities:
/// out and dqkv, and P and P' (with the causal mask's zeros) where the GPU keeps them too.
/// At `dims` = [B, T, C, NH, KV] (NH query heads of C / NH on KV key/value heads), under
/// `mask`, within `tol`.
fn attention_case(
    gpu: &CudaDevice,
    kind: AttentionSaves,
    spec: Option<DropoutSpec>,
    mask: CausalMask,
    dims: [usize; 5],
    tol: f64,
    rng: &mut SplitMix64,
) {
    let [b, t, c, nh, kv] = dims;
    let (n, width) = (b * t, c + 2 * kv * (c / nh));
    let (qkv, dout) = (rng.uniform(n * width, 2.0), rng.uniform(n * c, 1.0));
    let run = |dev: &dyn Device, kind| {
        let qkv = put(dev, &qkv, &[b, t, width]);
        let mut out = act_zeros(dev, &[b, t, c]);
        let mut saved = dev.empty_attention_saved(kind, [b, nh, t], spec.is_some(), Category::Workspace);
        dev.attention_forward(Some(&mut out), &mut saved, spec, &qkv, nh, kv, mask);
        let mut dqkv = put(dev, &vec![f32::NAN; n * width], &[b, t, width]);
        let dout = put(dev, &dout, &[b, t, c]);
        dev.attention_backward(&mut dqkv, &dout, &out, &qkv, &saved, spec, nh, kv, mask);
        let probs = match &saved {
            AttentionSaved::Probabilities { probs, dropped } => {
                [Some(probs), dropped.as_ref()].into_iter().flatten().map(|t| dev.to_host(t)).collect()
            }
            AttentionSaved::RowLogSumExp { .. } => vec![],
        };
        ([out, dqkv].map(|t| dev.to_host(&t)), probs)
    };
    let (want, got) = (run(&cpu(), AttentionSaves::Probabilities), run(gpu, kind));
    let dropout = if spec.is_some() { "with dropout" } else { "without dropout" };
    let case = format!("keeping {kind:?} {dropout}, {nh} query heads on {kv} key/value heads, {mask:?}");
    for (what, (g, w)) in ["out", "dqkv"].iter().zip(got.0.iter().zip(&want.0)) {
        assert_close(&format!("attention {what} {case}"), g, w, tol);
    }
    if kind == AttentionSaves::Probabilities {
        for (what, (g, w)) in ["P", "P'"].iter().zip(got.1.iter().zip(&want.1)) {
            assert_close(&format!("attention {what} {case}"), g, w, tol);
        }
        let masked = |att: &[f32]| att.iter().map(|&p| p == 0.0).collect::<Vec<_>>();
        assert_eq!(masked(&got.1[0]), masked(&want.1[0]), "the mask differs {case}");
    }
}

#[test]
fn attention_matches_with_and_without_dropout() {
    let Some(gpu) = gpu("attention_matches_with_and_without_dropout") else { return };
    let mut rng = seeded("attention");
    // The fused core the device runs at this head size (24), and the unfused one it runs
    // above 64.
    // Multi-head, and grouped-query attention with two and four query heads a key/value head.
    assert_eq!(AttentionSaves::cuda(C / NH, DType::F32), AttentionSaves::RowLogSumExp);
    // Each under the causal mask and a sliding window of 9 keys.
    for kind in [AttentionSaves::RowLogSumExp, AttentionSaves::Probabilities] {
        for (kv, mask) in
            [NH, 2, 1].into_iter().flat_map(|kv| [(kv, CausalMask::Full), (kv, CausalMask::Window(9))])
        {
            attention_case(&gpu, kind, None, mask, [B, T, C, NH, kv], TOL, &mut rng);
            let spec = Some(dropout(0.2, 3, DropoutSite::AttentionProbs));
            attention_case(&gpu, kind, spec, mask, [B, T, C, NH, kv], TOL, &mut rng);
        }
    }
    assert_eq!(gpu.ledger().live(Category::Workspace), 0, "scratch outlived the ops");
}

/// A tensor-parallel rank's heads draw the whole layer's dropout mask: here NH heads from
/// head 3 of 2 NH + 1 (each batch row's heads consecutive among the layer's, the batch rows
/// not), through the fused core and the unfused one, multi-head and grouped. A GPU that drew
/// its own heads' mask would differ from the CPU in P' and everything after it.
#[test]
fn attention_dropout_of_a_ranks_heads_draws_the_layers_mask() {
    let Some(gpu) = gpu("attention_dropout_of_a_ranks_heads_draws_the_layers_mask") else { return };
    let mut rng = seeded("attention heads");
    let heads = Some(HeadRange { first: 3, total: 2 * NH + 1 });
    let spec = Some(DropoutSpec { heads, ..dropout(0.2, 3, DropoutSite::AttentionProbs) });
    for kind in [AttentionSaves::RowLogSumExp, AttentionSaves::Probabilities] {
        for kv in [NH, 2] {
            attention_case(&gpu, kind, spec, CausalMask::Full, [B, T, C, NH, kv], TOL, &mut rng);
        }
    }
}

/// Llama's head size of 128, above the fp32 fused kernels', through the unfused core: 4
/// query heads on 2 key/value heads at T = 40.
#[test]
fn grouped_attention_at_head_size_128_matches() {
    let Some(gpu) = gpu("grouped_attention_at_head_size_128_matches") else { return };
    let mut rng = seeded("attention 128");
    let kind = AttentionSaves::cuda(128, DType::F32);
    assert_eq!(kind, AttentionSaves::Probabilities);
    let spec = Some(dropout(0.2, 3, DropoutSite::AttentionProbs));
    for spec in [None, spec] {
        attention_case(&gpu, kind, spec, CausalMask::Full, [1, 40, 512, 4, 2], TOL, &mut rng);
    }
    assert_eq!(gpu.ledger().live(Category::Workspace), 0, "scratch outlived the ops");
}

#[test]
fn bf16_attention_on_tensor_cores_is_close_to_fp32() {
    let Some(gpu) = bf16_gpu("bf16_attention_on_tensor_cores_is_close_to_fp32") else { return };
    let mut rng = seeded("bf16 attention");
    let spec = Some(dropout(0.2, 3, DropoutSite::AttentionProbs));
    // bf16 qkv, out, dout and dqkv, and bf16 operands of every product
    // (fused_attention_mma.cu), judged against the largest magnitude as
    // kernels/tests/simt/fused_attention_mma.rs judges the same kernels: heads of 64 with a
    // partial last tile, and of 32 and 16 at odd T, multi-head and 8 query heads on 2
    // key/value heads; and the kernels for larger heads, Llama's 128 (4 query heads on 2)
    // and 80.
    let dims = [
        [2, 100, 128, 2, 2],
        [2, 77, 64, 2, 2],
        [1, 37, 48, 3, 3],
        [2, 77, 128, 8, 2],
        [1, 70, 512, 4, 2],
        [1, 45, 160, 2, 2],
    ];
    for dims in dims {
        assert_eq!(AttentionSaves::cuda(dims[2] / dims[3], DType::Bf16), AttentionSaves::RowLogSumExp);
        attention_case(&gpu, AttentionSaves::RowLogSumExp, None, CausalMask::Full, dims, 2e-2, &mut rng);
        attention_case(&gpu, AttentionSaves::RowLogSumExp, spec, CausalMask::Full, dims, 2e-2, &mut rng);
        // A sliding window of 20 keys: key tiles before it skipped, dq's chains ended early.
        attention_case(
            &gpu,
            AttentionSaves::RowLogSumExp,
            spec,
            CausalMask::Window(20),
            dims,
            2e-2,
            &mut rng,
        );
    }
    assert_eq!(gpu.ledger().live(Category::Workspace), 0, "scratch outlived the ops");
}

/// The chained backward (every gradient from the key side, each query tile's dq summed
/// over the key tiles' blocks in turn, turns.cuh) at GPT-2 124M's attention with B = 16,
/// 3072 blocks; at TinyLlama 1.1B's (32 query heads of 64 on 4 key/value heads, so that a
/// block hands on turns for 8 query heads in a row) with B = 8, 512 blocks; and at Llama 3
/// 8B's (32 query heads of 128 on 8, the kernels for heads up to 128, whose query tiles of
/// 32 rows two warps share) with B = 2, 256 blocks: most blocks wait for their turns
/// behind blocks still running, where a missing fence would show as a dq that changes from
/// run to run, and a wrong order of tickets as a hang. dqkv must be the same bits in five
/// runs, and at B = 2 close to the CPU's. Only on a real GPU:
/// the stand-in's emulator runs one block at a time, which cannot show either fault (the
/// SIMT harness checks the order of the turns), and would take an hour at these sizes.
#[test]
fn the_chained_attention_backward_is_bitwise_run_to_run_at_gpt2_size() {
    let test = "the_chained_attention_backward_is_bitwise_run_to_run_at_gpt2_size";
    let Some(gpu) = bf16_gpu(test) else { return };
    if gpu.name().contains(kernels::STANDIN_GPU_NAME) {
        eprintln!(
            "SKIP {test}: the stand-in runs one block at a time, and these sizes would take it an hour"
        );
        return;
    }
    let mut rng = seeded(test);
    let spec = Some(dropout(0.1, 5, DropoutSite::AttentionProbs));
    for [b, t, c, nh, kv] in [[16, 1024, 768, 12, 12], [8, 1024, 2048, 32, 4], [2, 1024, 4096, 32, 8]] {
        let (n, width) = (b * t, c + 2 * kv * (c / nh));
        let (qkv, dout) = (rng.uniform(n * width, 2.0), rng.uniform(n * c, 1.0));
        let (qkv, dout) = (put(&gpu, &qkv, &[b, t, width]), put(&gpu, &dout, &[b, t, c]));
        let mut out = act_zeros(&gpu, &[b, t, c]);
        let mut saved =
            gpu.empty_attention_saved(AttentionSaves::RowLogSumExp, [b, nh, t], true, Category::Workspace);
        gpu.attention_forward(Some(&mut out), &mut saved, spec, &qkv, nh, kv, CausalMask::Full);
        let backward = || {
            let mut dqkv = put(&gpu, &vec![f32::NAN; n * width], &[b, t, width]);
            gpu.attention_backward(&mut dqkv, &dout, &out, &qkv, &saved, spec, nh, kv, CausalMask::Full);
            gpu.to_host(&dqkv).iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
        };
        let first = backward();
        for run in 1..5 {
            let again = backward();
            let differ = first.iter().zip(&again).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "{nh} on {kv}, run {run}: {differ} elements of dqkv differ from the first run's"
            );
        }
        attention_case(
            &gpu,
            AttentionSaves::RowLogSumExp,
            spec,
            CausalMask::Full,
            [2, t, c, nh, kv],
            2e-2,
            &mut rng,
        );
    }
}

/// A kernel of this directory's own, compiled by NVRTC for the GPU and loaded on a context
/// of its own, for a test of what only a real GPU computes: None, saying why, on the
/// stand-in (whose kernels are kernels/cuda's families under the emulator, so it would
/// compare the emulator with itself) and before sm_80 (no bf16 mma or bf16x2 conversion).
fn sm80_test_kernel(
    test: &str,
    source: &'static KernelSource,
) -> Option<(std::sync::Arc<cudarc::driver::CudaStream>, cudarc::driver::CudaFunction)> {
    use cudarc::driver::CudaContext;
    let gpu = gpu(test)?;
    let ctx = CudaContext::new(gpu.ordinal()).expect("a context");
    let (major, minor) = ctx.compute_capability().expect("a compute capability");
    if ctx.name().is_ok_and(|n| n == kernels::STANDIN_GPU_NAME) {
        eprintln!("SKIP {test}: the stand-in GPU runs kernels/cuda under the emulator, so it would compare the emulator with itself");
        return None;
    }
    if major < 8 {
        eprintln!(
            "SKIP {test}: no bf16 tensor-core instructions before sm_80 (this GPU is sm_{major}{minor})"
        );
        return None;
    }
    let ptx = compile(source, &format!("compute_{major}{minor}")).unwrap_or_else(|e| panic!("{e}"));
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).expect("the module loads");
    let function = module.load_function(source.kernels[0]).expect("the kernel");
    Some((ctx.default_stream(), function))
}

#[test]
fn tensor_core_mma_is_the_emulators() {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    // The kernel of kernels/tests/simt/mma.rs, whose fragments follow the PTX ISA's layouts:
    // the tensor cores must compute the plain matrix product that the emulator computes.
    const SOURCE: KernelSource = KernelSource {
        name: "mma_layout.cu",
        source: include_str!("mma_layout.cu"),
        kernels: &["mma_layout"],
    };
    let Some((stream, function)) = sm80_test_kernel("tensor_core_mma_is_the_emulators", &SOURCE) else {
        return;
    };
    let mut rng = seeded("tensor core mma");
    // Multiples of 1/8 up to 2: exact in bf16, and every product and sum exact in fp32.
    let mut eighths = |n| rng.uniform(n, 2.0).iter().map(|x| (x * 8.0).round() / 8.0).collect::<Vec<f32>>();
    let (a, b, c) = (eighths(16 * 16), eighths(16 * 8), eighths(16 * 8));
    let want: Vec<f32> = (0..16 * 8)
        .map(|e| c[e] + (0..16).map(|k| a[e / 8 * 16 + k] * b[k * 8 + e % 8]).sum::<f32>())
        .collect();
    let device = |x: &[f32]| {
        let mut d = stream.alloc_zeros::<f32>(x.len()).expect("an allocation");
        stream.memcpy_htod(x, &mut d).expect("a copy");
        d
    };
    let (da, db, dc, mut dd) = (device(&a), device(&b), device(&c), device(&[f32::NAN; 16 * 8]));
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&function);
    launch.arg(&mut dd).arg(&da).arg(&db).arg(&dc);
    // SAFETY: the kernel takes four float buffers of 128, 256, 128 and 128 elements.
    unsafe { launch.launch(cfg) }.expect("the launch");
    let mut got = vec![0.0f32; 16 * 8];
    stream.memcpy_dtoh(&dd, &mut got).expect("a copy back");
    assert_bitwise("tensor-core mma", &got, &want);
}

/// load_b_pair's and load_bt_pair's ldmatrix must give each lane the B fragments of the PTX
/// ISA's layout, as the emulator's reading of ldmatrix does (kernels/tests/simt/mma.rs,
/// whose expected words are written out again here): every bf16 of the staged tile
/// differs, so a wrong row, column or lane fails.
#[test]
fn ldmatrix_gives_the_emulators_b_fragments() {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    const SOURCE: KernelSource = KernelSource {
        name: "ldmatrix_layout.cu",
        source: include_str!("ldmatrix_layout.cu"),
        kernels: &["ldmatrix_layout"],
    };
    let Some((stream, function)) = sm80_test_kernel("ldmatrix_gives_the_emulators_b_fragments", &SOURCE)
    else {
        return;
    };
    let x: Vec<u32> = (1..=256u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let bf16 = |row: usize, col: usize| x[row * 16 + col / 2] >> (16 * (col % 2)) & 0xffff;
    let mut want = Vec::new();
    for (s, lane) in (0..4).flat_map(|s| (0..32).map(move |lane| (s, lane))) {
        let (g, t) = (lane / 4, lane % 4);
        if s < 2 {
            // Lane 4g + t: words 8s + t and 8s + 4 + t of rows g and 8 + g.
            want.extend([g, g + 8].into_iter().flat_map(|row| [0, 4].map(|w| x[row * 16 + 8 * s + w + t])));
        } else {
            // Columns 16c + g and 16c + 8 + g down rows 2t, 2t + 1 and 2t + 8, 2t + 9.
            let c = s - 2;
            for col in [16 * c + g, 16 * c + 8 + g] {
                want.extend([2 * t, 2 * t + 8].map(|k| bf16(k, col) | bf16(k + 1, col) << 16));
            }
        }
    }
    let mut dx = stream.alloc_zeros::<u32>(x.len()).expect("an allocation");
    stream.memcpy_htod(&x, &mut dx).expect("a copy");
    let mut dout = stream.alloc_zeros::<u32>(want.len()).expect("an allocation");
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&function);
    launch.arg(&mut dout).arg(&dx);
    // SAFETY: the kernel reads 256 words and writes 512, one warp.
    unsafe { launch.launch(cfg) }.expect("the launch");
    let mut got = vec![0u32; want.len()];
    stream.memcpy_dtoh(&dout, &mut got).expect("a copy back");
    assert_eq!(got, want, "ldmatrix's B fragments");
}

/// pack_bf16, which rounds the attention's P and dS for the tensor cores and its outputs for
/// storage, is one cvt.rn.bf16x2.f32 on the GPU, and bf16_bits, which rounds every other
/// bf16 store, one cvt.rn.bf16.f32: each must round as the CPU does (the `half` crate), bit
/// for bit, the pair's low half first. Random bit patterns of every magnitude, ties
/// with even and odd kept bits, subnormals, zeros, infinities and the largest finite values,
/// which round to infinity.
#[test]
fn bf16_packing_rounds_as_the_cpu() {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    const SOURCE: KernelSource = KernelSource {
        name: "pack_rounding.cu",
        source: include_str!("pack_rounding.cu"),
        kernels: &["pack_rounding"],
    };
    let Some((stream, function)) = sm80_test_kernel("bf16_packing_rounds_as_the_cpu", &SOURCE) else {
        return;
    };
    let mut rng = seeded("bf16 packing");
    let mut x: Vec<f32> =
        (0..1 << 16).map(|_| f32::from_bits(rng.next_u64() as u32)).filter(|v| !v.is_nan()).collect();
    for kept in [0x3f80_u32, 0x3f81, 0x0001, 0x0080, 0x7f7f, 0xbf80, 0xbf81] {
        x.extend([kept << 16 | 0x8000, kept << 16 | 0x7fff, kept << 16 | 0x8001].map(f32::from_bits));
    }
    x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-40]);
    x.truncate(x.len() / 2 * 2);
    let pairs = x.len() / 2;
    let want: Vec<u32> = x
        .chunks(2)
        .map(|p| {
            u32::from(half::bf16::from_f32(p[0]).to_bits())
                | u32::from(half::bf16::from_f32(p[1]).to_bits()) << 16
        })
        .collect();
    let mut dx = stream.alloc_zeros::<f32>(x.len()).expect("an allocation");
    stream.memcpy_htod(&x, &mut dx).expect("a copy");
    let mut dpacked = stream.alloc_zeros::<u32>(pairs).expect("an allocation");
    let mut deach = stream.alloc_zeros::<u16>(x.len()).expect("an allocation");
    let cfg = LaunchConfig {
        grid_dim: (pairs.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&function);
    let n = pairs as i32;
    launch.arg(&mut dpacked).arg(&mut deach).arg(&dx).arg(&n);
    // SAFETY: the kernel writes `pairs` words and 2 * `pairs` half-words from 2 * `pairs`
    // floats, and the grid covers them.
    unsafe { launch.launch(cfg) }.expect("the launch");
    let (mut packed, mut each) = (vec![0u32; pairs], vec![0u16; x.len()]);
    stream.memcpy_dtoh(&dpacked, &mut packed).expect("a copy back");
    stream.memcpy_dtoh(&deach, &mut each).expect("a copy back");
    if let Some(i) = packed.iter().zip(&want).position(|(g, w)| g != w) {
        panic!(
            "pair {i} ({:e}, {:e}): the GPU packs {:#010x}, the CPU rounds to {:#010x}",
            x[2 * i],
            x[2 * i + 1],
            packed[i],
            want[i]
        );
    }
    let halves = want.iter().flat_map(|w| [*w as u16, (w >> 16) as u16]);
    if let Some((i, (g, w))) = each.iter().zip(halves).enumerate().find(|(_, (g, w))| **g != *w) {
        panic!("element {i} ({:e}): the GPU rounds to {g:#06x}, the CPU to {w:#06x}", x[i]);
    }
}

/// A zero-centred norm weight's 1 + w: one f32 add, the CPU's bits on any GPU.
#[test]
fn add_scalar_matches_bit_for_bit() {
    let Some(gpu) = gpu("add_scalar_matches_bit_for_bit") else { return };
    let a = seeded("add_scalar").uniform(4099, 0.1);
    let run = |dev: &dyn Device| {
        let mut out = dev.zeros(&[a.len()], Category::Workspace);
        dev.add_scalar(&mut out, &put(dev, &a, &[a.len()]), 1.0);
        dev.to_host(&out)
    };
    assert!(run(&gpu) == run(&cpu()), "1 + w differs from the CPU's");
}

/// Gemma's embedding multiplier in place: one f32 product, the CPU's bits on any GPU.
#[test]
fn scale_matches_bit_for_bit() {
    let Some(gpu) = gpu("scale_matches_bit_for_bit") else { return };
    let a = seeded("scale").uniform(4099, 2.0);
    let run = |dev: &dyn Device| {
        let mut t = put(dev, &a, &[a.len()]);
        dev.scale(&mut t, (2048f64).sqrt() as f32);
        dev.to_host(&t)
    };
    assert!(run(&gpu) == run(&cpu()), "the product differs from the CPU's");
}

#[test]
fn gelu_matches() {
    let Some(gpu) = gpu("gelu_matches") else { return };
    let mut rng = seeded("gelu");
    let (x, dout) = (rng.uniform(50_000, 6.0), rng.uniform(50_000, 1.0));
    let run = |dev: &dyn Device| {
        let x = put(dev, &x, &[x.len()]);
        let mut out = dev.zeros(&[x.len()], Category::Workspace);
        dev.gelu_forward(&mut out, &x);
        let mut dinp = dev.zeros(&[x.len()], Category::Workspace);
        dev.gelu_backward(&mut dinp, &x, &put(dev, &dout, &[x.len()]));
        [out, dinp].map(|t| dev.to_host(&t))
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    assert_close("gelu", &got[0], &want[0], TOL);
    assert_close("dgelu", &got[1], &want[1], TOL);
}

/// Squared ReLU: a product of f32s in each direction, so the CPU's bits on any GPU.
#[test]
fn squared_relu_matches_bit_for_bit() {
    let Some(gpu) = gpu("squared_relu_matches_bit_for_bit") else { return };
    let mut rng = seeded("squared_relu");
    let (x, dout) = (rng.uniform(50_001, 6.0), rng.uniform(50_001, 1.0));
    let run = |dev: &dyn Device| {
        let x = put(dev, &x, &[x.len()]);
        let mut out = dev.zeros(&[x.len()], Category::Workspace);
        dev.squared_relu_forward(&mut out, &x);
        let mut dinp = dev.zeros(&[x.len()], Category::Workspace);
        dev.squared_relu_backward(&mut dinp, &x, &put(dev, &dout, &[x.len()]));
        [out, dinp].map(|t| dev.to_host(&t))
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    assert!(got[0] == want[0], "relu2 differs from the CPU's");
    assert!(got[1] == want[1], "drelu2 differs from the CPU's");
}

/// RoPE on 4 query heads sharing 2 key/value heads, the forward at a later position (a
/// decoder's) and the backward from 0, plain, with Llama 3.1's scaling, and turning half of
/// each head (Nemotron's partial rotary embedding). The emulator's
/// powf, cos and sin are the host's, so on the stand-in this is the CPU's bits; a GPU's may
/// differ by an ulp, hence the tolerance.
#[test]
fn rope_matches() {
    let Some(gpu) = gpu("rope_matches") else { return };
    let mut rng = seeded("rope");
    let (kv, hs) = (2, C / NH);
    let shape = [B, T, (NH + 2 * kv) * hs];
    let (x, dx) = (rng.uniform(shape.iter().product(), 2.0), rng.uniform(shape.iter().product(), 1.0));
    let plain = RopeFrequencies::plain(500_000.0);
    let scaled = RopeFrequencies { llama3_factor: Some(8.0), ..plain };
    let half = RopeFrequencies { rotary_dims: Some(hs / 2), ..plain };
    for freqs in [plain, scaled, half] {
        let run = |dev: &dyn Device| {
            let (mut qkv, mut dqkv) = (put(dev, &x, &shape), put(dev, &dx, &shape));
            dev.rope_forward(&mut qkv, NH, kv, freqs, 1000);
            dev.rope_backward(&mut dqkv, NH, kv, freqs);
            [qkv, dqkv].map(|t| dev.to_host(&t))
        };
        let (want, got) = (run(&cpu()), run(&gpu));
        assert_close("rope", &got[0], &want[0], TOL);
        assert_close("drope", &got[1], &want[1], TOL);
    }
}

/// SwiGLU (Llama's) and GeGLU (Gemma's).
#[test]
fn glu_matches() {
    let Some(gpu) = gpu("glu_matches") else { return };
    let mut rng = seeded("glu");
    let f = 37;
    let (inp, dout) = (rng.uniform(N * 2 * f, 6.0), rng.uniform(N * f, 1.0));
    for gate in [Gate::Silu, Gate::GeluTanh] {
        let run = |dev: &dyn Device| {
            let inp = put(dev, &inp, &[N, 2 * f]);
            let mut out = act_zeros(dev, &[N, f]);
            dev.glu_forward(&mut out, &inp, gate);
            let mut dinp = act_zeros(dev, &[N, 2 * f]);
            dev.glu_backward(&mut dinp, &inp, &put(dev, &dout, &[N, f]), gate);
            [out, dinp].map(|t| dev.to_host(&t))
        };
        let (want, got) = (run(&cpu()), run(&gpu));
        assert_close(&format!("{gate:?}"), &got[0], &want[0], TOL);
        assert_close(&format!("d{gate:?}"), &got[1], &want[1], TOL);
    }
}

/// A range of one tensor into a place in another, on the fp32 GPU and the bf16 one (whose
/// activations are bf16, moved as they are): exactly those elements change, to the source's.
#[test]
fn copy_part_moves_a_range_and_nothing_else() {
    for gpu in [
        gpu("copy_part_moves_a_range_and_nothing_else"),
        bf16_gpu("copy_part_moves_a_range_and_nothing_else"),
    ] {
        let Some(gpu) = gpu else { return };
        let (src, dst): (Vec<f32>, Vec<f32>) = ((0..37).map(|i| i as f32).collect(), vec![-1.0; 29]);
        let mut d = put(&gpu, &dst, &[29]);
        gpu.copy_part(&mut d, 3, &put(&gpu, &src, &[37]), 10..25);
        let want: Vec<f32> =
            (0..29).map(|i| if (3..18).contains(&i) { (i + 7) as f32 } else { -1.0 }).collect();
        assert_bitwise(&format!("copy_part ({:?})", gpu.activation_dtype()), &gpu.to_host(&d), &want);
    }
}

#[test]
fn dropout_draws_the_cpus_mask_bit_for_bit() {
    let Some(gpu) = gpu("dropout_draws_the_cpus_mask_bit_for_bit") else { return };
    let mut rng = seeded("dropout");
    let n = 100_003; // not a multiple of 4: the last Philox block is partial
    let (x, dout) = (rng.uniform(n, 1.0), rng.uniform(n, 1.0));
    // A layer's whole tensor, and a sequence-parallel rank's rows from mask elements that
    // are and are not a multiple of Philox's block of 4.
    let residual = dropout(0.1, 5, DropoutSite::MlpResidual);
    let from = |first| DropoutSpec { first, ..residual };
    for spec in [residual, dropout(0.5, 0, DropoutSite::Embedding), from(4 * 100_003), from(100_003 * 3 + 2)]
    {
        let run = |dev: &dyn Device| {
            let mut out = dev.zeros(&[n], Category::Workspace);
            dev.dropout_forward(&mut out, &put(dev, &x, &[n]), spec);
            let mut dinp = dev.zeros(&[n], Category::Workspace);
            dev.dropout_backward(&mut dinp, &put(dev, &dout, &[n]), spec);
            [out, dinp].map(|t| dev.to_host(&t))
        };
        let (want, got) = (run(&cpu()), run(&gpu));
        assert_bitwise("dropout forward", &got[0], &want[0]);
        assert_bitwise("dropout backward", &got[1], &want[1]);
        // An input the draw keeps is nonzero out unless it was zero in (uniform draws can
        // be exactly 0).
        let kept = (0..n)
            .filter(|&i| kernels::philox::keep(&spec.key, spec.first + i, spec.p) && x[i] != 0.0)
            .count();
        assert_eq!(got[0].iter().filter(|&&y| y != 0.0).count(), kept, "kept elements");
    }
}

/// The GPU's classifier against the CPU's (fp32) over a vocabulary of `v`, which the GPU
/// pads to a multiple of 128 columns, within `tol`.
fn classifier_case(gpu: &CudaDevice, v: usize, tol: f64) {
    let mut rng = seeded("classifier");
    let (x, wte, targets) = (rng.uniform(N * C, 1.0), rng.uniform(v * C, 1.0), rng.below(N, v as u32));
    let dwte0 = rng.uniform(v * C, 0.1);
    for grad_scale in [None, Some(1.0 / N as f32)] {
        let run = |dev: &dyn Device| {
            let mut losses = dev.zeros(&[N], Category::Workspace);
            let (mut dx, mut dwte) = (act_zeros(dev, &[B, T, C]), grad(dev, &dwte0, &[v, C]));
            let head_grad =
                grad_scale.map(|scale| ClassifierGrad { scale, dinp: &mut dx, dweight: &mut dwte });
            dev.classifier(
                &mut losses,
                &put(dev, &x, &[B, T, C]),
                &param(dev, &wte, &[v, C]),
                &targets,
                head_grad,
            );
            [losses, dx, dwte].map(|t| dev.to_host(&t))
        };
        let (want, got) = (run(&cpu()), run(gpu));
        for (what, g, w) in
            [("losses", &got[0], &want[0]), ("dinp", &got[1], &want[1]), ("dwte", &got[2], &want[2])]
        {
            assert_close(&format!("{what} ({grad_scale:?})"), g, w, tol);
        }
    }
}

#[test]
fn classifier_matches_with_and_without_gradient() {
    let Some(gpu) = gpu("classifier_matches_with_and_without_gradient") else { return };
    classifier_case(&gpu, 1000, TOL);
}

/// Under bf16 the head multiplies wte's bf16 copy, padded with zero rows, over the padded
/// vocabulary, into bf16 logits: an odd vocabulary (as GPT-2's 50257) checks that the
/// padding stays out of the loss and the gradients.
#[test]
fn bf16_classifier_over_an_odd_vocabulary_is_close_to_fp32() {
    let Some(gpu) = bf16_gpu("bf16_classifier_over_an_odd_vocabulary_is_close_to_fp32") else { return };
    // bf16 operands, as bf16_matmul_is_close_to_fp32.
    classifier_case(&gpu, 1001, 2e-2);
}

/// A tensor-parallel rank's loss over its shard of `v` columns, GPU against CPU: the row
/// statistics (another shard's targets give 0), their combination with a second shard's
/// (the losses and the whole rows' max and sum), then the dlogits from the whole rows. The logits
/// are what the GPU stores (bf16 on a bf16 GPU), so both sides read the same values and the
/// f32 statistics agree within f32 rounding; the dlogits within `tol`.
fn vocab_shard_case(gpu: &CudaDevice, v: usize, tol: f64) {
    let mut rng = seeded("vocab_shard");
    let mut targets = rng.below(N, v as u32);
    targets.iter_mut().step_by(3).for_each(|t| *t = OTHER_SHARD);
    let logits = gpu.to_host(&put(gpu, &rng.uniform(N * v, 4.0), &[N, v]));
    let (stats, dlogits) = {
        let run = |dev: &dyn Device| {
            let l = put(dev, &logits, &[N, v]);
            let mut stats = dev.empty(&[N, 3], Category::Workspace);
            dev.vocab_shard_stats(&mut stats, &l, &targets);
            dev.to_host(&stats)
        };
        let (want, got) = (run(&cpu()), run(gpu));
        assert_close("vocab shard statistics", &got, &want, TOL);
        // The group of this shard and another whose rows reach higher, holding no target.
        let other: Vec<f32> = want.chunks(3).flat_map(|s| [s[0] + 0.5, s[1] * 1.5, 0.0]).collect();
        let group = [want.clone(), other].concat();
        let run = |dev: &dyn Device| {
            let (mut losses, mut rows) =
                (dev.empty(&[N], Category::Workspace), dev.empty(&[N, 2], Category::Workspace));
            dev.vocab_shard_combine(
                &mut losses,
                &mut rows,
                &dev.from_host(&group, &[2, N, 3], Category::Workspace),
            );
            [losses, rows].map(|t| dev.to_host(&t))
        };
        let (want_whole, got_whole) = (run(&cpu()), run(gpu));
        assert_close("vocab shard losses", &got_whole[0], &want_whole[0], TOL);
        assert_close("whole rows", &got_whole[1], &want_whole[1], TOL);
        let whole = &want_whole[1];
        let run = |dev: &dyn Device| {
            let mut l = put(dev, &logits, &[N, v]);
            dev.vocab_shard_dlogits(
                &mut l,
                &dev.from_host(whole, &[N, 2], Category::Workspace),
                &targets,
                0.25,
            );
            dev.to_host(&l)
        };
        (want, (run(&cpu()), run(gpu)))
    };
    let zeros = stats.chunks(3).zip(&targets).filter(|(s, &t)| t == OTHER_SHARD && s[2] == 0.0).count();
    assert_eq!(zeros, targets.iter().filter(|&&t| t == OTHER_SHARD).count(), "other shards' target logits");
    assert_close("vocab shard dlogits", &dlogits.1, &dlogits.0, tol);
}

#[test]
fn vocab_shard_ops_match_the_cpu() {
    let Some(gpu) = gpu("vocab_shard_ops_match_the_cpu") else { return };
    vocab_shard_case(&gpu, 1001, TOL);
}

/// bf16 logits in, bf16 dlogits out (rounded once), the statistics f32.
#[test]
fn bf16_vocab_shard_ops_are_close_to_the_cpu() {
    let Some(gpu) = bf16_gpu("bf16_vocab_shard_ops_are_close_to_the_cpu") else { return };
    vocab_shard_case(&gpu, 1001, 1e-2);
}

fn adamw_step(step: u32) -> AdamWStep {
    AdamWStep { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step, grad_scale: 0.5 }
}

/// AdamW on a stage's tensors is one launch, each tensor stepped as the CPU steps it: a
/// matrix that decays, a bias that does not, a plain f32 tensor (no bf16 copy, beside
/// parameters with one on a bf16 GPU) and a part of a matrix; two steps, the second
/// through the table the first uploaded.
#[test]
fn adamw_steps_a_stage_in_one_launch() {
    for gpu in [gpu("adamw_steps_a_stage_in_one_launch"), bf16_gpu("adamw_steps_a_stage_in_one_launch")] {
        let Some(gpu) = gpu else { return };
        let mut rng = seeded("adamw one launch");
        let shapes: [(&[usize], bool, usize); 4] =
            [(&[C, C], true, 0), (&[C], false, 0), (&[7, C], true, 0), (&[C, C], true, 129)];
        let inputs: Vec<_> = shapes
            .iter()
            .map(|(shape, ..)| {
                let n = shape.iter().product();
                (rng.uniform(n, 1.0), rng.uniform(n, 0.1))
            })
            .collect();
        let run = |dev: &dyn Device, launches: &dyn Fn() -> u64| {
            let mut ts: Vec<_> = shapes
                .iter()
                .zip(&inputs)
                .enumerate()
                .map(|(i, ((shape, _, from), (p0, g)))| {
                    // The third a plain f32 tensor, the others parameters (with a bf16 copy on
                    // a bf16 GPU).
                    let category = if i == 2 { Category::Workspace } else { Category::Parameters };
                    let moments = p0.len() - from;
                    (
                        dev.from_host(p0, shape, category),
                        grad(dev, g, shape),
                        dev.zeros(&[moments], Category::OptimizerState),
                        dev.zeros(&[moments], Category::OptimizerState),
                    )
                })
                .collect();
            let mut launched = Vec::new();
            for step in 1..=2 {
                let mut tensors: Vec<AdamWTensor> = ts
                    .iter_mut()
                    .zip(&shapes)
                    .map(|((param, grad, m, v), &(_, decay, from))| AdamWTensor {
                        param,
                        grad,
                        m,
                        v,
                        from,
                        decay,
                    })
                    .collect();
                let before = launches();
                dev.adamw_tensors(&mut tensors, adamw_step(step));
                launched.push(launches() - before);
            }
            let values: Vec<_> = ts.iter().map(|(p, _, m, v)| [p, m, v].map(|t| dev.to_host(t))).collect();
            (values, launched)
        };
        let (got, launched) = run(&gpu, &|| gpu.launches());
        assert_eq!(launched, [1, 1], "{:?}: launches a step", gpu.activation_dtype());
        let (want, _) = run(&cpu(), &|| 0);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            for (what, (g, w)) in ["param", "m", "v"].iter().zip(g.iter().zip(w)) {
                assert_close(&format!("{:?}: {what} of tensor {i}", gpu.activation_dtype()), g, w, TOL);
            }
        }
        // Untouched before the part.
        assert_eq!(&got[3][0][..129], &inputs[3].0[..129]);
    }
}

/// A stage's gradients are zeroed in one launch, the second time through the kept table.
#[test]
fn fill_zero_tensors_zeroes_a_stage_in_one_launch() {
    let Some(gpu) = bf16_gpu("fill_zero_tensors_zeroes_a_stage_in_one_launch") else { return };
    let mut rng = seeded("zero tensors");
    let mut grads: Vec<Tensor> =
        [C * C, C, 7, 0].iter().map(|&n| grad(&gpu, &rng.uniform(n, 1.0), &[n])).collect();
    for round in 0..2 {
        let before = gpu.launches();
        gpu.fill_zero_tensors(&mut grads.iter_mut().collect::<Vec<_>>());
        assert_eq!(gpu.launches() - before, 1, "round {round}");
        for (i, g) in grads.iter().enumerate() {
            assert!(gpu.to_host(g).iter().all(|&x| x.to_bits() == 0), "round {round}: tensor {i} is not +0");
        }
        grads.iter_mut().for_each(|g| gpu.write_at(g, 0, &vec![1.5; g.len().min(3)]));
    }
}

/// On a bf16 GPU, AdamW refreshes a parameter's bf16 copy in its own pass, a matrix's and a
/// bias's (which the fused forward's epilogue reads): a matmul through the updated
/// parameters is bit for bit the one through the same values uploaded afresh (whose copies
/// the upload rounds).
#[test]
fn adamw_refreshes_the_bf16_copy() {
    let Some(gpu) = bf16_gpu("adamw_refreshes_the_bf16_copy") else { return };
    let mut rng = seeded("adamw bf16 copy");
    let (w0, g, x) = (rng.uniform(C * C, 1.0), rng.uniform(C * C, 0.1), rng.uniform(N * C, 1.0));
    let (b0, gb) = (rng.uniform(C, 1.0), rng.uniform(C, 0.1));
    let (mut w, mut b) = (param(&gpu, &w0, &[C, C]), param(&gpu, &b0, &[C]));
    for (p, g) in [(&mut w, &g), (&mut b, &gb)] {
        let shape = p.shape().to_vec();
        let (mut m, mut v) =
            (gpu.zeros(&shape, Category::OptimizerState), gpu.zeros(&shape, Category::OptimizerState));
        gpu.adamw(p, &grad(&gpu, g, &shape), &mut m, &mut v, adamw_step(1));
    }
    let fresh = (param(&gpu, &gpu.to_host(&w), &[C, C]), param(&gpu, &gpu.to_host(&b), &[C]));
    let x = put(&gpu, &x, &[N, C]);
    let product = |(w, b): (&Tensor, &Tensor)| {
        let mut out = act_zeros(&gpu, &[N, C]);
        gpu.matmul_forward(&mut out, &x, w, WeightLayout::InOut, Some(b));
        gpu.to_host(&out)
    };
    let before = product((&param(&gpu, &w0, &[C, C]), &param(&gpu, &b0, &[C])));
    let after = product((&w, &b));
    assert_bitwise("product through the updated copies", &after, &product((&fresh.0, &fresh.1)));
    assert_ne!(after, before, "the update reached the copy");
}

#[test]
fn adamw_matches_over_three_steps() {
    let Some(gpu) = gpu("adamw_matches_over_three_steps") else { return };
    let mut rng = seeded("adamw");
    let n = 30_001;
    let p0 = rng.uniform(n, 1.0);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.uniform(n, 0.1)).collect();
    let run = |dev: &dyn Device| {
        let mut p = param(dev, &p0, &[n]);
        let (mut m, mut v) =
            (dev.zeros(&[n], Category::OptimizerState), dev.zeros(&[n], Category::OptimizerState));
        for (i, g) in grads.iter().enumerate() {
            dev.adamw(&mut p, &grad(dev, g, &[n]), &mut m, &mut v, adamw_step(i as u32 + 1));
        }
        [p, m, v].map(|t| dev.to_host(&t))
    };
    let (want, got) = (run(&cpu()), run(&gpu));
    for (what, (g, w)) in ["param", "m", "v"].iter().zip(got.iter().zip(&want)) {
        assert_close(what, g, w, TOL);
    }
}

#[test]
fn every_op_is_bitwise_repeatable() {
    let Some(gpu) = gpu("every_op_is_bitwise_repeatable") else { return };
    let mut rng = seeded("repeatable");
    let (qkv, dout, x) = (rng.uniform(N * 3 * C, 2.0), rng.uniform(N * C, 1.0), rng.uniform(N * C, 1.0));
    let spec = dropout(0.1, 1, DropoutSite::AttentionProbs);
    let run = || {
        let qkv_t = put(&gpu, &qkv, &[B, T, 3 * C]);
        let mut out = gpu.zeros(&[B, T, C], Category::Workspace);
        let mut saved = gpu.empty_attention_saved(
            AttentionSaves::cuda(C / NH, DType::F32),
            [B, NH, T],
            true,
            Category::Workspace,
        );
        gpu.attention_forward(Some(&mut out), &mut saved, Some(spec), &qkv_t, NH, NH, CausalMask::Full);
        let AttentionSaved::RowLogSumExp { lse } = &saved else {
            unreachable!("the fused core at head size 24")
        };
        let mut dqkv = gpu.zeros(&[B, T, 3 * C], Category::Workspace);
        let dout_t = put(&gpu, &dout, &[B, T, C]);
        gpu.attention_backward(
            &mut dqkv,
            &dout_t,
            &out,
            &qkv_t,
            &saved,
            Some(spec),
            NH,
            NH,
            CausalMask::Full,
        );
        let x_t = put(&gpu, &x, &[B, T, C]);
        let (mut dw, mut db) =
            (gpu.zeros(&[C, C], Category::Workspace), gpu.zeros(&[C], Category::Workspace));
        gpu.matmul_backward_weight(&mut dw, Some(&mut db), &dout_t, &x_t, WeightLayout::InOut);
        let (mut lw, mut lb) = (gpu.zeros(&[C], Category::Workspace), gpu.zeros(&[C], Category::Workspace));
        let (mut ln, mut mean, mut rstd) = (
            gpu.zeros(&[B, T, C], Category::Workspace),
            gpu.zeros(&[N], Category::Workspace),
            gpu.zeros(&[N], Category::Workspace),
        );
        let w = put(&gpu, &x[..C], &[C]);
        gpu.layernorm_forward(&mut ln, &mut mean, &mut rstd, &x_t, &w, &w, 1e-5);
        let mut dx = gpu.zeros(&[B, T, C], Category::Workspace);
        gpu.layernorm_backward(&mut dx, &mut lw, &mut lb, &dout_t, &x_t, &w, &mean, &rstd);
        let norm = gpu.sum_squares(&dqkv);
        ([&out, lse, &dqkv, &dw, &db, &dx, &lw, &lb].map(|t| gpu.to_host(t)), norm)
    };
    let (first, second) = (run(), run());
    for (i, (a, b)) in first.0.iter().zip(&second.0).enumerate() {
        assert_bitwise(&format!("output {i}"), a, b);
    }
    assert_eq!(first.1.to_bits(), second.1.to_bits(), "sum_squares");
}

/// The distributed optimizer's ops on a part of a tensor, as the CPU does them: AdamW on a
/// part of a parameter, a part's sum of squares, and an upload into a part; on a bf16 GPU
/// both refresh the parameter's bf16 copy.
#[test]
fn the_ops_on_a_part_match_the_cpu() {
    let Some(gpu) = bf16_gpu("the_ops_on_a_part_match_the_cpu") else { return };
    let mut rng = seeded("parts");
    let (n, part) = (C * C, 1_001..C * C - 77);
    let (p0, g) = (rng.uniform(n, 1.0), rng.uniform(n, 0.1));
    let run = |dev: &dyn Device| {
        let mut p = param(dev, &p0, &[C, C]);
        let (mut m, mut v) = (
            dev.zeros(&[part.len()], Category::OptimizerState),
            dev.zeros(&[part.len()], Category::OptimizerState),
        );
        let grad = grad(dev, &g, &[n]);
        let share =
            AdamWTensor { param: &mut p, grad: &grad, m: &mut m, v: &mut v, from: part.start, decay: true };
        dev.adamw_tensors(&mut [share], adamw_step(1));
        let mut out = dev.readout(1);
        dev.sum_squares_of_parts_into(&mut out, 0, &[(&grad, part.clone())]);
        dev.write_at(&mut p, 0, &[5.0; 3]);
        (dev.read(&out)[0], [p, m, v].map(|t| dev.to_host(&t)))
    };
    let ((want_norm, want), (got_norm, got)) = (run(&cpu()), run(&gpu));
    assert!((got_norm - want_norm).abs() <= 1e-9 * want_norm, "{got_norm} vs {want_norm}");
    for (what, (g, w)) in ["param", "m", "v"].iter().zip(got.iter().zip(&want)) {
        assert_close(what, g, w, TOL);
    }
    assert_eq!(&got[0][..3], [5.0; 3]);
    assert_eq!(&got[0][3..part.start], &p0[3..part.start], "untouched before the part");
    // The bf16 copy the matmuls read holds the stepped and uploaded values: a product
    // through the parameter is the one through its values uploaded afresh.
    let mut p = param(&gpu, &p0, &[C, C]);
    let (mut m, mut v) = (
        gpu.zeros(&[part.len()], Category::OptimizerState),
        gpu.zeros(&[part.len()], Category::OptimizerState),
    );
    let grad = grad(&gpu, &g, &[n]);
    let share =
        AdamWTensor { param: &mut p, grad: &grad, m: &mut m, v: &mut v, from: part.start, decay: true };
    gpu.adamw_tensors(&mut [share], adamw_step(1));
    gpu.write_at(&mut p, 0, &[5.0; 3]);
    let x = put(&gpu, &rng.uniform(N * C, 1.0), &[N, C]);
    let product = |w: &Tensor| {
        let mut out = act_zeros(&gpu, &[N, C]);
        gpu.matmul_forward(&mut out, &x, w, WeightLayout::InOut, None);
        gpu.to_host(&out)
    };
    let fresh = param(&gpu, &gpu.to_host(&p), &[C, C]);
    assert_bitwise("product through the copy after a part's step", &product(&p), &product(&fresh));
}

/// GPU 0's sole device, for one test at a time: a GPU has one sole device per process, and
/// a machine may have one GPU.
fn sole_gpu() -> (std::sync::MutexGuard<'static, ()>, CudaDevice) {
    let turn = sole_turn();
    (turn, CudaDevice::sole(0).expect("GPU 0's sole device"))
}

/// Offload moves a tensor's bytes from the device's ledger to its host ledger and reload
/// brings back the same bits, in f32 and in bf16 (stored as bf16 on the host, 2 bytes an
/// element), on a device sharing its GPU (cudarc's per-buffer events on) and on a sole one
/// (off: only offload.rs's events order the copy stream). After the first round trip the
/// host and device buffers all come from the arena.
#[test]
fn offload_and_reload_keep_the_bits_and_move_the_bytes() {
    let test = "offload_and_reload_keep_the_bits_and_move_the_bytes";
    let Some(f32_gpu) = gpu(test) else { return };
    let Some(bf16) = bf16_gpu(test) else { return };
    let (_turn, sole) = sole_gpu();
    let mut rng = seeded("offload");
    let data = rng.uniform(N * C, 1.0);
    for dev in [&f32_gpu as &dyn Device, &bf16, &sole] {
        for round in 0..2 {
            let before = dev.counters();
            let mut t = put(dev, &data, &[N, C]);
            let (want, bytes) = (dev.to_host(&t), t.bytes());
            let device_before = dev.ledger().live_bytes();
            dev.offload(&mut t);
            assert_eq!(dev.ledger().live_bytes(), device_before - bytes);
            assert_eq!(dev.host_ledger().live(Category::Activations), bytes);
            assert_eq!(t.bytes(), N * C * dev.activation_dtype().size());
            dev.reload(&mut t, Category::Workspace);
            assert_eq!(dev.host_ledger().live_bytes(), 0);
            assert_eq!(dev.ledger().live_bytes(), device_before);
            dev.await_reloads();
            assert_eq!(dev.to_host(&t), want, "{} round {round}", dev.name());
            if round == 1 {
                assert_eq!((dev.counters() - before).backing_allocations, 0, "{}", dev.name());
            }
        }
    }
}

/// The device buffer an offload frees goes back to the arena while its copy out may still
/// be reading it: the next tensor of its size gets that buffer, and whatever the device
/// then writes into it waits for the copy. The stand-in's streams run on threads of their
/// own, so a missing wait reads the new values (or the stand-in's NaN poison) back.
#[test]
fn an_offloaded_buffer_is_not_reused_before_its_copy_has_read_it() {
    let test = "an_offloaded_buffer_is_not_reused_before_its_copy_has_read_it";
    let Some(shared) = gpu(test) else { return };
    let Some(bf16) = bf16_gpu(test) else { return };
    let (_turn, sole) = sole_gpu();
    let mut rng = seeded("offload reuse");
    let (first, second) = (rng.uniform(4 * N * C, 1.0), rng.uniform(4 * N * C, 1.0));
    for dev in [&shared as &dyn Device, &bf16, &sole] {
        let mut kept = Vec::new();
        for _ in 0..4 {
            let mut t = put(dev, &first, &[4 * N, C]);
            let want = dev.to_host(&t);
            dev.offload(&mut t);
            // The freed buffer, taken and overwritten at once on the device's stream.
            let reused = put(dev, &second, &[4 * N, C]);
            kept.push((t, want, reused));
        }
        for (mut t, want, reused) in kept {
            dev.reload(&mut t, Category::Workspace);
            dev.await_reloads();
            assert_eq!(dev.to_host(&t), want, "{}: the offloaded bits", dev.name());
            assert_eq!(dev.to_host(&reused), dev.to_host(&put(dev, &second, &[4 * N, C])), "{}", dev.name());
        }
    }
}
