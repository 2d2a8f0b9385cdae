//! Vectorisable f32 building blocks shared by the kernels.
//!
//! Rust never reassociates float arithmetic, so a plain `sum()` is one serial chain of adds
//! (latency bound, no SIMD). These reductions keep [`LANES`] independent partial sums and add
//! them in a fixed order: the compiler can use SIMD, and the rounding is a function of the
//! length alone, never of the thread count. `exp` is a polynomial the compiler can inline and
//! vectorise, where the libm call cannot be.

/// The mean of `xs` added in f64 in order (a microbatch's loss from its per-token losses).
pub fn mean_in_order(xs: &[f32]) -> f64 {
    xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64
}

/// Independent partial sums per reduction.
pub const LANES: usize = 16;

/// Sum over i of `f(a[i], b[i], c[i])` (i < a.len()): lane `l` adds the terms
/// i ≡ l (mod LANES) of the full blocks in order, then the lanes are added in order, then the
/// tail. Inputs that `f` ignores cost nothing: their loads are optimised away.
#[inline(always)]
pub fn lane_sum3(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let (b, c) = (&b[..a.len()], &c[..a.len()]);
    let mut acc = [0.0f32; LANES];
    let (mut ac, mut bc, mut cc) = (a.chunks_exact(LANES), b.chunks_exact(LANES), c.chunks_exact(LANES));
    for ((a, b), c) in (&mut ac).zip(&mut bc).zip(&mut cc) {
        for (acc, ((&x, &y), &z)) in acc.iter_mut().zip(a.iter().zip(b).zip(c)) {
            *acc += f(x, y, z);
        }
    }
    let mut total = 0.0;
    for a in acc {
        total += a;
    }
    for ((&x, &y), &z) in ac.remainder().iter().zip(bc.remainder()).zip(cc.remainder()) {
        total += f(x, y, z);
    }
    total
}

pub fn sum(xs: &[f32]) -> f32 {
    lane_sum3(xs, xs, xs, |x, _, _| x)
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    lane_sum3(a, b, a, |x, y, _| x * y)
}

/// Adds the per-chunk partial sums `partials` [chunks, width] in chunk order into the first
/// chunk's, which it returns: the fixed order that keeps a parameter gradient's column sums
/// independent of the thread count.
pub fn sum_chunks_in_order(partials: &mut [f32], width: usize) -> &[f32] {
    let (total, rest) = partials.split_at_mut(width);
    for partial in rest.chunks_exact(width) {
        for (t, &p) in total.iter_mut().zip(partial) {
            *t += p;
        }
    }
    total
}

/// The largest element (-inf for an empty slice). Exact, so the lane order is irrelevant.
pub fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = if x > *a { x } else { *a };
        }
    }
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    acc.iter().fold(tail, |m, &x| m.max(x))
}

/// e^x with a relative error of a few ulp (Cephes' expf polynomial, range reduction by
/// ln 2). Inputs are clamped to [-87.3, 88]: below, it returns e^-87.3 ≈ 1e-38 instead of a
/// smaller number, which is harmless where it is used (softmax terms beside the max term's 1,
/// and the sigmoid in GELU).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to the nearest integer, which then sits in the low mantissa
    // bits: no float-to-int conversion, so the loop stays vectorisable.
    const ROUND: f32 = 12_582_912.0;
    let x = if x < -87.3 { -87.3 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    e_r * f32::from_bits(((n_int + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_three_ulp_over_the_softmax_range() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let exact = (x as f64).exp();
            worst = worst.max(((exp(x) as f64 - exact) / exact).abs());
        }
        assert!(worst < 3.0 * f32::EPSILON as f64, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 2e-38 && exp(-1000.0) >= 0.0);
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn reductions_match_f64_sums() {
        let xs: Vec<f32> = (0..1003).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let ys: Vec<f32> = (0..1003).map(|i| ((i * 53 % 97) as f32 - 48.0) / 5.0).collect();
        let s: f64 = xs.iter().map(|&x| x as f64).sum();
        let d: f64 = xs.iter().zip(&ys).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((sum(&xs) as f64 - s).abs() < 1e-5 * xs.len() as f64, "{} vs {s}", sum(&xs));
        assert!((dot(&xs, &ys) as f64 - d).abs() < 1e-3, "{} vs {d}", dot(&xs, &ys));
        assert_eq!(max(&xs), xs.iter().cloned().fold(f32::MIN, f32::max));
        assert_eq!(max(&xs[..5]), xs[..5].iter().cloned().fold(f32::MIN, f32::max));
        assert_eq!(sum(&[]), 0.0);
    }
}
