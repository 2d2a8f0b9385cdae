//! SwiGLU, silu(a) * b with silu(a) = a * sigmoid(a), where a (the gate) and b (the up
//! projection) are the two halves of each row of Megatron's fused linear_fc1 output [N,2F]
//! (its `torch.chunk(x, 2, -1)`). The sigmoid uses the vectorisable polynomial exp, as GELU
//! does.

use super::math::exp;
use super::rows_per_task;
use rayon::prelude::*;

#[inline(always)]
fn sigmoid(a: f32) -> f32 {
    1.0 / (1.0 + exp(-a))
}

/// out [N,F] = silu(inp[:, :F]) * inp[:, F:], inp [N,2F]
pub fn forward(out: &mut [f32], inp: &[f32], f: usize) {
    assert_eq!(out.len() * 2, inp.len(), "swiglu: out [N,F] and inp [N,2F]");
    if out.is_empty() {
        return;
    }
    out.par_chunks_mut(f).with_min_len(rows_per_task(f)).zip(inp.par_chunks(2 * f)).for_each(|(out, row)| {
        let (a, b) = row.split_at(f);
        for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
            *o = a * sigmoid(a) * b;
        }
    });
}

/// dinp [N,2F] (overwrite) = (dout * b * silu'(a), dout * silu(a)) from inp [N,2F] and
/// dout [N,F]; silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32], f: usize) {
    assert!(dinp.len() == inp.len() && dout.len() * 2 == inp.len(), "swiglu: dinp, inp [N,2F], dout [N,F]");
    if dout.is_empty() {
        return;
    }
    let rows = dinp.par_chunks_mut(2 * f).with_min_len(rows_per_task(2 * f));
    rows.zip(inp.par_chunks(2 * f).zip(dout.par_chunks(f))).for_each(|(dinp, (row, dout))| {
        let (da, db) = dinp.split_at_mut(f);
        let (a, b) = row.split_at(f);
        for (((da, db), (&a, &b)), &d) in da.iter_mut().zip(db).zip(a.iter().zip(b)).zip(dout) {
            let s = sigmoid(a);
            *da = d * b * (s * (1.0 + a * (1.0 - s)));
            *db = d * (a * s);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};
    use crate::cpu::CHUNK;

    /// The defining formula in f64, out [N,F] from inp [N,2F].
    fn reference(inp: &[f64], f: usize) -> Vec<f64> {
        inp.chunks_exact(2 * f)
            .flat_map(|row| (0..f).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[f + j]))
            .collect()
    }

    #[test]
    fn forward_matches_the_definition() {
        // 3 rows per task and several tasks; the gate wide enough to reach both tails.
        let f = CHUNK / 3 + 5;
        let mut inp = random(1, 9 * 2 * f, 12.0);
        for row in inp.chunks_exact_mut(2 * f) {
            // Gates in exp's clamped ranges, both ways.
            (row[0], row[1], row[f + 1]) = (-95.0, 89.0, 1.0);
        }
        let mut out = vec![f32::NAN; 9 * f];
        forward(&mut out, &inp, f);
        // Tolerance: 1e-6 of the largest output (~144), a few ulp of the sigmoid and two products.
        assert_close(&out, &reference(&to_f64(&inp), f), 1e-6, "swiglu");
        // Elementwise, a small gate's output must be relatively accurate too.
        let small = random(2, 2 * 500, 0.1);
        let mut out = vec![0.0; 500];
        forward(&mut out, &small, 500);
        for (o, w) in out.iter().zip(reference(&to_f64(&small), 500)) {
            assert!((*o as f64 - w).abs() <= 1e-6 * w.abs(), "{o} vs {w}");
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let f = 37;
        let inp = random(3, 7 * 2 * f, 6.0);
        let dout = random(4, 7 * f, 1.0);
        let fd = finite_diff(&inp, |x| weighted_sum(&reference(x, f), &dout));
        let mut dinp = vec![f32::NAN; inp.len()];
        backward(&mut dinp, &inp, &dout, f);
        // Tolerance: 1e-5 of the largest gradient (a few ulp of the sigmoid, several products).
        assert_close(&dinp, &fd, 1e-5, "dswiglu");
    }
}
