//! The CUDA device's fused attention op (kernels/src/cuda/fused_attention.rs), launch for
//! launch with its shapes and buffers, against the CPU's attention op through the same
//! `Device` seam: forward into out and lse, then backward from out and lse into dqkv (the
//! query side leaving delta for the key side, or, where one kernel sums every gradient, a
//! launch for delta first), with and without dropout.

use crate::attention::{cpu_attention, Dims};
use crate::harness::{bf16_bits, close, max_abs, rounds_from, Arg, Buf, Family, Rng, Run, Storage};
use crate::philox::{dropout_mask, unused_dropout_mask};
use cudarc::driver::LaunchConfig;
use kernels::attention::{attention_mma_stream, ATTENTION_MMA_TILE};
use kernels::cuda::launch::per_attention_tile;
use kernels::{CausalMask, ChainedDq, DType, DropoutKey, DropoutSite, DropoutSpec};

/// One family of the fused attention kernels: its file of kernels/cuda, its kernels, their
/// launches (T, heads, hs: B * NH query heads, or B * KV key/value heads for the key side),
/// the storage of their [B, T, *] tensors (qkv, out, dout, dqkv; lse and delta are f32),
/// and how close to the CPU's its outputs must be, relative to the largest magnitude of
/// each output of a head.
pub struct Fused {
    pub file: &'static str,
    pub forward: &'static str,
    pub forward_launch: fn(usize, usize, usize) -> LaunchConfig,
    pub backward: Backward,
    pub launch: fn(usize, usize, usize) -> LaunchConfig,
    pub storage: Storage,
    pub tol: f64,
}

/// The kernels of a family's backward, as the device launches them.
pub enum Backward {
    /// The query side (dq, and delta for the key side), a block per query tile, then the
    /// key side (dk and dv), a block per key tile.
    TwoSided { query: &'static str, key_value: &'static str },
    /// delta, with the turns' counters zeroed, a block per query tile; then every gradient
    /// from the key side, each streamed query tile's dq summed over the key tiles' blocks in
    /// turn (fused_attention_mma.cu); their scratch and turns are those of the kernels
    /// compiled for heads up to `compiled`, whatever the run's head size.
    Chained { delta: &'static str, backward: &'static str, compiled: usize },
}

impl Fused {
    /// An output of a head against the CPU's: within `tol` of the output's largest magnitude
    /// (`close` with that floor, which no element exceeds), in bf16 before the output's own
    /// rounding, with no part relative to the element itself.
    fn check(&self, what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
        let largest = max_abs(want);
        match self.storage {
            Storage::F32 => close(what, got, want, self.tol, largest),
            // The bits of `got` again: each is a bf16 value, so rounds to itself.
            Storage::Bf16 => rounds_from(what, &bf16_bits(got), want, 0.0, self.tol * largest),
        }
    }
}

/// The fp32 kernels: sums of the same fp32 terms as the CPU's in another order.
pub const FP32: Fused = Fused {
    file: "fused_attention.cu",
    forward: "fused_attention_forward",
    forward_launch: per_attention_tile,
    backward: Backward::TwoSided {
        query: "fused_attention_backward_query",
        key_value: "fused_attention_backward_key_value",
    },
    launch: per_attention_tile,
    storage: Storage::F32,
    tol: 1e-5,
};

/// Head h of sequence b's [T, hs] block of x, rows `stride` wide, heads from column
/// `offset`.
fn head<T: Copy>(x: &[T], d: Dims, [b, h]: [usize; 2], stride: usize, offset: usize) -> Vec<T> {
    let hs = d.hs();
    (0..d.t).flat_map(|t| &x[(b * d.t + t) * stride + offset + h * hs..][..hs]).copied().collect()
}

/// The blocks of a launch of `tiles` tiles of each of `heads`.
fn blocks(heads: &[usize], tiles: usize) -> Vec<u64> {
    heads.iter().flat_map(|&bh| (0..tiles).map(move |x| (bh * tiles + x) as u64)).collect()
}

/// A fused attention kernel's arguments: its buffers, then T, NH, KV, hs, the keys a query
/// sees at most, the dropout mask and whether to apply it.
pub fn kernel_args(bufs: &[Buf], d: Dims, mask: Arg, on: i32) -> Vec<Arg> {
    let sizes = [d.t, d.nh, d.kv, d.hs(), d.mask.keys(d.t)].map(|x| Arg::from(x as i32));
    bufs.iter().map(|&b| Arg::from(b)).chain(sizes).chain([mask, on.into()]).collect()
}

/// Forward and backward of `kernels` (built as `family`) at `d`, running the blocks of query
/// heads `heads` (b * NH + h) and of the key/value heads they read only; Err on the first
/// difference from the CPU in those heads, whose op runs in f32 on the values of qkv and
/// dout the kernels read. The key side's blocks sum over every query head of their group,
/// so `heads` holds whole groups.
pub fn fused_attention(
    family: &Family,
    kernels: &Fused,
    d: Dims,
    heads: &[usize],
    spec: Option<DropoutSpec>,
    seed: u64,
) -> Result<(), String> {
    let storage = kernels.storage;
    let mut rng = Rng::new(seed);
    let (qkv, dout) = (storage.round(rng.uniform(d.qkv(), 2.0)), storage.round(rng.uniform(d.act(), 1.0)));
    let forward_cfg = (kernels.forward_launch)(d.t, d.heads(), d.hs());
    let cfg = (kernels.launch)(d.t, d.heads(), d.hs());
    let key_cfg = (kernels.launch)(d.t, d.kv_heads(), d.hs());
    // Without dropout the kernels are passed the device's unused mask and do not read it.
    let mask = || spec.as_ref().map_or_else(unused_dropout_mask, dropout_mask);
    let on = spec.is_some() as i32;
    let rows = d.heads() * d.t;
    let mut groups: Vec<usize> = heads.iter().map(|&bh| d.kv_of(bh)).collect();
    groups.dedup();
    let group = d.nh / d.kv;
    assert!(
        groups.iter().all(|&g| (0..group).all(|r| heads.contains(&(g / d.kv * d.nh + g % d.kv * group + r)))),
        "the heads {heads:?} must be whole groups of {group}"
    );
    let query_blocks = blocks(heads, cfg.grid_dim.0 as usize);

    let mut run = Run::new(seed);
    let (gqkv, gdout) = (storage.buffer(&mut run, &qkv), storage.buffer(&mut run, &dout));
    let (out, lse, delta) = (
        storage.output(&mut run, d.act()),
        run.buffer(&vec![f32::NAN; rows]),
        run.buffer(&vec![f32::NAN; rows]),
    );
    let dqkv = storage.output(&mut run, d.qkv());
    let args = |bufs: &[Buf]| kernel_args(bufs, d, mask(), on);
    let forward_blocks = blocks(heads, forward_cfg.grid_dim.0 as usize);
    run.launch_blocks(kernels.forward, forward_cfg, &args(&[out, lse, gqkv]), &forward_blocks);
    run.read(out);
    let key_blocks = blocks(&groups, key_cfg.grid_dim.0 as usize);
    let turns = match kernels.backward {
        Backward::TwoSided { query, key_value } => {
            run.launch_blocks(query, cfg, &args(&[dqkv, delta, gqkv, out, gdout, lse]), &query_blocks);
            run.launch_blocks(key_value, key_cfg, &args(&[dqkv, gqkv, gdout, lse, delta]), &key_blocks);
            None
        }
        Backward::Chained { delta: delta_kernel, backward, compiled } => {
            // The partial sums and the counters start as garbage: the delta launch must
            // zero every counter the backward reads, and the chain write every partial sum
            // before it reads it.
            let scratch =
                ChainedDq::of(DType::Bf16, compiled, d.t, d.heads(), d.kv_heads()).expect("a chained dtype");
            let partials = run.buffer(&vec![f32::NAN; scratch.partials]);
            let turns = run.buffer(&vec![u32::MAX; scratch.turns]);
            let sizes = [d.t, d.nh, d.kv, d.hs()].map(|x| Arg::from(x as i32));
            let delta_args: Vec<Arg> =
                [delta, turns, out, gdout].map(Arg::from).into_iter().chain(sizes).collect();
            run.launch_blocks(delta_kernel, cfg, &delta_args, &query_blocks);
            run.launch_blocks(
                backward,
                key_cfg,
                &args(&[dqkv, partials, turns, gqkv, gdout, lse, delta]),
                &key_blocks,
            );
            run.read(turns);
            Some((turns, attention_mma_stream(compiled), key_cfg.grid_dim.0 as usize))
        }
    };
    run.read(dqkv);
    let got = family.run(run)?;
    if let Some((turns, stream, key_tiles)) = turns {
        chain_ended(&got.get::<u32>(turns), d, heads, &groups, stream, key_tiles)?;
    }

    let [want_out, _, _, want_dqkv] = cpu_attention(d, spec, &qkv, &dout);
    let case = if spec.is_some() { "with dropout" } else { "without dropout" };
    let (out, dqkv, c, w) = (storage.read(&got, out), storage.read(&got, dqkv), d.c, d.width());
    // Sums of terms of either sign in another order: judged against the largest magnitude.
    let compare = |what: String, x: &[f32], want: &[f32], at: [usize; 2], stride, offset| {
        kernels.check(&what, &head(x, d, at, stride, offset), &head(want, d, at, stride, offset))
    };
    for &bh in heads {
        let at = [bh / d.nh, bh % d.nh];
        compare(format!("{storage} fused out, head {bh} {case}"), &out, &want_out, at, c, 0)?;
        compare(format!("{storage} fused dq, head {bh} {case}"), &dqkv, &want_dqkv, at, w, 0)?;
    }
    for &g in &groups {
        let at = [g / d.kv, g % d.kv];
        for (part, offset) in [("dk", c), ("dv", c + d.kv * d.hs())] {
            compare(
                format!("{storage} fused {part}, key/value head {g} {case}"),
                &dqkv,
                &want_dqkv,
                at,
                w,
                offset,
            )?;
        }
    }
    Ok(())
}

/// The turns' counters after a chained backward: each head run's query tiles of `stream`
/// rows, tile n handed on as many times as key tiles before the one holding its queries
/// (of ATTENTION_MMA_TILE rows) add to its sum (key tile 0 ends it, n stream / 64 times;
/// under a window the lowest whose last key its first query sees), and each key/value
/// head run has given out a ticket to each of its `key_tiles` blocks.
fn chain_ended(
    turns: &[u32],
    d: Dims,
    heads: &[usize],
    groups: &[usize],
    stream: usize,
    key_tiles: usize,
) -> Result<(), String> {
    let tiles = d.t.div_ceil(stream);
    for &bh in heads {
        let got = &turns[bh * tiles..][..tiles];
        let lowest =
            |n: usize| (0..).find(|k| (k + 1) * ATTENTION_MMA_TILE > d.mask.first_key(n * stream)).unwrap();
        let due: Vec<u32> =
            (0..tiles).map(|n| (n * stream / ATTENTION_MMA_TILE - lowest(n)) as u32).collect();
        if got != due {
            return Err(format!("head {bh}: query tiles handed on {got:?} times, not {due:?}"));
        }
    }
    for &g in groups {
        let tickets = turns[d.heads() * tiles + g];
        if tickets != key_tiles as u32 {
            return Err(format!("key/value head {g}: {tickets} tickets for {key_tiles} key tiles"));
        }
    }
    Ok(())
}

const KEY: DropoutKey =
    DropoutKey { seed: 99, step: 4, microbatch: 1, layer: 9, site: DropoutSite::AttentionProbs };

/// Two odd heads: T = 37 ends inside a second tile, head size 24 below a warp.
pub const ODD: Dims = Dims { b: 2, t: 37, c: 96, nh: 4, kv: 4, mask: CausalMask::Full };
pub const SPEC: DropoutSpec = DropoutSpec { p: 0.1, key: KEY, first: 0, heads: None };
/// GPT-2's head size with T = 100: two tiles, the last partial, in both heads.
pub const TWO_TILES: Dims = Dims { b: 1, t: 100, c: 128, nh: 2, kv: 2, mask: CausalMask::Full };
/// GPT-2 124M's step in full: B = 4, T = 1024, C = 768, 12 heads of 64.
pub const GPT2: Dims = Dims { b: 4, t: 1024, c: 768, nh: 12, kv: 12, mask: CausalMask::Full };
/// Grouped-query attention: 8 query heads on 2 key/value heads (Llama 3's 4 a group) of 16,
/// T = 77 ending inside a second tile of 64 (and a fifth of the fp32 key side's 16).
pub const GROUPED: Dims = Dims { b: 2, t: 77, c: 128, nh: 8, kv: 2, mask: CausalMask::Full };

#[test]
fn fused_attention_matches_the_cpu() {
    let Some(family) = Family::of("fused_attention_matches_the_cpu", FP32.file) else { return };
    // GPT-2 124M's step in full, of whose 48 heads the last (b = 3, h = 11, the largest
    // offsets) runs: every head's blocks do the same work, and one head's 32 query tiles
    // and 32 key tiles take seconds to emulate.
    fused_attention(&family, &FP32, GPT2, &[47], Some(SPEC), 31).unwrap();
    let all: Vec<usize> = (0..ODD.heads()).collect();
    fused_attention(&family, &FP32, ODD, &all, None, 32).unwrap();
    fused_attention(&family, &FP32, ODD, &all, Some(SPEC), 33).unwrap();
    fused_attention(&family, &FP32, TWO_TILES, &[0, 1], Some(SPEC), 34).unwrap();
    let all: Vec<usize> = (0..GROUPED.heads()).collect();
    fused_attention(&family, &FP32, GROUPED, &all, None, 35).unwrap();
    fused_attention(&family, &FP32, GROUPED, &all, Some(SPEC), 36).unwrap();
    // A sliding window of 21 keys at T = 150: three query tiles of 64, the third's first
    // rows seeing none of the first key tile, a key side's last query tile short of T.
    let windowed = Dims { t: 150, mask: CausalMask::Window(21), ..GROUPED };
    let all: Vec<usize> = (0..windowed.heads()).collect();
    fused_attention(&family, &FP32, windowed, &all, Some(SPEC), 37).unwrap();
}
