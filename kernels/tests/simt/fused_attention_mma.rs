//! The tensor-core fused attention kernels (fused_attention_mma.cu), launch for launch as
//! the device runs them under `precision: bf16`, against the CPU's attention op: the same
//! runs as fused_attention.rs, with the head sizes these kernels take (multiples of 16),
//! and every [B, T, *] tensor (qkv, out, dout, dqkv) stored as bf16, as the device stores
//! activations and their gradients under bf16; lse and delta stay fp32.

use crate::attention::Dims;
use crate::fused_attention::{fused_attention, kernel_args, Backward, Fused, GPT2, GROUPED, SPEC, TWO_TILES};
use crate::harness::{bf16_bits, Family, Rng, Run, Storage};
use crate::philox::unused_dropout_mask;
use half::bf16;
use kernels::cuda::launch::{
    per_attention_forward_bf16, per_attention_forward_bf16_hs128, per_attention_tile_bf16,
};
use kernels::cuda::sources::SOURCES;
use kernels::CausalMask;

/// The kernels take their inputs as bf16, and the CPU takes the same bf16 values in f32, so
/// what differs is the rounding inside the kernels: the probabilities P' (forward, and dv
/// on the key side), P and dS enter their products rounded to bf16 (8 significant bits: a
/// relative error of up to 2^-9 each), against the CPU's fp32 throughout; and out, which
/// the query side reads back for delta, is the kernel's own bf16 output. Judged, as the
/// fp32 kernels are, against the largest magnitude of each output of a head: every bf16
/// output must be the rounding of a value within `tol` times that magnitude of the CPU's
/// (`rounds_from`, with no part relative to the element itself), so the outputs' own final
/// rounding is not counted against the tolerance. The worst cases are not long sums, whose
/// rounding errors largely cancel, but outputs that one or two terms dominate (the first
/// rows: out_0 = P'_00 v_0, with P'_00 = 1 / (1 - p) rounded under dropout), and dS, where
/// P_ij (dP_ij - delta_i) is set against delta_i = dout_i . out_i from the bf16 out (for
/// row 0 the CPU's dS is exactly 0). In these runs the largest such error is 5.7e-3 of the
/// largest magnitude (dq at T = 77 with dropout), against 5e-3 to 8e-3 when q, k, v and
/// dout were still rounded inside the kernels. The tolerance stays 2e-2, which leaves room
/// for other inputs and for the tensor cores' own order of summation, while a wrong
/// fragment, a missed tile or a wrong mask bit is off by a whole term, of the order of the
/// largest magnitude itself. That the outputs round to nearest, once, no tolerance can
/// tell: `fused_attention_mma_rounds_its_output_once` checks it bit for bit.
pub const BF16: Fused = Fused {
    file: "fused_attention_mma.cu",
    forward: "fused_attention_forward_bf16",
    forward_launch: per_attention_forward_bf16,
    backward: Backward::Chained {
        delta: "fused_attention_backward_delta_bf16",
        backward: "fused_attention_backward_bf16",
        compiled: 64,
    },
    launch: per_attention_tile_bf16,
    storage: Storage::Bf16,
    tol: 2e-2,
};

/// The kernels compiled for head sizes above 64, up to 128 (Llama's). The forward streams
/// key tiles of 64 rows from dynamic shared memory, the backward query tiles of 32, so that
/// dq's chain runs over query tiles of 32 and two warps share a tile, each summing half its
/// columns: the same rounding, so the same tolerance.
pub const BF16_HS128: Fused = Fused {
    file: "fused_attention_mma.cu",
    forward: "fused_attention_forward_bf16_hs128",
    forward_launch: per_attention_forward_bf16_hs128,
    backward: Backward::Chained {
        delta: "fused_attention_backward_delta_bf16_hs128",
        backward: "fused_attention_backward_bf16_hs128",
        compiled: 128,
    },
    launch: per_attention_tile_bf16,
    storage: Storage::Bf16,
    tol: 2e-2,
};

/// Every head of two odd sequences: T = 77 ends inside a second tile of 64, heads of 32
/// take two k steps of 16.
pub const ODD: Dims = Dims { b: 2, t: 77, c: 64, nh: 2, kv: 2, mask: CausalMask::Full };

#[test]
fn fused_attention_mma_matches_the_cpu() {
    let Some(family) = Family::of("fused_attention_mma_matches_the_cpu", BF16.file) else { return };
    // GPT-2 124M's step in full, of whose 48 heads the last (b = 3, h = 11, the largest
    // offsets) runs, as fused_attention.rs does.
    fused_attention(&family, &BF16, GPT2, &[47], Some(SPEC), 51).unwrap();
    // GPT-2's head size with T = 100, whose last tile is partial, in both heads.
    fused_attention(&family, &BF16, TWO_TILES, &[0, 1], None, 52).unwrap();
    fused_attention(&family, &BF16, TWO_TILES, &[0, 1], Some(SPEC), 53).unwrap();
    let all: Vec<usize> = (0..ODD.heads()).collect();
    fused_attention(&family, &BF16, ODD, &all, None, 54).unwrap();
    fused_attention(&family, &BF16, ODD, &all, Some(SPEC), 55).unwrap();
    // The smallest head size, one k step: T = 37 inside one tile.
    let small = Dims { b: 1, t: 37, c: 48, nh: 3, kv: 3, mask: CausalMask::Full };
    fused_attention(&family, &BF16, small, &[0, 1, 2], Some(SPEC), 56).unwrap();
    // Grouped-query attention, 4 query heads a key/value head, read in place.
    let all: Vec<usize> = (0..GROUPED.heads()).collect();
    fused_attention(&family, &BF16, GROUPED, &all, None, 59).unwrap();
    fused_attention(&family, &BF16, GROUPED, &all, Some(SPEC), 60).unwrap();
    // Sliding windows at T = 300 (three blocks of 128 queries, the last partial): 70 keys,
    // across a streamed tile's edge, and 20, within one, so that a warp's rows see no key
    // of the block's first tile and some query tiles' dq chains end above key tile 0.
    for (window, spec, seed) in [(70, Some(SPEC), 65), (20, None, 66)] {
        let windowed = Dims { t: 300, mask: CausalMask::Window(window), ..GROUPED };
        fused_attention(&family, &BF16, windowed, &all, spec, seed).unwrap();
    }
}

#[test]
fn fused_attention_mma_at_head_size_128_matches_the_cpu() {
    let test = "fused_attention_mma_at_head_size_128_matches_the_cpu";
    let Some(family) = Family::of(test, BF16_HS128.file) else { return };
    // A Llama 3 8B layer's sequence (hidden 4096, 32 query heads of 128 on 8 key/value
    // heads, T = 1024), of which the last group runs (query heads 28 to 31 and the key/value
    // head they share, the largest offsets): every group's blocks do the same work, and one
    // group's takes most of a minute to emulate.
    let llama = Dims { b: 1, t: 1024, c: 4096, nh: 32, kv: 8, mask: CausalMask::Full };
    fused_attention(&family, &BF16_HS128, llama, &[28, 29, 30, 31], Some(SPEC), 61).unwrap();
    // Heads of 80 (a second run of 64 columns, partly past hs), 2 query heads a key/value
    // head, T = 77: a partial last tile of the block's 64 rows, of the forward's 64 streamed
    // and of the backward's 32.
    let odd = Dims { b: 2, t: 77, c: 320, nh: 4, kv: 2, mask: CausalMask::Full };
    let all: Vec<usize> = (0..odd.heads()).collect();
    fused_attention(&family, &BF16_HS128, odd, &all, None, 62).unwrap();
    fused_attention(&family, &BF16_HS128, odd, &all, Some(SPEC), 63).unwrap();
    // Multi-head at 128, T = 45: one block of rows, one streamed tile forward and two backward.
    let multi = Dims { b: 1, t: 45, c: 256, nh: 2, kv: 2, mask: CausalMask::Full };
    fused_attention(&family, &BF16_HS128, multi, &[0, 1], Some(SPEC), 64).unwrap();
    // A sliding window of 45 keys at T = 200 on two query heads sharing a key/value head:
    // the backward's query tiles of 32 end each key tile's stream early.
    let windowed = Dims { b: 1, t: 200, c: 256, nh: 2, kv: 1, mask: CausalMask::Window(45) };
    fused_attention(&family, &BF16_HS128, windowed, &[0, 1], Some(SPEC), 67).unwrap();
}

/// The forwards' output bit for bit where every step before its rounding is exact: with
/// q = 0 every score is 0, so a row's probabilities are exactly 1 (exp2 of 0) over l = i + 1
/// keys, and with v in eighths up to 2 the accumulated sum of row i is exact in fp32. The
/// kernel's fp32 result is then the sum times 1 / l, each rounded as fp32 rounds them, and
/// out must be that rounded once to nearest even: a store that truncated, or that rounded
/// an output twice, differs in about half the elements.
#[test]
fn fused_attention_mma_rounds_its_output_once() {
    let Some(family) = Family::of("fused_attention_mma_rounds_its_output_once", BF16.file) else { return };
    // Every head of T = 77 (two tiles, a partial one) at head size 32, and of T = 100 at 64,
    // through the kernels compiled for each head size.
    for (kernels, d, seed) in
        [(&BF16, ODD, 57), (&BF16, TWO_TILES, 58), (&BF16_HS128, ODD, 65), (&BF16_HS128, TWO_TILES, 66)]
    {
        let (c, t) = (d.c, d.t);
        let eighths: Vec<f32> =
            Rng::new(seed).uniform(d.qkv(), 2.0).iter().map(|x| (x * 8.0).round() / 8.0).collect();
        // q = 0, k and v eighths.
        let qkv: Vec<f32> =
            eighths.iter().enumerate().map(|(e, &x)| if e % d.width() < c { 0.0 } else { x }).collect();
        let cfg = (kernels.forward_launch)(t, d.heads(), d.hs());
        let mut run = Run::new(seed);
        let nan = bf16::NAN.to_bits();
        let (out, lse, gqkv) = (
            run.buffer(&vec![nan; d.act()]),
            run.buffer(&vec![f32::NAN; d.heads() * t]),
            run.buffer(&bf16_bits(&qkv)),
        );
        let args = kernel_args(&[out, lse, gqkv], d, unused_dropout_mask(), 0);
        run.launch(kernels.forward, cfg, &args);
        run.read(out);
        let got = family.run(run).unwrap().get::<u16>(out);
        let want: Vec<u16> = (0..d.act())
            .map(|e| {
                let (row, col) = (e / c, e % c);
                let (b, i) = (row / t, row % t);
                // v of keys 0 ..= i in this column, summed exactly, from +0 as the
                // accumulators start (so that a sum of -0 is +0, as the kernel's is).
                let sum = (0..=i).fold(0.0f32, |sum, j| sum + qkv[(b * t + j) * d.width() + 2 * c + col]);
                bf16::from_f32(sum * (1.0 / (i + 1) as f32)).to_bits()
            })
            .collect();
        if let Some(e) = (0..want.len()).find(|&e| got[e] != want[e]) {
            panic!("out element {e} is {:#06x}, the rounding of the exact result {:#06x}", got[e], want[e]);
        }
    }
}

/// The forward at head size 128 stages its tiles in dynamic shared memory: a launch that
/// gives it fewer bytes than they take fails, as on a GPU it would read past its own. Its
/// launch gives 69,632 bytes, and 16 fewer fail: the tiles (a multiple of 16 bytes) take
/// exactly what `ATTENTION_MMA_FORWARD_HS128_SHARED` says, so the Rust constant and the
/// kernel's declaration cannot drift apart unnoticed.
#[test]
fn the_forward_at_128_fails_a_launch_short_of_its_shared_memory() {
    let test = "the_forward_at_128_fails_a_launch_short_of_its_shared_memory";
    let Some(family) = Family::of(test, BF16_HS128.file) else { return };
    let d = Dims { b: 1, t: 16, c: 16, nh: 1, kv: 1, mask: CausalMask::Full };
    let mut cfg = (BF16_HS128.forward_launch)(d.t, d.heads(), d.hs());
    assert_eq!(cfg.shared_mem_bytes, 69_632);
    cfg.shared_mem_bytes -= 16;
    let mut run = Run::new(67);
    let (out, lse, qkv) = (
        run.buffer(&vec![0u16; d.act()]),
        run.buffer(&vec![0f32; d.heads() * d.t]),
        run.buffer(&vec![0u16; d.qkv()]),
    );
    let args = kernel_args(&[out, lse, qkv], d, unused_dropout_mask(), 0);
    run.launch(BF16_HS128.forward, cfg, &args);
    run.read(out);
    let err = family.run(run).err().expect("a launch short of the kernel's shared memory fails");
    assert!(err.contains("69632 bytes of dynamic shared memory, where the launch gives 69616"), "{err}");
}

/// The forwards copy their tiles by `cp.async` (async_copy.cuh), whose copies the emulator
/// lands only when their thread waits for them. Without the wait in the loop over tiles a
/// run fails, its copies never waited for; with the wait moved past the loop, so that each
/// tile after the first is read before it has landed, the results are wrong. Both forwards,
/// over two streamed tiles of T = 100.
#[test]
fn the_forwards_read_a_tile_only_once_its_copies_have_landed() {
    let test = "the_forwards_read_a_tile_only_once_its_copies_have_landed";
    let source = SOURCES.iter().find(|s| s.name == BF16.file).expect("the family").source;
    const WAIT: &str = "        copies_landed();  // tile n + 1's, which the next barrier publishes\n    }\n";
    assert_eq!(source.matches(WAIT).count(), 1, "the loop's wait, as written");
    let never = source.replace(WAIT, "    }\n");
    let late = source.replace(WAIT, "    }\n    copies_landed();\n");
    for kernels in [&BF16, &BF16_HS128] {
        for (edit, text) in [("no wait", &never), ("the wait after the loop", &late)] {
            let Some(edited) = Family::edited(test, BF16.file, &[(BF16.file, text.clone())]) else { return };
            let err = fused_attention(&edited, kernels, TWO_TILES, &[0, 1], None, 68)
                .err()
                .unwrap_or_else(|| panic!("{} passes with {edit}", kernels.forward));
            let never_waited = err.contains("asynchronous copies it never waited for");
            assert_eq!(never_waited, edit == "no wait", "{} with {edit}: {err}", kernels.forward);
        }
    }
}
