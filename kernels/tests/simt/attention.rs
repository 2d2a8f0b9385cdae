//! The attention core as kernels/src/cuda/attention.rs runs it: heads split out of qkv,
//! the causal softmax and its backward, dropout of the probabilities and the merge back,
//! with the per-head products (cuBLAS on a GPU) computed between the runs by the CPU
//! backend's matmul. Compared with the CPU's attention op, forward and backward.

use crate::harness::{close, max_abs, Family, Rng, Run};
use crate::philox::dropout_mask;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_item, per_pack, per_row_warp};
use kernels::{
    AttentionSaved, AttentionSaves, Category, CausalMask, DType, Device, DropoutKey, DropoutSite,
    DropoutSpec, WeightLayout,
};

/// qkv [B,T,C + 2*KV*hs]: NH query heads (C = NH*hs) on KV key/value heads; the keys each
/// query sees.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
    pub kv: usize,
    pub mask: CausalMask,
}

impl Dims {
    /// The kernels' `window` argument: the most keys a query sees.
    pub fn window(&self) -> i32 {
        self.mask.keys(self.t) as i32
    }
    pub fn hs(&self) -> usize {
        self.c / self.nh
    }
    /// Query heads, B*NH.
    pub fn heads(&self) -> usize {
        self.b * self.nh
    }
    /// Key/value heads, B*KV.
    pub fn kv_heads(&self) -> usize {
        self.b * self.kv
    }
    /// The key/value head (b * KV + g) that query head bh = b * NH + h reads.
    pub fn kv_of(&self, bh: usize) -> usize {
        bh / self.nh * self.kv + bh % self.nh / (self.nh / self.kv)
    }
    /// Elements of out and dout.
    pub fn act(&self) -> usize {
        self.b * self.t * self.c
    }
    /// A row of qkv.
    pub fn width(&self) -> usize {
        self.c + 2 * self.kv * self.hs()
    }
    pub fn qkv(&self) -> usize {
        self.b * self.t * self.width()
    }
}

/// [out, att, dropped, dqkv] of the CPU's attention op, forward and backward (dropped is
/// zeros without dropout).
pub fn cpu_attention(d: Dims, spec: Option<DropoutSpec>, qkv: &[f32], dout: &[f32]) -> [Vec<f32>; 4] {
    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let (b, t, c, nh) = (d.b, d.t, d.c, d.nh);
    let tqkv = put(qkv, &[b, t, d.width()]);
    let mut out = dev.zeros(&[b, t, c], Category::Workspace);
    let kind = AttentionSaves::Probabilities;
    let mut saved = dev.empty_attention_saved(kind, [b, nh, t], spec.is_some(), Category::Workspace);
    dev.attention_forward(Some(&mut out), &mut saved, spec, &tqkv, nh, d.kv, d.mask);
    let mut dqkv = dev.zeros(&[b, t, d.width()], Category::Workspace);
    dev.attention_backward(&mut dqkv, &put(dout, &[b, t, c]), &out, &tqkv, &saved, spec, nh, d.kv, d.mask);
    let AttentionSaved::Probabilities { probs, dropped } = saved else {
        unreachable!("asked for probabilities")
    };
    let dropped = dropped.map_or_else(|| vec![0.0; probs.len()], |d| dev.to_host(&d));
    [dev.to_host(&out), dev.to_host(&probs), dropped, dev.to_host(&dqkv)]
}

/// The emulated families the op uses.
struct Families {
    attention: Family,
    dropout: Family,
}

/// [B,heads,T,hs] copies of `src` (rows `stride` wide), one per (heads, first column).
fn split(
    f: &Families,
    d: Dims,
    src: &[f32],
    stride: usize,
    parts: &[(usize, usize)],
    seed: u64,
) -> Result<Vec<Vec<f32>>, String> {
    let mut run = Run::new(seed);
    let s = run.buffer(src);
    let outs: Vec<_> = parts
        .iter()
        .map(|&(heads, offset)| {
            let len = d.b * d.t * heads * d.hs();
            let dst = run.buffer(&vec![f32::NAN; len]);
            let ints = [d.b, d.t, heads, d.hs(), stride, offset].map(|x| (x as i32).into());
            let args: Vec<_> = [dst.into(), s.into()].into_iter().chain(ints).collect();
            run.launch("split_heads", per_item(len), &args);
            run.read(dst);
            dst
        })
        .collect();
    let got = f.attention.run(run)?;
    Ok(outs.into_iter().map(|b| got.get(b)).collect())
}

/// dst [B,T,stride] with each [B,heads,T,hs] copy merged into its columns from `offset`.
fn merge(
    f: &Families,
    d: Dims,
    dst: &[f32],
    stride: usize,
    parts: &[(&[f32], usize)],
    seed: u64,
) -> Result<Vec<f32>, String> {
    let mut run = Run::new(seed);
    let out = run.buffer(dst);
    for &(copy, offset) in parts {
        let src = run.buffer(copy);
        let heads = copy.len() / (d.b * d.t * d.hs());
        let ints = [d.b, d.t, heads, d.hs(), stride, offset].map(|x| (x as i32).into());
        let args: Vec<_> = [out.into(), src.into()].into_iter().chain(ints).collect();
        run.launch("merge_heads", per_item(copy.len()), &args);
    }
    run.read(out);
    Ok(f.attention.run(run)?.get(out))
}

/// `x` through dropout_apply_inplace.
fn drop(f: &Families, x: &[f32], spec: &DropoutSpec, seed: u64) -> Result<Vec<f32>, String> {
    let mut run = Run::new(seed);
    let buf = run.buffer(x);
    run.launch(
        "dropout_apply_inplace",
        per_pack(x.len(), DType::F32),
        &[buf.into(), (x.len() as u64).into(), dropout_mask(spec)],
    );
    run.read(buf);
    Ok(f.dropout.run(run)?.get(buf))
}

/// The per-head products of the CUDA op, on the CPU: `alpha` times a b^T, P x or P^T x,
/// for each query head, whose key/value operand (b of the first two, the result of the
/// third) is its group's: P^T x sums the group's query heads in ascending order.
#[derive(Clone, Copy)]
enum Product {
    Scores,
    ProbsTimes,
    ProbsTransposedTimes,
}

fn heads_product(dev: &CpuDevice, d: Dims, product: Product, alpha: f32, a: &[f32], b: &[f32]) -> Vec<f32> {
    let (t, hs) = (d.t, d.hs());
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let small = |x: &[f32], h: usize| put(&x[h * t * hs..][..t * hs], &[t, hs]);
    let square = |x: &[f32], h: usize| put(&x[h * t * t..][..t * t], &[t, t]);
    let mut out = match product {
        Product::ProbsTransposedTimes => vec![0.0; d.kv_heads() * t * hs],
        _ => Vec::new(),
    };
    for h in 0..d.heads() {
        let g = d.kv_of(h);
        let result = match product {
            Product::Scores => {
                let mut s = dev.zeros(&[t, t], Category::Workspace);
                dev.matmul_forward(&mut s, &small(a, h), &small(b, g), WeightLayout::OutIn, None);
                s
            }
            Product::ProbsTimes => {
                let mut y = dev.zeros(&[t, hs], Category::Workspace);
                dev.matmul_forward(&mut y, &square(a, h), &small(b, g), WeightLayout::InOut, None);
                y
            }
            Product::ProbsTransposedTimes => {
                let mut y = dev.zeros(&[t, hs], Category::Workspace);
                dev.matmul_backward_weight(&mut y, None, &small(b, h), &square(a, h), WeightLayout::InOut);
                y
            }
        };
        let result = dev.to_host(&result).into_iter().map(|x| x * alpha);
        match product {
            Product::ProbsTransposedTimes => {
                out[g * t * hs..][..t * hs].iter_mut().zip(result).for_each(|(o, x)| *o += x)
            }
            _ => out.extend(result),
        }
    }
    out
}

/// Forward and backward through the emulated kernels; Err on the first difference from
/// the CPU's attention op.
fn check(f: &Families, d: Dims, spec: Option<DropoutSpec>, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (qkv, dout) = (rng.uniform(d.qkv(), 2.0), rng.uniform(d.act(), 1.0));
    let dev = CpuDevice::new(2);
    let (c, scale) = (d.c, 1.0 / (d.hs() as f32).sqrt());
    let (rows, ti) = ((d.heads() * d.t) as u64, d.t as i32);
    let (kv_cols, w) = (d.kv * d.hs(), d.width());

    // Forward: S = scale q k^T, P = softmax(S) in place, P' = dropout(P), y = P' v.
    let parts = [(d.nh, 0), (d.kv, c), (d.kv, c + kv_cols)];
    let [q, k, v]: [Vec<f32>; 3] = split(f, d, &qkv, w, &parts, seed)?.try_into().expect("three");
    let scores = heads_product(&dev, d, Product::Scores, scale, &q, &k);
    let mut run = Run::new(seed);
    let att = run.buffer(&scores);
    run.launch(
        "causal_softmax_forward",
        per_row_warp(d.heads() * d.t),
        &[att.into(), rows.into(), ti.into(), d.window().into()],
    );
    run.read(att);
    let att = f.attention.run(run)?.get::<f32>(att);
    let dropped = match &spec {
        Some(spec) => drop(f, &att, spec, seed)?,
        None => att.clone(),
    };
    let y = heads_product(&dev, d, Product::ProbsTimes, 1.0, &dropped, &v);
    let out = merge(f, d, &vec![f32::NAN; d.act()], c, &[(&y, 0)], seed)?;

    // Backward: dP' = dy v^T, dv = P'^T dy, dP = dropout(dP'), dS = softmax'(dP),
    // dq = scale dS k, dk = scale dS^T q.
    let [dy]: [Vec<f32>; 1] = split(f, d, &dout, c, &[(d.nh, 0)], seed)?.try_into().expect("one");
    let dp = heads_product(&dev, d, Product::Scores, 1.0, &dy, &v);
    let dv = heads_product(&dev, d, Product::ProbsTransposedTimes, 1.0, &dropped, &dy);
    let dp = match &spec {
        Some(spec) => drop(f, &dp, spec, seed)?,
        None => dp,
    };
    let mut run = Run::new(seed);
    let (gdp, gatt) = (run.buffer(&dp), run.buffer(&att));
    run.launch(
        "causal_softmax_backward",
        per_row_warp(d.heads() * d.t),
        &[gdp.into(), gatt.into(), rows.into(), ti.into(), d.window().into()],
    );
    run.read(gdp);
    let ds = f.attention.run(run)?.get::<f32>(gdp);
    let dq = heads_product(&dev, d, Product::ProbsTimes, scale, &ds, &k);
    let dk = heads_product(&dev, d, Product::ProbsTransposedTimes, scale, &ds, &q);
    let grads = [(&dq[..], 0), (&dk[..], c), (&dv[..], c + kv_cols)];
    let dqkv = merge(f, d, &vec![f32::NAN; d.qkv()], w, &grads, seed)?;

    let [want_out, want_att, want_dropped, want_dqkv] = cpu_attention(d, spec, &qkv, &dout);
    let case = if spec.is_some() { "with dropout" } else { "without dropout" };
    // Probabilities elementwise; the outputs and gradients sum terms of either sign, so
    // their errors are judged against the largest magnitude, as in the GPU tests.
    close(&format!("att {case}"), &att, &want_att, 1e-5, 0.0)?;
    if spec.is_some() {
        close(&format!("dropped {case}"), &dropped, &want_dropped, 1e-5, 0.0)?;
    }
    close(&format!("out {case}"), &out, &want_out, 1e-5, max_abs(&want_out))?;
    close(&format!("dqkv {case}"), &dqkv, &want_dqkv, 1e-5, max_abs(&want_dqkv))
}

#[test]
fn attention_kernels_match_the_cpu() {
    let test = "attention_kernels_match_the_cpu";
    let (Some(attention), Some(dropout)) = (Family::of(test, "attention.cu"), Family::of(test, "dropout.cu"))
    else {
        return;
    };
    let f = Families { attention, dropout };
    let spec = DropoutSpec {
        p: 0.1,
        key: DropoutKey { seed: 1234, step: 5, microbatch: 3, layer: 7, site: DropoutSite::AttentionProbs },
        first: 0,
        heads: None,
    };
    // One sequence of GPT-2 124M (T = 1024, C = 768, 12 heads): B = 1 of the step's 4,
    // since the rows of the other sequences repeat the same work at larger offsets.
    check(&f, Dims { b: 1, t: 1024, c: 768, nh: 12, kv: 12, mask: CausalMask::Full }, Some(spec), 14)
        .unwrap();
    // T not a multiple of a warp, a head size of 24.
    let odd = Dims { b: 2, t: 37, c: 96, nh: 4, kv: 4, mask: CausalMask::Full };
    check(&f, odd, None, 15).unwrap();
    check(&f, odd, Some(spec), 16).unwrap();
    // Grouped-query attention, as the CUDA op runs it beyond the fused kernels' head sizes:
    // one sequence of a Llama 3 8B layer (hidden 4096, 32 query heads of 128 on 8 key/value
    // heads, T = 1024), and an odd one (8 query heads on 2, T = 70).
    check(&f, Dims { b: 1, t: 1024, c: 4096, nh: 32, kv: 8, mask: CausalMask::Full }, Some(spec), 17)
        .unwrap();
    check(&f, Dims { b: 2, t: 70, c: 1024, nh: 8, kv: 2, mask: CausalMask::Full }, None, 18).unwrap();
    // A sliding window of 23 keys (Mistral's, OLMo 3's), at T = 70, with dropout.
    check(&f, Dims { b: 2, t: 70, c: 1024, nh: 8, kv: 2, mask: CausalMask::Window(23) }, Some(spec), 19)
        .unwrap();
}
