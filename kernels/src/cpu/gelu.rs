//! GPT-2's tanh GELU, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed
//! as the equal x * sigmoid(2u): one vectorisable exp and one division per element instead
//! of a libm tanh call.

use super::elementwise::{map, zip_map};
use super::math::exp;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const CUBIC: f32 = 0.044_715;

/// sigmoid(2u(x)).
#[inline(always)]
fn sigmoid_2u(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + CUBIC * x * x * x);
    1.0 / (1.0 + exp(-2.0 * u))
}

/// gelu(x) = x * sigmoid(2u(x)).
#[inline(always)]
pub(super) fn value(x: f32) -> f32 {
    x * sigmoid_2u(x)
}

/// gelu'(x) = s + x s (1 - s) 2 u'(x), with s = sigmoid(2u(x)).
#[inline(always)]
pub(super) fn slope(x: f32) -> f32 {
    let s = sigmoid_2u(x);
    let du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * x * x);
    s + x * s * (1.0 - s) * 2.0 * du_dx
}

/// out [n] = gelu(inp [n])
pub fn forward(out: &mut [f32], inp: &[f32]) {
    map(out, inp, value);
}

/// dinp [n] = gelu'(inp [n]) * dout [n] (overwrite)
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    zip_map(dinp, inp, dout, |x, d| slope(x) * d);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};
    use crate::cpu::CHUNK;

    /// The defining tanh formula, in f64.
    fn reference(x: &[f64]) -> Vec<f64> {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        x.iter().map(|&x| 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())).collect()
    }

    #[test]
    fn forward_matches_the_tanh_formula() {
        // Wide enough to reach both saturated tails.
        let inp = random(1, 3 * CHUNK + 3, 12.0);
        let mut out = vec![0.0; inp.len()];
        forward(&mut out, &inp);
        // Tolerance: 1e-6 of the largest output (~12), a few ulp of the sigmoid.
        assert_close(&out, &reference(&to_f64(&inp)), 1e-6, "gelu");
        // Elementwise near zero, where the output is tiny, the error must be relatively small too.
        let small = random(2, 1000, 0.1);
        let mut out = vec![0.0; small.len()];
        forward(&mut out, &small);
        for (o, w) in out.iter().zip(reference(&to_f64(&small))) {
            assert!((*o as f64 - w).abs() <= 1e-6 * w.abs(), "{o} vs {w}");
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let inp = random(3, 500, 5.0);
        let dout = random(4, 500, 1.0);
        let fd = finite_diff(&inp, |x| weighted_sum(&reference(x), &dout));
        let mut dinp = vec![f32::NAN; inp.len()];
        backward(&mut dinp, &inp, &dout);
        // Tolerance: 1e-5 of the largest gradient.
        assert_close(&dinp, &fd, 1e-5, "dgelu");
    }
}
