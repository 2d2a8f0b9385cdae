//! RMSNorm over the channel axis, as Hugging Face's LlamaRMSNorm computes it in f32:
//! rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd).

use super::math::{lane_sum3, sum_chunks_in_order};
use rayon::prelude::*;

/// Rows per parallel task. In backward it is also the fixed chunk whose dweight partial
/// sums are added in order, so it must not depend on the thread count.
const ROWS: usize = 32;

/// out [N,C], rstd [N] from inp [N,C], weight [C]
pub fn forward(out: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], eps: f32) {
    let c = weight.len();
    if out.is_empty() {
        return;
    }
    out.par_chunks_mut(c).with_min_len(ROWS).zip(rstd.par_iter_mut()).zip(inp.par_chunks(c)).for_each(
        |((out, rstd), x)| {
            let s = rstd_of(x, eps);
            for ((o, &x), &w) in out.iter_mut().zip(x).zip(weight) {
                *o = w * (x * s);
            }
            *rstd = s;
        },
    );
}

/// 1 / sqrt(mean(x^2) + eps) of one row.
fn rstd_of(x: &[f32], eps: f32) -> f32 {
    1.0 / (lane_sum3(x, x, x, |x, _, _| x * x) / x.len() as f32 + eps).sqrt()
}

/// What forward saved: inp [N,C], weight [C], rstd [N].
#[derive(Clone, Copy)]
pub struct Saved<'a> {
    pub inp: &'a [f32],
    pub weight: &'a [f32],
    pub rstd: &'a [f32],
}

/// Scratch `backward` needs: a dweight partial per chunk of ROWS rows.
pub fn partials_len(n: usize, c: usize) -> usize {
    n.div_ceil(ROWS) * c
}

/// dinp [N,C] = (overwrite); dweight [C] += , from dout [N,C].
/// `partials` [N/ROWS, C] is scratch of `partials_len`.
pub fn backward(dinp: &mut [f32], dweight: &mut [f32], dout: &[f32], saved: Saved, partials: &mut [f32]) {
    let c = saved.weight.len();
    if dinp.is_empty() {
        return;
    }
    partials.par_chunks_mut(c).zip(dinp.par_chunks_mut(ROWS * c)).enumerate().for_each(
        |(chunk, (pw, dinp))| {
            pw.fill(0.0);
            for (r, dinp) in dinp.chunks_exact_mut(c).enumerate() {
                let n = chunk * ROWS + r;
                let (x, dout) = (&saved.inp[n * c..][..c], &dout[n * c..][..c]);
                let (s, w) = (saved.rstd[n], saved.weight);
                // dnorm = dout * w, norm = x * rstd; rstd's dependence on x gives the second
                // term of dinp = (dnorm - norm * mean(dnorm * norm)) * rstd
                let dnorm_norm_mean = lane_sum3(dout, w, x, |d, w, x| d * w * (x * s)) / c as f32;
                for ((di, pw), ((&x, &d), &w)) in
                    dinp.iter_mut().zip(pw.iter_mut()).zip(x.iter().zip(dout).zip(w))
                {
                    let norm = x * s;
                    *di = (d * w - norm * dnorm_norm_mean) * s;
                    *pw += d * norm;
                }
            }
        },
    );
    for (dw, &total) in dweight.iter_mut().zip(sum_chunks_in_order(partials, c)) {
        *dw += total;
    }
}

/// The query and key heads of qkv [N,(NH+2*KV)*hs] (N tokens): each token's NH query heads
/// and then its KV key heads, hs values each, lie side by side at the row's start; its KV
/// value heads follow, untouched.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub nh: usize,
    pub kv: usize,
    pub hs: usize,
}

impl Heads {
    /// A token's width in qkv.
    fn width(&self) -> usize {
        (self.nh + 2 * self.kv) * self.hs
    }

    /// Normalised rows per token: its query heads, then its key heads.
    fn rows(&self) -> usize {
        self.nh + self.kv
    }

    /// The weight of a token's head `h` (query heads first).
    fn weight<'a>(&self, h: usize, weights: [&'a [f32]; 2]) -> &'a [f32] {
        weights[usize::from(h >= self.nh)]
    }
}

/// QK-norm, in place: each query head of qkv [N,(NH+2*KV)*hs] becomes
/// q_weight [hs] * (q * rstd) and each key head k_weight [hs] * (k * rstd), every head its
/// own row of [`forward`]'s arithmetic; rstd [N, NH+KV], the query heads' and then the key
/// heads' of each token.
pub fn heads_forward(qkv: &mut [f32], rstd: &mut [f32], weights: [&[f32]; 2], h: Heads, eps: f32) {
    if qkv.is_empty() {
        return;
    }
    qkv.par_chunks_mut(h.width()).with_min_len(ROWS).zip(rstd.par_chunks_mut(h.rows())).for_each(
        |(token, rstd)| {
            for ((head, x), rstd) in token.chunks_exact_mut(h.hs).take(h.rows()).enumerate().zip(rstd) {
                let s = rstd_of(x, eps);
                for (x, &w) in x.iter_mut().zip(h.weight(head, weights)) {
                    *x = w * (*x * s);
                }
                *rstd = s;
            }
        },
    );
}

/// Scratch `heads_backward` needs: the two weights' partials per chunk of ROWS tokens.
pub fn heads_partials_len(n: usize, h: Heads) -> usize {
    n.div_ceil(ROWS) * 2 * h.hs
}

/// QK-norm's backward, in place: dqkv's query and key heads (the gradient of
/// [`heads_forward`]'s output) become the gradient of its input `inp` [N,(NH+2*KV)*hs],
/// each head as [`backward`] computes a row, the value heads untouched;
/// dweights [q, k] [hs] each += . `partials` is scratch of `heads_partials_len`.
pub fn heads_backward(
    dqkv: &mut [f32],
    dweights: [&mut [f32]; 2],
    inp: &[f32],
    weights: [&[f32]; 2],
    rstd: &[f32],
    h: Heads,
    partials: &mut [f32],
) {
    let (hs, width) = (h.hs, h.width());
    if dqkv.is_empty() {
        return;
    }
    partials.par_chunks_mut(2 * hs).zip(dqkv.par_chunks_mut(ROWS * width)).enumerate().for_each(
        |(chunk, (pw, dqkv))| {
            pw.fill(0.0);
            for (r, token) in dqkv.chunks_exact_mut(width).enumerate() {
                let n = chunk * ROWS + r;
                let heads = token.chunks_exact_mut(hs).take(h.rows()).enumerate();
                for (head, d) in heads {
                    let x = &inp[n * width + head * hs..][..hs];
                    let (s, w) = (rstd[n * h.rows() + head], h.weight(head, weights));
                    let pw = &mut pw[usize::from(head >= h.nh) * hs..][..hs];
                    // As `backward`: dinp = (dnorm - norm * mean(dnorm * norm)) * rstd.
                    let dnorm_norm_mean = lane_sum3(d, w, x, |d, w, x| d * w * (x * s)) / hs as f32;
                    for ((d, pw), (&x, &w)) in d.iter_mut().zip(pw).zip(x.iter().zip(w)) {
                        let norm = x * s;
                        *pw += *d * norm;
                        *d = (*d * w - norm * dnorm_norm_mean) * s;
                    }
                }
            }
        },
    );
    let totals = sum_chunks_in_order(partials, 2 * hs);
    for (dweight, totals) in dweights.into_iter().zip(totals.chunks_exact(hs)) {
        for (dw, &total) in dweight.iter_mut().zip(totals) {
            *dw += total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};

    const N: usize = 71; // two full chunks of ROWS and a partial one
    const C: usize = 37; // two lane blocks of the reductions and a tail
    const EPS: f32 = 1e-6;

    /// (out, rstd) in f64.
    fn reference(inp: &[f64], weight: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let mut out = vec![0.0; N * C];
        let mut rstds = vec![0.0; N];
        for n in 0..N {
            let x = &inp[n * C..][..C];
            let rstd = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / C as f64 + EPS as f64).sqrt();
            for i in 0..C {
                out[n * C + i] = weight[i] * x[i] * rstd;
            }
            rstds[n] = rstd;
        }
        (out, rstds)
    }

    fn inputs() -> (Vec<f32>, Vec<f32>) {
        let mut inp = random(1, N * C, 2.0);
        inp.iter_mut().enumerate().for_each(|(i, x)| *x *= 1.0 + (i / C) as f32 * 0.1); // row scales
        (inp, random(2, C, 1.5))
    }

    #[test]
    fn forward_matches_f64_reference() {
        let (inp, weight) = inputs();
        let (mut out, mut rstd) = (vec![f32::NAN; N * C], vec![f32::NAN; N]);
        forward(&mut out, &mut rstd, &inp, &weight, EPS);
        let (want, want_rstd) = reference(&to_f64(&inp), &to_f64(&weight));
        // Tolerance: 1e-6 of the largest value, a few f32 roundings of a 37-term sum of squares
        // and the two products of the output.
        assert_close(&out, &want, 1e-6, "out");
        assert_close(&rstd, &want_rstd, 1e-6, "rstd");
        // eps counts: a row of zeros has rstd 1/sqrt(eps) and a zero output.
        let (zeros, mut out, mut rstd) = (vec![0.0; C], vec![f32::NAN; C], vec![f32::NAN; 1]);
        forward(&mut out, &mut rstd, &zeros, &weight, 0.25);
        assert_eq!((rstd[0], out.iter().all(|&o| o == 0.0)), (2.0, true));
    }

    #[test]
    fn backward_matches_finite_differences_and_accumulates() {
        let (inp, weight) = inputs();
        let w = random(4, N * C, 1.0);
        let (mut out, mut rstd) = (vec![0.0; N * C], vec![0.0; N]);
        forward(&mut out, &mut rstd, &inp, &weight, EPS);
        let (inp64, weight64) = (to_f64(&inp), to_f64(&weight));
        let fd_inp = finite_diff(&inp, |x| weighted_sum(&reference(x, &weight64).0, &w));
        let fd_weight = finite_diff(&weight, |x| weighted_sum(&reference(&inp64, x).0, &w));

        let mut dinp = vec![f32::NAN; N * C]; // overwritten, whatever it held
        let mut dweight = vec![0.0; C];
        let mut partials = vec![f32::NAN; partials_len(N, C)];
        let saved = Saved { inp: &inp, weight: &weight, rstd: &rstd };
        backward(&mut dinp, &mut dweight, &w, saved, &mut partials);
        // Tolerance: 1e-5 of the largest gradient (f32 rounding of the 37-term row reduction
        // and of the 71-row column sums).
        assert_close(&dinp, &fd_inp, 1e-5, "dinp");
        assert_close(&dweight, &fd_weight, 1e-5, "dweight");

        let once = dweight.clone();
        backward(&mut dinp, &mut dweight, &w, saved, &mut partials);
        // The whole step's sum is added once, so twice is exactly double.
        assert!(dweight.iter().zip(&once).all(|(&a, &b)| a == 2.0 * b), "a second call must add again");
    }

    /// qkv of 35 tokens (a full chunk of ROWS and a partial one) with 4 query heads and 2
    /// key/value heads of 6, and the rows of its query heads and key heads gathered.
    fn qkv_and_its_heads() -> (Vec<f32>, Heads, [Vec<f32>; 2]) {
        let h = Heads { nh: 4, kv: 2, hs: 6 };
        let qkv = random(7, 35 * h.width(), 2.0);
        let gather = |first: usize, heads: usize| -> Vec<f32> {
            qkv.chunks(h.width()).flat_map(|token| token[first * h.hs..][..heads * h.hs].to_vec()).collect()
        };
        let heads = [gather(0, h.nh), gather(h.nh, h.kv)];
        (qkv, h, heads)
    }

    #[test]
    fn each_head_normalises_as_a_row_and_the_values_stay() {
        let (mut qkv, h, [q, k]) = qkv_and_its_heads();
        let before = qkv.clone();
        let weights = [random(8, h.hs, 1.5), random(9, h.hs, 1.5)];
        let mut rstd = vec![f32::NAN; 35 * h.rows()];
        heads_forward(&mut qkv, &mut rstd, [&weights[0], &weights[1]], h, EPS);
        // The same bits as `forward` over the gathered rows, each group with its weight.
        for (rows, weight, first, heads) in [(&q, &weights[0], 0, h.nh), (&k, &weights[1], h.nh, h.kv)] {
            let (mut want, mut want_rstd) = (vec![0.0; rows.len()], vec![0.0; rows.len() / h.hs]);
            forward(&mut want, &mut want_rstd, rows, weight, EPS);
            for (n, token) in qkv.chunks(h.width()).enumerate() {
                assert_eq!(token[first * h.hs..][..heads * h.hs], want[n * heads * h.hs..][..heads * h.hs]);
                assert_eq!(rstd[n * h.rows() + first..][..heads], want_rstd[n * heads..][..heads]);
            }
        }
        let values = |qkv: &[f32]| -> Vec<f32> {
            qkv.chunks(h.width()).flat_map(|token| token[h.rows() * h.hs..].to_vec()).collect()
        };
        assert_eq!(values(&qkv), values(&before), "the value heads are untouched");
    }

    #[test]
    fn each_head_backward_is_a_rows_and_the_weights_sum_every_head() {
        let (inp, h, heads) = qkv_and_its_heads();
        let weights = [random(8, h.hs, 1.5), random(9, h.hs, 1.5)];
        let (mut out, mut rstd) = (inp.clone(), vec![0.0; 35 * h.rows()]);
        heads_forward(&mut out, &mut rstd, [&weights[0], &weights[1]], h, EPS);
        let dout = random(10, inp.len(), 1.0);
        let mut dqkv = dout.clone();
        let mut dweights = [vec![0.0; h.hs], vec![0.0; h.hs]];
        let mut partials = vec![f32::NAN; heads_partials_len(35, h)];
        let [dq, dk] = &mut dweights;
        let weight_refs = [&weights[0][..], &weights[1][..]];
        heads_backward(&mut dqkv, [dq, dk], &inp, weight_refs, &rstd, h, &mut partials);
        let groups = [(0, h.nh), (h.nh, h.kv)];
        for ((rows, weight), (dweight, (first, count))) in
            heads.iter().zip(&weights).zip(dweights.iter().zip(groups))
        {
            let gathered = |t: &[f32]| -> Vec<f32> {
                t.chunks(h.width()).flat_map(|token| token[first * h.hs..][..count * h.hs].to_vec()).collect()
            };
            let row_rstd: Vec<f32> =
                rstd.chunks(h.rows()).flat_map(|token| token[first..][..count].to_vec()).collect();
            let (mut want, mut want_dweight) = (vec![0.0; rows.len()], vec![0.0; h.hs]);
            let mut scratch = vec![0.0; partials_len(rows.len() / h.hs, h.hs)];
            let saved = Saved { inp: rows, weight, rstd: &row_rstd };
            backward(&mut want, &mut want_dweight, &gathered(&dout), saved, &mut scratch);
            assert_eq!(gathered(&dqkv), want, "each head's input gradient is a row's, bit for bit");
            // The weight's column sums run over tokens, not rows, in chunks: the same sum
            // in another order, within a few f32 roundings of 140 or 70 terms.
            let want: Vec<f64> = to_f64(&want_dweight);
            assert_close(dweight, &want, 1e-6, "dweight");
        }
        let values = |qkv: &[f32]| -> Vec<f32> {
            qkv.chunks(h.width()).flat_map(|token| token[h.rows() * h.hs..].to_vec()).collect()
        };
        assert_eq!(values(&dqkv), values(&dout), "the value heads' gradients are untouched");
    }
}
