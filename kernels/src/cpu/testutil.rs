//! Test helpers: reproducible random inputs, finite differences in f64, and a norm-relative
//! comparison.

use crate::splitmix::SplitMix64;

/// `n` values uniform in [-scale, scale) from a SplitMix64 stream seeded by `seed`.
pub fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    SplitMix64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03).uniform(n, scale)
}

pub fn to_f64(xs: &[f32]) -> Vec<f64> {
    xs.iter().map(|&x| x as f64).collect()
}

/// The gradient of `loss` at `x` by central differences with step 1e-5, all in f64: its
/// error (~1e-10 relative) is far below the f32 kernels' rounding, so it is a reference.
pub fn finite_diff(x: &[f32], loss: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    finite_diff_at(x, 0..x.len(), loss)
}

/// `finite_diff` for the components `indices` only, where every component is too slow.
pub fn finite_diff_at(
    x: &[f32],
    indices: impl Iterator<Item = usize>,
    loss: impl Fn(&[f64]) -> f64,
) -> Vec<f64> {
    const H: f64 = 1e-5;
    let mut at = to_f64(x);
    indices
        .map(|i| {
            let orig = at[i];
            at[i] = orig + H;
            let up = loss(&at);
            at[i] = orig - H;
            let down = loss(&at);
            at[i] = orig;
            (up - down) / (2.0 * H)
        })
        .collect()
}

/// sum(out * w), the scalar loss whose gradient with respect to `out` is `w`.
pub fn weighted_sum(out: &[f64], w: &[f32]) -> f64 {
    assert_eq!(out.len(), w.len());
    out.iter().zip(w).map(|(&o, &w)| o * w as f64).sum()
}

/// Asserts max |got - want| <= rtol * max |want| (a norm-relative tolerance: elementwise
/// relative errors are meaningless for entries that cancel to nearly zero).
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f64], rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{what}: the reference is all zeros, the check would be vacuous");
    let (worst, at) = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (&g, &w))| ((g as f64 - w).abs(), i))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    assert!(
        worst <= rtol * scale,
        "{what}: |got - want| = {worst:e} at {at} (got {}, want {}), tolerance {rtol:e} x {scale:e}",
        got[at],
        want[at]
    );
}
