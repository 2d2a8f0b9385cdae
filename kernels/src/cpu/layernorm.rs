//! LayerNorm over the channel axis.

use super::math::{dot, lane_sum3, sum, sum_chunks_in_order};
use rayon::prelude::*;

/// Rows per parallel task. In backward it is also the fixed chunk whose dweight/dbias
/// partial sums are added in order, so it must not depend on the thread count.
const ROWS: usize = 32;

/// out [N,C], mean [N], rstd [N] = 1 / sqrt(var + eps) from inp [N,C], weight [C], bias [C]
pub fn forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    bias: &[f32],
    eps: f32,
) {
    let c = weight.len();
    out.par_chunks_mut(c)
        .with_min_len(ROWS)
        .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
        .zip(inp.par_chunks(c))
        .for_each(|((out, (mean, rstd)), x)| {
            let m = sum(x) / c as f32;
            let var = lane_sum3(x, x, x, |x, _, _| (x - m) * (x - m)) / c as f32;
            let s = 1.0 / (var + eps).sqrt();
            for (((o, &x), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(bias) {
                *o = (x - m) * s * w + b;
            }
            *mean = m;
            *rstd = s;
        });
}

/// What forward saved: inp [N,C], weight [C], mean [N], rstd [N].
#[derive(Clone, Copy)]
pub struct Saved<'a> {
    pub inp: &'a [f32],
    pub weight: &'a [f32],
    pub mean: &'a [f32],
    pub rstd: &'a [f32],
}

/// Scratch `backward` needs: a dweight and a dbias partial per chunk of ROWS rows.
pub fn partials_len(n: usize, c: usize) -> usize {
    n.div_ceil(ROWS) * 2 * c
}

/// dinp [N,C] = (overwrite); dweight [C] +=; dbias [C] += , from dout [N,C].
/// `partials` [N/ROWS, 2, C] is scratch of `partials_len`.
pub fn backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    saved: Saved,
    partials: &mut [f32],
) {
    let c = saved.weight.len();
    if dinp.is_empty() {
        return;
    }
    partials.par_chunks_mut(2 * c).zip(dinp.par_chunks_mut(ROWS * c)).enumerate().for_each(
        |(chunk, (partial, dinp))| {
            partial.fill(0.0);
            let (pw, pb) = partial.split_at_mut(c);
            let row0 = chunk * ROWS;
            for (r, dinp) in dinp.chunks_exact_mut(c).enumerate() {
                let n = row0 + r;
                let (x, dout) = (&saved.inp[n * c..][..c], &dout[n * c..][..c]);
                let (m, s, w) = (saved.mean[n], saved.rstd[n], saved.weight);
                // dnorm = dout * w, norm = (x - mean) * rstd; the two means of the formula
                // dinp = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
                let dnorm_mean = dot(dout, w) / c as f32;
                let dnorm_norm_mean = lane_sum3(dout, w, x, |d, w, x| d * w * ((x - m) * s)) / c as f32;
                let grads = dinp.iter_mut().zip(pw.iter_mut()).zip(pb.iter_mut());
                for (((di, pw), pb), ((&x, &d), &w)) in grads.zip(x.iter().zip(dout).zip(w)) {
                    let norm = (x - m) * s;
                    *di = (d * w - dnorm_mean - norm * dnorm_norm_mean) * s;
                    *pw += d * norm;
                    *pb += d;
                }
            }
        },
    );
    // One += per parameter, of the chunk sums added in chunk order.
    let total = sum_chunks_in_order(partials, 2 * c);
    for ((dw, db), (&tw, &tb)) in dweight.iter_mut().zip(dbias.iter_mut()).zip(total.iter().zip(&total[c..]))
    {
        *dw += tw;
        *db += tb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};

    const N: usize = 70; // two full chunks of ROWS and a partial one
    const C: usize = 24;
    const EPS: f32 = 1e-5; // GPT-2's

    /// (out, mean, rstd) in f64.
    fn reference(inp: &[f64], weight: &[f64], bias: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut out = vec![0.0; N * C];
        let (mut means, mut rstds) = (vec![0.0; N], vec![0.0; N]);
        for n in 0..N {
            let x = &inp[n * C..][..C];
            let mean = x.iter().sum::<f64>() / C as f64;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / C as f64;
            let rstd = 1.0 / (var + EPS as f64).sqrt();
            for i in 0..C {
                out[n * C + i] = (x[i] - mean) * rstd * weight[i] + bias[i];
            }
            (means[n], rstds[n]) = (mean, rstd);
        }
        (out, means, rstds)
    }

    fn inputs() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut inp = random(1, N * C, 2.0);
        inp.iter_mut().enumerate().for_each(|(i, x)| *x += (i / C) as f32 * 0.1); // row offsets
        (inp, random(2, C, 1.5), random(3, C, 0.5))
    }

    #[test]
    fn forward_matches_f64_reference() {
        let (inp, weight, bias) = inputs();
        let (mut out, mut mean, mut rstd) = (vec![0.0; N * C], vec![0.0; N], vec![0.0; N]);
        forward(&mut out, &mut mean, &mut rstd, &inp, &weight, &bias, EPS);
        let (want, want_mean, want_rstd) = reference(&to_f64(&inp), &to_f64(&weight), &to_f64(&bias));
        // Tolerance: 1e-6 of the largest value, a few f32 roundings of a 24-term sum.
        assert_close(&out, &want, 1e-6, "out");
        assert_close(&mean, &want_mean, 1e-6, "mean");
        assert_close(&rstd, &want_rstd, 1e-6, "rstd");
    }

    #[test]
    fn backward_matches_finite_differences_and_accumulates() {
        let (inp, weight, bias) = inputs();
        let w = random(4, N * C, 1.0);
        let (mut out, mut mean, mut rstd) = (vec![0.0; N * C], vec![0.0; N], vec![0.0; N]);
        forward(&mut out, &mut mean, &mut rstd, &inp, &weight, &bias, EPS);
        let (inp64, weight64, bias64) = (to_f64(&inp), to_f64(&weight), to_f64(&bias));
        let loss = |i: &[f64], wt: &[f64], b: &[f64]| weighted_sum(&reference(i, wt, b).0, &w);
        let fd_inp = finite_diff(&inp, |x| loss(x, &weight64, &bias64));
        let fd_weight = finite_diff(&weight, |x| loss(&inp64, x, &bias64));
        let fd_bias = finite_diff(&bias, |x| loss(&inp64, &weight64, x));

        let mut dinp = vec![f32::NAN; N * C]; // overwritten, whatever it held
        let (mut dweight, mut dbias) = (vec![0.0; C], vec![0.0; C]);
        let mut partials = vec![0.0; partials_len(N, C)];
        let saved = Saved { inp: &inp, weight: &weight, mean: &mean, rstd: &rstd };
        backward(&mut dinp, &mut dweight, &mut dbias, &w, saved, &mut partials);
        // Tolerance: 1e-4 of the largest gradient (f32 rounding of the row reductions).
        assert_close(&dinp, &fd_inp, 1e-4, "dinp");
        assert_close(&dweight, &fd_weight, 1e-4, "dweight");
        assert_close(&dbias, &fd_bias, 1e-4, "dbias");

        let (once_w, once_b) = (dweight.clone(), dbias.clone());
        backward(&mut dinp, &mut dweight, &mut dbias, &w, saved, &mut partials);
        // The whole step's sum is added once, so twice is exactly double.
        assert!(dweight.iter().zip(&once_w).all(|(&a, &b)| a == 2.0 * b));
        assert!(dbias.iter().zip(&once_b).all(|(&a, &b)| a == 2.0 * b));
    }
}
