//! The tensor-core fused attention kernels (fused_attention_mma.cu), launch for launch as
//! the device runs them under `precision: bf16`, against the CPU's attention op: the same
//! runs as fused_attention.rs, with the head sizes these kernels take (multiples of 16).

use crate::attention::Dims;
use crate::fused_attention::{fused_attention, Fused, SPEC};
use crate::harness::Family;
use kernels::cuda::launch::per_attention_tile_bf16;

/// q, k, v, dout and the probabilities enter every product rounded to bf16 (8 significant
/// bits: a relative error of up to 2^-9 each), against the CPU's fp32 throughout. Judged,
/// as the fp32 kernels are, against the largest magnitude of each output of a head. The
/// worst cases are not long sums, whose rounding errors largely cancel, but outputs that
/// one or two terms dominate (the first rows: out_0 = P'_00 v_0 carries the rounding of
/// both), and dS, where the bf16 dP_ij is set against delta_i = dout_i . out_i in fp32
/// (for row 0 the CPU's dS is exactly 0): up to between 5e-3 and 8e-3 of the largest
/// magnitude in these runs. 2e-2 leaves room for other inputs and for the tensor cores'
/// own order of summation, while a wrong fragment, a missed tile or a wrong mask bit is off
/// by a whole term, of the order of the largest magnitude itself.
pub const BF16: Fused = Fused {
    file: "fused_attention_mma.cu",
    forward: "fused_attention_forward_bf16",
    query: "fused_attention_backward_query_bf16",
    key_value: "fused_attention_backward_key_value_bf16",
    launch: per_attention_tile_bf16,
    tol: 2e-2,
};

/// Every head of two odd sequences: T = 77 ends inside a second tile of 64, heads of 32
/// take two k steps of 16.
pub const ODD: Dims = Dims { b: 2, t: 77, c: 64, nh: 2 };

#[test]
fn fused_attention_mma_matches_the_cpu() {
    let Some(family) = Family::of("fused_attention_mma_matches_the_cpu", BF16.file) else { return };
    // GPT-2 124M's step in full (B = 4, T = 1024, C = 768, 12 heads of 64), of whose 48
    // heads the last (b = 3, h = 11, the largest offsets) runs, as fused_attention.rs does.
    let gpt2 = Dims { b: 4, t: 1024, c: 768, nh: 12 };
    fused_attention(&family, &BF16, gpt2, &[47], Some(SPEC), 51).unwrap();
    // GPT-2's head size with T = 100, whose last tile is partial, in both heads.
    let partial = Dims { b: 1, t: 100, c: 128, nh: 2 };
    fused_attention(&family, &BF16, partial, &[0, 1], None, 52).unwrap();
    fused_attention(&family, &BF16, partial, &[0, 1], Some(SPEC), 53).unwrap();
    let all: Vec<usize> = (0..ODD.heads()).collect();
    fused_attention(&family, &BF16, ODD, &all, None, 54).unwrap();
    fused_attention(&family, &BF16, ODD, &all, Some(SPEC), 55).unwrap();
    // The smallest head size, one k step: T = 37 inside one tile.
    let small = Dims { b: 1, t: 37, c: 48, nh: 3 };
    fused_attention(&family, &BF16, small, &[0, 1, 2], Some(SPEC), 56).unwrap();
}
