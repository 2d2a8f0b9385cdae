//! The reductions: LayerNorm, the column sums of the bias gradients and the sum of squares
//! of the gradient norm; each replays the launches of the CUDA op
//! (kernels/src/cuda/rowwise.rs) and compares with the CPU op. The kernels with a
//! bf16-storage twin run in both storages, the same test for each: in bf16 from inputs
//! rounded to bf16, against the CPU's op on those rounded values.

use crate::harness::{close, max_abs, Buf, Family, Rng, Run, Storage, Tolerance, Word};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{
    first_blocks, one_block, per_column_chunk, per_column_tile, per_pack, per_row_warp, sum_squares,
    ROWS_PER_CHUNK, SUM_SQUARES_CHUNK,
};
use kernels::{Category, Device, WeightLayout};

/// GPT-2 124M's rows per step (B * T) and width.
const N: usize = 4 * 1024;
const C: usize = 768;
/// GPT-2's LayerNorm epsilon.
const EPS: f32 = 1e-5;
/// GPT-2 124M's vocabulary: its embedding gradient's length in the sum of squares.
const V: usize = 50257;

fn cpu() -> CpuDevice {
    CpuDevice::new(2)
}

/// out [C] += column sums of x [rows, C], as `add_column_sums` and the norms' parameter
/// gradients launch `add_partials` over the partial sums.
pub fn add_partials(run: &mut Run, out: Buf, partial: Buf, chunks: usize, cols: usize) {
    run.launch(
        "add_partials",
        per_column_tile(cols),
        &[out.into(), partial.into(), (chunks as i32).into(), (cols as i32).into()],
    );
}

/// LayerNorm forward and backward at (n, c), input, output, dout and dinp in `storage`
/// (mean, rstd and the parameter gradients f32); Err on the first difference from the CPU.
pub fn layernorm(
    family: &Family,
    bias_family: &Family,
    storage: Storage,
    n: usize,
    c: usize,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let inp = storage.round(rng.uniform(n * c, 2.0).iter().map(|x| x + 0.5).collect());
    let (w, b, dout) = (rng.uniform(c, 1.0), rng.uniform(c, 1.0), storage.round(rng.uniform(n * c, 1.0)));
    let (dw0, db0) = (rng.uniform(c, 1.0), rng.uniform(c, 1.0));
    let (ni, ci) = (n as i32, c as i32);

    let mut run = Run::new(seed);
    let (gi, gw, gb, gd) =
        (storage.buffer(&mut run, &inp), run.buffer(&w), run.buffer(&b), storage.buffer(&mut run, &dout));
    let (out, mean, rstd) =
        (storage.output(&mut run, n * c), run.buffer(&vec![f32::NAN; n]), run.buffer(&vec![f32::NAN; n]));
    run.launch(
        storage.kernel("layernorm_forward"),
        per_row_warp(n),
        &[
            out.into(),
            mean.into(),
            rstd.into(),
            gi.into(),
            gw.into(),
            gb.into(),
            ni.into(),
            ci.into(),
            EPS.into(),
        ],
    );
    let dinp = storage.output(&mut run, n * c);
    run.launch(
        storage.kernel("layernorm_backward_input"),
        per_row_warp(n),
        &[dinp.into(), gd.into(), gi.into(), gw.into(), mean.into(), rstd.into(), ni.into(), ci.into()],
    );
    let (cfg, chunks) = per_column_chunk(n, c);
    let (pw, pb) = (run.buffer(&vec![f32::NAN; chunks * c]), run.buffer(&vec![f32::NAN; chunks * c]));
    run.launch(
        storage.kernel("layernorm_backward_params_partial"),
        cfg,
        &[
            pw.into(),
            pb.into(),
            gd.into(),
            gi.into(),
            mean.into(),
            rstd.into(),
            ni.into(),
            ci.into(),
            (ROWS_PER_CHUNK as i32).into(),
        ],
    );
    for buf in [out, mean, rstd, dinp, pw, pb] {
        run.read(buf);
    }
    let got = family.run(run)?;

    // Stage two is bias.cu's, from the f32 partial sums the first program wrote: one kernel
    // for both storages.
    let mut run = Run::new(seed + 1);
    let (pw, pb) = (run.buffer(&got.get::<f32>(pw)), run.buffer(&got.get::<f32>(pb)));
    let (dw, db) = (run.buffer(&dw0), run.buffer(&db0));
    add_partials(&mut run, dw, pw, chunks, c);
    add_partials(&mut run, db, pb, chunks, c);
    for buf in [dw, db] {
        run.read(buf);
    }
    let params = bias_family.run(run)?;

    let dev = cpu();
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let (ti, tw, tb) = (put(&inp, &[n, c]), put(&w, &[c]), put(&b, &[c]));
    let (mut tout, mut tmean, mut trstd) = (
        dev.zeros(&[n, c], Category::Workspace),
        dev.zeros(&[n], Category::Workspace),
        dev.zeros(&[n], Category::Workspace),
    );
    dev.layernorm_forward(&mut tout, &mut tmean, &mut trstd, &ti, &tw, &tb, EPS);
    let (mut tdinp, mut tdw, mut tdb) =
        (dev.zeros(&[n, c], Category::Workspace), put(&dw0, &[c]), put(&db0, &[c]));
    dev.layernorm_backward(&mut tdinp, &mut tdw, &mut tdb, &put(&dout, &[n, c]), &ti, &tw, &tmean, &trstd);
    let what = |part: &str| format!("layernorm {part} in {storage}");
    // out = norm * w + b, the gradients and the column sums cancel terms of order 1: their
    // errors are judged against the largest magnitude (as in the GPU tests); mean and rstd
    // elementwise.
    close(&what("mean"), &got.get(mean), &dev.to_host(&tmean), 1e-5, 0.0)?;
    close(&what("rstd"), &got.get(rstd), &dev.to_host(&trstd), 1e-5, 0.0)?;
    for (part, buf, want) in [("out", out, dev.to_host(&tout)), ("dinp", dinp, dev.to_host(&tdinp))] {
        let largest = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) };
        storage.check(&what(part), &storage.read(&got, buf), &want, largest)?;
    }
    for (part, got, want) in
        [("dweight", params.get(dw), dev.to_host(&tdw)), ("dbias", params.get(db), dev.to_host(&tdb))]
    {
        close(&what(part), &got, &want, 1e-5, max_abs(&want))?;
    }
    Ok(())
}

#[test]
fn layernorm_matches_the_cpu_in_f32_and_bf16() {
    let test = "layernorm_matches_the_cpu_in_f32_and_bf16";
    let (Some(family), Some(bias)) = (Family::of(test, "layernorm.cu"), Family::of(test, "bias.cu")) else {
        return;
    };
    for storage in Storage::BOTH {
        // GPT-2 124M in full, then rows that end inside a block and a chunk, C not a multiple
        // of 32.
        layernorm(&family, &bias, storage, N, C, 5).unwrap();
        layernorm(&family, &bias, storage, 75, 100, 6).unwrap();
    }
}

/// The sums of squares of tensors of `lens` elements, in one fused pass over chunks of
/// `chunk` (the device's `SUM_SQUARES_CHUNK`, or smaller to give stage two more partial
/// sums), against the CPU's per tensor: stage one (`sum_squares_chunks`) run by `first`,
/// stage two (`sum_squares_totals`) by `second`, so that either can be a family with an edit.
/// Each tensor is a part of a buffer, `skip` elements in (as the distributed optimizer's
/// parts are), whose elements before it must not count.
pub fn sum_of_squares(
    first: &Family,
    second: &Family,
    lens: &[usize],
    skip: usize,
    chunk: usize,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let buffers: Vec<Vec<f32>> = lens.iter().map(|&n| rng.uniform(skip + n, 1.0)).collect();
    let xs: Vec<&[f32]> = buffers.iter().map(|b| &b[skip..]).collect();
    let firsts = first_blocks(lens, chunk);
    let blocks = *firsts.last().unwrap() as usize;
    let (one, two) = sum_squares(blocks, lens.len());
    let mut run = Run::new(seed);
    // sum_squares.cu's records: each tensor's address and length.
    let words: Vec<Word> = buffers
        .iter()
        .zip(lens)
        .flat_map(|(b, &n)| [Word::At(run.buffer(b), 4 * skip as u64), Word::Value(n as u64)])
        .collect();
    let table = run.table(&words);
    let gfirst = run.buffer(&firsts);
    let partial = run.buffer(&vec![f64::NAN; blocks]);
    let (count, chunk) = (lens.len() as i32, chunk as u64);
    let args = [partial.into(), table.into(), gfirst.into(), count.into(), chunk.into()];
    run.launch("sum_squares_chunks", one, &args);
    run.read(partial);
    let partials = first.run(run)?.get::<f64>(partial);
    let mut run = Run::new(seed + 1);
    let (partial, gfirst) = (run.buffer(&partials), run.buffer(&firsts));
    // Stage two is small: it runs four times, each launch in its own order of warps, so that
    // one order that happens to hide a race does not decide the check.
    let totals: Vec<Buf> = (0..4).map(|_| run.buffer(&vec![f64::NAN; lens.len()])).collect();
    for &out in &totals {
        run.launch("sum_squares_totals", two, &[out.into(), partial.into(), gfirst.into()]);
        run.read(out);
    }
    let outputs = second.run(run)?;
    let dev = cpu();
    for (i, x) in xs.iter().enumerate() {
        let want = dev.sum_squares(&dev.from_host(x, &[x.len()], Category::Workspace));
        for &out in &totals {
            let got = outputs.get::<f64>(out)[i];
            // Both sum in f64 in their own fixed orders: far closer than 1e-5.
            if (got - want).abs() > 1e-12 * want {
                return Err(format!(
                    "tensor {i} of {}: sum of squares {got:e}, the CPU's {want:e}",
                    lens.len()
                ));
            }
        }
    }
    Ok(())
}

/// The element counts of GPT-2 124M's 148 parameter tensors, in global parameter order:
/// wte, wpe, twelve blocks of twelve, ln_f's two.
fn gpt2_parameter_lens() -> Vec<usize> {
    let block = [C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C];
    let mut lens = vec![V * C, 1024 * C];
    (0..12).for_each(|_| lens.extend(block));
    lens.extend([C, C]);
    lens
}

#[test]
fn sum_squares_matches_the_cpu() {
    let Some(family) = Family::of("sum_squares_matches_the_cpu", "sum_squares.cu") else { return };
    let lens = gpt2_parameter_lens();
    assert_eq!(lens.len(), 148);
    assert_eq!(lens.iter().sum::<usize>(), 124_439_808, "GPT-2 124M's parameter count");
    // All 148 in one pass at 1/64 of their sizes (every table entry, tensors of one block
    // and of many), then at their real sizes wpe and the first block's twelve (7.9 M
    // elements; all 124 M would take minutes to emulate), with an empty tensor among them.
    let scaled: Vec<usize> = lens.iter().map(|n| n / 64 + 1).collect();
    sum_of_squares(&family, &family, &scaled, 0, SUM_SQUARES_CHUNK, 9).unwrap();
    let mut real = lens[1..14].to_vec();
    real.insert(3, 0);
    sum_of_squares(&family, &family, &real, 0, SUM_SQUARES_CHUNK, 10).unwrap();
    // Parts one element into their buffers, every pack off a 16-byte boundary (element by
    // element), and four in (in packs again), over chunks of 4096 so that a tensor spans
    // blocks.
    let parts: Vec<usize> = lens[1..14].iter().map(|n| n / 64 + 3).collect();
    sum_of_squares(&family, &family, &parts, 1, 4096, 11).unwrap();
    sum_of_squares(&family, &family, &parts, 4, 4096, 12).unwrap();
}

/// The column sums of rows [n, c] in `storage` into f32 partial sums, then `add_partials`
/// (for both), and the bias added to those rows in place; Err on the first difference from
/// the CPU.
pub fn bias_kernels(family: &Family, storage: Storage, n: usize, c: usize, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (x, bias, db0) = (storage.round(rng.uniform(n * c, 1.0)), rng.uniform(c, 1.0), rng.uniform(c, 1.0));
    let mut run = Run::new(seed);
    let (gx, gb, db) = (storage.buffer(&mut run, &x), run.buffer(&bias), run.buffer(&db0));
    let (cfg, chunks) = per_column_chunk(n, c);
    let partial = run.buffer(&vec![f32::NAN; chunks * c]);
    run.launch(
        storage.kernel("column_partial_sums"),
        cfg,
        &[partial.into(), gx.into(), (n as i32).into(), (c as i32).into(), (ROWS_PER_CHUNK as i32).into()],
    );
    add_partials(&mut run, db, partial, chunks, c);
    run.launch(
        storage.kernel("bias_add"),
        per_pack(n * c, storage.dtype()),
        &[gx.into(), gb.into(), (n as u64).into(), (c as i32).into()],
    );
    for buf in [db, gx] {
        run.read(buf);
    }
    let got = family.run(run)?;

    // The CPU's bias gradient comes with a matmul's weight gradient: one input channel.
    let dev = cpu();
    let put = |v: &[f32], shape: &[usize]| dev.from_host(v, shape, Category::Workspace);
    let (mut dw, mut tdb) = (dev.zeros(&[1, c], Category::Workspace), put(&db0, &[c]));
    let dout = put(&x, &[n, c]);
    dev.matmul_backward_weight(
        &mut dw,
        Some(&mut tdb),
        &dout,
        &put(&vec![0.0; n], &[n, 1]),
        WeightLayout::InOut,
    );
    let what = |part: &str| format!("{part} in {storage}, [{n}, {c}]");
    // A sum of n terms of either sign, in another order: judged against the largest sum.
    let want = dev.to_host(&tdb);
    close(&what("dbias"), &got.get(db), &want, 1e-5, max_abs(&want))?;
    // x + bias: one rounding, as the CPU's matmul adds its bias (then bf16's, in bf16).
    let want: Vec<f32> = x.iter().enumerate().map(|(i, &v)| v + bias[i % c]).collect();
    storage.check(&what("bias_add"), &storage.read(&got, gx), &want, Tolerance::Exact)
}

#[test]
fn bias_kernels_match_the_cpu_in_f32_and_bf16() {
    let Some(family) = Family::of("bias_kernels_match_the_cpu_in_f32_and_bf16", "bias.cu") else { return };
    for storage in Storage::BOTH {
        // c_fc's output (B * T rows of 4C), an odd shape whose 128-bit packs span the ends
        // of rows and whose last pack is partial in both storages, and 12 and 147 chunks of
        // rows, which `add_partials`'s 16 warps take one each (four warps none) and 10 each
        // (a batch of 8 loads and 2 one by one; the last run 7, and the last warp none).
        for (n, c) in [(N, 4 * C), (75, 101), (11 * 64 + 5, 101), (146 * 64 + 5, 101)] {
            bias_kernels(&family, storage, n, c, n as u64).unwrap();
        }
    }
}

/// A microbatch's mean loss over a step's 4096 tokens (two of the kernel's chunks) and over
/// 5, bit for bit with the CPU's (both add in f64 in token order).
#[test]
fn loss_mean_matches_the_cpu() {
    let Some(family) = Family::of("loss_mean_matches_the_cpu", "loss_mean.cu") else { return };
    for (n, seed) in [(N, 11), (5, 12)] {
        loss_mean(&family, n, seed).unwrap();
    }
}

/// `loss_mean` over n per-token losses against the CPU's, bit for bit.
pub fn loss_mean(family: &Family, n: usize, seed: u64) -> Result<(), String> {
    let losses: Vec<f32> = Rng::new(seed).uniform(n, 4.0).iter().map(|x| x.abs() + 6.0).collect();
    let mut run = Run::new(seed);
    let (gl, out) = (run.buffer(&losses), run.buffer(&[f64::NAN]));
    run.launch("loss_mean", one_block(), &[out.into(), gl.into(), (n as u64).into()]);
    run.read(out);
    let got = family.run(run)?.get::<f64>(out)[0];
    let dev = cpu();
    let mut want = dev.readout(1);
    dev.loss_mean(&mut want, 0, &dev.from_host(&losses, &[n], Category::Workspace));
    let want = dev.read(&want)[0];
    if got.to_bits() == want.to_bits() {
        Ok(())
    } else {
        Err(format!("loss_mean, n = {n}: {got:e} vs the CPU's {want:e}"))
    }
}
