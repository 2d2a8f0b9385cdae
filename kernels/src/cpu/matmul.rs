//! Matmul with the `gemm` crate, weights used in place through strides (no transposed
//! copies), plus the bias add and the bias-gradient column sums.

use crate::op_args::WeightLayout;
use gemm::Parallelism;
use rayon::prelude::*;

/// Output rows per parallel task of the bias broadcast.
const BIAS_ROWS: usize = 16;
/// Columns per parallel task of the dbias column sums; each task sums all rows in order.
const BIAS_COLS: usize = 64;

/// A matmul's sizes: inp [N,IC], out [N,OC].
pub use crate::shapes::MatmulDims as Dims;

/// A strided matrix operand: element (r, c) is at `ptr + r * rs + c * cs`.
#[derive(Clone, Copy)]
pub struct Strided<P> {
    pub ptr: P,
    pub rs: usize,
    pub cs: usize,
}

/// dst [m,n] = scale * lhs [m,k] @ rhs [k,n], or dst += that when `accumulate`.
///
/// # Safety
/// Every operand must be valid for its strided extent, and dst must not overlap lhs or rhs
/// (nor be written by anyone else meanwhile).
pub unsafe fn gemm_strided(
    (m, n, k): (usize, usize, usize),
    dst: Strided<*mut f32>,
    lhs: Strided<*const f32>,
    rhs: Strided<*const f32>,
    accumulate: bool,
    scale: f32,
    par: Parallelism,
) {
    // gemm computes dst = alpha * dst + beta * lhs @ rhs (alpha and beta named the reverse
    // of BLAS) and takes each operand's column stride before its row stride.
    let s = |x: usize| x as isize;
    gemm::gemm(
        m,
        n,
        k,
        dst.ptr,
        s(dst.cs),
        s(dst.rs),
        accumulate,
        lhs.ptr,
        s(lhs.cs),
        s(lhs.rs),
        rhs.ptr,
        s(rhs.cs),
        s(rhs.rs),
        1.0,
        scale,
        false,
        false,
        false,
        par,
    );
}

/// Strides of the weight seen as the [IC,OC] matrix W, whatever its memory layout.
fn weight_strides(layout: WeightLayout, d: Dims) -> (usize, usize) {
    match layout {
        WeightLayout::InOut => (d.oc, 1),
        WeightLayout::OutIn => (1, d.ic),
    }
}

fn check(d: Dims, rows_oc: &[f32], inp: &[f32], weight: &[f32]) {
    assert_eq!(rows_oc.len(), d.n * d.oc, "[N,OC] operand for {d:?}");
    assert_eq!(inp.len(), d.n * d.ic, "[N,IC] operand for {d:?}");
    assert_eq!(weight.len(), d.ic * d.oc, "weight for {d:?}");
}

/// out [N,OC] = inp [N,IC] @ W (+ bias [OC]); W per `layout`.
pub fn forward(
    out: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    layout: WeightLayout,
    bias: Option<&[f32]>,
    d: Dims,
    par: Parallelism,
) {
    check(d, out, inp, weight);
    if let Some(bias) = bias {
        // The bias goes in first and gemm adds the product to it: one pass over out, not two.
        out.par_chunks_mut(d.oc).with_min_len(BIAS_ROWS).for_each(|row| row.copy_from_slice(bias));
    }
    let (w_rs, w_cs) = weight_strides(layout, d);
    // SAFETY: the extents match the slice lengths checked above; out is exclusively borrowed.
    unsafe {
        gemm_strided(
            (d.n, d.oc, d.ic),
            Strided { ptr: out.as_mut_ptr(), rs: d.oc, cs: 1 },
            Strided { ptr: inp.as_ptr(), rs: d.ic, cs: 1 },
            Strided { ptr: weight.as_ptr(), rs: w_rs, cs: w_cs },
            bias.is_some(),
            1.0,
            par,
        )
    }
}

/// dinp [N,IC] = dout [N,OC] @ W^T (overwrite).
pub fn backward_input(
    dinp: &mut [f32],
    dout: &[f32],
    weight: &[f32],
    layout: WeightLayout,
    d: Dims,
    par: Parallelism,
) {
    check(d, dout, dinp, weight);
    let (w_rs, w_cs) = weight_strides(layout, d);
    // SAFETY: as in forward.
    unsafe {
        gemm_strided(
            (d.n, d.ic, d.oc),
            Strided { ptr: dinp.as_mut_ptr(), rs: d.ic, cs: 1 },
            Strided { ptr: dout.as_ptr(), rs: d.oc, cs: 1 },
            Strided { ptr: weight.as_ptr(), rs: w_cs, cs: w_rs },
            false,
            1.0,
            par,
        )
    }
}

/// dweight (the [IC,OC] matrix W per `layout`) += inp [N,IC]^T @ dout [N,OC];
/// dbias [OC] += column sums of dout.
pub fn backward_weight(
    dweight: &mut [f32],
    dbias: Option<&mut [f32]>,
    dout: &[f32],
    inp: &[f32],
    layout: WeightLayout,
    d: Dims,
    par: Parallelism,
) {
    check(d, dout, inp, dweight);
    let (w_rs, w_cs) = weight_strides(layout, d);
    // SAFETY: as in forward.
    unsafe {
        gemm_strided(
            (d.ic, d.oc, d.n),
            Strided { ptr: dweight.as_mut_ptr(), rs: w_rs, cs: w_cs },
            Strided { ptr: inp.as_ptr(), rs: 1, cs: d.ic },
            Strided { ptr: dout.as_ptr(), rs: d.oc, cs: 1 },
            true,
            1.0,
            par,
        )
    }
    if let Some(dbias) = dbias {
        dbias.par_chunks_mut(BIAS_COLS).enumerate().for_each(|(chunk, dbias)| {
            let mut sums = [0.0f32; BIAS_COLS];
            for row in dout.chunks_exact(d.oc) {
                for (s, &g) in sums.iter_mut().zip(&row[chunk * BIAS_COLS..]) {
                    *s += g;
                }
            }
            for (db, s) in dbias.iter_mut().zip(sums) {
                *db += s;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64, weighted_sum};

    const D: Dims = Dims { n: 9, ic: 13, oc: 70 }; // OC spans two BIAS_COLS chunks
    const LAYOUTS: [WeightLayout; 2] = [WeightLayout::InOut, WeightLayout::OutIn];

    /// W[i][o] of either layout.
    fn w_at(weight: &[f64], layout: WeightLayout, i: usize, o: usize) -> f64 {
        match layout {
            WeightLayout::InOut => weight[i * D.oc + o],
            WeightLayout::OutIn => weight[o * D.ic + i],
        }
    }

    fn reference(inp: &[f64], weight: &[f64], layout: WeightLayout, bias: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; D.n * D.oc];
        for n in 0..D.n {
            for o in 0..D.oc {
                let dot: f64 = (0..D.ic).map(|i| inp[n * D.ic + i] * w_at(weight, layout, i, o)).sum();
                out[n * D.oc + o] = dot + bias[o];
            }
        }
        out
    }

    fn inputs() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (random(1, D.n * D.ic, 1.0), random(2, D.ic * D.oc, 1.0), random(3, D.oc, 1.0))
    }

    #[test]
    fn forward_matches_f64_reference_for_both_layouts() {
        let (inp, weight, bias) = inputs();
        for layout in LAYOUTS {
            let mut out = vec![f32::NAN; D.n * D.oc];
            forward(&mut out, &inp, &weight, layout, Some(&bias), D, Parallelism::None);
            let want = reference(&to_f64(&inp), &to_f64(&weight), layout, &to_f64(&bias));
            // Tolerance: 1e-6 of the largest output (13-term f32 dot products).
            assert_close(&out, &want, 1e-6, "out with bias");
            forward(&mut out, &inp, &weight, layout, None, D, Parallelism::None);
            let want = reference(&to_f64(&inp), &to_f64(&weight), layout, &[0.0; D.oc]);
            assert_close(&out, &want, 1e-6, "out without bias");
        }
    }

    #[test]
    fn backward_matches_finite_differences_and_accumulates() {
        let (inp, weight, bias) = inputs();
        let w = random(4, D.n * D.oc, 1.0);
        let (inp64, weight64, bias64) = (to_f64(&inp), to_f64(&weight), to_f64(&bias));
        for layout in LAYOUTS {
            let loss = |i: &[f64], wt: &[f64], b: &[f64]| weighted_sum(&reference(i, wt, layout, b), &w);
            let fd_inp = finite_diff(&inp, |x| loss(x, &weight64, &bias64));
            let fd_weight = finite_diff(&weight, |x| loss(&inp64, x, &bias64));
            let fd_bias = finite_diff(&bias, |x| loss(&inp64, &weight64, x));

            let mut dinp = vec![f32::NAN; D.n * D.ic];
            backward_input(&mut dinp, &w, &weight, layout, D, Parallelism::None);
            let (mut dweight, mut dbias) = (vec![0.0; D.ic * D.oc], vec![0.0; D.oc]);
            backward_weight(&mut dweight, Some(&mut dbias), &w, &inp, layout, D, Parallelism::None);
            // Tolerance: 1e-5 of the largest gradient (short f32 dot products).
            assert_close(&dinp, &fd_inp, 1e-5, "dinp");
            assert_close(&dweight, &fd_weight, 1e-5, "dweight");
            assert_close(&dbias, &fd_bias, 1e-5, "dbias");

            let (once_w, once_b) = (dweight.clone(), dbias.clone());
            backward_weight(&mut dweight, Some(&mut dbias), &w, &inp, layout, D, Parallelism::None);
            // K = N is a single gemm depth block, so the product is added once: exactly 2x.
            assert!(dweight.iter().zip(&once_w).all(|(&a, &b)| a == 2.0 * b));
            assert!(dbias.iter().zip(&once_b).all(|(&a, &b)| a == 2.0 * b));
            // Without a bias, the same weight gradient.
            let mut alone = vec![0.0; D.ic * D.oc];
            backward_weight(&mut alone, None, &w, &inp, layout, D, Parallelism::None);
            assert!(alone == once_w, "dweight without dbias ({layout:?})");
        }
    }
}
