//! The norms fused with the residual stream (layernorm.cu and rmsnorm.cu): the residual add
//! with the norm after it in one kernel, and the norm's input gradient with the residual
//! gradient added in the same kernel. Each replays the CUDA op's row-wise launch
//! (kernels/src/cuda/rowwise.rs; the parameter gradients' kernels are the unfused op's,
//! checked in rowwise.rs and rmsnorm.rs) and holds it to the CPU's op and to the unfused
//! kernels run on the same buffers, in both storages.

use crate::harness::{bitwise, close, max_abs, Arg, Buf, Family, Rng, Run, Storage, Tolerance};
use kernels::cpu::CpuDevice;
use kernels::cuda::launch::{per_row_warp, ROWS_PER_CHUNK};
use kernels::{Category, Device, Tensor};

/// GPT-2's LayerNorm epsilon and Llama-3's `rms_norm_eps`.
const EPS: f32 = 1e-5;
/// Two full chunks of rows and a partial one, and a block of warps that ends inside the
/// grid: every row is the same code on its own warp, so more rows would only take longer
/// to emulate.
const ROWS: usize = 2 * ROWS_PER_CHUNK + 5;

#[derive(Clone, Copy, Debug)]
enum Norm {
    Layer,
    Rms,
}

impl Norm {
    /// The fused forward, the unfused forward, the fused input gradient and the unfused
    /// one, in `storage`.
    fn kernels(self, storage: Storage) -> [&'static str; 4] {
        match self {
            Norm::Layer => [
                storage.kernel("layernorm_residual_forward"),
                storage.kernel("layernorm_forward"),
                storage.kernel("layernorm_residual_backward_input"),
                storage.kernel("layernorm_backward_input"),
            ],
            Norm::Rms => [
                storage.kernel("rmsnorm_residual_forward"),
                storage.kernel("rmsnorm_forward"),
                storage.kernel("rmsnorm_residual_backward_input"),
                storage.kernel("rmsnorm_backward_input"),
            ],
        }
    }

    /// The row statistics it keeps: mean and rstd, or rstd.
    fn stats(self) -> usize {
        match self {
            Norm::Layer => 2,
            Norm::Rms => 1,
        }
    }
}

/// The CPU's norm of `inp` [n, c]: out, then the statistics (mean and rstd, or rstd).
fn cpu_forward(dev: &CpuDevice, norm: Norm, inp: &Tensor, w: &Tensor, b: &Tensor) -> (Tensor, Vec<Tensor>) {
    let mut out = dev.zeros(inp.shape(), Category::Workspace);
    let mut stats = cpu_stats(dev, norm, inp.shape()[0]);
    match &mut stats[..] {
        [mean, rstd] => dev.layernorm_forward(&mut out, mean, rstd, inp, w, b, EPS),
        [rstd] => dev.rmsnorm_forward(&mut out, rstd, inp, w, EPS),
        _ => unreachable!(),
    }
    (out, stats)
}

fn cpu_stats(dev: &CpuDevice, norm: Norm, n: usize) -> Vec<Tensor> {
    (0..norm.stats()).map(|_| dev.zeros(&[n], Category::Workspace)).collect()
}

/// Residual forward and backward of `norm` at (n, c) in `storage`; Err on the first
/// difference.
fn residual_norm(
    family: &Family,
    norm: Norm,
    storage: Storage,
    n: usize,
    c: usize,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    // A mean well away from zero (as in rowwise.rs), so that LayerNorm's is judged
    // relative to itself.
    let a = storage.round(rng.uniform(n * c, 2.0).iter().map(|x| x + 0.5).collect());
    let b = storage.round(rng.uniform(n * c, 1.0));
    let (w, bias) = (rng.uniform(c, 1.0), rng.uniform(c, 1.0));
    let (dout, dres) = (storage.round(rng.uniform(n * c, 1.0)), storage.round(rng.uniform(n * c, 1.0)));
    let (ni, ci) = (n as i32, c as i32);

    let mut run = Run::new(seed);
    let (ga, gb, gw, gbias) =
        (storage.buffer(&mut run, &a), storage.buffer(&mut run, &b), run.buffer(&w), run.buffer(&bias));
    let (gdout, gdres) = (storage.buffer(&mut run, &dout), storage.buffer(&mut run, &dres));
    let stat = |run: &mut Run| run.buffer(&vec![f32::NAN; n]);
    // The statistics of the fused forward, then of the unfused one on its residual.
    let fused_stats: Vec<Buf> = (0..norm.stats()).map(|_| stat(&mut run)).collect();
    let plain_stats: Vec<Buf> = (0..norm.stats()).map(|_| stat(&mut run)).collect();
    let stat_args = |stats: &[Buf]| stats.iter().map(|&s| s.into()).collect::<Vec<Arg>>();
    let params: Vec<Arg> = match norm {
        Norm::Layer => vec![gw.into(), gbias.into()],
        Norm::Rms => vec![gw.into()],
    };
    let [fused_forward, forward, fused_backward, backward] = norm.kernels(storage);
    let (residual, out, plain_out) =
        (storage.output(&mut run, n * c), storage.output(&mut run, n * c), storage.output(&mut run, n * c));
    let sizes: Vec<Arg> = vec![ni.into(), ci.into(), EPS.into()];
    let args = [
        vec![residual.into(), out.into()],
        stat_args(&fused_stats),
        vec![ga.into(), gb.into()],
        params.clone(),
        sizes.clone(),
    ];
    run.launch(fused_forward, per_row_warp(n), &args.concat());
    let args = [vec![plain_out.into()], stat_args(&plain_stats), vec![residual.into()], params, sizes];
    run.launch(forward, per_row_warp(n), &args.concat());
    // Backward from the fused forward's residual and statistics, with and without the
    // residual gradient.
    let (dinp, plain_dinp) = (storage.output(&mut run, n * c), storage.output(&mut run, n * c));
    let rows_args =
        |stats: &[Buf]| [vec![gdout.into(), residual.into(), gw.into()], stat_args(stats)].concat();
    let args = [vec![dinp.into(), gdres.into()], rows_args(&fused_stats), vec![ni.into(), ci.into()]];
    run.launch(fused_backward, per_row_warp(n), &args.concat());
    let args = [vec![plain_dinp.into()], rows_args(&fused_stats), vec![ni.into(), ci.into()]];
    run.launch(backward, per_row_warp(n), &args.concat());
    for buf in [residual, out, plain_out, dinp, plain_dinp].into_iter().chain(fused_stats.iter().copied()) {
        run.read(buf);
    }
    for &buf in &plain_stats {
        run.read(buf);
    }
    let got = family.run(run)?;
    let what = |part: &str| format!("{norm:?}Norm {part} at N = {n}, C = {c} in {storage}");

    // The recompute's promise: the fused norm is, bit for bit, the unfused kernel's on the
    // residual the fused one stored.
    bitwise(&what("out vs the unfused kernel"), &storage.read(&got, out), &storage.read(&got, plain_out))?;
    for (&f, &p) in fused_stats.iter().zip(&plain_stats) {
        bitwise(&what("statistics vs the unfused kernel"), &got.get(f), &got.get(p))?;
    }
    // f32: the unfused input gradient plus dres, one f32 add, exactly (as the unfused
    // kernel and then `accumulate`). bf16 rounds once, after that add, so only the CPU
    // check below holds.
    if storage == Storage::F32 {
        let plain: Vec<f32> = got.get::<f32>(plain_dinp).iter().zip(&dres).map(|(g, d)| g + d).collect();
        bitwise(&what("dinp vs the unfused kernel and the add"), &got.get(dinp), &plain)?;
    }

    // The CPU's fused op, on the residual as stored (rounded to bf16 in bf16 storage).
    let dev = CpuDevice::new(2);
    let put = |x: &[f32], shape: &[usize]| dev.from_host(x, shape, Category::Workspace);
    let (ta, tb, tw, tbias) = (put(&a, &[n, c]), put(&b, &[n, c]), put(&w, &[c]), put(&bias, &[c]));
    let (mut tres, mut tout) =
        (dev.zeros(&[n, c], Category::Workspace), dev.zeros(&[n, c], Category::Workspace));
    let mut tstats = cpu_stats(&dev, norm, n);
    match &mut tstats[..] {
        [mean, rstd] => {
            dev.layernorm_residual_forward(&mut tres, &mut tout, mean, rstd, &ta, &tb, &tw, &tbias, EPS)
        }
        [rstd] => dev.rmsnorm_residual_forward(&mut tres, &mut tout, rstd, &ta, &tb, &tw, EPS),
        _ => unreachable!(),
    }
    // residual = a + b, one add: the CPU's value (in bf16, its rounding).
    storage.check(&what("residual"), &storage.read(&got, residual), &dev.to_host(&tres), Tolerance::Exact)?;
    let stored = put(&storage.read(&got, residual), &[n, c]);
    let (tout, tstats) = match storage {
        Storage::F32 => (tout, tstats),
        Storage::Bf16 => cpu_forward(&dev, norm, &stored, &tw, &tbias),
    };
    for (&f, t) in fused_stats.iter().zip(&tstats) {
        close(&what("statistics"), &got.get(f), &dev.to_host(t), 1e-5, 0.0)?;
    }
    let want = dev.to_host(&tout);
    let largest = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) };
    storage.check(&what("out"), &storage.read(&got, out), &want, largest)?;

    let mut tdinp = put(&vec![f32::NAN; n * c], &[n, c]); // overwritten
    let (mut tdw, mut tdb) = (dev.zeros(&[c], Category::Workspace), dev.zeros(&[c], Category::Workspace));
    let (tdout, tdres) = (put(&dout, &[n, c]), put(&dres, &[n, c]));
    match &tstats[..] {
        [mean, rstd] => dev.layernorm_residual_backward(
            &mut tdinp, &tdres, &mut tdw, &mut tdb, &tdout, &stored, &tw, mean, rstd,
        ),
        [rstd] => dev.rmsnorm_residual_backward(&mut tdinp, &tdres, &mut tdw, &tdout, &stored, &tw, rstd),
        _ => unreachable!(),
    }
    let want = dev.to_host(&tdinp);
    let largest = Tolerance::Close { rtol: 1e-5, floor: max_abs(&want) };
    storage.check(&what("dinp"), &storage.read(&got, dinp), &want, largest)
}

#[test]
fn residual_norms_match_the_cpu_and_the_unfused_kernels() {
    let test = "residual_norms_match_the_cpu_and_the_unfused_kernels";
    let (Some(layer), Some(rms)) = (Family::of(test, "layernorm.cu"), Family::of(test, "rmsnorm.cu")) else {
        return;
    };
    for (norm, family) in [(Norm::Layer, &layer), (Norm::Rms, &rms)] {
        for storage in Storage::BOTH {
            // GPT-2's width, Llama-3-8B's, and one not a multiple of 32 with rows that end
            // inside a block.
            for (i, (n, c)) in [(ROWS, 768), (ROWS, 4096), (37, 100)].into_iter().enumerate() {
                residual_norm(family, norm, storage, n, c, 31 + i as u64).unwrap();
            }
        }
    }
}
