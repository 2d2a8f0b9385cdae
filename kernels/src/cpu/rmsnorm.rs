//! RMSNorm over the channel axis, as Hugging Face's LlamaRMSNorm computes it in f32:
//! rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd).

use super::math::{lane_sum3, sum_chunks_in_order};
use crate::qk_norm::QkNormRows;
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
    rstd_from(sum_squares(x), x.len(), eps)
}

/// The sum of x^2 over one row.
fn sum_squares(x: &[f32]) -> f32 {
    lane_sum3(x, x, x, |x, _, _| x * x)
}

/// The sum of dnorm * norm over one row (dnorm = dout * w, norm = x * rstd), whose mean
/// rstd's dependence on x brings into the input gradient.
fn dnorm_norm_sum(dout: &[f32], w: &[f32], x: &[f32], rstd: f32) -> f32 {
    lane_sum3(dout, w, x, |d, w, x| d * w * (x * rstd))
}

/// 1 / sqrt(mean(x^2) + eps) of a row of `width` whose squares sum to `sum`.
fn rstd_from(sum: f32, width: usize, eps: f32) -> f32 {
    1.0 / (sum / width as f32 + eps).sqrt()
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
                let dnorm_norm_mean = dnorm_norm_sum(dout, w, x, s) / c as f32;
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

/// QK-norm, in place: each row `r` names in each token of qkv [N, token width] (a query or
/// key head, or a whole projection) becomes q_weight * (q * rstd) or k_weight * (k * rstd),
/// every row its own row of [`forward`]'s arithmetic; rstd [N, rows a token], the query rows'
/// and then the key rows' of each token.
pub fn heads_forward(qkv: &mut [f32], rstd: &mut [f32], weights: [&[f32]; 2], r: QkNormRows, eps: f32) {
    normalize_rows(qkv, rstd, weights, r, |x, _| rstd_of(x, eps));
}

/// Each row's sum of squares, sums [N, rows a token]: the first half of QK-norm over rows
/// cut across `parts` tensor ranks, which the group sums.
pub fn heads_sum_squares(qkv: &[f32], sums: &mut [f32], r: QkNormRows) {
    if qkv.is_empty() {
        return;
    }
    qkv.par_chunks(r.token_width()).with_min_len(ROWS).zip(sums.par_chunks_mut(r.rows())).for_each(
        |(token, sums)| {
            for (row, sum) in sums.iter_mut().enumerate() {
                let (at, width, _) = r.row(row);
                *sum = sum_squares(&token[at..][..width]);
            }
        },
    );
}

/// The second half: [`heads_forward`] with each row's statistic from `stats`, the sum of
/// squares of the whole row (every part's, summed over the group), which becomes its rstd
/// in place. A row here is 1/`parts` of the whole.
pub fn heads_forward_summed(
    qkv: &mut [f32],
    stats: &mut [f32],
    weights: [&[f32]; 2],
    r: QkNormRows,
    parts: usize,
    eps: f32,
) {
    normalize_rows(qkv, stats, weights, r, |x, sum| rstd_from(sum, x.len() * parts, eps));
}

/// Each row x of qkv becomes weight * (x * s), s = rstd(x, its entry of `stats`), which
/// then holds s.
fn normalize_rows(
    qkv: &mut [f32],
    stats: &mut [f32],
    weights: [&[f32]; 2],
    r: QkNormRows,
    rstd: impl Fn(&[f32], f32) -> f32 + Sync,
) {
    if qkv.is_empty() {
        return;
    }
    qkv.par_chunks_mut(r.token_width()).with_min_len(ROWS).zip(stats.par_chunks_mut(r.rows())).for_each(
        |(token, stats)| {
            for (row, stat) in stats.iter_mut().enumerate() {
                let (at, width, weight) = r.row(row);
                let x = &mut token[at..][..width];
                let s = rstd(x, *stat);
                for (x, &w) in x.iter_mut().zip(weights[weight]) {
                    *x = w * (*x * s);
                }
                *stat = s;
            }
        },
    );
}

/// Scratch `heads_backward` needs: the two weights' partials per chunk of ROWS tokens.
pub fn heads_partials_len(n: usize, r: QkNormRows) -> usize {
    n.div_ceil(ROWS) * (r.q_width + r.k_width)
}

/// What QK-norm's backward reads: its input `inp` [N, token width], the weights [q, k] and
/// the rstd [N, rows a token] forward wrote.
#[derive(Clone, Copy)]
pub struct HeadsSaved<'a> {
    pub inp: &'a [f32],
    pub weights: [&'a [f32]; 2],
    pub rstd: &'a [f32],
}

/// QK-norm's backward, in place: dqkv's query and key rows (the gradient of
/// [`heads_forward`]'s output) become the gradient of its input, each as [`backward`]
/// computes a row, the value heads untouched; dweights [q, k] (as wide as the rows) += .
/// `partials` is scratch of `heads_partials_len`.
pub fn heads_backward(
    dqkv: &mut [f32],
    dweights: [&mut [f32]; 2],
    saved: HeadsSaved,
    r: QkNormRows,
    partials: &mut [f32],
) {
    backward_rows(dqkv, dweights, saved, r, partials, |_, d, w, x, s| {
        dnorm_norm_sum(d, w, x, s) / d.len() as f32
    });
}

/// Each row's sum of dnorm * norm, dots [N, rows a token], from dqkv before the backward
/// overwrites it: the first half of the backward over rows cut across tensor ranks, which
/// the group sums.
pub fn heads_backward_dots(dqkv: &[f32], saved: HeadsSaved, r: QkNormRows, dots: &mut [f32]) {
    if dqkv.is_empty() {
        return;
    }
    let width = r.token_width();
    let tokens = dqkv.par_chunks(width).zip(saved.inp.par_chunks(width)).zip(saved.rstd.par_chunks(r.rows()));
    tokens.with_min_len(ROWS).zip(dots.par_chunks_mut(r.rows())).for_each(|(((d, x), rstd), dots)| {
        for (row, (dot, &s)) in dots.iter_mut().zip(rstd).enumerate() {
            let (at, c, weight) = r.row(row);
            let (d, x) = (&d[at..][..c], &x[at..][..c]);
            *dot = dnorm_norm_sum(d, saved.weights[weight], x, s);
        }
    });
}

/// The second half: [`heads_backward`] with each row's mean of dnorm * norm from `dots`,
/// the whole row's sum (every part's, summed over the group); a row here is 1/`parts` of
/// the whole.
pub fn heads_backward_summed(
    dqkv: &mut [f32],
    dweights: [&mut [f32]; 2],
    saved: HeadsSaved,
    (dots, parts): (&[f32], usize),
    r: QkNormRows,
    partials: &mut [f32],
) {
    backward_rows(dqkv, dweights, saved, r, partials, |i, d, _, _, _| dots[i] / (d.len() * parts) as f32);
}

/// The backward of each row, its mean of dnorm * norm from `mean` (of the row's index in
/// rstd, and its d, w, x and s).
fn backward_rows(
    dqkv: &mut [f32],
    dweights: [&mut [f32]; 2],
    saved: HeadsSaved,
    r: QkNormRows,
    partials: &mut [f32],
    mean: impl Fn(usize, &[f32], &[f32], &[f32], f32) -> f32 + Sync,
) {
    let (width, sums) = (r.token_width(), r.q_width + r.k_width);
    if dqkv.is_empty() {
        return;
    }
    partials.par_chunks_mut(sums).zip(dqkv.par_chunks_mut(ROWS * width)).enumerate().for_each(
        |(chunk, (pw, dqkv))| {
            pw.fill(0.0);
            for (t, token) in dqkv.chunks_exact_mut(width).enumerate() {
                let n = chunk * ROWS + t;
                for row in 0..r.rows() {
                    let (at, c, weight) = r.row(row);
                    let (d, x) = (&mut token[at..][..c], &saved.inp[n * width + at..][..c]);
                    let i = n * r.rows() + row;
                    let (s, w) = (saved.rstd[i], saved.weights[weight]);
                    let pw = &mut pw[[0, r.q_width][weight]..][..c];
                    // As `backward`: dinp = (dnorm - norm * mean(dnorm * norm)) * rstd.
                    let dnorm_norm_mean = mean(i, d, w, x, s);
                    for ((d, pw), (&x, &w)) in d.iter_mut().zip(pw).zip(x.iter().zip(w)) {
                        let norm = x * s;
                        *pw += *d * norm;
                        *d = (*d * w - norm * dnorm_norm_mean) * s;
                    }
                }
            }
        },
    );
    let (q_totals, k_totals) = sum_chunks_in_order(partials, sums).split_at(r.q_width);
    for (dweight, totals) in dweights.into_iter().zip([q_totals, k_totals]) {
        for (dw, &total) in dweight.iter_mut().zip(totals) {
            *dw += total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};
    use crate::qk_norm::QkNormSpan;

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
    /// key/value heads of 6, QK-norm's rows over `span`, and the gathered rows of each
    /// weight: [q, k].
    fn qkv_and_its_rows(span: QkNormSpan) -> (Vec<f32>, QkNormRows, [Vec<f32>; 2]) {
        let r = span.rows(4, 2, 6);
        let qkv = random(7, 35 * r.token_width(), 2.0);
        (qkv.clone(), r, [0, 1].map(|weight| gather(&qkv, r, weight)))
    }

    /// The rows of weight `weight` (0 q, 1 k) of each token of qkv, in token and row order.
    fn gather(qkv: &[f32], r: QkNormRows, weight: usize) -> Vec<f32> {
        let rows: Vec<_> = (0..r.rows()).map(|row| r.row(row)).filter(|&(.., w)| w == weight).collect();
        qkv.chunks(r.token_width())
            .flat_map(|token| rows.iter().flat_map(|&(at, c, _)| &token[at..][..c]))
            .copied()
            .collect()
    }

    /// The rstd of weight `weight`'s rows, in token and row order.
    fn gather_rstd(rstd: &[f32], r: QkNormRows, weight: usize) -> Vec<f32> {
        let range = [0..r.q_rows, r.q_rows..r.rows()][weight].clone();
        rstd.chunks(r.rows()).flat_map(|token| &token[range.clone()]).copied().collect()
    }

    /// Each token's value heads.
    fn values(qkv: &[f32], r: QkNormRows) -> Vec<f32> {
        let start = r.q_rows * r.q_width + r.k_rows * r.k_width;
        qkv.chunks(r.token_width()).flat_map(|token| &token[start..]).copied().collect()
    }

    #[test]
    fn each_row_normalises_as_a_row_and_the_values_stay() {
        for span in QkNormSpan::ALL {
            let (mut qkv, r, rows) = qkv_and_its_rows(span);
            let before = qkv.clone();
            let weights = r.weight_widths().map(|c| random(8 + c as u64, c, 1.5));
            let mut rstd = vec![f32::NAN; 35 * r.rows()];
            heads_forward(&mut qkv, &mut rstd, [&weights[0], &weights[1]], r, EPS);
            // The same bits as `forward` over the gathered rows, each weight's rows with it.
            for (weight, (rows, w)) in rows.iter().zip(&weights).enumerate() {
                let (mut want, mut want_rstd) = (vec![0.0; rows.len()], vec![0.0; rows.len() / w.len()]);
                forward(&mut want, &mut want_rstd, rows, w, EPS);
                assert_eq!(gather(&qkv, r, weight), want, "{span:?} weight {weight}");
                assert_eq!(gather_rstd(&rstd, r, weight), want_rstd, "{span:?} weight {weight}");
            }
            assert_eq!(values(&qkv, r), values(&before, r), "{span:?}: the value heads are untouched");
        }
    }

    #[test]
    fn each_row_backward_is_a_rows_and_the_weights_sum_every_row() {
        for span in QkNormSpan::ALL {
            let (inp, r, rows) = qkv_and_its_rows(span);
            let weights = r.weight_widths().map(|c| random(8 + c as u64, c, 1.5));
            let (mut out, mut rstd) = (inp.clone(), vec![0.0; 35 * r.rows()]);
            heads_forward(&mut out, &mut rstd, [&weights[0], &weights[1]], r, EPS);
            let dout = random(10, inp.len(), 1.0);
            let mut dqkv = dout.clone();
            let mut dweights = r.weight_widths().map(|c| vec![0.0; c]);
            let mut partials = vec![f32::NAN; heads_partials_len(35, r)];
            let [dq, dk] = &mut dweights;
            let weight_refs = [&weights[0][..], &weights[1][..]];
            let saved = HeadsSaved { inp: &inp, weights: weight_refs, rstd: &rstd };
            heads_backward(&mut dqkv, [dq, dk], saved, r, &mut partials);
            for (weight, ((rows, w), dweight)) in rows.iter().zip(&weights).zip(&dweights).enumerate() {
                let c = w.len();
                let (mut want, mut want_dweight) = (vec![0.0; rows.len()], vec![0.0; c]);
                let mut scratch = vec![0.0; partials_len(rows.len() / c, c)];
                let row_rstd = gather_rstd(&rstd, r, weight);
                let saved = Saved { inp: rows, weight: w, rstd: &row_rstd };
                backward(&mut want, &mut want_dweight, &gather(&dout, r, weight), saved, &mut scratch);
                assert_eq!(
                    gather(&dqkv, r, weight),
                    want,
                    "{span:?}: each row's input gradient, bit for bit"
                );
                // The weight's column sums run over tokens, not rows, in chunks: the same sum
                // in another order, within a few f32 roundings of at most 140 terms.
                assert_close(dweight, &to_f64(&want_dweight), 1e-6, "dweight");
            }
            assert_eq!(
                values(&dqkv, r),
                values(&dout, r),
                "{span:?}: the value heads' gradients are untouched"
            );
        }
    }

    /// The whole-projection norm over a tensor-parallel group, two halves a side: each
    /// rank's sums of squares and dots summed over the ranks, then each rank's rows. At one
    /// part it is the one-pass op's bits; cut in two (8 heads on 4 a token, 2 ranks of 4 on 2,
    /// each rank's q, k and v the token's halves) it is the whole within f32 rounding.
    #[test]
    fn rows_cut_across_ranks_are_the_whole_rows_once_the_group_sums() {
        let (nh, kv, hs, n) = (8, 4, 6, 35);
        let whole = QkNormSpan::Projection.rows(nh, kv, hs);
        let inp = random(11, n * whole.token_width(), 2.0);
        let dout = random(12, inp.len(), 1.0);
        let weights = whole.weight_widths().map(|c| random(13 + c as u64, c, 1.5));
        let weight_refs = [&weights[0][..], &weights[1][..]];
        // The one-pass op over whole rows.
        let (mut out, mut rstd) = (inp.clone(), vec![0.0; n * whole.rows()]);
        heads_forward(&mut out, &mut rstd, weight_refs, whole, EPS);
        let (mut dinp, mut dweights) = (dout.clone(), whole.weight_widths().map(|c| vec![0.0; c]));
        let mut partials = vec![0.0; heads_partials_len(n, whole)];
        let [dq, dk] = &mut dweights;
        let saved = HeadsSaved { inp: &inp, weights: weight_refs, rstd: &rstd };
        heads_backward(&mut dinp, [dq, dk], saved, whole, &mut partials);

        for parts in [1, 2] {
            let r = QkNormSpan::Projection.rows(nh / parts, kv / parts, hs);
            // Rank p's q, k and v of each token, and its slice of each weight.
            let cut = |x: &[f32], p: usize| -> Vec<f32> {
                let sides = [(0, nh * hs), (nh * hs, kv * hs), ((nh + kv) * hs, kv * hs)];
                x.chunks(whole.token_width())
                    .flat_map(|t| {
                        sides.iter().flat_map(move |&(at, w)| &t[at + p * w / parts..][..w / parts])
                    })
                    .copied()
                    .collect()
            };
            let slice = |w: &[f32], p: usize| w[p * w.len() / parts..][..w.len() / parts].to_vec();
            // The group's sum of each rank's statistics, in rank order.
            let group_sum = |each: &[Vec<f32>]| -> Vec<f32> {
                (0..each[0].len()).map(|i| each.iter().fold(0.0, |acc, e| acc + e[i])).collect()
            };
            let xs: Vec<_> = (0..parts).map(|p| cut(&inp, p)).collect();
            let ws: Vec<_> = (0..parts).map(|p| weights.each_ref().map(|w| slice(w, p))).collect();
            let stats = group_sum(
                &xs.iter()
                    .map(|x| {
                        let mut sums = vec![f32::NAN; n * r.rows()];
                        heads_sum_squares(x, &mut sums, r);
                        sums
                    })
                    .collect::<Vec<_>>(),
            );
            let (mut ys, mut ss) = (xs.clone(), vec![stats; parts]);
            for ((y, s), w) in ys.iter_mut().zip(&mut ss).zip(&ws) {
                heads_forward_summed(y, s, [&w[0], &w[1]], r, parts, EPS);
            }
            let saved = |p: usize| HeadsSaved { inp: &xs[p], weights: [&ws[p][0], &ws[p][1]], rstd: &ss[p] };
            let dots = group_sum(
                &(0..parts)
                    .map(|p| {
                        let mut dots = vec![f32::NAN; n * r.rows()];
                        heads_backward_dots(&cut(&dout, p), saved(p), r, &mut dots);
                        dots
                    })
                    .collect::<Vec<_>>(),
            );
            for p in 0..parts {
                let (y, s) = (&ys[p], &ss[p]);
                let mut d = cut(&dout, p);
                let mut dw = ws[p].each_ref().map(|w| vec![0.0; w.len()]);
                let mut partials = vec![f32::NAN; heads_partials_len(n, r)];
                let [dq, dk] = &mut dw;
                heads_backward_summed(&mut d, [dq, dk], saved(p), (&dots, parts), r, &mut partials);
                let what = |t: &str| format!("{t}, rank {p} of {parts}");
                if parts == 1 {
                    assert_eq!((y, s, &d), (&out, &rstd, &dinp), "one part is the one-pass op, bit for bit");
                    assert_eq!(dw, dweights);
                    continue;
                }
                // Tolerance: the sums of squares and dots are summed in another order (two
                // halves, then the halves), a few f32 roundings of 48 or 24 terms.
                assert_close(y, &to_f64(&cut(&out, p)), 1e-6, &what("out"));
                assert_close(&d, &to_f64(&cut(&dinp, p)), 1e-5, &what("dinp"));
                for (dw, whole_dw) in dw.iter().zip(&dweights) {
                    assert_close(dw, &to_f64(&slice(whole_dw, p)), 1e-5, &what("dweight"));
                }
            }
        }
    }
}
