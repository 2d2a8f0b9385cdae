//! Every op of the `Device` trait on one device against another (the GPU against the CPU)
//! on the same inputs, at the sizes given (the bench's: GPT-2 small's training sizes): per
//! op, the largest difference relative to the largest magnitude of the reference's result,
//! as `kernels/tests/cuda_ops.rs` judges them. The tests assert at small odd sizes; this
//! prints figures at the real ones, on the machine at hand.

use super::{Row, Verdict};
use kernels::{
    AdamWStep, AttentionSaved, AttentionSaves, Category, CausalMask, ClassifierGrad, Device, DropoutKey,
    DropoutSite, DropoutSpec, SplitMix64, Tensor, WeightLayout,
};

/// The tests' bound: fp32 against fp32, different summation orders.
const TOLERANCE: f64 = 1e-5;

/// B, T, C, NH and V of the inputs.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub heads: usize,
    pub vocab: usize,
}

impl Sizes {
    pub const GPT2_SMALL: Sizes = Sizes { b: 4, t: 1024, c: 768, heads: 12, vocab: 50257 };
    /// On the CUDA stand-in, whose kernels run under an emulator: every op still, at sizes
    /// that take seconds there (the vocabulary stays GPT-2's, the classifier's real width).
    pub const STANDIN: Sizes = Sizes { b: 2, t: 64, c: 64, heads: 4, vocab: 50257 };
}

/// What an op reads, made once on the host and uploaded to each device.
struct Inputs {
    s: Sizes,
    /// [B,T,C] twice, [B,T,3C], [B,T,4C].
    x: Vec<f32>,
    y: Vec<f32>,
    qkv: Vec<f32>,
    wide: Vec<f32>,
    /// c_attn's weight [C,3C] and bias [3C]; a LayerNorm's weight and bias [C].
    w: Vec<f32>,
    bias: Vec<f32>,
    ln_w: Vec<f32>,
    ln_b: Vec<f32>,
    /// wte [V,C], wpe [T,C], token ids and targets [B*T].
    wte: Vec<f32>,
    wpe: Vec<f32>,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

impl Inputs {
    fn new(s: Sizes) -> Inputs {
        let (n, c) = (s.b * s.t, s.c);
        let mut d = SplitMix64::new(1234);
        Inputs {
            s,
            x: d.uniform(n * c, 1.0),
            y: d.uniform(n * c, 1.0),
            qkv: d.uniform(n * 3 * c, 1.0),
            wide: d.uniform(n * 4 * c, 2.0),
            w: d.uniform(c * 3 * c, 0.05),
            bias: d.uniform(3 * c, 0.05),
            ln_w: d.uniform(c, 0.1).iter().map(|w| 1.0 + w).collect(),
            ln_b: d.uniform(c, 0.1),
            wte: d.uniform(s.vocab * c, 0.05),
            wpe: d.uniform(s.t * c, 0.05),
            tokens: d.below(n, s.vocab as u32),
            targets: d.below(n, s.vocab as u32),
        }
    }
}

fn dropout(site: DropoutSite) -> DropoutSpec {
    DropoutSpec {
        p: 0.1,
        key: DropoutKey { seed: 1234, step: 1, microbatch: 0, layer: 0, site },
        first: 0,
        heads: None,
    }
}

/// A device and what its attention core keeps (the CPU: the probabilities; CUDA: the fused
/// core's log-sum-exp up to head size 64), which only the core's outputs are compared across.
pub type Under<'a> = (&'a dyn Device, AttentionSaves);

/// One op's outputs on a device, downloaded.
type Op = fn(Under, &Inputs) -> Vec<Vec<f32>>;

fn ops() -> [(&'static str, Op); 21] {
    [
        ("add", |(d, _), i| {
            let mut out = d.empty(&[i.x.len()], Category::Workspace);
            d.add(&mut out, &put(d, &i.x), &put(d, &i.y));
            host(d, [out])
        }),
        ("accumulate", |(d, _), i| {
            let mut acc = put(d, &i.x);
            d.accumulate(&mut acc, &put(d, &i.y));
            host(d, [acc])
        }),
        ("sum_squares", |(d, _), i| vec![vec![d.sum_squares(&put(d, &i.qkv)) as f32]]),
        ("embedding forward", |(d, _), i| {
            let s = i.s;
            let mut out = d.empty(&[s.b, s.t, s.c], Category::Workspace);
            d.embedding_forward(
                &mut out,
                &i.tokens,
                &shaped(d, &i.wte, &[s.vocab, s.c]),
                Some(&shaped(d, &i.wpe, &[s.t, s.c])),
            );
            host(d, [out])
        }),
        ("embedding backward", |(d, _), i| {
            let s = i.s;
            let (mut dwte, mut dwpe) =
                (d.zeros(&[s.vocab, s.c], Category::Workspace), d.zeros(&[s.t, s.c], Category::Workspace));
            d.embedding_backward(&mut dwte, Some(&mut dwpe), &shaped(d, &i.x, &[s.b, s.t, s.c]), &i.tokens);
            host(d, [dwte, dwpe])
        }),
        ("layernorm forward", |(d, _), i| host(d, layernorm(d, i))),
        ("layernorm backward", |(d, _), i| {
            let [_, mean, rstd] = layernorm(d, i);
            let (n, c) = (i.s.b * i.s.t, i.s.c);
            let mut dinp = d.empty(&[n, c], Category::Workspace);
            let (mut dw, mut db) = (d.zeros(&[c], Category::Workspace), d.zeros(&[c], Category::Workspace));
            let (inp, dout) = (shaped(d, &i.x, &[n, c]), shaped(d, &i.y, &[n, c]));
            d.layernorm_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &put(d, &i.ln_w), &mean, &rstd);
            host(d, [dinp, dw, db])
        }),
        ("residual add + layernorm forward", |(d, _), i| host(d, residual_layernorm(d, i))),
        ("layernorm backward + residual gradient", |(d, _), i| {
            let [residual, _, mean, rstd] = residual_layernorm(d, i);
            let (n, c) = (i.s.b * i.s.t, i.s.c);
            let mut dinp = d.empty(&[n, c], Category::Workspace);
            let (mut dw, mut db) = (d.zeros(&[c], Category::Workspace), d.zeros(&[c], Category::Workspace));
            let (dres, dout) = (shaped(d, &i.x, &[n, c]), shaped(d, &i.y, &[n, c]));
            let w = put(d, &i.ln_w);
            d.layernorm_residual_backward(
                &mut dinp, &dres, &mut dw, &mut db, &dout, &residual, &w, &mean, &rstd,
            );
            host(d, [dinp, dw, db])
        }),
        ("matmul forward (c_attn)", |(d, _), i| {
            let (n, c) = (i.s.b * i.s.t, i.s.c);
            let mut out = d.empty(&[n, 3 * c], Category::Workspace);
            let bias = put(d, &i.bias);
            d.matmul_forward(
                &mut out,
                &shaped(d, &i.x, &[n, c]),
                &shaped(d, &i.w, &[c, 3 * c]),
                WeightLayout::InOut,
                Some(&bias),
            );
            host(d, [out])
        }),
        ("matmul backward input", |(d, _), i| {
            let (n, c) = (i.s.b * i.s.t, i.s.c);
            let mut dinp = d.empty(&[n, c], Category::Workspace);
            let w = shaped(d, &i.w, &[c, 3 * c]);
            d.matmul_backward_input(&mut dinp, &shaped(d, &i.qkv, &[n, 3 * c]), &w, WeightLayout::InOut);
            host(d, [dinp])
        }),
        ("matmul backward input through gelu", |(d, _), i| {
            let (n, c) = (i.s.b * i.s.t, i.s.c);
            let mut dinp = d.empty(&[n, c], Category::Workspace);
            let (w, dout) = (shaped(d, &i.w, &[c, 3 * c]), shaped(d, &i.qkv, &[n, 3 * c]));
            d.matmul_backward_input_gelu(
                &mut dinp,
                &dout,
                &w,
                WeightLayout::InOut,
                &shaped(d, &i.x, &[n, c]),
            );
            host(d, [dinp])
        }),
        ("matmul backward weight", |(d, _), i| {
            let (n, c) = (i.s.b * i.s.t, i.s.c);
            let (mut dw, mut db) =
                (d.zeros(&[c, 3 * c], Category::Workspace), d.zeros(&[3 * c], Category::Workspace));
            let (dout, inp) = (shaped(d, &i.qkv, &[n, 3 * c]), shaped(d, &i.x, &[n, c]));
            d.matmul_backward_weight(&mut dw, Some(&mut db), &dout, &inp, WeightLayout::InOut);
            host(d, [dw, db])
        }),
        ("matmul forward (LM head)", |(d, _), i| host(d, [logits(d, i)])),
        ("attention forward", |(d, kind), i| host(d, [attention(d, kind, i, None).0])),
        ("attention forward, dropout", |(d, kind), i| {
            host(d, [attention(d, kind, i, Some(dropout(DropoutSite::AttentionProbs))).0])
        }),
        ("attention backward, dropout", |(d, kind), i| {
            let s = i.s;
            let spec = dropout(DropoutSite::AttentionProbs);
            let (out, saved) = attention(d, kind, i, Some(spec));
            let mut dqkv = d.empty(&[s.b, s.t, 3 * s.c], Category::Workspace);
            let (dout, qkv) = (shaped(d, &i.y, &[s.b, s.t, s.c]), shaped(d, &i.qkv, &[s.b, s.t, 3 * s.c]));
            d.attention_backward(
                &mut dqkv,
                &dout,
                &out,
                &qkv,
                &saved,
                Some(spec),
                s.heads,
                s.heads,
                CausalMask::Full,
            );
            host(d, [dqkv])
        }),
        ("gelu forward and backward", |(d, _), i| {
            let n = i.wide.len();
            let (inp, mut out, mut dinp) =
                (put(d, &i.wide), d.empty(&[n], Category::Workspace), d.empty(&[n], Category::Workspace));
            d.gelu_forward(&mut out, &inp);
            d.gelu_backward(&mut dinp, &inp, &put(d, &i.wide[..n].iter().rev().copied().collect::<Vec<_>>()));
            host(d, [out, dinp])
        }),
        ("dropout forward and backward", |(d, _), i| {
            let spec = dropout(DropoutSite::MlpResidual);
            let (mut out, mut dinp) =
                (d.empty(&[i.x.len()], Category::Workspace), d.empty(&[i.x.len()], Category::Workspace));
            d.dropout_forward(&mut out, &put(d, &i.x), spec);
            d.dropout_backward(&mut dinp, &put(d, &i.y), spec);
            host(d, [out, dinp])
        }),
        ("classifier: loss, dinp and dwte", |(d, _), i| {
            let (n, c, v) = (i.s.b * i.s.t, i.s.c, i.s.vocab);
            let mut losses = d.empty(&[n], Category::Workspace);
            let (mut dinp, mut dwte) =
                (d.empty(&[n, c], Category::Workspace), d.zeros(&[v, c], Category::Workspace));
            let grad = ClassifierGrad { scale: 1.0 / n as f32, dinp: &mut dinp, dweight: &mut dwte };
            d.classifier(
                &mut losses,
                &shaped(d, &i.x, &[n, c]),
                &shaped(d, &i.wte, &[v, c]),
                &i.targets,
                Some(grad),
            );
            host(d, [losses, dinp, dwte])
        }),
        ("adamw", |(d, _), i| {
            let (mut param, grad) = (put(d, &i.x), put(d, &i.y));
            let (mut m, mut v) =
                (put(d, &i.wide[..i.x.len()]), put(d, &i.x.iter().map(|x| x * x).collect::<Vec<_>>()));
            let hp = AdamWStep {
                lr: 6e-4,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                step: 3,
                grad_scale: 0.5,
            };
            d.adamw(&mut param, &grad, &mut m, &mut v, hp);
            host(d, [param, m, v])
        }),
    ]
}

fn put(d: &dyn Device, data: &[f32]) -> Tensor {
    d.from_host(data, &[data.len()], Category::Workspace)
}

fn shaped(d: &dyn Device, data: &[f32], shape: &[usize]) -> Tensor {
    d.from_host(data, shape, Category::Workspace)
}

fn host<const K: usize>(d: &dyn Device, tensors: [Tensor; K]) -> Vec<Vec<f32>> {
    tensors.iter().map(|t| d.to_host(t)).collect()
}

/// ln(x): out [N,C], mean and rstd [N].
fn layernorm(d: &dyn Device, i: &Inputs) -> [Tensor; 3] {
    let (n, c) = (i.s.b * i.s.t, i.s.c);
    let (mut out, mut mean, mut rstd) = (
        d.empty(&[n, c], Category::Workspace),
        d.empty(&[n], Category::Workspace),
        d.empty(&[n], Category::Workspace),
    );
    d.layernorm_forward(
        &mut out,
        &mut mean,
        &mut rstd,
        &shaped(d, &i.x, &[n, c]),
        &put(d, &i.ln_w),
        &put(d, &i.ln_b),
        1e-5,
    );
    [out, mean, rstd]
}

/// x + y and ln of it in one op (a block's residual add and norm_2): residual and out
/// [N,C], mean and rstd [N].
fn residual_layernorm(d: &dyn Device, i: &Inputs) -> [Tensor; 4] {
    let (n, c) = (i.s.b * i.s.t, i.s.c);
    let [mut residual, mut out] = [(); 2].map(|_| d.empty(&[n, c], Category::Workspace));
    let [mut mean, mut rstd] = [(); 2].map(|_| d.empty(&[n], Category::Workspace));
    let (x, y) = (shaped(d, &i.x, &[n, c]), shaped(d, &i.y, &[n, c]));
    let (w, b) = (put(d, &i.ln_w), put(d, &i.ln_b));
    d.layernorm_residual_forward(&mut residual, &mut out, &mut mean, &mut rstd, &x, &y, &w, &b, 1e-5);
    [residual, out, mean, rstd]
}

/// x [N,C] against the tied wte [V,C]: the LM head's logits [N,V].
fn logits(d: &dyn Device, i: &Inputs) -> Tensor {
    let (n, c, v) = (i.s.b * i.s.t, i.s.c, i.s.vocab);
    let mut out = d.empty(&[n, v], Category::Workspace);
    d.matmul_forward(
        &mut out,
        &shaped(d, &i.x, &[n, c]),
        &shaped(d, &i.wte, &[v, c]),
        WeightLayout::OutIn,
        None,
    );
    out
}

/// out [B,T,C] and what the core keeps, of the kind `kind`.
fn attention(
    d: &dyn Device,
    kind: AttentionSaves,
    i: &Inputs,
    spec: Option<DropoutSpec>,
) -> (Tensor, AttentionSaved) {
    let s = i.s;
    let mut out = d.empty(&[s.b, s.t, s.c], Category::Workspace);
    let mut saved = d.empty_attention_saved(kind, [s.b, s.heads, s.t], spec.is_some(), Category::Workspace);
    let qkv = shaped(d, &i.qkv, &[s.b, s.t, 3 * s.c]);
    d.attention_forward(Some(&mut out), &mut saved, spec, &qkv, s.heads, s.heads, CausalMask::Full);
    (out, saved)
}

/// max |got - want| over max |want| across an op's outputs (infinite where got is NaN).
fn relative_error(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    let pairs = || got.iter().flatten().zip(want.iter().flatten());
    let scale = want.iter().flatten().fold(0.0f64, |m, &w| m.max(f64::from(w).abs())).max(f64::MIN_POSITIVE);
    let worst = pairs().fold(0.0f64, |m, (&g, &w)| {
        if g.is_nan() != w.is_nan() {
            f64::INFINITY
        } else {
            m.max((f64::from(g) - f64::from(w)).abs())
        }
    });
    worst / scale
}

/// Every op on `dev` against `reference`, one row each.
pub fn rows(dev: Under, reference: Under, sizes: Sizes) -> Vec<Row> {
    let inputs = Inputs::new(sizes);
    ops()
        .iter()
        .map(|(name, op)| {
            let error = relative_error(&op(dev, &inputs), &op(reference, &inputs));
            Row {
                check: format!("op vs CPU: {name}"),
                measured: format!("{error:.1e}"),
                against: format!("<= {TOLERANCE:.0e} of the largest value"),
                verdict: Verdict::within(error, TOLERANCE),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::cpu::CpuDevice;

    /// Every op runs, on two CPU devices of different thread counts, to the same bits: the
    /// comparison's machinery is sound, and a GPU's difference is the GPU's.
    #[test]
    fn every_op_on_two_cpu_devices_agrees_exactly() {
        let sizes = Sizes { b: 2, t: 37, c: 96, heads: 4, vocab: 101 };
        let cpu = AttentionSaves::Probabilities;
        let rows = rows((&CpuDevice::new(2), cpu), (&CpuDevice::new(1), cpu), sizes);
        assert_eq!(rows.len(), ops().len());
        for r in &rows {
            assert_eq!((r.measured.as_str(), &r.verdict), ("0.0e0", &Verdict::Pass), "{}", r.check);
        }
    }

    #[test]
    fn the_error_is_relative_to_the_largest_reference_value_and_nan_is_infinite() {
        assert_eq!(relative_error(&[vec![1.0, 4.5]], &[vec![1.0, 4.0]]), 0.125);
        assert_eq!(relative_error(&[vec![f32::NAN]], &[vec![1.0]]), f64::INFINITY);
    }
}
