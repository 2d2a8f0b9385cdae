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
            let s = 1.0 / (lane_sum3(x, x, x, |x, _, _| x * x) / c as f32 + eps).sqrt();
            for ((o, &x), &w) in out.iter_mut().zip(x).zip(weight) {
                *o = w * (x * s);
            }
            *rstd = s;
        },
    );
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
}
