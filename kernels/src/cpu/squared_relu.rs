//! Squared ReLU, relu(x)^2 (Megatron's `squared_relu`, Nemotron's `relu2`, So et al.'s
//! Primer): the MLP activation of NVIDIA's Nemotron models. A NaN input passes through as
//! torch's relu passes it, so that a diverging run's NaN check still sees it.

use super::elementwise::{map, zip_map};

/// relu(x): x where it is not below 0 (a NaN included), else 0.
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// out [n] = relu(inp [n])^2
pub fn forward(out: &mut [f32], inp: &[f32]) {
    map(out, inp, |x| relu(x) * relu(x));
}

/// dinp [n] = 2 relu(inp [n]) * dout [n] (overwrite); 2 relu(x) is exact, so each element
/// is one rounding.
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    zip_map(dinp, inp, dout, |x, d| 2.0 * relu(x) * d);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, weighted_sum};
    use crate::cpu::CHUNK;

    #[test]
    fn forward_squares_the_positive_part_exactly() {
        let inp = [-3.0, -0.0, 0.0, 0.5, 3.0, 1.5e-20, f32::NAN];
        let mut out = [f32::NAN; 7];
        forward(&mut out, &inp);
        assert_eq!(out[..6], [0.0, 0.0, 0.0, 0.25, 9.0, 1.5e-20 * 1.5e-20]);
        assert!(out[6].is_nan(), "a NaN input must reach the loss");
        let wide = random(1, 3 * CHUNK + 3, 8.0);
        let mut out = vec![0.0; wide.len()];
        forward(&mut out, &wide);
        for (o, &x) in out.iter().zip(&wide) {
            assert_eq!(*o, if x > 0.0 { x * x } else { 0.0 }, "relu2({x})");
        }
    }

    #[test]
    fn backward_matches_finite_differences_and_is_one_rounding() {
        let (inp, dout) = (random(3, 500, 5.0), random(4, 500, 1.0));
        let reference = |x: &[f64]| x.iter().map(|&x| x.max(0.0).powi(2)).collect::<Vec<_>>();
        let fd = finite_diff(&inp, |x| weighted_sum(&reference(x), &dout));
        let mut dinp = vec![f32::NAN; inp.len()];
        backward(&mut dinp, &inp, &dout);
        // Tolerance: 1e-5 of the largest gradient (central differences of a kinked function
        // are exact away from 0, which no random input here comes near).
        assert_close(&dinp, &fd, 1e-5, "drelu2");
        for ((g, &x), &d) in dinp.iter().zip(&inp).zip(&dout) {
            let want = if x > 0.0 { ((2.0 * x as f64) * d as f64) as f32 } else { 0.0 };
            assert_eq!(*g, want, "x {x}, dout {d}");
        }
    }
}
