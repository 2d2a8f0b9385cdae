//! RMSNorm (rmsnorm.cu) forward and backward, and QK-norm's, replaying the launches of the
//! CUDA op (kernels/src/cuda/rowwise.rs) and comparing with the CPU op, in both storages: in
//! bf16 from inputs rounded to bf16, against the CPU's op on those rounded values.

use crate::harness::{bitwise, close, max_abs, Arg, Family, Rng, Run, Storage, Tolerance};
use crate::rowwise::add_partials;
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_column_chunk, per_column_chunk_of_each, per_row_warp, ROWS_PER_CHUNK};
use kernels::{Category, Device, QkNormHeads, QkNormRows, QkNormSpan};

/// Llama-3-8B's width and its RMSNorm epsilon (`rms_norm_eps`).
const C: usize = 4096;
const EPS: f32 = 1e-5;
/// Rows of its B * T (8192 per sequence): two full chunks of the weight gradient's column
/// sums and a partial one, and a block of warps that ends inside the grid. All 8192 would
/// take minutes to emulate; every row is the same code on its own warp.
const N: usize = 2 * ROWS_PER_CHUNK + 5;

/// RMSNorm forward and backward at (n, c) with `eps`, input, output, dout and dinp in
/// `storage` (rstd and the weight gradient f32); Err on the first difference from the CPU.
pub fn rmsnorm(
    family: &Family,
    bias_family: &Family,
    storage: Storage,
    n: usize,
    c: usize,
    eps: f32,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let inp = storage.round(rng.uniform(n * c, 2.0));
    let (w, dout, dw0) = (rng.uniform(c, 1.0), storage.round(rng.uniform(n * c, 1.0)), rng.uniform(c, 1.0));
    let (ni, ci) = (n as i32, c as i32);

    let mut run = Run::new(seed);
    let (gi, gw, gd) = (storage.buffer(&mut run, &inp), run.buffer(&w), storage.buffer(&mut run, &dout));
    let (out, rstd) = (storage.output(&mut run, n * c), run.buffer(&vec![f32::NAN; n]));
    run.launch(
        storage.kernel("rmsnorm_forward"),
        per_row_warp(n),
        &[out.into(), rstd.into(), gi.into(), gw.into(), ni.into(), ci.into(), eps.into()],
    );
    let dinp = storage.output(&mut run, n * c);
    run.launch(
        storage.kernel("rmsnorm_backward_input"),
        per_row_warp(n),
        &[dinp.into(), gd.into(), gi.into(), gw.into(), rstd.into(), ni.into(), ci.into()],
    );
    let (cfg, chunks) = per_column_chunk(n, c);
    let pw = run.buffer(&vec![f32::NAN; chunks * c]);
    run.launch(
        storage.kernel("rmsnorm_backward_weight_partial"),
        cfg,
        &[pw.into(), gd.into(), gi.into(), rstd.into(), ni.into(), ci.into(), (ROWS_PER_CHUNK as i32).into()],
    );
    for buf in [out, rstd, dinp, pw] {
        run.read(buf);
    }
    let got = family.run(run)?;

    // Stage two is bias.cu's `add_partials`, from the f32 partial sums: one kernel for both
    // storages.
    let mut run = Run::new(seed + 1);
    let (pw, dw) = (run.buffer(&got.get::<f32>(pw)), run.buffer(&dw0));
    add_partials(&mut run, dw, pw, chunks, c);
    run.read(dw);
    let dweight = bias_family.run(run)?.get::<f32>(dw);

    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let (ti, tw) = (put(&inp, &[n, c]), put(&w, &[c]));
    let (mut tout, mut trstd) =
        (dev.zeros(&[n, c], Category::Workspace), dev.zeros(&[n], Category::Workspace));
    dev.rmsnorm_forward(&mut tout, &mut trstd, &ti, &tw, eps);
    let (mut tdinp, mut tdw) = (dev.zeros(&[n, c], Category::Workspace), put(&dw0, &[c]));
    dev.rmsnorm_backward(&mut tdinp, &mut tdw, &put(&dout, &[n, c]), &ti, &tw, &trstd);
    let what = |part: &str| format!("rmsnorm {part} at N = {n}, C = {c} in {storage}");
    // rstd and out = w * (x * rstd) are products of one sum of squares (no cancellation):
    // elementwise. dinp and dweight cancel terms of either sign: judged against the largest
    // magnitude (as in the GPU tests).
    close(&what("rstd"), &got.get(rstd), &dev.to_host(&trstd), 1e-5, 0.0)?;
    let elementwise = Tolerance::Close { rtol: 1e-5, floor: 0.0 };
    storage.check(&what("out"), &storage.read(&got, out), &dev.to_host(&tout), elementwise)?;
    let want = dev.to_host(&tdinp);
    let largest = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) };
    storage.check(&what("dinp"), &storage.read(&got, dinp), &want, largest)?;
    let want = dev.to_host(&tdw);
    close(&what("dweight"), &dweight, &want, 1e-5, max_abs(&want))
}

#[test]
fn rmsnorm_matches_the_cpu_in_f32_and_bf16() {
    let test = "rmsnorm_matches_the_cpu_in_f32_and_bf16";
    let (Some(family), Some(bias)) = (Family::of(test, "rmsnorm.cu"), Family::of(test, "bias.cu")) else {
        return;
    };
    for storage in Storage::BOTH {
        rmsnorm(&family, &bias, storage, N, C, EPS, 21).unwrap();
        // C not a multiple of 32, rows that end inside a block and a chunk; an epsilon large
        // beside mean(x^2) (about 1.3), so one the kernel did not add would fail rstd.
        rmsnorm(&family, &bias, storage, 37, 100, 0.5, 22).unwrap();
    }
}

/// QK-norm on qkv [B,T,(NH+2*KV)*hs] over each head or the whole projections.
struct Heads {
    b: usize,
    t: usize,
    nh: usize,
    kv: usize,
    hs: usize,
    span: QkNormSpan,
}

impl Heads {
    fn heads(&self) -> QkNormHeads {
        QkNormHeads { heads: self.nh, kv_heads: self.kv, span: self.span }
    }

    fn rows(&self) -> QkNormRows {
        self.span.rows(self.nh, self.kv, self.hs)
    }

    fn width(&self) -> usize {
        self.rows().token_width()
    }

    /// The value heads of each token of `qkv`, which QK-norm leaves as they are.
    fn values(&self, qkv: &[f32]) -> Vec<f32> {
        let first = (self.nh + self.kv) * self.hs;
        qkv.chunks(self.width()).flat_map(|token| token[first..].to_vec()).collect()
    }
}

/// QK-norm forward and backward, in place, qkv and dqkv in `storage` (rstd and the weight
/// gradients f32); Err on the first difference from the CPU.
fn qk_norm(
    family: &Family,
    bias_family: &Family,
    storage: Storage,
    h: &Heads,
    eps: f32,
    seed: u64,
) -> Result<(), String> {
    let r = h.rows();
    let (n, rows, len) = (h.b * h.t, h.b * h.t * r.rows(), h.b * h.t * h.width());
    let mut rng = Rng::new(seed);
    let (qkv, dqkv) = (storage.round(rng.uniform(len, 2.0)), storage.round(rng.uniform(len, 1.0)));
    let [wq, dwq0] = [(); 2].map(|()| rng.uniform(r.q_width, 1.0));
    let [wk, dwk0] = [(); 2].map(|()| rng.uniform(r.k_width, 1.0));
    let dims: [Arg; 5] = [n, r.q_rows, r.k_rows, r.q_width, r.k_width].map(|x| (x as i32).into());

    let mut run = Run::new(seed);
    // gi: the input again, which the caller keeps for the backward while gq is normalised.
    let (gq, gd, gi) =
        (storage.buffer(&mut run, &qkv), storage.buffer(&mut run, &dqkv), storage.buffer(&mut run, &qkv));
    let (gwq, gwk, rstd) = (run.buffer(&wq), run.buffer(&wk), run.buffer(&vec![f32::NAN; rows]));
    let mut args = vec![gq.into(), rstd.into(), gwq.into(), gwk.into()];
    args.extend(dims.clone());
    args.extend([0i32.into(), eps.into()]); // whole rows
    run.launch(storage.kernel("qk_norm_forward"), per_row_warp(rows), &args);
    // As the op: the weights' partial sums first, from dqkv before it is overwritten.
    let (cfg, chunks) = per_column_chunk_of_each(n, r.q_width.max(r.k_width), 2);
    let pw = run.buffer(&vec![f32::NAN; chunks * (r.q_width + r.k_width)]);
    let mut args = vec![pw.into(), gd.into(), gi.into(), rstd.into()];
    args.extend(dims.clone());
    args.push((ROWS_PER_CHUNK as i32).into());
    run.launch(storage.kernel("qk_norm_backward_weight_partial"), cfg, &args);
    // Whole rows: the dots pointer (rstd) unread.
    let mut args = vec![gd.into(), gi.into(), gwq.into(), gwk.into(), rstd.into(), rstd.into()];
    args.extend(dims);
    args.push(0i32.into());
    run.launch(storage.kernel("qk_norm_backward_input"), per_row_warp(rows), &args);
    for buf in [gq, rstd, gd, pw] {
        run.read(buf);
    }
    let got = family.run(run)?;

    // Stage two, into each weight from its half of the partial sums.
    let mut run = Run::new(seed + 1);
    let partials = got.get::<f32>(pw);
    let (pq, pk) = partials.split_at(chunks * r.q_width);
    let (dwq, dwk) = (run.buffer(&dwq0), run.buffer(&dwk0));
    let (pq, pk) = (run.buffer(pq), run.buffer(pk));
    add_partials(&mut run, dwq, pq, chunks, r.q_width);
    add_partials(&mut run, dwk, pk, chunks, r.k_width);
    run.read(dwq);
    run.read(dwk);
    let dweights = bias_family.run(run)?;

    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let shape = [h.b, h.t, h.width()];
    let (mut tq, ti, mut td) = (put(&qkv, &shape), put(&qkv, &shape), put(&dqkv, &shape));
    let (tw, mut trstd) =
        ([put(&wq, &[r.q_width]), put(&wk, &[r.k_width])], dev.zeros(&[rows], Category::Workspace));
    dev.qk_norm_forward(&mut tq, &mut trstd, [&tw[0], &tw[1]], h.heads(), eps);
    let (mut tdwq, mut tdwk) = (put(&dwq0, &[r.q_width]), put(&dwk0, &[r.k_width]));
    dev.qk_norm_backward(&mut td, [&mut tdwq, &mut tdwk], &ti, [&tw[0], &tw[1]], &trstd, h.heads());
    let what = |part: &str| {
        format!("qk-norm {part}, {} heads on {} of {} over each {:?} in {storage}", h.nh, h.kv, h.hs, h.span)
    };
    // As `rmsnorm`: rstd and out elementwise, the input gradient and the weights' (sums of
    // either sign) against the largest magnitude.
    close(&what("rstd"), &got.get(rstd), &dev.to_host(&trstd), 1e-5, 0.0)?;
    let (out, dinp) = (storage.read(&got, gq), storage.read(&got, gd));
    let elementwise = Tolerance::Close { rtol: 1e-5, floor: 0.0 };
    storage.check(&what("out"), &out, &dev.to_host(&tq), elementwise)?;
    let want = dev.to_host(&td);
    storage.check(&what("dinp"), &dinp, &want, Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) })?;
    bitwise(&what("value heads"), &h.values(&out), &h.values(&qkv))?;
    bitwise(&what("value heads' gradient"), &h.values(&dinp), &h.values(&dqkv))?;
    // Each weight gradient started from a value of its own, which the CPU adds to as well.
    for (name, buf, want) in [("dq_weight", dwq, &tdwq), ("dk_weight", dwk, &tdwk)] {
        let want = dev.to_host(want);
        close(&what(name), &dweights.get::<f32>(buf), &want, 1e-5, max_abs(&want))?;
    }
    Ok(())
}

#[test]
fn qk_norm_matches_the_cpu_in_f32_and_bf16() {
    let test = "qk_norm_matches_the_cpu_in_f32_and_bf16";
    let (Some(family), Some(bias)) = (Family::of(test, "rmsnorm.cu"), Family::of(test, "bias.cu")) else {
        return;
    };
    for storage in Storage::BOTH {
        // Qwen3's heads of 128 and epsilon (`rms_norm_eps`), on 4 query heads sharing 2
        // key/value heads (Qwen3-8B has 32 on 8: the same code for each head's warp); 7
        // sequences of 19 tokens, two full chunks of the weights' column sums and a partial one.
        let qwen3 = Heads { b: 7, t: 19, nh: 4, kv: 2, hs: 128, span: QkNormSpan::Head };
        assert_eq!(qwen3.b * qwen3.t, 2 * ROWS_PER_CHUNK + 5);
        qk_norm(&family, &bias, storage, &qwen3, 1e-6, 31).unwrap();
        // Heads of 10, no multiple of a pack in either storage, so element by element; 148
        // heads ending inside a block of warps, and an epsilon that counts (as in `rmsnorm`).
        let odd = Heads { b: 1, t: 37, nh: 3, kv: 1, hs: 10, span: QkNormSpan::Head };
        qk_norm(&family, &bias, storage, &odd, 0.5, 32).unwrap();
        // OLMo 2's QK-norm over the whole projections, as wide as OLMo 2 1B's (16 heads of
        // 128 on 16), each warp walking 2048 channels.
        let olmo2_1b = Heads { b: 1, t: 9, nh: 16, kv: 16, hs: 128, span: QkNormSpan::Projection };
        qk_norm(&family, &bias, storage, &olmo2_1b, 1e-6, 33).unwrap();
        // OLMo 2 32B's: 40 query heads of 128 on 8 key/value heads, a query row of 5120 and a
        // key row of 1024, so the weight partial sums' grid spans columns the key side lacks.
        let olmo2_32b = Heads { b: 1, t: 5, nh: 40, kv: 8, hs: 128, span: QkNormSpan::Projection };
        qk_norm(&family, &bias, storage, &olmo2_32b, 1e-6, 34).unwrap();
        // Odd widths over the projections: 3 heads of 10 on 1, rows of 30 and 10.
        let odd = Heads { span: QkNormSpan::Projection, ..odd };
        qk_norm(&family, &bias, storage, &odd, 0.5, 35).unwrap();
    }
}

/// QK-norm's two halves where a row is one rank's part of a whole projection, qkv and dqkv
/// in `storage`: each row's sum of squares, the forward from the group's sums over `parts`
/// parts, each row's dots, and the input gradient from the group's dots, each kernel against
/// the CPU's op on the same inputs (the group's sums given: the CPU's sums of squares and
/// dots, times `parts`, as if every rank's part were this one's). At one part the halves
/// are the one-pass kernels' bits.
fn qk_norm_summed(
    family: &Family,
    storage: Storage,
    h: &Heads,
    parts: usize,
    seed: u64,
) -> Result<(), String> {
    let r = h.rows();
    let (n, rows, len) = (h.b * h.t, h.b * h.t * r.rows(), h.b * h.t * h.width());
    let eps = 1e-6;
    let mut rng = Rng::new(seed);
    let (qkv, dqkv) = (storage.round(rng.uniform(len, 2.0)), storage.round(rng.uniform(len, 1.0)));
    let (wq, wk) = (rng.uniform(r.q_width, 1.0), rng.uniform(r.k_width, 1.0));
    let dims: [Arg; 5] = [n, r.q_rows, r.k_rows, r.q_width, r.k_width].map(|x| (x as i32).into());

    // The CPU's halves, and the group's sums and dots they give.
    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let shape = [h.b, h.t, h.width()];
    let (tw, stats_shape) = ([put(&wq, &[r.q_width]), put(&wk, &[r.k_width])], [rows]);
    let tw = [&tw[0], &tw[1]];
    let (ti, mut tsums) = (put(&qkv, &shape), dev.zeros(&stats_shape, Category::Workspace));
    dev.qk_norm_sum_squares(&ti, &mut tsums, h.heads());
    let group = |x: Vec<f32>| -> Vec<f32> { x.iter().map(|v| v * parts as f32).collect() };
    let stats = group(dev.to_host(&tsums));
    let (mut ty, mut trstd) = (put(&qkv, &shape), put(&stats, &stats_shape));
    dev.qk_norm_forward_summed(&mut ty, &mut trstd, tw, h.heads(), parts, eps);
    let (td, mut tdots) = (put(&dqkv, &shape), dev.zeros(&stats_shape, Category::Workspace));
    dev.qk_norm_backward_dots(&td, &ti, tw, &trstd, &mut tdots, h.heads());
    let dots = group(dev.to_host(&tdots));
    let (mut tdinp, tgroup_dots) = (put(&dqkv, &shape), put(&dots, &stats_shape));
    let mut tdw = r.weight_widths().map(|c| dev.zeros(&[c], Category::Workspace));
    let [dq, dk] = &mut tdw;
    dev.qk_norm_backward_summed(&mut tdinp, [dq, dk], &ti, tw, &trstd, (&tgroup_dots, parts), h.heads());

    // The same on the device: each half from the CPU's group sums, so each kernel is judged
    // alone.
    let mut run = Run::new(seed);
    let (gx, gy, gd) =
        (storage.buffer(&mut run, &qkv), storage.buffer(&mut run, &qkv), storage.buffer(&mut run, &dqkv));
    let (gwq, gwk) = (run.buffer(&wq), run.buffer(&wk));
    let (sums, rstd) = (run.buffer(&vec![f32::NAN; rows]), run.buffer(&stats));
    let (gdots, group_dots) = (run.buffer(&vec![f32::NAN; rows]), run.buffer(&dots));
    let mut args = vec![gx.into(), sums.into()];
    args.extend(dims.clone());
    run.launch(storage.kernel("qk_norm_sum_squares"), per_row_warp(rows), &args);
    let mut args = vec![gy.into(), rstd.into(), gwq.into(), gwk.into()];
    args.extend(dims.clone());
    args.extend([(parts as i32).into(), eps.into()]);
    run.launch(storage.kernel("qk_norm_forward"), per_row_warp(rows), &args);
    let mut args = vec![gd.into(), gx.into(), gwq.into(), gwk.into(), rstd.into(), gdots.into()];
    args.extend(dims.clone());
    run.launch(storage.kernel("qk_norm_backward_dots"), per_row_warp(rows), &args);
    let mut args = vec![gd.into(), gx.into(), gwq.into(), gwk.into(), rstd.into(), group_dots.into()];
    args.extend(dims.clone());
    args.push((parts as i32).into());
    run.launch(storage.kernel("qk_norm_backward_input"), per_row_warp(rows), &args);
    for buf in [sums, gy, rstd, gdots, gd] {
        run.read(buf);
    }
    let got = family.run(run)?;

    let what =
        |part: &str| format!("qk-norm {part} over {parts} parts, {} heads on {} in {storage}", h.nh, h.kv);
    let sums_tolerance = Tolerance::Close { rtol: 1e-5, floor: 0.0 };
    close(&what("sums of squares"), &got.get(sums), &dev.to_host(&tsums), 1e-5, 0.0)?;
    close(&what("rstd"), &got.get(rstd), &dev.to_host(&trstd), 1e-5, 0.0)?;
    storage.check(&what("out"), &storage.read(&got, gy), &dev.to_host(&ty), sums_tolerance)?;
    let want_dots = dev.to_host(&tdots);
    close(&what("dots"), &got.get(gdots), &want_dots, 1e-5, max_abs(&want_dots))?;
    let want = dev.to_host(&tdinp);
    storage.check(
        &what("dinp"),
        &storage.read(&got, gd),
        &want,
        Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) },
    )?;
    if parts > 1 {
        return Ok(());
    }
    // One part: the one-pass kernels' bits, from the device's own sums.
    let mut run = Run::new(seed + 1);
    let (fused, split) = (storage.buffer(&mut run, &qkv), storage.buffer(&mut run, &qkv));
    let (gwq, gwk) = (run.buffer(&wq), run.buffer(&wk));
    let (fused_rstd, split_rstd) = (run.buffer(&vec![f32::NAN; rows]), run.buffer(&vec![f32::NAN; rows]));
    let mut args = vec![split.into(), split_rstd.into()];
    args.extend(dims.clone());
    run.launch(storage.kernel("qk_norm_sum_squares"), per_row_warp(rows), &args);
    for (buf, stats, parts) in [(fused, fused_rstd, 0i32), (split, split_rstd, 1)] {
        let mut args = vec![buf.into(), stats.into(), gwq.into(), gwk.into()];
        args.extend(dims.clone());
        args.extend([parts.into(), eps.into()]);
        run.launch(storage.kernel("qk_norm_forward"), per_row_warp(rows), &args);
    }
    for buf in [fused, split, fused_rstd, split_rstd] {
        run.read(buf);
    }
    let got = family.run(run)?;
    bitwise(&what("one-part rstd"), &got.get::<f32>(split_rstd), &got.get::<f32>(fused_rstd))?;
    bitwise(&what("one-part out"), &storage.read(&got, split), &storage.read(&got, fused))
}

#[test]
fn qk_norm_halves_across_ranks_match_the_cpu_in_f32_and_bf16() {
    let test = "qk_norm_halves_across_ranks_match_the_cpu_in_f32_and_bf16";
    let Some(family) = Family::of(test, "rmsnorm.cu") else {
        return;
    };
    for storage in Storage::BOTH {
        // OLMo 2 32B's projections at tensor parallelism 4: a rank's 10 query heads of 128
        // on 2 key/value heads, rows of 1280 and 256; 37 tokens, ending inside a block.
        let olmo2_32b_at_t4 = Heads { b: 1, t: 37, nh: 10, kv: 2, hs: 128, span: QkNormSpan::Projection };
        qk_norm_summed(&family, storage, &olmo2_32b_at_t4, 4, 41).unwrap();
        // Odd widths (rows of 30 and 10, element by element) at one part: the one-pass bits.
        let odd = Heads { b: 1, t: 9, nh: 3, kv: 1, hs: 10, span: QkNormSpan::Projection };
        qk_norm_summed(&family, storage, &odd, 1, 42).unwrap();
        qk_norm_summed(&family, storage, &odd, 2, 43).unwrap();
    }
}
