//! The causal grouped-query self-attention core, per (batch, query head h): S = Q_h K_g^T /
//! sqrt(hs) under the causal mask (or a sliding window's), P = softmax(S) (saved to `att`),
//! P' = dropout(P) (saved to `dropped`), out_h = P' V_g, where g = h / (NH/KV) is the
//! key/value head that h shares with the other query heads of its group (KV == NH:
//! multi-head attention). Backward reads P (softmax) and P' (dV), and regenerates the mask
//! for dP from its key.
//!
//! Forward cuts the (batch, query head) pairs, backward the (batch, key/value head) pairs
//! with all their query heads, into one contiguous group per thread, each with its own
//! scratch slots; every pair is computed the same way whatever group it falls in, so the
//! result does not depend on the thread count. A key/value head's dK and dV are its first
//! query head's, plus each later one's in ascending order. The per-head products are
//! single-threaded gemm calls on strided views of qkv, out and dqkv, taken in row blocks so
//! that the masked upper triangle, and under a window the keys before it, are (mostly)
//! skipped.

use super::disjoint::DisjointMut;
use super::dropout::scale_by_mask;
use super::math::{dot, exp, max, sum};
use super::matmul::{gemm_strided, Strided};
use crate::attention::CausalMask;
use crate::dropout::DropoutSpec;
use gemm::Parallelism;
use rayon::prelude::*;

/// Rows per block of the per-head products: query rows i0..i1 only see keys 0..i1.
const BLOCK: usize = 64;

/// qkv [B,T,(NH+2*KV)*hs], out [B,T,NH*hs], att [B,NH,T,T]: NH query heads, KV key/value
/// heads (KV divides NH), head size hs; the keys each query sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub kv: usize,
    pub hs: usize,
    pub mask: CausalMask,
}

impl Dims {
    pub fn att_len(&self) -> usize {
        self.b * self.nh * self.t * self.t
    }

    /// The width of a row of qkv: the query, key and value heads.
    pub fn qkv_width(&self) -> usize {
        (self.nh + 2 * self.kv) * self.hs
    }

    /// The width of a row of out: the query heads'.
    pub fn out_width(&self) -> usize {
        self.nh * self.hs
    }

    /// Query heads per key/value head.
    fn group(&self) -> usize {
        self.nh / self.kv
    }

    /// The keys query `i` sees, first_key..=i: the rest of its row is masked.
    fn live(&self, i: usize) -> std::ops::RangeInclusive<usize> {
        self.mask.first_key(i)..=i
    }
}

/// Scratch `backward` needs for `groups` groups: dP / dS [T,T] a group and, where a
/// key/value head serves several query heads, the later heads' dK and dV [T,hs] each.
pub fn backward_scratch_len(d: Dims, groups: usize) -> usize {
    let kv_partials = if d.group() > 1 { 2 * d.t * d.hs } else { 0 };
    groups * (d.t * d.t + kv_partials)
}

/// What forward saved: qkv [B,T,(NH+2*KV)*hs], att (P) [B,NH,T,T] and, under dropout, the
/// dropped probabilities (P') [B,NH,T,T] with the dropout that made them.
#[derive(Clone, Copy)]
pub struct Saved<'a> {
    pub qkv: &'a [f32],
    pub att: &'a [f32],
    pub dropout: Option<(&'a DropoutSpec, &'a [f32])>,
}

/// Where one query head's operands live.
struct Head {
    /// Index of the (batch, query head) pair, b * NH + h.
    bh: usize,
    /// Offsets of q, and of its key/value head's k and v, [T,hs] in qkv (row stride
    /// `qkv_width`).
    q: usize,
    k: usize,
    v: usize,
    /// Offset of this head's [T,hs] block in out / dout (row stride `out_width`).
    o: usize,
}

impl Head {
    fn new(d: Dims, bh: usize) -> Head {
        let (b, h, hs) = (bh / d.nh, bh % d.nh, d.hs);
        let g = h / d.group();
        let row0 = b * d.t * d.qkv_width();
        Head {
            bh,
            q: row0 + h * hs,
            k: row0 + (d.nh + g) * hs,
            v: row0 + (d.nh + d.kv + g) * hs,
            o: b * d.t * d.out_width() + h * hs,
        }
    }

    /// Whether this is the first query head of its key/value head, the one whose dK and dV
    /// backward writes in place.
    fn leads_group(&self, d: Dims) -> bool {
        self.bh.is_multiple_of(d.group())
    }

    /// Flat index in [B,NH,T,T] of (row i, column 0): the dropout mask's element index. A
    /// tensor-parallel rank's heads index the whole layer's [B,NH,T,T] (`spec.heads`).
    fn mask_row(&self, d: Dims, spec: &DropoutSpec, i: usize) -> usize {
        let bh = match spec.heads {
            Some(r) => self.bh / d.nh * r.total + r.first + self.bh % d.nh,
            None => self.bh,
        };
        (bh * d.t + i) * d.t
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
/// recompute for backward) out [B,T,NH*hs], from qkv [B,T,(NH+2*KV)*hs].
pub fn forward(
    out: Option<&mut [f32]>,
    att: &mut [f32],
    dropout: Option<(&DropoutSpec, &mut [f32])>,
    qkv: &[f32],
    d: Dims,
    groups: usize,
) {
    assert!(qkv.len() == d.b * d.t * d.qkv_width() && att.len() == d.att_len());
    assert!(out.as_ref().is_none_or(|out| out.len() == d.b * d.t * d.out_width()), "attention out");
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
    let (t, c3, hs) = (d.t, d.qkv_width(), d.hs);
    let scale = 1.0 / (hs as f32).sqrt();
    let none = Parallelism::None;
    for (i0, i1) in blocks(t) {
        // att[i0..i1, j0..i1] = scale * Q[i0..i1] @ K[j0..i1]^T, j0 the block's first key
        // SAFETY: every view stays inside its slice; att is exclusively borrowed.
        let j0 = d.mask.first_key(i0);
        unsafe {
            let dst = Strided { ptr: att[i0 * t + j0..].as_mut_ptr(), rs: t, cs: 1 };
            let k_t = Strided { ptr: qkv[head.k + j0 * c3..].as_ptr(), rs: 1, cs: c3 };
            gemm_strided((i1 - i0, i1 - j0, hs), dst, at(qkv, head.q + i0 * c3, c3), k_t, false, scale, none);
        }
    }
    for (i, row) in att.chunks_exact_mut(t).enumerate() {
        let live = &mut row[d.live(i)];
        let row_max = max(live);
        live.iter_mut().for_each(|x| *x = exp(*x - row_max));
        let inv_sum = 1.0 / sum(live);
        live.iter_mut().for_each(|x| *x *= inv_sum);
        zero_outside(row, d.live(i));
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
        // out[i0..i1] = probs[i0..i1, j0..i1] @ V[j0..i1]
        // SAFETY: this head alone writes its [T,hs] block of out; the reads stay in bounds.
        let j0 = d.mask.first_key(i0);
        unsafe {
            let dst = Strided { ptr: out.ptr_at(head.o + i0 * d.out_width()), rs: d.out_width(), cs: 1 };
            let v = at(qkv, head.v + j0 * c3, c3);
            gemm_strided((i1 - i0, hs, i1 - j0), dst, at(probs, i0 * t + j0, t), v, false, 1.0, none);
        }
    }
}

/// Zeroes `row` outside the keys its query sees.
fn zero_outside(row: &mut [f32], live: std::ops::RangeInclusive<usize>) {
    row[..*live.start()].fill(0.0);
    row[live.end() + 1..].fill(0.0);
}

/// dropped [T,T] = att [T,T] * mask / (1 - p) where a query sees the key, 0 elsewhere.
fn drop_probs(d: Dims, head: &Head, att: &[f32], spec: &DropoutSpec, dropped: &mut [f32]) {
    for (i, (row, probs)) in dropped.chunks_exact_mut(d.t).zip(att.chunks_exact(d.t)).enumerate() {
        let first = d.mask.first_key(i);
        let live = &mut row[d.live(i)];
        live.copy_from_slice(&probs[d.live(i)]);
        // The mask's element index of key `first`: its row's plus the column.
        scale_by_mask(spec, head.mask_row(d, spec, i) + first, live);
        zero_outside(row, d.live(i));
    }
}

/// dqkv [B,T,(NH+2*KV)*hs] (overwrite) from dout [B,T,NH*hs] and what forward saved;
/// `scratch` of `backward_scratch_len`, for `groups` groups of (batch, key/value head) pairs.
pub fn backward(dqkv: &mut [f32], dout: &[f32], saved: Saved, d: Dims, scratch: &mut [f32], groups: usize) {
    let Saved { qkv, att, dropout } = saved;
    assert!(qkv.len() == d.b * d.t * d.qkv_width() && dqkv.len() == qkv.len());
    assert_eq!(dout.len(), d.b * d.t * d.out_width());
    assert_eq!(att.len(), d.att_len());
    assert!(dropout.is_none_or(|(_, dropped)| dropped.len() == d.att_len()), "dropped probabilities");
    let tt = d.t * d.t;
    if tt == 0 || d.b == 0 {
        return;
    }
    // A (batch, key/value head) pair's query heads are consecutive in att.
    let heads_per_group = (d.b * d.kv).div_ceil(groups) * d.group();
    let dqkv = DisjointMut::new(dqkv);
    for_each_group(att.par_chunks(heads_per_group * tt), scratch, groups, |att_group, g, slot| {
        let (dscores, kv_partials) = slot.split_at_mut(tt);
        for (j, att_bh) in att_group.chunks_exact(tt).enumerate() {
            let head = Head::new(d, g * heads_per_group + j);
            let dropout = dropout.map(|(spec, dropped)| (spec, &dropped[head.bh * tt..][..tt]));
            let kv_partials = (!head.leads_group(d)).then_some(&mut *kv_partials);
            head_backward(d, &head, att_bh, qkv, dout, dqkv, dropout, dscores, kv_partials);
        }
    });
}

/// One query head's share of dqkv: its dQ, and its dK and dV, which it writes into dqkv when
/// it leads its group (`kv_partials` None) and else into `kv_partials` [2,T,hs], then adds to
/// dqkv's.
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
    mut kv_partials: Option<&mut [f32]>,
) {
    let (t, c, c3, hs) = (d.t, d.out_width(), d.qkv_width(), d.hs);
    let scale = 1.0 / (hs as f32).sqrt();
    let none = Parallelism::None;
    let probs = dropout.map_or(att, |(_, dropped)| dropped);
    // Row j of dK and dV: (dk + j * rs, dv + j * rs).
    // SAFETY: this head's (batch, key/value head) pair alone writes those columns of dqkv.
    let (dk, dv, rs) = match kv_partials.as_deref_mut() {
        None => unsafe { (dqkv.ptr_at(head.k), dqkv.ptr_at(head.v), c3) },
        Some(partials) => {
            let (dk, dv) = partials.split_at_mut(t * hs);
            (dk.as_mut_ptr(), dv.as_mut_ptr(), hs)
        }
    };
    for (j0, j1) in blocks(t) {
        // dV[j0..j1] = probs[j0..e, j0..j1]^T @ dout[j0..e], e the end of the queries that
        // see those keys (rows above j0 are masked)
        // dscores[j0..j1, k0..j1] = dout[j0..j1] @ V[k0..j1]^T, k0 the block's first key
        // SAFETY: this head alone writes its columns of dqkv (and its pair its dK and dV);
        // the reads stay in bounds.
        let (e, k0) = (d.mask.queries_end(j1, t), d.mask.first_key(j0));
        unsafe {
            let dst = Strided { ptr: dv.add(j0 * rs), rs, cs: 1 };
            let probs_t = Strided { ptr: probs[j0 * t + j0..].as_ptr(), rs: 1, cs: t };
            gemm_strided((j1 - j0, hs, e - j0), dst, probs_t, at(dout, head.o + j0 * c, c), false, 1.0, none);
            let dst = Strided { ptr: dscores[j0 * t + k0..].as_mut_ptr(), rs: t, cs: 1 };
            let v_t = Strided { ptr: qkv[head.v + k0 * c3..].as_ptr(), rs: 1, cs: c3 };
            gemm_strided((j1 - j0, j1 - k0, hs), dst, at(dout, head.o + j0 * c, c), v_t, false, 1.0, none);
        }
    }
    // Back through dropout, then softmax: dS = P * (dP - sum_j P dP); 0 where masked.
    for (i, (row, p)) in dscores.chunks_exact_mut(t).zip(att.chunks_exact(t)).enumerate() {
        let first = d.mask.first_key(i);
        let live = &mut row[d.live(i)];
        if let Some((spec, _)) = dropout {
            scale_by_mask(spec, head.mask_row(d, spec, i) + first, live);
        }
        let p = &p[d.live(i)];
        let p_dp = dot(p, live);
        live.iter_mut().zip(p).for_each(|(x, &p)| *x = p * (*x - p_dp));
        zero_outside(row, d.live(i));
    }
    for (i0, i1) in blocks(t) {
        // dQ[i0..i1] = scale * dS[i0..i1, k0..i1] @ K[k0..i1]
        // dK[i0..i1] = scale * dS[i0..e, i0..i1]^T @ Q[i0..e]
        // SAFETY: as above.
        let (e, k0) = (d.mask.queries_end(i1, t), d.mask.first_key(i0));
        unsafe {
            let dst = Strided { ptr: dqkv.ptr_at(head.q + i0 * c3), rs: c3, cs: 1 };
            gemm_strided(
                (i1 - i0, hs, i1 - k0),
                dst,
                at(dscores, i0 * t + k0, t),
                at(qkv, head.k + k0 * c3, c3),
                false,
                scale,
                none,
            );
            let dst = Strided { ptr: dk.add(i0 * rs), rs, cs: 1 };
            let ds_t = Strided { ptr: dscores[i0 * t + i0..].as_ptr(), rs: 1, cs: t };
            gemm_strided((i1 - i0, hs, e - i0), dst, ds_t, at(qkv, head.q + i0 * c3, c3), false, scale, none);
        }
    }
    let Some(partials) = kv_partials else { return };
    let (dk, dv) = partials.split_at(t * hs);
    for (i, (dk, dv)) in dk.chunks_exact(hs).zip(dv.chunks_exact(hs)).enumerate() {
        // SAFETY: as above; the group's heads run one after another.
        let (k_row, v_row) = unsafe { (dqkv.slice(head.k + i * c3, hs), dqkv.slice(head.v + i * c3, hs)) };
        for ((a, &x), (b, &y)) in k_row.iter_mut().zip(dk).zip(v_row.iter_mut().zip(dv)) {
            *a += x;
            *b += y;
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
    const D: Dims = Dims { b: 2, t: 70, nh: 3, kv: 3, hs: 4, mask: CausalMask::Full };
    // 6 query heads sharing 2 key/value heads, 3 query heads each.
    const GQA: Dims = Dims { b: 2, t: 70, nh: 6, kv: 2, hs: 4, mask: CausalMask::Full };
    // A window of 13 keys: the second row block starts past its first keys, and the
    // first block's keys reach past it.
    const WINDOW: CausalMask = CausalMask::Window(13);
    const GROUPS: usize = 2;
    const SPEC: DropoutSpec = DropoutSpec {
        p: 0.3,
        key: DropoutKey { seed: 9, step: 2, microbatch: 1, layer: 4, site: DropoutSite::AttentionProbs },
        first: 0,
        heads: None,
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
        let (t, c, w, hs) = (d.t, d.out_width(), d.qkv_width(), d.hs);
        let mut out = vec![0.0; d.b * t * c];
        let mut att = vec![0.0; d.att_len()];
        for bh in 0..d.b * d.nh {
            let (b, h) = (bh / d.nh, bh % d.nh);
            let g = h * d.kv / d.nh; // Hugging Face's repeat_kv
            let heads = [h, d.nh + g, d.nh + d.kv + g]; // q, k, v
            let x = |i: usize, part: usize, k: usize| qkv[(b * t + i) * w + heads[part] * hs + k];
            for i in 0..t {
                let first = d.mask.first_key(i);
                let scores: Vec<f64> = (first..=i)
                    .map(|j| (0..hs).map(|k| x(i, 0, k) * x(j, 1, k)).sum::<f64>() / (hs as f64).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in (first..).zip(&scores) {
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
        let (mut out, mut att) = (vec![f32::NAN; d.b * d.t * d.out_width()], vec![f32::NAN; d.att_len()]);
        let mut dropped = vec![f32::NAN; if dropout.is_some() { d.att_len() } else { 0 }];
        forward(Some(&mut out), &mut att, dropout.map(|spec| (spec, &mut dropped[..])), qkv, d, GROUPS);
        (out, att, dropped)
    }

    /// dqkv from dout `w`, after `run_forward`, with `groups` groups.
    fn run_backward(
        qkv: &[f32],
        w: &[f32],
        d: Dims,
        dropout: Option<&DropoutSpec>,
        groups: usize,
    ) -> Vec<f32> {
        let (_, att, dropped) = run_forward(qkv, d, dropout);
        let mut dqkv = vec![f32::NAN; qkv.len()];
        let mut scratch = vec![f32::NAN; backward_scratch_len(d, groups)];
        let saved = Saved { qkv, att: &att, dropout: dropout.map(|spec| (spec, &dropped[..])) };
        backward(&mut dqkv, w, saved, d, &mut scratch, groups);
        dqkv
    }

    #[test]
    fn forward_matches_f64_reference_with_and_without_dropout() {
        for d in [D, GQA, Dims { mask: WINDOW, ..GQA }] {
            let qkv = random(1, d.b * d.t * d.qkv_width(), 2.0);
            for dropout in [None, Some(&SPEC)] {
                let (out, att, dropped) = run_forward(&qkv, d, dropout);
                let mask = multipliers(d, dropout);
                let (want_out, want_att) = reference(&to_f64(&qkv), d, &mask);
                // Tolerance: 1e-5 of the largest value (softmax and 70-term sums in f32).
                assert_close(&out, &want_out, 1e-5, "out");
                assert_close(&att, &want_att, 1e-5, "att");
                if dropout.is_some() {
                    let want_dropped: Vec<f64> = want_att.iter().zip(&mask).map(|(p, m)| p * m).collect();
                    assert_close(&dropped, &want_dropped, 1e-5, "dropped");
                }
                // A recompute (no out) writes the same probabilities, bit for bit, over stale data.
                let (mut again, mut again_dropped) = (vec![7.0; att.len()], vec![7.0; dropped.len()]);
                forward(
                    None,
                    &mut again,
                    dropout.map(|spec| (spec, &mut again_dropped[..])),
                    &qkv,
                    d,
                    GROUPS,
                );
                assert!(again == att && again_dropped == dropped, "recomputed probabilities differ");
                let (row, key) = (|x: usize| (x / d.t) % d.t, |x: usize| x % d.t);
                let mut masked = (0..d.att_len()).filter(|&x| !d.live(row(x)).contains(&key(x)));
                assert!(masked.all(|x| att[x] == 0.0), "masked probabilities must be exactly 0");
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences_with_and_without_dropout() {
        // T over one BLOCK; the forward test covers the batch offsets. Multi-head, and 4 query
        // heads on 2 key/value heads.
        let mha = Dims { b: 1, t: 67, nh: 2, kv: 2, hs: 4, mask: CausalMask::Full };
        let gqa = Dims { nh: 4, ..mha };
        for d in [mha, gqa, Dims { mask: WINDOW, ..gqa }] {
            let qkv = random(2, d.b * d.t * d.qkv_width(), 1.5);
            let w = random(3, d.b * d.t * d.out_width(), 1.0);
            // Every 7th component (7 is prime to the row lengths 24 and 32): all of q, k, v,
            // every head and both row blocks, at a seventh of the cost.
            let sampled = || (0..qkv.len()).step_by(7);
            for dropout in [None, Some(&SPEC)] {
                let mask = multipliers(d, dropout);
                let fd = finite_diff_at(&qkv, sampled(), |x| weighted_sum(&reference(x, d, &mask).0, &w));
                let dqkv = run_backward(&qkv, &w, d, dropout, GROUPS);
                let got: Vec<f32> = sampled().map(|i| dqkv[i]).collect();
                // Tolerance: 1e-4 of the largest gradient component.
                assert_close(&got, &fd, 1e-4, "dqkv");
            }
        }
    }

    /// qkv [B,T,3*NH*hs] of multi-head attention whose key/value heads repeat those of `qkv`
    /// [B,T,(NH+2*KV)*hs] as Hugging Face's repeat_kv does.
    fn repeat_kv(qkv: &[f32], d: Dims) -> Vec<f32> {
        let hs = d.hs;
        let head = |row: &[f32], h: usize| row[h * hs..][..hs].to_vec();
        qkv.chunks_exact(d.qkv_width())
            .flat_map(|row| {
                let q = (0..d.nh).map(|h| head(row, h));
                let k = (0..d.nh).map(|h| head(row, d.nh + h / d.group()));
                let v = (0..d.nh).map(|h| head(row, d.nh + d.kv + h / d.group()));
                q.chain(k).chain(v).flatten().collect::<Vec<f32>>()
            })
            .collect()
    }

    #[test]
    fn grouped_query_attention_is_multi_head_on_repeated_key_value_heads_bitwise() {
        for mask in [CausalMask::Full, WINDOW] {
            gqa_is_mha_on_repeated_heads(Dims { mask, ..GQA });
        }
    }

    fn gqa_is_mha_on_repeated_heads(gqa: Dims) {
        let mha = Dims { kv: gqa.nh, ..gqa };
        let qkv = random(4, gqa.b * gqa.t * gqa.qkv_width(), 2.0);
        let repeated = repeat_kv(&qkv, gqa);
        let w = random(5, gqa.b * gqa.t * gqa.out_width(), 1.0);
        for dropout in [None, Some(&SPEC)] {
            // The same masks: they are keyed per (batch, query head) in both.
            assert!(run_forward(&qkv, gqa, dropout) == run_forward(&repeated, mha, dropout), "forward");
            let (dqkv, dmha) =
                (run_backward(&qkv, &w, gqa, dropout, 3), run_backward(&repeated, &w, mha, dropout, 3));
            // dK and dV of a key/value head: its query heads' in ascending order, added in f32.
            let (hs, group) = (gqa.hs, gqa.group());
            let mut want = Vec::new();
            for row in dmha.chunks_exact(mha.qkv_width()) {
                let head = |h: usize| &row[h * hs..][..hs];
                want.extend_from_slice(&row[..gqa.nh * hs]);
                for first in (gqa.nh..3 * gqa.nh).step_by(group) {
                    let mut sum = head(first).to_vec();
                    for h in first + 1..first + group {
                        sum.iter_mut().zip(head(h)).for_each(|(s, &x)| *s += x);
                    }
                    want.extend(sum);
                }
            }
            assert!(dqkv == want, "backward, dropout {}", dropout.is_some());
        }
    }

    #[test]
    fn backward_is_the_same_for_any_number_of_groups() {
        let qkv = random(6, GQA.b * GQA.t * GQA.qkv_width(), 2.0);
        let w = random(7, GQA.b * GQA.t * GQA.out_width(), 1.0);
        for d in [GQA, Dims { mask: WINDOW, ..GQA }] {
            let one = run_backward(&qkv, &w, d, Some(&SPEC), 1);
            for groups in [3, 4] {
                assert!(run_backward(&qkv, &w, d, Some(&SPEC), groups) == one, "{groups} groups");
            }
        }
    }

    /// A window of as many keys as the sequence has is the causal mask, bit for bit, and one
    /// of fewer changes every row past it.
    #[test]
    fn a_window_as_long_as_the_sequence_is_the_causal_mask() {
        let qkv = random(8, GQA.b * GQA.t * GQA.qkv_width(), 2.0);
        let w = random(9, GQA.b * GQA.t * GQA.out_width(), 1.0);
        let full = (run_forward(&qkv, GQA, Some(&SPEC)), run_backward(&qkv, &w, GQA, Some(&SPEC), 2));
        let whole = Dims { mask: CausalMask::Window(GQA.t), ..GQA };
        assert!(
            (run_forward(&qkv, whole, Some(&SPEC)), run_backward(&qkv, &w, whole, Some(&SPEC), 2)) == full
        );
        let (out, _, _) = run_forward(&qkv, Dims { mask: CausalMask::Window(GQA.t - 1), ..GQA }, None);
        let (want, _, _) = run_forward(&qkv, GQA, None);
        let last_row = |o: &[f32]| o[(GQA.t - 1) * GQA.out_width()..][..GQA.out_width()].to_vec();
        assert!(out[..(GQA.t - 1) * GQA.out_width()] == want[..(GQA.t - 1) * GQA.out_width()]);
        assert!(
            last_row(&out).iter().zip(last_row(&want)).all(|(a, b)| a != &b),
            "the last row sees one key less"
        );
    }
}
