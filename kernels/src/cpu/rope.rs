//! Rotary position embedding in Hugging Face's rotate-half layout, in place on the query and
//! key heads of qkv [B,T,(NH+2*KV)*hs] (queries, then keys, then values in each token's
//! row). Token t of a sequence sits at position first + t (first is 0 in training; a
//! decoder's next token sits after its cache). Of each head the first `rot` channels turn
//! (all hs, or a partial rotary embedding's share; the rest pass through): with
//! half = rot/2, for i < half: angle = position * inv_freq_i
//! (kernels/src/rope_frequencies.rs), and the pair (x[i], x[i + half]) turns by that angle. Every value is the f32 Hugging Face's
//! LlamaRotaryEmbedding computes: the frequencies in f32 as transformers computes them, the
//! angle an f32 product; cos and sin are computed in f64 and rounded once, the correctly
//! rounded f32 that torch's approximate.
//!
//! Each call fills a table of cos and sin [T, half] once (in parallel over positions) and
//! then rotates the rows in parallel; the rotation of an element depends on nothing else, so
//! the result is the same whatever the thread count.

use super::rows_per_task;
use crate::rope_frequencies::RopeFrequencies;
use rayon::prelude::*;

/// The heads of qkv: NH query heads, KV key heads (and KV value heads, untouched) of hs
/// values each, T tokens a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub t: usize,
    pub nh: usize,
    pub kv: usize,
    pub hs: usize,
    /// The position of each sequence's first token.
    pub first: usize,
}

impl Dims {
    fn width(&self) -> usize {
        (self.nh + 2 * self.kv) * self.hs
    }
}

/// Scratch `forward` and `backward` need: cos and sin [2, T, rot/2].
pub fn table_len(d: Dims, freqs: RopeFrequencies) -> usize {
    d.t * freqs.rotated(d.hs)
}

/// table [2, T, rot/2] = cos and sin of (first + t) * inv_freq_i, the sines negated for
/// `inverse`.
fn fill_table(table: &mut [f32], d: Dims, freqs: RopeFrequencies, inverse: bool) {
    let half = freqs.rotated(d.hs) / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| freqs.inv_freq(i, d.hs)).collect();
    let sign = if inverse { -1.0 } else { 1.0 };
    let (cos, sin) = table.split_at_mut(d.t * half);
    cos.par_chunks_mut(half).zip(sin.par_chunks_mut(half)).enumerate().for_each(|(t, (cos, sin))| {
        for ((c, s), &f) in cos.iter_mut().zip(sin).zip(&inv_freq) {
            let angle = ((d.first + t) as f32 * f) as f64;
            (*c, *s) = (angle.cos() as f32, sign * angle.sin() as f32);
        }
    });
}

/// Turns every (x[i], x[i + half]) of the query and key heads of qkv [B,T,W] (i < rot/2) by the angle
/// of `table` at its position: x[i] = x[i] cos - x[i + half] sin,
/// x[i + half] = x[i + half] cos + x[i] sin.
fn rotate(qkv: &mut [f32], table: &[f32], d: Dims, rot: usize) {
    let (half, width) = (rot / 2, d.width());
    let (cos, sin) = table.split_at(d.t * half);
    qkv.par_chunks_mut(width).with_min_len(rows_per_task(width)).enumerate().for_each(|(n, row)| {
        let t = n % d.t;
        let (cos, sin) = (&cos[t * half..][..half], &sin[t * half..][..half]);
        for head in row[..(d.nh + d.kv) * d.hs].chunks_exact_mut(d.hs) {
            let (x1, x2) = head[..rot].split_at_mut(half);
            for (((a, b), &c), &s) in x1.iter_mut().zip(x2).zip(cos).zip(sin) {
                (*a, *b) = (*a * c - *b * s, *b * c + *a * s);
            }
        }
    });
}

/// The channels of each head that turn, checked.
fn check(qkv: &[f32], table: &[f32], d: Dims, freqs: RopeFrequencies) -> usize {
    let rot = freqs.rotated(d.hs);
    assert!(
        rot.is_multiple_of(2) && rot > 0 && rot <= d.hs,
        "rope: {rot} channels of a head of {} must turn (even, at most the head)",
        d.hs
    );
    assert!(d.t > 0 && qkv.len().is_multiple_of(d.t * d.width()), "rope: qkv of {} for {d:?}", qkv.len());
    assert_eq!(table.len(), table_len(d, freqs), "rope: table for {d:?}");
    rot
}

/// Rotates the query and key heads of qkv [B,T,(NH+2*KV)*hs] in place; `table` is scratch
/// of `table_len`.
pub fn forward(qkv: &mut [f32], table: &mut [f32], d: Dims, freqs: RopeFrequencies) {
    let rot = check(qkv, table, d, freqs);
    fill_table(table, d, freqs, false);
    rotate(qkv, table, d, rot);
}

/// The transpose of `forward` (its inverse rotation), in place on dqkv:
/// d[i] = d[i] cos + d[i + half] sin, d[i + half] = d[i + half] cos - d[i] sin.
pub fn backward(dqkv: &mut [f32], table: &mut [f32], d: Dims, freqs: RopeFrequencies) {
    let rot = check(dqkv, table, d, freqs);
    fill_table(table, d, freqs, true);
    rotate(dqkv, table, d, rot);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};

    // Odd sizes: 3 sequences of 7 tokens, 3 query heads sharing 1 key/value head of 10.
    const B: usize = 3;
    const D: Dims = Dims { t: 7, nh: 3, kv: 1, hs: 10, first: 0 };
    const FREQS: RopeFrequencies = RopeFrequencies::plain(10_000.0);
    /// 6 of the 10 channels turning: three pairs, an odd count, (i, i + 3).
    const PARTIAL: RopeFrequencies = RopeFrequencies { rotary_dims: Some(6), ..FREQS };

    fn qkv(seed: u64) -> Vec<f32> {
        random(seed, B * D.t * D.width(), 2.0)
    }

    /// RoPE in f64 from the definition, with the f32 angles of the op.
    fn reference(x: &[f64], freqs: RopeFrequencies) -> Vec<f64> {
        let (half, width) = (freqs.rotated(D.hs) / 2, D.width());
        let mut out = x.to_vec();
        for (n, row) in out.chunks_exact_mut(width).enumerate() {
            for head in row[..(D.nh + D.kv) * D.hs].chunks_exact_mut(D.hs) {
                for i in 0..half {
                    let angle = ((n % D.t) as f32 * freqs.inv_freq(i, D.hs)) as f64;
                    let (x1, x2) = (head[i], head[i + half]);
                    head[i] = x1 * angle.cos() - x2 * angle.sin();
                    head[i + half] = x2 * angle.cos() + x1 * angle.sin();
                }
            }
        }
        out
    }

    fn run_with(x: &[f32], inverse: bool, freqs: RopeFrequencies) -> Vec<f32> {
        let (mut out, mut table) = (x.to_vec(), vec![f32::NAN; table_len(D, freqs)]);
        if inverse {
            backward(&mut out, &mut table, D, freqs);
        } else {
            forward(&mut out, &mut table, D, freqs);
        }
        out
    }

    fn run(x: &[f32], inverse: bool) -> Vec<f32> {
        run_with(x, inverse, FREQS)
    }

    #[test]
    fn forward_matches_f64_reference_and_leaves_values_and_position_0_alone() {
        let x = qkv(1);
        let got = run(&x, false);
        // Tolerance: 1e-6 of the largest value: two products and a sum in f32, and cos and
        // sin rounded to f32.
        assert_close(&got, &reference(&to_f64(&x), FREQS), 1e-6, "rope");
        let (rotated, width) = ((D.nh + D.kv) * D.hs, D.width());
        for (n, (g, x)) in got.chunks_exact(width).zip(x.chunks_exact(width)).enumerate() {
            assert_eq!(g[rotated..], x[rotated..], "values of row {n} must be untouched");
            if n % D.t == 0 {
                assert_eq!(g, x, "position 0 (row {n}) is the identity");
            }
        }
    }

    #[test]
    fn one_element_by_hand() {
        // Position 2, query head 0, pair i = 1 of hs = 10: inv_freq = 1 / 10000^0.2 =
        // 0.15848932, angle = 0.31697863.
        let x = qkv(2);
        let got = run(&x, false);
        let row = 2 * D.width();
        let (x1, x2) = (x[row + 1], x[row + 6]);
        assert_eq!(FREQS.inv_freq(1, 10), 0.158_489_32);
        let angle = 2.0f32 * 0.158_489_32;
        assert_eq!(angle, 0.316_978_63);
        let (c, s) = (0.950_181_5f32, 0.311_697_16f32); // cos and sin of 0.31697863, to f32
        assert_eq!(((angle as f64).cos() as f32, (angle as f64).sin() as f32), (c, s));
        assert_eq!((got[row + 1], got[row + 6]), (x1 * c - x2 * s, x2 * c + x1 * s));
    }

    /// A decoder rotates one token at a time at its position: the same bits as that row of
    /// a whole sequence rotated at once.
    #[test]
    fn a_token_at_a_later_position_is_rotated_as_in_its_sequence() {
        let x = qkv(5);
        let whole = run(&x, false);
        let width = D.width();
        for t in 0..D.t {
            let one = Dims { t: 1, first: t, ..D };
            let mut row = x[t * width..(t + 1) * width].to_vec();
            let mut table = vec![f32::NAN; table_len(one, FREQS)];
            forward(&mut row, &mut table, one, FREQS);
            assert_eq!(row, whole[t * width..(t + 1) * width], "position {t}");
        }
    }

    #[test]
    fn backward_is_the_transpose_and_undoes_forward() {
        let x = qkv(3);
        let w = random(4, x.len(), 1.0);
        // The op is linear in x, so its transpose applied to w is the gradient of sum(w * rope(x)).
        let fd = finite_diff(&x, |x| weighted_sum(&reference(x, FREQS), &w));
        // Tolerance: 1e-6 of the largest gradient, as forward.
        assert_close(&run(&w, true), &fd, 1e-6, "drope");
        let back = run(&run(&x, false), true);
        let worst = back.iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        // A rotation and its inverse in f32: a few ulp of values below 2.
        assert!(worst <= 1e-6, "backward(forward(x)) is {worst:e} off x");
    }

    /// A partial rotary embedding turns the leading 6 channels of each query and key head
    /// by frequencies over 6 (pair 1's is 1 / 10000^(2/6), not 1 / 10000^(2/10)), leaves
    /// the other 4 bit for bit, and its backward is its transpose.
    #[test]
    fn a_partial_rotation_turns_the_leading_channels_alone() {
        let x = qkv(6);
        assert_eq!(PARTIAL.inv_freq(1, D.hs), 1.0 / 10_000f32.powf(2.0 / 6.0));
        let got = run_with(&x, false, PARTIAL);
        assert_close(&got, &reference(&to_f64(&x), PARTIAL), 1e-6, "partial rope");
        let width = D.width();
        for (n, (g, x)) in got.chunks_exact(width).zip(x.chunks_exact(width)).enumerate() {
            for (head, (g, x)) in g.chunks_exact(D.hs).zip(x.chunks_exact(D.hs)).enumerate() {
                assert_eq!(g[6..], x[6..], "row {n}, head {head}: the passed-through channels");
            }
            if n % D.t != 0 {
                assert_ne!(g[..6], x[..6], "row {n}: the turned channels");
            }
        }
        let w = random(7, x.len(), 1.0);
        let fd = finite_diff(&x, |x| weighted_sum(&reference(x, PARTIAL), &w));
        assert_close(&run_with(&w, true, PARTIAL), &fd, 1e-6, "partial drope");
    }
}
