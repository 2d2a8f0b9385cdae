//! The gated linear units (Shazeer, 2020): out = act(a) * b, where a (the gate) and b (the
//! up projection) are the two halves of each row of Megatron's fused linear_fc1 output
//! [N,2F] (its `torch.chunk(x, 2, -1)`). SwiGLU's act is silu(a) = a * sigmoid(a) (Llama's);
//! GeGLU's is GPT-2's tanh GELU (Gemma's `gelu_pytorch_tanh`), computed as gelu.rs computes
//! it. The sigmoids use the vectorisable polynomial exp.

use super::gelu;
use super::math::exp;
use super::rows_per_task;
use crate::Gate;
use rayon::prelude::*;

/// A gate's activation, and with it its slope.
trait Activation {
    fn act(a: f32) -> f32;
    /// (act(a), act'(a)).
    fn act_and_slope(a: f32) -> (f32, f32);
}

struct Silu;

impl Activation for Silu {
    #[inline(always)]
    fn act(a: f32) -> f32 {
        a * sigmoid(a)
    }

    /// silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
    #[inline(always)]
    fn act_and_slope(a: f32) -> (f32, f32) {
        let s = sigmoid(a);
        (a * s, s * (1.0 + a * (1.0 - s)))
    }
}

struct GeluTanh;

impl Activation for GeluTanh {
    #[inline(always)]
    fn act(a: f32) -> f32 {
        gelu::value(a)
    }

    #[inline(always)]
    fn act_and_slope(a: f32) -> (f32, f32) {
        (gelu::value(a), gelu::slope(a))
    }
}

#[inline(always)]
fn sigmoid(a: f32) -> f32 {
    1.0 / (1.0 + exp(-a))
}

/// out [N,F] = act(inp[:, :F]) * inp[:, F:], inp [N,2F]
pub fn forward(out: &mut [f32], inp: &[f32], f: usize, gate: Gate) {
    match gate {
        Gate::Silu => forward_with::<Silu>(out, inp, f),
        Gate::GeluTanh => forward_with::<GeluTanh>(out, inp, f),
    }
}

/// dinp [N,2F] (overwrite) = (dout * b * act'(a), dout * act(a)) from inp [N,2F] and
/// dout [N,F].
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32], f: usize, gate: Gate) {
    match gate {
        Gate::Silu => backward_with::<Silu>(dinp, inp, dout, f),
        Gate::GeluTanh => backward_with::<GeluTanh>(dinp, inp, dout, f),
    }
}

fn forward_with<G: Activation>(out: &mut [f32], inp: &[f32], f: usize) {
    assert_eq!(out.len() * 2, inp.len(), "glu: out [N,F] and inp [N,2F]");
    if out.is_empty() {
        return;
    }
    out.par_chunks_mut(f).with_min_len(rows_per_task(f)).zip(inp.par_chunks(2 * f)).for_each(|(out, row)| {
        let (a, b) = row.split_at(f);
        for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
            *o = G::act(a) * b;
        }
    });
}

fn backward_with<G: Activation>(dinp: &mut [f32], inp: &[f32], dout: &[f32], f: usize) {
    assert!(dinp.len() == inp.len() && dout.len() * 2 == inp.len(), "glu: dinp, inp [N,2F], dout [N,F]");
    if dout.is_empty() {
        return;
    }
    let rows = dinp.par_chunks_mut(2 * f).with_min_len(rows_per_task(2 * f));
    rows.zip(inp.par_chunks(2 * f).zip(dout.par_chunks(f))).for_each(|(dinp, (row, dout))| {
        let (da, db) = dinp.split_at_mut(f);
        let (a, b) = row.split_at(f);
        for (((da, db), (&a, &b)), &d) in da.iter_mut().zip(db).zip(a.iter().zip(b)).zip(dout) {
            let (act, slope) = G::act_and_slope(a);
            *da = d * b * slope;
            *db = d * act;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};
    use crate::cpu::CHUNK;

    /// The gate's defining formula in f64.
    fn act(gate: Gate, a: f64) -> f64 {
        match gate {
            Gate::Silu => a / (1.0 + (-a).exp()),
            Gate::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * a * (1.0 + (k * (a + 0.044715 * a * a * a)).tanh())
            }
        }
    }

    /// out [N,F] from inp [N,2F], in f64.
    fn reference(inp: &[f64], f: usize, gate: Gate) -> Vec<f64> {
        inp.chunks_exact(2 * f).flat_map(|row| (0..f).map(move |j| act(gate, row[j]) * row[f + j])).collect()
    }

    const GATES: [Gate; 2] = [Gate::Silu, Gate::GeluTanh];

    #[test]
    fn forward_matches_the_definition() {
        for gate in GATES {
            // 3 rows per task and several tasks; the gate wide enough to reach both tails.
            let f = CHUNK / 3 + 5;
            let mut inp = random(1, 9 * 2 * f, 12.0);
            for row in inp.chunks_exact_mut(2 * f) {
                // Gates in exp's clamped ranges, both ways.
                (row[0], row[1], row[f + 1]) = (-95.0, 89.0, 1.0);
            }
            let mut out = vec![f32::NAN; 9 * f];
            forward(&mut out, &inp, f, gate);
            // Tolerance: 1e-6 of the largest output (~144), a few ulp of the sigmoid and two
            // products.
            assert_close(&out, &reference(&to_f64(&inp), f, gate), 1e-6, &format!("{gate:?}"));
            // Elementwise, a small gate's output must be relatively accurate too.
            let small = random(2, 2 * 500, 0.1);
            let mut out = vec![0.0; 500];
            forward(&mut out, &small, 500, gate);
            for (o, w) in out.iter().zip(reference(&to_f64(&small), 500, gate)) {
                assert!((*o as f64 - w).abs() <= 1e-6 * w.abs(), "{gate:?}: {o} vs {w}");
            }
        }
    }

    /// GeGLU's gate is gelu.rs's GELU to the bit, as transformers' GeGLU is its GELU.
    #[test]
    fn geglus_gate_is_gelus_bits() {
        let a = random(5, 1000, 8.0);
        let mut ones = a.clone();
        ones.extend(std::iter::repeat_n(1.0, 1000));
        let (mut glu, mut plain) = (vec![0.0; 1000], vec![0.0; 1000]);
        forward(&mut glu, &ones, 1000, Gate::GeluTanh);
        gelu::forward(&mut plain, &a);
        assert!(glu == plain, "GeGLU's gate differs from GELU");
    }

    #[test]
    fn backward_matches_finite_differences() {
        for gate in GATES {
            let f = 37;
            let inp = random(3, 7 * 2 * f, 6.0);
            let dout = random(4, 7 * f, 1.0);
            let fd = finite_diff(&inp, |x| weighted_sum(&reference(x, f, gate), &dout));
            let mut dinp = vec![f32::NAN; inp.len()];
            backward(&mut dinp, &inp, &dout, f, gate);
            // Tolerance: 1e-5 of the largest gradient (a few ulp of the sigmoid, several
            // products).
            assert_close(&dinp, &fd, 1e-5, &format!("d{gate:?}"));
        }
    }
}
