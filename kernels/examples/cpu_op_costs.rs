//! Times every op of one GPT-2-124M transformer block (forward and backward) and of the LM
//! head with its loss on a CpuDevice, against the matmul peak of the same run: how much of a
//! training step the non-matmul kernels cost. Then the same for a Llama block of the same
//! width (RMSNorm, RoPE, 12 query heads on 4 key/value heads, SwiGLU of 2048), and each
//! block's forward as a share of the matmul peak: what its MFU would be.
//!
//! cargo run --release -p kernels --example cpu_op_costs -- [threads] [micro_batch] [seq_len]

use kernels::cpu::{cross_entropy, measure_matmul_peak, CpuDevice};
use kernels::{
    AttentionSaved, Category, CausalMask, Device, DropoutKey, DropoutSite, DropoutSpec, Gate,
    RopeFrequencies, Tensor, WeightLayout,
};
use std::cell::Cell;
use std::time::Instant;

const C: usize = 768;
const NH: usize = 12;
const V: usize = 50257;
/// The Llama block's key/value heads, head size and SwiGLU width.
const KV: usize = 4;
const HS: usize = C / NH;
const F: usize = 2048;

/// Which part of the step an op belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Gpt2Forward,
    Gpt2Backward,
    Head,
    LlamaForward,
    LlamaBackward,
}

fn main() {
    let arg =
        |i: usize, default: usize| std::env::args().nth(i).map_or(default, |a| a.parse().expect("a number"));
    let (threads, b, t) = (arg(1, 2), arg(2, 4), arg(3, 256));
    let n = b * t;
    let dev = CpuDevice::new(threads);
    let peak = measure_matmul_peak(&dev);
    let z = |shape: &[usize]| dev.zeros(shape, Category::Activations);
    let filled = |shape: &[usize], seed: usize| {
        let len: usize = shape.iter().product();
        let data: Vec<f32> =
            (0..len).map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 * 1e-4 - 0.1).collect();
        dev.from_host(&data, shape, Category::Parameters)
    };
    let drop = |site| DropoutSpec {
        p: 0.1,
        key: DropoutKey { seed: 1, step: 1, microbatch: 0, layer: 0, site },
        first: 0,
        heads: None,
    };
    let part = Cell::new(Part::Gpt2Forward);
    let mut rows: Vec<(Part, &str, f64, f64)> = Vec::new(); // (part, op, seconds, matmul FLOPs)
                                                            // One warm-up, then the best of up to 5 runs within half a second (the machine is shared).
    let mut time = |name: &'static str, flops: f64, f: &mut dyn FnMut()| {
        f();
        let (mut best, mut spent) = (f64::MAX, 0.0);
        for _ in 0..5 {
            let start = Instant::now();
            f();
            let took = start.elapsed().as_secs_f64();
            (best, spent) = (best.min(took), spent + took);
            if spent > 0.5 {
                break;
            }
        }
        rows.push((part.get(), name, best, flops));
    };
    let mm = |rows_: usize, ic: usize, oc: usize| 2.0 * (rows_ * ic * oc) as f64;

    let (x, w_ln, b_ln) = (filled(&[b, t, C], 1), filled(&[C], 2), filled(&[C], 3));
    let (mut ln, mut mean, mut rstd) = (z(&[n, C]), z(&[n]), z(&[n]));
    let (w_qkv, b_qkv, w_o, w_fc, w_pr) = (
        filled(&[C, 3 * C], 4),
        filled(&[3 * C], 5),
        filled(&[C, C], 6),
        filled(&[C, 4 * C], 7),
        filled(&[4 * C, C], 8),
    );
    let (mut qkv, mut y) = (z(&[b, t, 3 * C]), z(&[b, t, C]));
    let mut saved =
        AttentionSaved::Probabilities { probs: z(&[b, NH, t, t]), dropped: Some(z(&[b, NH, t, t])) };
    let (mut h, mut g, mut o, mut res) = (z(&[n, 4 * C]), z(&[n, 4 * C]), z(&[n, C]), z(&[n, C]));
    let attn = drop(DropoutSite::AttentionProbs);

    time("layernorm fwd", 0.0, &mut || {
        dev.layernorm_forward(&mut ln, &mut mean, &mut rstd, &x, &w_ln, &b_ln, 1e-5)
    });
    time("matmul fwd qkv", mm(n, C, 3 * C), &mut || {
        dev.matmul_forward(&mut qkv, &ln, &w_qkv, WeightLayout::InOut, Some(&b_qkv))
    });
    time("attention fwd", 0.0, &mut || {
        dev.attention_forward(Some(&mut y), &mut saved, Some(attn), &qkv, NH, NH, CausalMask::Full)
    });
    time("matmul fwd proj", mm(n, C, C), &mut || {
        dev.matmul_forward(&mut o, &y, &w_o, WeightLayout::InOut, None)
    });
    time("dropout fwd", 0.0, &mut || dev.dropout_forward(&mut res, &o, drop(DropoutSite::AttentionResidual)));
    time("residual add", 0.0, &mut || dev.add(&mut o, &res, &x));
    time("matmul fwd fc", mm(n, C, 4 * C), &mut || {
        dev.matmul_forward(&mut h, &ln, &w_fc, WeightLayout::InOut, None)
    });
    time("gelu fwd", 0.0, &mut || dev.gelu_forward(&mut g, &h));
    time("matmul fwd fc proj", mm(n, 4 * C, C), &mut || {
        dev.matmul_forward(&mut o, &g, &w_pr, WeightLayout::InOut, None)
    });

    part.set(Part::Gpt2Backward);
    let (mut dx, mut dln, mut dqkv, mut dy) = (z(&[n, C]), z(&[n, C]), z(&[b, t, 3 * C]), z(&[n, C]));
    let (mut dh, mut dg) = (z(&[n, 4 * C]), z(&[n, 4 * C]));
    let (mut dw_qkv, mut db_qkv, mut dw_fc, mut dw_pr) =
        (z(&[C, 3 * C]), z(&[3 * C]), z(&[C, 4 * C]), z(&[4 * C, C]));
    let (mut dw_ln, mut db_ln) = (z(&[C]), z(&[C]));
    time("matmul bwd fc proj", 2.0 * mm(n, 4 * C, C), &mut || {
        dev.matmul_backward_input(&mut dg, &o, &w_pr, WeightLayout::InOut);
        dev.matmul_backward_weight(&mut dw_pr, None, &o, &g, WeightLayout::InOut);
    });
    time("gelu bwd", 0.0, &mut || dev.gelu_backward(&mut dh, &h, &dg));
    time("matmul bwd fc", 2.0 * mm(n, C, 4 * C), &mut || {
        dev.matmul_backward_input(&mut dln, &dh, &w_fc, WeightLayout::InOut);
        dev.matmul_backward_weight(&mut dw_fc, None, &dh, &ln, WeightLayout::InOut);
    });
    time("dropout bwd", 0.0, &mut || dev.dropout_backward(&mut dy, &o, drop(DropoutSite::AttentionResidual)));
    time("attention bwd", 0.0, &mut || {
        dev.attention_backward(&mut dqkv, &dy, &y, &qkv, &saved, Some(attn), NH, NH, CausalMask::Full)
    });
    time("matmul bwd qkv", 2.0 * mm(n, C, 3 * C), &mut || {
        dev.matmul_backward_input(&mut dln, &dqkv, &w_qkv, WeightLayout::InOut);
        dev.matmul_backward_weight(&mut dw_qkv, Some(&mut db_qkv), &dqkv, &ln, WeightLayout::InOut);
    });
    time("layernorm bwd", 0.0, &mut || {
        dev.layernorm_backward(&mut dx, &mut dw_ln, &mut db_ln, &dln, &x, &w_ln, &mean, &rstd)
    });
    time("accumulate", 0.0, &mut || dev.accumulate(&mut dx, &dy));

    part.set(Part::Head);
    let wte = filled(&[V, C], 9);
    let mut dwte = z(&[V, C]);
    let mut logits = z(&[n, V]);
    let mut losses = z(&[n]);
    let targets: Vec<u32> = (0..n as u32).map(|i| i * 31 % V as u32).collect();
    time("matmul fwd lm head", mm(n, C, V), &mut || {
        dev.matmul_forward(&mut logits, &ln, &wte, WeightLayout::OutIn, None)
    });
    // The loss pass of `Device::classifier` alone, between its two matmuls, on as many threads.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
    time("cross entropy", 0.0, &mut || {
        pool.install(|| {
            cross_entropy::forward_backward(losses.cpu_mut(), logits.cpu_mut(), &targets, Some(1.0))
        })
    });
    time("matmul bwd lm head", 2.0 * mm(n, C, V), &mut || {
        dev.matmul_backward_input(&mut dln, &logits, &wte, WeightLayout::OutIn);
        dev.matmul_backward_weight(&mut dwte, None, &logits, &ln, WeightLayout::OutIn);
    });
    let param_grad: Tensor = filled(&[V, C], 10);
    let (mut m, mut v, mut p) = (z(&[V, C]), z(&[V, C]), filled(&[V, C], 11));
    let hp = kernels::AdamWStep {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 1,
        grad_scale: 1.0,
    };
    time("adamw (wte)", 0.0, &mut || dev.adamw(&mut p, &param_grad, &mut m, &mut v, hp));
    time("sum_squares (wte)", 0.0, &mut || {
        std::hint::black_box(dev.sum_squares(&param_grad));
    });

    // The Llama block: nn.Linear weights (OutIn), no biases, no dropout.
    part.set(Part::LlamaForward);
    let qkv_width = (NH + 2 * KV) * HS;
    let (w_norm, w_qkv, w_o, w_fc, w_pr) = (
        filled(&[C], 12),
        filled(&[qkv_width, C], 13),
        filled(&[C, C], 14),
        filled(&[2 * F, C], 15),
        filled(&[C, F], 16),
    );
    let (mut qkv, mut h, mut g) = (z(&[b, t, qkv_width]), z(&[n, 2 * F]), z(&[n, F]));
    let mut saved = AttentionSaved::Probabilities { probs: z(&[b, NH, t, t]), dropped: None };
    time("rmsnorm fwd", 0.0, &mut || dev.rmsnorm_forward(&mut ln, &mut rstd, &x, &w_norm, 1e-5));
    time("matmul fwd qkv", mm(n, C, qkv_width), &mut || {
        dev.matmul_forward(&mut qkv, &ln, &w_qkv, WeightLayout::OutIn, None)
    });
    time("rope fwd", 0.0, &mut || dev.rope_forward(&mut qkv, NH, KV, RopeFrequencies::plain(10_000.0), 0));
    time("attention fwd", 0.0, &mut || {
        dev.attention_forward(Some(&mut y), &mut saved, None, &qkv, NH, KV, CausalMask::Full)
    });
    time("matmul fwd proj", mm(n, C, C), &mut || {
        dev.matmul_forward(&mut o, &y, &w_o, WeightLayout::OutIn, None)
    });
    time("residual add", 0.0, &mut || dev.add(&mut res, &o, &x));
    time("matmul fwd fc", mm(n, C, 2 * F), &mut || {
        dev.matmul_forward(&mut h, &ln, &w_fc, WeightLayout::OutIn, None)
    });
    time("swiglu fwd", 0.0, &mut || dev.glu_forward(&mut g, &h, Gate::Silu));
    time("matmul fwd fc proj", mm(n, F, C), &mut || {
        dev.matmul_forward(&mut o, &g, &w_pr, WeightLayout::OutIn, None)
    });

    part.set(Part::LlamaBackward);
    let (mut dqkv, mut dh, mut dg) = (z(&[b, t, qkv_width]), z(&[n, 2 * F]), z(&[n, F]));
    let (mut dw_qkv, mut dw_fc, mut dw_pr) = (z(&[qkv_width, C]), z(&[2 * F, C]), z(&[C, F]));
    time("matmul bwd fc proj", 2.0 * mm(n, F, C), &mut || {
        dev.matmul_backward_input(&mut dg, &o, &w_pr, WeightLayout::OutIn);
        dev.matmul_backward_weight(&mut dw_pr, None, &o, &g, WeightLayout::OutIn);
    });
    time("swiglu bwd", 0.0, &mut || dev.glu_backward(&mut dh, &h, &dg, Gate::Silu));
    time("matmul bwd fc", 2.0 * mm(n, C, 2 * F), &mut || {
        dev.matmul_backward_input(&mut dln, &dh, &w_fc, WeightLayout::OutIn);
        dev.matmul_backward_weight(&mut dw_fc, None, &dh, &ln, WeightLayout::OutIn);
    });
    time("attention bwd", 0.0, &mut || {
        dev.attention_backward(&mut dqkv, &dy, &y, &qkv, &saved, None, NH, KV, CausalMask::Full)
    });
    time("rope bwd", 0.0, &mut || dev.rope_backward(&mut dqkv, NH, KV, RopeFrequencies::plain(10_000.0)));
    time("matmul bwd qkv", 2.0 * mm(n, C, qkv_width), &mut || {
        dev.matmul_backward_input(&mut dln, &dqkv, &w_qkv, WeightLayout::OutIn);
        dev.matmul_backward_weight(&mut dw_qkv, None, &dqkv, &ln, WeightLayout::OutIn);
    });
    time("rmsnorm bwd", 0.0, &mut || dev.rmsnorm_backward(&mut dx, &mut dw_ln, &dln, &x, &w_norm, &rstd));

    println!("{} | B={b} T={t} | matmul peak {:.1} GFLOP/s", dev.name(), peak / 1e9);
    let titles = [
        (Part::Gpt2Forward, "GPT-2 block forward"),
        (Part::Gpt2Backward, "GPT-2 block backward"),
        (Part::Head, "LM head, loss, optimizer"),
        (Part::LlamaForward, "Llama block forward (KV 4, SwiGLU 2048)"),
        (Part::LlamaBackward, "Llama block backward"),
    ];
    for (which, title) in titles {
        println!("-- {title}");
        for (_, name, secs, flops) in rows.iter().filter(|r| r.0 == which) {
            let rate = if *flops > 0.0 {
                format!("{:5.1}% of peak", 100.0 * flops / secs / peak)
            } else {
                String::new()
            };
            println!("{name:>20} {:9.3} ms  {rate}", secs * 1e3);
        }
    }
    type Row<'a> = (Part, &'a str, f64, f64);
    let sum = |rs: &[&Row], i: fn(&Row) -> f64| rs.iter().map(|r| i(r)).sum::<f64>();
    let gpt2: Vec<&Row> =
        rows.iter().filter(|r| !matches!(r.0, Part::LlamaForward | Part::LlamaBackward)).collect();
    let (mm_time, other): (Vec<&Row>, Vec<_>) = gpt2.iter().partition(|r| r.3 > 0.0);
    let flops = sum(&mm_time, |r| r.3);
    let (mm_s, other_s) = (sum(&mm_time, |r| r.2), sum(&other, |r| r.2));
    println!(
        "GPT-2: matmul {:.1} ms at {:.1}% of peak; everything else {:.1} ms = {:.1}% of the total",
        mm_s * 1e3,
        100.0 * flops / mm_s / peak,
        other_s * 1e3,
        100.0 * other_s / (mm_s + other_s)
    );
    for (which, model) in [(Part::Gpt2Forward, "GPT-2"), (Part::LlamaForward, "Llama")] {
        let forward: Vec<&Row> = rows.iter().filter(|r| r.0 == which).collect();
        let (flops, secs) = (sum(&forward, |r| r.3), sum(&forward, |r| r.2));
        println!(
            "{model} block forward: {:.1} ms, {:.1}% of the matmul peak",
            secs * 1e3,
            100.0 * flops / secs / peak
        );
    }
}
