//! The causal self-attention core, per (batch, head): S = Q K^T / sqrt(hs) under the causal
//! mask, P = softmax(S) (saved to `att`), P' = dropout(P) (saved to `dropped`), out = P' V.
//! Backward reads P (softmax) and P' (dV), and regenerates the mask for dP from its key.
//!
//! The (batch, head) pairs are cut into one contiguous group per thread, each with its own
//! scratch slots; every pair is computed the same way whatever group it falls in, so the
//! result does not depend on the thread count. The per-head products are single-threaded
//! gemm calls on strided views of qkv, out and dqkv, taken in row blocks so that the masked
//! upper triangle is (mostly) skipped.

use super::disjoint::DisjointMut;
use super::dropout::scale_by_mask;
use super::math::{dot, exp, max, sum};
use super::matmul::{gemm_strided, Strided};
use crate::dropout::DropoutSpec;
use gemm::Parallelism;
use rayon::prelude::*;

/// Rows per block of the per-head products: query rows i0..i1 only see keys 0..i1.
const BLOCK: usize = 64;

/// qkv [B,T,3C], out [B,T,C], att [B,NH,T,T]; head size C / NH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
}

impl Dims {
    pub fn att_len(&self) -> usize {
        self.b * self.nh * self.t * self.t
    }
}

/// Scratch `backward` needs for `groups` groups: dP / dS, [T,T] a group.
pub fn backward_scratch_len(d: Dims, groups: usize) -> usize {
    groups * d.t * d.t
}

/// What forward saved: qkv [B,T,3C], att (P) [B,NH,T,T] and, under dropout, the dropped
/// probabilities (P') [B,NH,T,T] with the dropout that made them.
#[derive(Clone, Copy)]
pub struct Saved<'a> {
    pub qkv: &'a [f32],
    pub att: &'a [f32],
    pub dropout: Option<(&'a DropoutSpec, &'a [f32])>,
}

/// Where one head's operands live.
struct Head {
    /// Index of the (batch, head) pair, b * NH + h.
    bh: usize,
    /// Offsets of q, k, v [T,hs] in qkv (row stride 3C).
    q: usize,
    k: usize,
    v: usize,
    /// Offset of this head's [T,hs] block in out / dout (row stride C).
    o: usize,
}

impl Head {
    fn new(d: Dims, bh: usize) -> Head {
        let (b, h, hs) = (bh / d.nh, bh % d.nh, d.c / d.nh);
        let q = b * d.t * 3 * d.c + h * hs;
        Head { bh, q, k: q + d.c, v: q + 2 * d.c, o: b * d.t * d.c + h * hs }
    }

    /// Flat index in [B,NH,T,T] of (row i, column 0): the dropout mask's element index.
    fn mask_row(&self, d: Dims, i: usize) -> usize {
        (self.bh * d.t + i) * d.t
    }
}

/// Row blocks [i0, i1) of 0..t.
fn blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t).step_by(BLOCK).map(move |i0| (i0, (i0 + BLOCK).min(t)))
}

fn at(s: &[f32], offset: usize, rs: usize) -> Strided<*const f32> {
    Strided { ptr: s[offset..].as_ptr(), rs, cs: 1 }
}

/// Runs `per_group(att_group, g, slot)` for the groups of (batch, head) pairs in parallel,
/// group g with scratch slot g.
fn for_each_group<A: Send>(
    att_groups: impl IndexedParallelIterator<Item = A>,
    scratch: &mut [f32],
    groups: usize,
    per_group: impl Fn(A, usize, &mut [f32]) + Sync,
) {
    let slot_len = scratch.len() / groups;
    let scratch = DisjointMut::new(scratch);
    att_groups.enumerate().for_each(|(g, att_group)| {
        // SAFETY: group g alone uses slot g.
        per_group(att_group, g, unsafe { scratch.slice(g * slot_len, slot_len) });
    });
}

/// att [B,NH,T,T], under `dropout` its dropped [B,NH,T,T], and unless `out` is None (a
/// recompute for backward) out [B,T,C], from qkv [B,T,3C].
pub fn forward(
    out: Option<&mut [f32]>,
    att: &mut [f32],
    dropout: Option<(&DropoutSpec, &mut [f32])>,
    qkv: &[f32],
    d: Dims,
    groups: usize,
) {
    assert!(qkv.len() == d.b * d.t * 3 * d.c && att.len() == d.att_len());
    assert!(out.as_ref().is_none_or(|out| out.len() * 3 == qkv.len()), "attention out");
    let tt = d.t * d.t;
    if tt == 0 || d.b == 0 {
        return;
    }
    let per_group = (d.b * d.nh).div_ceil(groups);
    let out = out.map(DisjointMut::new);
    let (spec, dropped) = match dropout {
        Some((spec, dropped)) => {
            assert_eq!(dropped.len(), d.att_len(), "dropped probabilities");
            (Some(spec), Some(DisjointMut::new(dropped)))
        }
        None => (None, None),
    };
    att.par_chunks_mut(per_group * tt).enumerate().for_each(|(g, att_group)| {
        for (j, att_bh) in att_group.chunks_exact_mut(tt).enumerate() {
            let head = Head::new(d, g * per_group + j);
            // SAFETY: head bh alone uses its [T,T] block of dropped.
            let dropout = spec.zip(dropped.map(|x| unsafe { x.slice(head.bh * tt, tt) }));
            head_forward(d, &head, att_bh, qkv, out, dropout);
        }
    });
}

fn head_forward(
    d: Dims,
    head: &Head,
    att: &mut [f32],
    qkv: &[f32],
    out: Option<DisjointMut>,
    dropout: Option<(&DropoutSpec, &mut [f32])>,
) {
    let (t, c3, hs) = (d.t, 3 * d.c, d.c / d.nh);
    let scale = 1.0 / (hs as f32).sqrt();
    let none = Parallelism::None;
    for (i0, i1) in blocks(t) {
        // att[i0..i1, 0..i1] = scale * Q[i0..i1] @ K[0..i1]^T
        // SAFETY: every view stays inside its slice; att is exclusively borrowed.
        unsafe {
            let dst = Strided { ptr: att[i0 * t..].as_mut_ptr(), rs: t, cs: 1 };
            let k_t = Strided { ptr: qkv[head.k..].as_ptr(), rs: 1, cs: c3 };
            gemm_strided((i1 - i0, i1, hs), dst, at(qkv, head.q + i0 * c3, c3), k_t, false, scale, none);
        }
    }
    for (i, row) in att.chunks_exact_mut(t).enumerate() {
        let (live, masked) = row.split_at_mut(i + 1);
        let row_max = max(live);
        live.iter_mut().for_each(|x| *x = exp(*x - row_max));
        let inv_sum = 1.0 / sum(live);
        live.iter_mut().for_each(|x| *x *= inv_sum);
        masked.fill(0.0);
    }
    let probs: &[f32] = match dropout {
        None => att,
        Some((spec, dropped)) => {
            drop_probs(d, head, att, spec, dropped);
            dropped
        }
    };
    let Some(out) = out else { return };
    for (i0, i1) in blocks(t) {
        // out[i0..i1] = probs[i0..i1, 0..i1] @ V[0..i1]
        // SAFETY: this head alone writes its [T,hs] block of out; the reads stay in bounds.
        unsafe {
            let dst = Strided { ptr: out.ptr_at(head.o + i0 * d.c), rs: d.c, cs: 1 };
            gemm_strided((i1 - i0, hs, i1), dst, at(probs, i0 * t, t), at(qkv, head.v, c3), false, 1.0, none);
        }
    }
}

/// dropped [T,T] = att [T,T] * mask / (1 - p) on and below the diagonal, 0 above.
fn drop_probs(d: Dims, head: &Head, att: &[f32], spec: &DropoutSpec, dropped: &mut [f32]) {
    for (i, (row, probs)) in dropped.chunks_exact_mut(d.t).zip(att.chunks_exact(d.t)).enumerate() {
        let (live, masked) = row.split_at_mut(i + 1);
        live.copy_from_slice(&probs[..=i]);
        scale_by_mask(spec, head.mask_row(d, i), live);
        masked.fill(0.0);
    }
}

/// dqkv [B,T,3C] (overwrite) from dout [B,T,C] and what forward saved; `scratch` of
/// `backward_scratch_len`.
pub fn backward(dqkv: &mut [f32], dout: &[f32], saved: Saved, d: Dims, scratch: &mut [f32], groups: usize) {
    let Saved { qkv, att, dropout } = saved;
    assert!(qkv.len() == d.b * d.t * 3 * d.c && dqkv.len() == qkv.len() && dout.len() * 3 == qkv.len());
    assert_eq!(att.len(), d.att_len());
    assert!(dropout.is_none_or(|(_, dropped)| dropped.len() == d.att_len()), "dropped probabilities");
    let tt = d.t * d.t;
    if tt == 0 || d.b == 0 {
        return;
    }
    let per_group = (d.b * d.nh).div_ceil(groups);
    let dqkv = DisjointMut::new(dqkv);
    for_each_group(att.par_chunks(per_group * tt), scratch, groups, |att_group, g, dscores| {
        for (j, att_bh) in att_group.chunks_exact(tt).enumerate() {
            let head = Head::new(d, g * per_group + j);
            let dropout = dropout.map(|(spec, dropped)| (spec, &dropped[head.bh * tt..][..tt]));
            head_backward(d, &head, att_bh, qkv, dout, dqkv, dropout, dscores);
        }
    });
}

#[allow(clippy::too_many_arguments)]
fn head_backward(
    d: Dims,
    head: &Head,
    att: &[f32],
    qkv: &[f32],
    dout: &[f32],
    dqkv: DisjointMut,
    dropout: Option<(&DropoutSpec, &[f32])>,
    dscores: &mut [f32],
) {
    let (t, c, c3, hs) = (d.t, d.c, 3 * d.c, d.c / d.nh);
    let scale = 1.0 / (hs as f32).sqrt();
    let none = Parallelism::None;
    let probs = dropout.map_or(att, |(_, dropped)| dropped);
    for (j0, j1) in blocks(t) {
        // dV[j0..j1] = probs[j0..t, j0..j1]^T @ dout[j0..t] (rows above j0 are masked)
        // dscores[i0..i1, 0..i1] = dout[i0..i1] @ V[0..i1]^T
        // SAFETY: this head alone writes its columns of dqkv; the reads stay in bounds.
        unsafe {
            let dst = Strided { ptr: dqkv.ptr_at(head.v + j0 * c3), rs: c3, cs: 1 };
            let probs_t = Strided { ptr: probs[j0 * t + j0..].as_ptr(), rs: 1, cs: t };
            gemm_strided((j1 - j0, hs, t - j0), dst, probs_t, at(dout, head.o + j0 * c, c), false, 1.0, none);
            let dst = Strided { ptr: dscores[j0 * t..].as_mut_ptr(), rs: t, cs: 1 };
            let v_t = Strided { ptr: qkv[head.v..].as_ptr(), rs: 1, cs: c3 };
            gemm_strided((j1 - j0, j1, hs), dst, at(dout, head.o + j0 * c, c), v_t, false, 1.0, none);
        }
    }
    // Back through dropout, then softmax: dS = P * (dP - sum_j P dP); 0 above the diagonal.
    for (i, (row, p)) in dscores.chunks_exact_mut(t).zip(att.chunks_exact(t)).enumerate() {
        let (live, masked) = row.split_at_mut(i + 1);
        if let Some((spec, _)) = dropout {
            scale_by_mask(spec, head.mask_row(d, i), live);
        }
        let p = &p[..=i];
        let p_dp = dot(p, live);
        live.iter_mut().zip(p).for_each(|(x, &p)| *x = p * (*x - p_dp));
        masked.fill(0.0);
    }
    for (i0, i1) in blocks(t) {
        // dQ[i0..i1] = scale * dS[i0..i1, 0..i1] @ K[0..i1]
        // dK[i0..i1] = scale * dS[i0..t, i0..i1]^T @ Q[i0..t]
        // SAFETY: as above.
        unsafe {
            let dst = Strided { ptr: dqkv.ptr_at(head.q + i0 * c3), rs: c3, cs: 1 };
            gemm_strided(
                (i1 - i0, hs, i1),
                dst,
                at(dscores, i0 * t, t),
                at(qkv, head.k, c3),
                false,
                scale,
                none,
            );
            let dst = Strided { ptr: dqkv.ptr_at(head.k + i0 * c3), rs: c3, cs: 1 };
            let ds_t = Strided { ptr: dscores[i0 * t + i0..].as_ptr(), rs: 1, cs: t };
            gemm_strided((i1 - i0, hs, t - i0), dst, ds_t, at(qkv, head.q + i0 * c3, c3), false, scale, none);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff_at, random, to_f64, weighted_sum};
    use crate::dropout::{DropoutKey, DropoutSite};
    use crate::philox;

    // T spans a full BLOCK and a partial one; 6 (batch, head) pairs in 2 groups.
    const D: Dims = Dims { b: 2, t: 70, c: 12, nh: 3 };
    const GROUPS: usize = 2;
    const SPEC: DropoutSpec = DropoutSpec {
        p: 0.3,
        key: DropoutKey { seed: 9, step: 2, microbatch: 1, layer: 4, site: DropoutSite::AttentionProbs },
    };

    /// The multiplier of each element of att [B,NH,T,T]: 1/(1-p) or 0 (all 1 without dropout).
    fn multipliers(d: Dims, dropout: Option<&DropoutSpec>) -> Vec<f64> {
        let scale = dropout.map_or(1.0, |s| 1.0 / (1.0 - s.p as f64));
        (0..d.att_len())
            .map(|i| if dropout.is_none_or(|s| philox::keep(&s.key, i, s.p)) { scale } else { 0.0 })
            .collect()
    }

    /// (out, att) in f64, straight from the definition; `mask` from `multipliers`.
    fn reference(qkv: &[f64], d: Dims, mask: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (t, c, hs) = (d.t, d.c, d.c / d.nh);
        let mut out = vec![0.0; d.b * t * c];
        let mut att = vec![0.0; d.att_len()];
        for bh in 0..d.b * d.nh {
            let (b, h) = (bh / d.nh, bh % d.nh);
            let x = |i: usize, part: usize, k: usize| qkv[(b * t + i) * 3 * c + part * c + h * hs + k];
            for i in 0..t {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| (0..hs).map(|k| x(i, 0, k) * x(j, 1, k)).sum::<f64>() / (hs as f64).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - m).exp() / total;
                    let index = (bh * t + i) * t + j;
                    att[index] = p;
                    let kept = p * mask[index];
                    for k in 0..hs {
                        out[(b * t + i) * c + h * hs + k] += kept * x(j, 2, k);
                    }
                }
            }
        }
        (out, att)
    }

    /// (out, att, dropped); dropped is empty without dropout.
    fn run_forward(qkv: &[f32], d: Dims, dropout: Option<&DropoutSpec>) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (mut out, mut att) = (vec![f32::NAN; d.b * d.t * d.c], vec![f32::NAN; d.att_len()]);
        let mut dropped = vec![f32::NAN; if dropout.is_some() { d.att_len() } else { 0 }];
        forward(Some(&mut out), &mut att, dropout.map(|spec| (spec, &mut dropped[..])), qkv, d, GROUPS);
        (out, att, dropped)
    }

    #[test]
    fn forward_matches_f64_reference_with_and_without_dropout() {
        let qkv = random(1, D.b * D.t * 3 * D.c, 2.0);
        for dropout in [None, Some(&SPEC)] {
            let (out, att, dropped) = run_forward(&qkv, D, dropout);
            let mask = multipliers(D, dropout);
            let (want_out, want_att) = reference(&to_f64(&qkv), D, &mask);
            // Tolerance: 1e-5 of the largest value (softmax and 70-term sums in f32).
            assert_close(&out, &want_out, 1e-5, "out");
            assert_close(&att, &want_att, 1e-5, "att");
            if dropout.is_some() {
                let want_dropped: Vec<f64> = want_att.iter().zip(&mask).map(|(p, m)| p * m).collect();
                assert_close(&dropped, &want_dropped, 1e-5, "dropped");
            }
            // A recompute (no out) writes the same probabilities, bit for bit, over stale data.
            let (mut again, mut again_dropped) = (vec![7.0; att.len()], vec![7.0; dropped.len()]);
            forward(None, &mut again, dropout.map(|spec| (spec, &mut again_dropped[..])), &qkv, D, GROUPS);
            assert!(again == att && again_dropped == dropped, "recomputed probabilities differ");
            let upper = (0..D.att_len()).filter(|&x| (x % D.t) > (x / D.t) % D.t);
            assert!(upper.clone().all(|x| att[x] == 0.0), "masked probabilities must be exactly 0");
        }
    }

    #[test]
    fn backward_matches_finite_differences_with_and_without_dropout() {
        // T over one BLOCK; the forward test covers the batch offsets.
        let d = Dims { b: 1, t: 67, c: 8, nh: 2 };
        let qkv = random(2, d.b * d.t * 3 * d.c, 1.5);
        let w = random(3, d.b * d.t * d.c, 1.0);
        // Every 7th component (7 is prime to the row length 24): all of q, k, v, both heads
        // and both row blocks, at a seventh of the cost.
        let sampled = || (0..qkv.len()).step_by(7);
        for dropout in [None, Some(&SPEC)] {
            let mask = multipliers(d, dropout);
            let fd = finite_diff_at(&qkv, sampled(), |x| weighted_sum(&reference(x, d, &mask).0, &w));
            let (_, att, dropped) = run_forward(&qkv, d, dropout);
            let mut dqkv = vec![f32::NAN; qkv.len()];
            let mut scratch = vec![0.0; backward_scratch_len(d, GROUPS)];
            let saved = Saved { qkv: &qkv, att: &att, dropout: dropout.map(|spec| (spec, &dropped[..])) };
            backward(&mut dqkv, &w, saved, d, &mut scratch, GROUPS);
            let got: Vec<f32> = sampled().map(|i| dqkv[i]).collect();
            // Tolerance: 1e-4 of the largest gradient component.
            assert_close(&got, &fd, 1e-4, "dqkv");
        }
    }
}
