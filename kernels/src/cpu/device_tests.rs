//! Tests of `CpuDevice` as a whole: bitwise determinism across pool sizes (GPT-2's ops and
//! Llama's), the dropout mask shared by forward and backward, the ledger accounting of
//! scratch, and the head counts the device refuses.

use super::testutil::random;
use super::CpuDevice;
use crate::attention::{AttentionSaved, CausalMask};
use crate::device::Device;
use crate::dropout::{DropoutKey, DropoutSite, DropoutSpec};
use crate::gate::Gate;
use crate::memory::Category;
use crate::op_args::{AdamWStep, AdamWTensor, ClassifierGrad, WeightLayout};
use crate::philox;
use crate::rope_frequencies::RopeFrequencies;
use crate::tensor::Tensor;

// A small GPT-2 block. T spans two attention row blocks; 4C = 640 exceeds gemm's depth
// block (512), so the accumulation across depth blocks is covered too; every elementwise
// buffer of [N,4C] spans several parallel chunks.
const B: usize = 2;
const T: usize = 80;
const C: usize = 160;
const NH: usize = 4;
const V: usize = 300;
const N: usize = B * T;

/// What the CPU's attention keeps under dropout: P and P'.
fn probabilities(probs: Tensor, dropped: Tensor) -> AttentionSaved {
    AttentionSaved::Probabilities { probs, dropped: Some(dropped) }
}

fn spec(site: DropoutSite, p: f32) -> DropoutSpec {
    DropoutSpec {
        p,
        key: DropoutKey { seed: 5, step: 1, microbatch: 2, layer: 3, site },
        first: 0,
        heads: None,
    }
}

/// Runs every op of the device once and returns every output, in order.
fn every_output(dev: &CpuDevice) -> Vec<Vec<f32>> {
    let t = |seed: u64, shape: &[usize], scale: f32| {
        dev.from_host(&random(seed, shape.iter().product(), scale), shape, Category::Activations)
    };
    let z = |shape: &[usize]| dev.zeros(shape, Category::Workspace);
    let tokens: Vec<u32> = (0..N as u32).map(|i| i * 7 % V as u32).collect();
    let mut outs: Vec<Vec<f32>> = Vec::new();
    let mut keep = |x: &Tensor| outs.push(dev.to_host(x));

    let (wte, wpe) = (t(1, &[V, C], 0.5), t(2, &[T, C], 0.5));
    let mut x = z(&[B, T, C]);
    dev.embedding_forward(&mut x, &tokens, &wte, Some(&wpe));
    keep(&x);

    let (lnw, lnb) = (t(3, &[C], 1.0), t(4, &[C], 0.1));
    let (mut ln, mut mean, mut rstd) = (z(&[N, C]), z(&[N]), z(&[N]));
    dev.layernorm_forward(&mut ln, &mut mean, &mut rstd, &x, &lnw, &lnb, 1e-5);
    [&ln, &mean, &rstd].into_iter().for_each(&mut keep);

    let (w_qkv, b_qkv) = (t(5, &[C, 3 * C], 0.1), t(6, &[3 * C], 0.1));
    let mut qkv = z(&[B, T, 3 * C]);
    dev.matmul_forward(&mut qkv, &ln, &w_qkv, WeightLayout::InOut, Some(&b_qkv));
    keep(&qkv);

    let attn_drop = spec(DropoutSite::AttentionProbs, 0.1);
    let mut y = z(&[B, T, C]);
    let mut saved = probabilities(z(&[B, NH, T, T]), z(&[B, NH, T, T]));
    dev.attention_forward(Some(&mut y), &mut saved, Some(attn_drop), &qkv, NH, NH, CausalMask::Full);
    keep(&y);
    let AttentionSaved::Probabilities { probs, dropped: Some(dropped) } = &saved else { unreachable!() };
    [probs, dropped].into_iter().for_each(&mut keep);

    let w_fc = t(7, &[4 * C, C], 0.1); // OutIn
    let (mut h, mut g) = (z(&[N, 4 * C]), z(&[N, 4 * C]));
    dev.matmul_forward(&mut h, &y, &w_fc, WeightLayout::OutIn, None);
    dev.gelu_forward(&mut g, &h);
    let w_proj = t(8, &[4 * C, C], 0.1); // InOut, depth 4C
    let mut p = z(&[N, C]);
    dev.matmul_forward(&mut p, &g, &w_proj, WeightLayout::InOut, None);
    let mut pd = z(&[N, C]);
    dev.dropout_forward(&mut pd, &p, spec(DropoutSite::MlpResidual, 0.2));
    let mut res = z(&[N, C]);
    dev.add(&mut res, &pd, &x);
    [&h, &g, &p, &pd, &res].into_iter().for_each(&mut keep);

    let (mut losses, mut dres_head, mut dwte_head) = (z(&[N]), z(&[N, C]), t(16, &[V, C], 0.1));
    let head_grad = ClassifierGrad { scale: 1.0 / N as f32, dinp: &mut dres_head, dweight: &mut dwte_head };
    dev.classifier(&mut losses, &res, &wte, &tokens, Some(head_grad));
    [&losses, &dres_head, &dwte_head].into_iter().for_each(&mut keep);

    // Backward through the same ops, parameter gradients starting non-zero.
    let dres = t(9, &[N, C], 0.1);
    let (mut dp, mut dg, mut dh, mut dy) = (z(&[N, C]), z(&[N, 4 * C]), z(&[N, 4 * C]), z(&[N, C]));
    dev.dropout_backward(&mut dp, &dres, spec(DropoutSite::MlpResidual, 0.2));
    let (mut dw_proj, mut dw_fc, mut dw_qkv) =
        (t(10, &[4 * C, C], 0.1), t(11, &[4 * C, C], 0.1), z(&[C, 3 * C]));
    let mut db_qkv = t(12, &[3 * C], 0.1);
    dev.matmul_backward_input(&mut dg, &dp, &w_proj, WeightLayout::InOut);
    dev.matmul_backward_weight(&mut dw_proj, None, &dp, &g, WeightLayout::InOut);
    dev.gelu_backward(&mut dh, &h, &dg);
    dev.matmul_backward_input(&mut dy, &dh, &w_fc, WeightLayout::OutIn);
    dev.matmul_backward_weight(&mut dw_fc, None, &dh, &y, WeightLayout::OutIn);
    let mut dqkv = z(&[B, T, 3 * C]);
    dev.attention_backward(&mut dqkv, &dy, &y, &qkv, &saved, Some(attn_drop), NH, NH, CausalMask::Full);
    let mut dln = z(&[N, C]);
    dev.matmul_backward_input(&mut dln, &dqkv, &w_qkv, WeightLayout::InOut);
    dev.matmul_backward_weight(&mut dw_qkv, Some(&mut db_qkv), &dqkv, &ln, WeightLayout::InOut);
    let (mut dx, mut dlnw, mut dlnb) = (z(&[B, T, C]), t(13, &[C], 0.1), z(&[C]));
    dev.layernorm_backward(&mut dx, &mut dlnw, &mut dlnb, &dln, &x, &lnw, &mean, &rstd);
    dev.accumulate(&mut dx, &dres);
    let (mut dwte, mut dwpe) = (t(14, &[V, C], 0.1), z(&[T, C]));
    dev.embedding_backward(&mut dwte, Some(&mut dwpe), &dx, &tokens);
    [&dp, &dg, &dw_proj, &dh, &dy, &dw_fc, &dqkv, &dln, &dw_qkv, &db_qkv, &dx, &dlnw, &dlnb, &dwte, &dwpe]
        .into_iter()
        .for_each(&mut keep);

    let mut param = z(&[4 * C, C]);
    dev.copy(&mut param, &w_proj);
    let (mut m, mut v) = (t(15, &[4 * C, C], 0.01), z(&[4 * C, C]));
    let hp = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 3,
        grad_scale: 0.7,
    };
    dev.adamw(&mut param, &dw_proj, &mut m, &mut v, hp);
    [&param, &m, &v].into_iter().for_each(&mut keep);
    let norm = dev.sum_squares(&dw_fc);
    dev.fill_zero(&mut param);
    keep(&param);
    outs.push(vec![norm as f32, (norm - norm as f32 as f64) as f32]);
    outs
}

#[test]
fn every_op_is_bitwise_identical_on_1_and_3_threads() {
    let bits = |outs: Vec<Vec<f32>>| -> Vec<Vec<u32>> {
        outs.into_iter().map(|o| o.into_iter().map(f32::to_bits).collect()).collect()
    };
    let one = bits(every_output(&CpuDevice::new(1)));
    let three = bits(every_output(&CpuDevice::new(3)));
    assert_eq!(one.len(), three.len());
    for (i, (a, b)) in one.iter().zip(&three).enumerate() {
        assert!(a == b, "output #{i} differs between 1 and 3 threads");
    }
}

#[test]
fn dropout_backward_regenerates_the_forward_mask() {
    let dev = CpuDevice::new(2);
    let n = 50_000;
    let s = spec(DropoutSite::Embedding, 0.3);
    let inp = dev.from_host(&vec![1.0; n], &[n], Category::Activations);
    let dout = dev.from_host(&random(1, n, 1.0), &[n], Category::Activations);
    let (mut out, mut dinp) = (dev.zeros(&[n], Category::Activations), dev.zeros(&[n], Category::Workspace));
    dev.dropout_forward(&mut out, &inp, s);
    dev.dropout_backward(&mut dinp, &dout, s);
    let (out, dinp, dout) = (dev.to_host(&out), dev.to_host(&dinp), dev.to_host(&dout));
    for i in 0..n {
        let kept = philox::keep(&s.key, i, s.p);
        assert_eq!(out[i], if kept { 1.0 / 0.7 } else { 0.0 }, "forward element {i}");
        assert_eq!(dinp[i], if kept { dout[i] * (1.0 / 0.7) } else { 0.0 }, "backward element {i}");
    }
}

#[test]
fn op_scratch_is_counted_as_workspace_and_released() {
    let dev = CpuDevice::new(2);
    let qkv = dev.from_host(&random(1, B * T * 3 * C, 1.0), &[B, T, 3 * C], Category::Activations);
    let dout = dev.from_host(&random(2, B * T * C, 1.0), &[B, T, C], Category::Activations);
    let act = |shape: &[usize]| dev.zeros(shape, Category::Activations);
    let mut y = act(&[B, T, C]);
    let mut saved = probabilities(act(&[B, NH, T, T]), act(&[B, NH, T, T]));
    let drop = spec(DropoutSite::AttentionProbs, 0.1);
    let ledger = dev.ledger();
    ledger.reset_peaks();
    dev.attention_forward(Some(&mut y), &mut saved, Some(drop), &qkv, NH, NH, CausalMask::Full);
    // Forward writes straight into its outputs.
    assert_eq!(ledger.peak(Category::Workspace), 0);
    let mut dqkv = act(&[B, T, 3 * C]);
    dev.attention_backward(&mut dqkv, &dout, &y, &qkv, &saved, Some(drop), NH, NH, CausalMask::Full);
    // One group per thread, each with dS [T,T].
    assert_eq!(ledger.peak(Category::Workspace), 2 * T * T * 4);
    assert_eq!(ledger.live(Category::Workspace), 0);
    assert_eq!(dev.name(), "cpu (2 threads)");
    assert_eq!(dev.threads(), 2);
}

/// An offload moves a tensor into buffers the host ledger counts, as activations, and its
/// device bytes leave the device's ledger. A reload is the same bits back on the device
/// under the category asked for; a reload of a device tensor, or an offload of a host one,
/// is a bug the device refuses.
#[test]
fn offload_moves_bytes_between_the_ledgers_and_reload_brings_back_the_bits() {
    let dev = CpuDevice::new(2);
    let data = random(3, B * T * C, 1.0);
    let mut t = dev.from_host(&data, &[B, T, C], Category::Workspace);
    let bytes = B * T * C * 4;
    dev.offload(&mut t);
    assert_eq!((dev.ledger().live_bytes(), dev.host_ledger().live(Category::Activations)), (0, bytes));
    dev.reload(&mut t, Category::Workspace);
    assert_eq!((dev.ledger().live(Category::Workspace), dev.host_ledger().live_bytes()), (bytes, 0));
    assert_eq!((t.cpu(), t.shape()), (&data[..], &[B, T, C][..]));
    let offload_a_host_tensor = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut host = dev.from_host(&data, &[B, T, C], Category::Workspace);
        dev.offload(&mut host);
        dev.offload(&mut host)
    }));
    assert!(offload_a_host_tensor.is_err());
    let reload_a_device_tensor =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.reload(&mut t, Category::Workspace)));
    assert!(reload_a_device_tensor.is_err());
}

// A small Llama block: 4 query heads on 2 key/value heads of 40, SwiGLU of F = 2.7 C.
const KV: usize = 2;
const HS: usize = C / NH;
const QKV: usize = (NH + 2 * KV) * HS;
const F: usize = 432;

/// Runs every Llama op (and the embedding without positions) once, forward then backward,
/// and returns every output, in order.
fn every_llama_output(dev: &CpuDevice) -> Vec<Vec<f32>> {
    let t = |seed: u64, shape: &[usize], scale: f32| {
        dev.from_host(&random(seed, shape.iter().product(), scale), shape, Category::Activations)
    };
    let z = |shape: &[usize]| dev.zeros(shape, Category::Workspace);
    let tokens: Vec<u32> = (0..N as u32).map(|i| i * 11 % V as u32).collect();
    let mut outs: Vec<Vec<f32>> = Vec::new();
    let mut keep = |x: &Tensor| outs.push(dev.to_host(x));

    let wte = t(1, &[V, C], 0.5);
    let mut x = z(&[B, T, C]);
    dev.embedding_forward(&mut x, &tokens, &wte, None);
    keep(&x);
    let norm_w = t(2, &[C], 1.0);
    let (mut ln, mut rstd) = (z(&[N, C]), z(&[N]));
    dev.rmsnorm_forward(&mut ln, &mut rstd, &x, &norm_w, 1e-6);
    [&ln, &rstd].into_iter().for_each(&mut keep);
    let w_qkv = t(3, &[QKV, C], 0.1); // OutIn, as nn.Linear
    let mut qkv = z(&[B, T, QKV]);
    dev.matmul_forward(&mut qkv, &ln, &w_qkv, WeightLayout::OutIn, None);
    dev.rope_forward(&mut qkv, NH, KV, RopeFrequencies::plain(10_000.0), 0);
    keep(&qkv);
    let attn_drop = spec(DropoutSite::AttentionProbs, 0.1);
    let mut y = z(&[B, T, C]);
    let mut saved = probabilities(z(&[B, NH, T, T]), z(&[B, NH, T, T]));
    dev.attention_forward(Some(&mut y), &mut saved, Some(attn_drop), &qkv, NH, KV, CausalMask::Full);
    keep(&y);
    let w_fc = t(4, &[2 * F, C], 0.1);
    let (mut h, mut g) = (z(&[N, 2 * F]), z(&[N, F]));
    dev.matmul_forward(&mut h, &y, &w_fc, WeightLayout::OutIn, None);
    dev.glu_forward(&mut g, &h, Gate::Silu);
    [&h, &g].into_iter().for_each(&mut keep);

    let dg = t(5, &[N, F], 0.1);
    let (mut dh, mut dy) = (z(&[N, 2 * F]), t(6, &[N, C], 0.1));
    dev.glu_backward(&mut dh, &h, &dg, Gate::Silu);
    let mut dqkv = z(&[B, T, QKV]);
    dev.attention_backward(&mut dqkv, &dy, &y, &qkv, &saved, Some(attn_drop), NH, KV, CausalMask::Full);
    dev.rope_backward(&mut dqkv, NH, KV, RopeFrequencies::plain(10_000.0));
    dev.matmul_backward_input(&mut dy, &dqkv, &w_qkv, WeightLayout::OutIn);
    let (mut dx, mut dnorm_w) = (z(&[B, T, C]), t(7, &[C], 0.1));
    dev.rmsnorm_backward(&mut dx, &mut dnorm_w, &dy, &x, &norm_w, &rstd);
    let mut dwte = t(8, &[V, C], 0.1);
    dev.embedding_backward(&mut dwte, None, &dx, &tokens);
    [&dh, &dqkv, &dy, &dx, &dnorm_w, &dwte].into_iter().for_each(&mut keep);
    outs
}

#[test]
fn every_llama_op_is_bitwise_identical_on_1_and_3_threads() {
    let one = every_llama_output(&CpuDevice::new(1));
    let three = every_llama_output(&CpuDevice::new(3));
    assert_eq!(one.len(), three.len());
    for (i, (a, b)) in one.iter().zip(&three).enumerate() {
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert!(bits(a) == bits(b), "output #{i} differs between 1 and 3 threads");
    }
}

#[test]
fn llama_op_scratch_is_counted_as_workspace_and_released() {
    let dev = CpuDevice::new(2);
    let act = |seed: u64, shape: &[usize]| {
        dev.from_host(&random(seed, shape.iter().product(), 1.0), shape, Category::Activations)
    };
    let (mut qkv, x, w) = (act(1, &[B, T, QKV]), act(2, &[N, C]), act(3, &[C]));
    let (mut y, mut dqkv, mut dx, mut dw, mut rstd) =
        (act(4, &[B, T, C]), act(5, &[B, T, QKV]), act(6, &[N, C]), act(7, &[C]), act(8, &[N]));
    let mut saved = AttentionSaved::Probabilities { probs: act(9, &[B, NH, T, T]), dropped: None };
    let ledger = dev.ledger();
    let peak_after = |op: &mut dyn FnMut()| {
        ledger.reset_peaks();
        op();
        assert_eq!(ledger.live(Category::Workspace), 0);
        ledger.peak(Category::Workspace)
    };
    // RoPE: its cos and sin table [2, T, hs/2].
    assert_eq!(
        peak_after(&mut || dev.rope_forward(&mut qkv, NH, KV, RopeFrequencies::plain(10_000.0), 0)),
        2 * T * (HS / 2) * 4
    );
    assert_eq!(
        peak_after(&mut || dev.rope_backward(&mut dqkv, NH, KV, RopeFrequencies::plain(10_000.0))),
        2 * T * (HS / 2) * 4
    );
    // RMSNorm: a dweight partial per 32 rows.
    let rmsnorm = &mut || dev.rmsnorm_backward(&mut dx, &mut dw, &y, &x, &w, &rstd);
    assert_eq!(peak_after(rmsnorm), N.div_ceil(32) * C * 4);
    assert_eq!(peak_after(&mut || dev.rmsnorm_forward(&mut dx, &mut rstd, &x, &w, 1e-6)), 0);
    // Grouped-query attention: a group per thread, each with dS [T,T] and the dK and dV
    // [T,hs] of the later query heads of a key/value head.
    assert_eq!(
        peak_after(&mut || dev.attention_forward(
            Some(&mut y),
            &mut saved,
            None,
            &qkv,
            NH,
            KV,
            CausalMask::Full
        )),
        0
    );
    let backward =
        &mut || dev.attention_backward(&mut dqkv, &y, &y, &qkv, &saved, None, NH, KV, CausalMask::Full);
    assert_eq!(peak_after(backward), 2 * (T * T + 2 * T * HS) * 4);
}

#[test]
#[should_panic(expected = "with 4 query heads on 3 key/value heads")]
fn key_value_heads_must_divide_the_query_heads() {
    let dev = CpuDevice::new(1);
    let mut qkv = dev.zeros(&[B, T, (NH + 2 * 3) * HS], Category::Activations);
    dev.rope_forward(&mut qkv, NH, 3, RopeFrequencies::plain(10_000.0), 0);
}

#[test]
#[should_panic(expected = "rope: 5 channels of a head of 5 must turn (even, at most the head)")]
fn rope_needs_an_even_head_size() {
    let dev = CpuDevice::new(1);
    let mut qkv = dev.zeros(&[1, 3, 3 * 5], Category::Activations);
    dev.rope_forward(&mut qkv, 1, 1, RopeFrequencies::plain(10_000.0), 0);
}

/// The norms fused with the residual stream are the unfused ops' bits: residual = a + b and
/// the norm of it as `add` then the norm, and the input gradient with the residual gradient
/// folded in as the norm's backward then `accumulate`, parameter gradients alike.
#[test]
fn residual_norms_are_the_add_and_the_norm_bit_for_bit() {
    let dev = CpuDevice::new(3);
    let t = |seed: u64, shape: &[usize]| {
        dev.from_host(&random(seed, shape.iter().product(), 1.5), shape, Category::Workspace)
    };
    let z = |shape: &[usize]| dev.zeros(shape, Category::Workspace);
    let (a, b, dout, dres) = (t(1, &[B, T, C]), t(2, &[B, T, C]), t(3, &[B, T, C]), t(4, &[B, T, C]));
    let (w, bias) = (t(5, &[C]), t(6, &[C]));
    let host = |ts: &[&Tensor]| ts.iter().map(|x| dev.to_host(x)).collect::<Vec<_>>();
    for rms in [false, true] {
        let [mut res, mut out, mut dinp, mut plain_res, mut plain_out, mut plain_dinp] =
            [(); 6].map(|_| z(&[B, T, C]));
        let [mut mean, mut rstd, mut plain_mean, mut plain_rstd] = [(); 4].map(|_| z(&[N]));
        let [mut dw, mut db, mut plain_dw, mut plain_db] = [(); 4].map(|_| t(7, &[C]));
        dev.add(&mut plain_res, &a, &b);
        if rms {
            dev.rmsnorm_residual_forward(&mut res, &mut out, &mut rstd, &a, &b, &w, 1e-6);
            dev.rmsnorm_forward(&mut plain_out, &mut plain_rstd, &plain_res, &w, 1e-6);
            dev.rmsnorm_residual_backward(&mut dinp, &dres, &mut dw, &dout, &res, &w, &rstd);
            dev.rmsnorm_backward(&mut plain_dinp, &mut plain_dw, &dout, &plain_res, &w, &plain_rstd);
        } else {
            dev.layernorm_residual_forward(&mut res, &mut out, &mut mean, &mut rstd, &a, &b, &w, &bias, 1e-5);
            dev.layernorm_forward(
                &mut plain_out,
                &mut plain_mean,
                &mut plain_rstd,
                &plain_res,
                &w,
                &bias,
                1e-5,
            );
            dev.layernorm_residual_backward(
                &mut dinp, &dres, &mut dw, &mut db, &dout, &res, &w, &mean, &rstd,
            );
            dev.layernorm_backward(
                &mut plain_dinp,
                &mut plain_dw,
                &mut plain_db,
                &dout,
                &plain_res,
                &w,
                &plain_mean,
                &plain_rstd,
            );
        }
        dev.accumulate(&mut plain_dinp, &dres);
        let fused = host(&[&res, &out, &mean, &rstd, &dinp, &dw, &db]);
        let plain =
            host(&[&plain_res, &plain_out, &plain_mean, &plain_rstd, &plain_dinp, &plain_dw, &plain_db]);
        for (i, (f, p)) in fused.iter().zip(&plain).enumerate() {
            let same = f.iter().zip(p).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "rms {rms}: output {i} of the fused ops differs from the unfused ops'");
        }
        // The gradients did move: a check that compared two untouched buffers would pass too.
        assert_ne!(dev.to_host(&dinp), dev.to_host(&dres), "rms {rms}: the norm's gradient was added");
    }
}

/// The AdamW hyper-parameters of these tests at 1-based `step`.
fn adamw_step(step: u32) -> AdamWStep {
    AdamWStep { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step, grad_scale: 0.5 }
}

/// AdamW on many tensors at once steps each as `adamw` steps it alone, with the step's
/// weight decay where the tensor decays and none where it does not.
#[test]
fn adamw_tensors_steps_each_as_adamw_alone() {
    let (dev, hp) = (CpuDevice::new(2), adamw_step(2));
    let put = |data: &[f32], cat| dev.from_host(data, &[data.len()], cat);
    let zeros = |n| dev.zeros(&[n], Category::OptimizerState);
    let (a0, b0, ga, gb) =
        (random(51, 30, 1.0), random(52, 11, 1.0), random(53, 30, 0.1), random(54, 11, 0.1));
    let (ga, gb) = (put(&ga, Category::Gradients), put(&gb, Category::Gradients));
    let (mut a, mut b) = (put(&a0, Category::Parameters), put(&b0, Category::Parameters));
    let (mut ma, mut va, mut mb, mut vb) = (zeros(30), zeros(30), zeros(11), zeros(11));
    dev.adamw_tensors(
        &mut [
            AdamWTensor { param: &mut a, grad: &ga, m: &mut ma, v: &mut va, from: 0, decay: true },
            AdamWTensor { param: &mut b, grad: &gb, m: &mut mb, v: &mut vb, from: 0, decay: false },
        ],
        hp,
    );
    let (mut a1, mut b1) = (put(&a0, Category::Parameters), put(&b0, Category::Parameters));
    let (mut ma1, mut va1, mut mb1, mut vb1) = (zeros(30), zeros(30), zeros(11), zeros(11));
    dev.adamw(&mut a1, &ga, &mut ma1, &mut va1, hp);
    dev.adamw(&mut b1, &gb, &mut mb1, &mut vb1, AdamWStep { weight_decay: 0.0, ..hp });
    let bits = |t: &Tensor| dev.to_host(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (got, want) in [(&a, &a1), (&ma, &ma1), (&va, &va1), (&b, &b1), (&mb, &mb1), (&vb, &vb1)] {
        assert_eq!(bits(got), bits(want));
    }
    // Without its decay the bias would have moved otherwise.
    let mut b2 = put(&b0, Category::Parameters);
    dev.adamw(&mut b2, &gb, &mut zeros(11), &mut zeros(11), hp);
    assert_ne!(bits(&b2), bits(&b));
}

/// The distributed optimizer's ops on a part of a tensor: AdamW on elements 7..20 of 27
/// leaves exactly those elements as the whole step does and the rest untouched; a part's
/// sum of squares is that of a tensor of just its elements; `write_at` lands where it says.
#[test]
fn the_ops_on_a_part_are_the_whole_ops_there() {
    let dev = CpuDevice::new(2);
    let (n, part) = (27, 7..20);
    let (p0, g) = (random(41, n, 1.0), random(42, n, 0.1));
    let hp = adamw_step;
    let put = |data: &[f32], cat| dev.from_host(data, &[data.len()], cat);
    let grad = put(&g, Category::Gradients);
    let (mut whole, mut cut) = (put(&p0, Category::Parameters), put(&p0, Category::Parameters));
    let moments =
        |len| (dev.zeros(&[len], Category::OptimizerState), dev.zeros(&[len], Category::OptimizerState));
    let ((mut m, mut v), (mut pm, mut pv)) = (moments(n), moments(part.len()));
    for step in 1..=2 {
        dev.adamw(&mut whole, &grad, &mut m, &mut v, hp(step));
        let cut = AdamWTensor {
            param: &mut cut,
            grad: &grad,
            m: &mut pm,
            v: &mut pv,
            from: part.start,
            decay: true,
        };
        dev.adamw_tensors(&mut [cut], hp(step));
    }
    let (whole, cut) = (dev.to_host(&whole), dev.to_host(&cut));
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&cut[part.clone()]), bits(&whole[part.clone()]));
    assert_eq!(bits(&cut[..part.start]), bits(&p0[..part.start]));
    assert_eq!(bits(&cut[part.end..]), bits(&p0[part.end..]));
    assert_eq!(bits(&dev.to_host(&pm)), bits(&dev.to_host(&m)[part.clone()]));
    assert_eq!(bits(&dev.to_host(&pv)), bits(&dev.to_host(&v)[part.clone()]));

    let big = random(43, 3 * super::CHUNK + 5, 1.0);
    let (t, range) = (put(&big, Category::Gradients), 5..2 * super::CHUNK + 9);
    let mut out = dev.readout(2);
    dev.sum_squares_of_parts_into(&mut out, 0, &[(&t, range.clone()), (&t, 0..0)]);
    let alone = dev.sum_squares(&put(&big[range], Category::Gradients));
    assert_eq!(dev.read(&out), [alone, 0.0]);

    let mut w = put(&[0.0; 6], Category::Parameters);
    dev.write_at(&mut w, 2, &[1.0, 2.0, 3.0]);
    assert_eq!(dev.to_host(&w), [0.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
}
