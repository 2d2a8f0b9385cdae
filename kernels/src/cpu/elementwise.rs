//! Buffer arithmetic: copy, zero, residual add, a scalar's add and product, gradient
//! accumulation, and the sum of squares behind the global gradient norm.

use super::CHUNK;
use rayon::prelude::*;

/// out [n] = f(a [n]), element by element over parallel chunks: the loop every pointwise op
/// shares, so that each keeps only its arithmetic. Inlined, so that `f` vectorises in it.
#[inline(always)]
pub(super) fn map(out: &mut [f32], a: &[f32], f: impl Fn(f32) -> f32 + Sync) {
    out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK)).for_each(|(out, a)| {
        for (o, &a) in out.iter_mut().zip(a) {
            *o = f(a);
        }
    });
}

/// out [n] = f(a [n], b [n]), as [`map`].
#[inline(always)]
pub(super) fn zip_map(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK))).for_each(|(out, (a, b))| {
        for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
            *o = f(a, b);
        }
    });
}

/// dst [n] = src [n]
pub fn copy(dst: &mut [f32], src: &[f32]) {
    dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| d.copy_from_slice(s));
}

/// t [n] = 0
pub fn fill_zero(t: &mut [f32]) {
    t.par_chunks_mut(CHUNK).for_each(|c| c.fill(0.0));
}

/// acc [n] += x [n]
pub fn accumulate(acc: &mut [f32], x: &[f32]) {
    acc.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(acc, x)| {
        for (a, &x) in acc.iter_mut().zip(x) {
            *a += x;
        }
    });
}

/// out [n] = a [n] + b [n]
pub fn add(out: &mut [f32], a: &[f32], b: &[f32]) {
    zip_map(out, a, b, |a, b| a + b);
}

/// out [n] = a [n] + s
pub fn add_scalar(out: &mut [f32], a: &[f32], s: f32) {
    map(out, a, |a| a + s);
}

/// t [n] *= s
pub fn scale(t: &mut [f32], s: f32) {
    t.par_chunks_mut(CHUNK).for_each(|t| t.iter_mut().for_each(|x| *x *= s));
}

/// Sum of x² over t [n] in f64: each CHUNK is summed on its own (in 8 interleaved lanes, so
/// it vectorises), then the chunk sums are added in chunk order. The rounding depends on the
/// length only, never on how rayon split the work.
pub fn sum_squares(t: &[f32]) -> f64 {
    let chunk_sums: Vec<f64> = t
        .par_chunks(CHUNK)
        .map(|chunk| {
            let mut lanes = [0.0f64; 8];
            let mut blocks = chunk.chunks_exact(8);
            for block in &mut blocks {
                for (lane, &x) in lanes.iter_mut().zip(block) {
                    *lane += x as f64 * x as f64;
                }
            }
            let tail: f64 = blocks.remainder().iter().map(|&x| x as f64 * x as f64).sum();
            lanes.iter().sum::<f64>() + tail
        })
        .collect();
    chunk_sums.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::random;

    #[test]
    fn arithmetic_is_exact() {
        let n = 3 * CHUNK + 5;
        let a = random(1, n, 1.0);
        let b = random(2, n, 1.0);
        let mut out = vec![0.0; n];
        add(&mut out, &a, &b);
        assert!(out.iter().zip(&a).zip(&b).all(|((&o, &a), &b)| o == a + b));
        accumulate(&mut out, &a);
        assert!(out.iter().zip(&a).zip(&b).all(|((&o, &a), &b)| o == (a + b) + a));
        add_scalar(&mut out, &a, 1.0);
        assert!(out.iter().zip(&a).all(|(&o, &a)| o == a + 1.0));
        scale(&mut out, 55.425625);
        assert!(out.iter().zip(&a).all(|(&o, &a)| o == (a + 1.0) * 55.425625));
        copy(&mut out, &b);
        assert_eq!(out, b);
        fill_zero(&mut out);
        assert!(out.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn sum_squares_matches_f64_reference() {
        let t = random(3, 2 * CHUNK + 77, 2.0);
        let exact: f64 = t.iter().map(|&x| x as f64 * x as f64).sum();
        let got = sum_squares(&t);
        assert!((got - exact).abs() <= 1e-12 * exact, "{got} vs {exact}");
        assert_eq!(sum_squares(&[]), 0.0);
    }
}
