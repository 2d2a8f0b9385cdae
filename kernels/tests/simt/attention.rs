//! The attention core as kernels/src/cuda/attention.rs runs it: heads split out of qkv,
//! the causal softmax and its backward, dropout of the probabilities and the merge back,
//! with the per-head products (cuBLAS on a GPU) computed between the runs by the CPU
//! backend's matmul. Compared with the CPU's attention op, forward and backward.

use crate::harness::{close, max_abs, Family, Rng, Run};
use crate::philox::dropout_mask;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_item, per_row_warp};
use kernels::{
    AttentionSaved, AttentionSaves, Category, Device, DropoutKey, DropoutSite, DropoutSpec, WeightLayout,
};

/// qkv [B,T,3C], NH heads.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
}

impl Dims {
    pub fn hs(&self) -> usize {
        self.c / self.nh
    }
    pub fn heads(&self) -> usize {
        self.b * self.nh
    }
    pub fn act(&self) -> usize {
        self.b * self.t * self.c
    }
}

/// [out, att, dropped, dqkv] of the CPU's attention op, forward and backward (dropped is
/// zeros without dropout).
pub fn cpu_attention(d: Dims, spec: Option<DropoutSpec>, qkv: &[f32], dout: &[f32]) -> [Vec<f32>; 4] {
    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let (b, t, c, nh) = (d.b, d.t, d.c, d.nh);
    let tqkv = put(qkv, &[b, t, 3 * c]);
    let mut out = dev.zeros(&[b, t, c], Category::Workspace);
    let kind = AttentionSaves::Probabilities;
    let mut saved = AttentionSaved::empty(&dev, kind, [b, nh, t], spec.is_some(), Category::Workspace);
    dev.attention_forward(Some(&mut out), &mut saved, spec, &tqkv, nh, nh);
    let mut dqkv = dev.zeros(&[b, t, 3 * c], Category::Workspace);
    dev.attention_backward(&mut dqkv, &put(dout, &[b, t, c]), &out, &tqkv, &saved, spec, nh, nh);
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

/// [B,NH,T,hs] heads of `src` (rows `stride` wide, columns from `offset`), one per offset.
fn split(
    f: &Families,
    d: Dims,
    src: &[f32],
    stride: usize,
    offsets: &[usize],
    seed: u64,
) -> Result<Vec<Vec<f32>>, String> {
    let mut run = Run::new(seed);
    let s = run.buffer(src);
    let outs: Vec<_> = offsets
        .iter()
        .map(|&offset| {
            let dst = run.buffer(&vec![f32::NAN; d.act()]);
            let ints = [d.b, d.t, d.nh, d.hs(), stride, offset].map(|x| (x as i32).into());
            let args: Vec<_> = [dst.into(), s.into()].into_iter().chain(ints).collect();
            run.launch("split_heads", per_item(d.act()), &args);
            run.read(dst);
            dst
        })
        .collect();
    let got = f.attention.run(run)?;
    Ok(outs.into_iter().map(|b| got.get(b)).collect())
}

/// dst [B,T,stride] with each (heads, offset) merged into its columns.
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
    for &(heads, offset) in parts {
        let src = run.buffer(heads);
        let ints = [d.b, d.t, d.nh, d.hs(), stride, offset].map(|x| (x as i32).into());
        let args: Vec<_> = [out.into(), src.into()].into_iter().chain(ints).collect();
        run.launch("merge_heads", per_item(d.act()), &args);
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
        per_item(x.len().div_ceil(4)),
        &[buf.into(), (x.len() as u64).into(), dropout_mask(spec)],
    );
    run.read(buf);
    Ok(f.dropout.run(run)?.get(buf))
}

/// The per-head products of the CUDA op, on the CPU: `alpha` times a b^T, P x or P^T x.
#[derive(Clone, Copy)]
enum Product {
    Scores,
    ProbsTimes,
    ProbsTransposedTimes,
}

fn heads_product(dev: &CpuDevice, d: Dims, product: Product, alpha: f32, a: &[f32], b: &[f32]) -> Vec<f32> {
    let (t, hs) = (d.t, d.hs());
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let mut out = Vec::new();
    for h in 0..d.heads() {
        let small = |x: &[f32]| put(&x[h * t * hs..][..t * hs], &[t, hs]);
        let square = |x: &[f32]| put(&x[h * t * t..][..t * t], &[t, t]);
        let result = match product {
            Product::Scores => {
                let mut s = dev.zeros(&[t, t], Category::Workspace);
                dev.matmul_forward(&mut s, &small(a), &small(b), WeightLayout::OutIn, None);
                s
            }
            Product::ProbsTimes => {
                let mut y = dev.zeros(&[t, hs], Category::Workspace);
                dev.matmul_forward(&mut y, &square(a), &small(b), WeightLayout::InOut, None);
                y
            }
            Product::ProbsTransposedTimes => {
                let mut y = dev.zeros(&[t, hs], Category::Workspace);
                dev.matmul_backward_weight(&mut y, None, &small(b), &square(a), WeightLayout::InOut);
                y
            }
        };
        out.extend(dev.to_host(&result).iter().map(|x| x * alpha));
    }
    out
}

/// Forward and backward through the emulated kernels; Err on the first difference from
/// the CPU's attention op.
fn check(f: &Families, d: Dims, spec: Option<DropoutSpec>, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (qkv, dout) = (rng.uniform(d.act() * 3, 2.0), rng.uniform(d.act(), 1.0));
    let dev = CpuDevice::new(2);
    let (c, scale) = (d.c, 1.0 / (d.hs() as f32).sqrt());
    let (rows, ti) = ((d.heads() * d.t) as u64, d.t as i32);

    // Forward: S = scale q k^T, P = softmax(S) in place, P' = dropout(P), y = P' v.
    let [q, k, v]: [Vec<f32>; 3] = split(f, d, &qkv, 3 * c, &[0, c, 2 * c], seed)?.try_into().expect("three");
    let scores = heads_product(&dev, d, Product::Scores, scale, &q, &k);
    let mut run = Run::new(seed);
    let att = run.buffer(&scores);
    run.launch(
        "causal_softmax_forward",
        per_row_warp(d.heads() * d.t),
        &[att.into(), rows.into(), ti.into()],
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
    let [dy]: [Vec<f32>; 1] = split(f, d, &dout, c, &[0], seed)?.try_into().expect("one");
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
        &[gdp.into(), gatt.into(), rows.into(), ti.into()],
    );
    run.read(gdp);
    let ds = f.attention.run(run)?.get::<f32>(gdp);
    let dq = heads_product(&dev, d, Product::ProbsTimes, scale, &ds, &k);
    let dk = heads_product(&dev, d, Product::ProbsTransposedTimes, scale, &ds, &q);
    let dqkv = merge(f, d, &vec![f32::NAN; 3 * d.act()], 3 * c, &[(&dq, 0), (&dk, c), (&dv, 2 * c)], seed)?;

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
    };
    // One sequence of GPT-2 124M (T = 1024, C = 768, 12 heads): B = 1 of the step's 4,
    // since the rows of the other sequences repeat the same work at larger offsets.
    check(&f, Dims { b: 1, t: 1024, c: 768, nh: 12 }, Some(spec), 14).unwrap();
    // T not a multiple of a warp, a head size of 24.
    let odd = Dims { b: 2, t: 37, c: 96, nh: 4 };
    check(&f, odd, None, 15).unwrap();
    check(&f, odd, Some(spec), 16).unwrap();
}
