//! Softmax cross-entropy over the vocabulary, fused with its gradient; and the same split
//! around a tensor-parallel group's exchange, for a rank that holds a shard of the
//! vocabulary (`shard_stats`, the group's `shard_combine` of every rank's, then
//! `shard_dlogits`).

use super::math::{exp, lane_sum3, max, sum};
use crate::op_args::OTHER_SHARD;
use rayon::prelude::*;

/// losses [N] = -log softmax(logits [N,V])[targets [N]]. With `grad_scale` s, logits is
/// overwritten with s * (softmax - onehot(target)), the gradient of s * sum(losses).
pub fn forward_backward(losses: &mut [f32], logits: &mut [f32], targets: &[u32], grad_scale: Option<f32>) {
    if losses.is_empty() {
        return;
    }
    let v = logits.len() / losses.len();
    logits.par_chunks_mut(v).zip(losses.par_iter_mut()).zip(targets.par_iter()).for_each(
        |((row, loss), &target)| {
            let target = target as usize;
            assert!(target < v, "target {target} outside the vocabulary of {v}");
            // Subtracting the row max keeps every exp <= 1: no overflow for any logits.
            let row_max = max(row);
            let target_logit = row[target];
            let sum_exp = match grad_scale {
                Some(_) => {
                    row.iter_mut().for_each(|x| *x = exp(*x - row_max));
                    sum(row)
                }
                None => lane_sum3(row, row, row, |x, _, _| exp(x - row_max)),
            };
            *loss = sum_exp.ln() - (target_logit - row_max);
            if let Some(s) = grad_scale {
                let k = s / sum_exp;
                row.iter_mut().for_each(|x| *x *= k);
                row[target] -= s;
            }
        },
    );
}

/// stats [N,3] = for each row of a shard's logits [N, V/t]: its max, its sum of
/// exp(logit - max), and its target's logit, 0 for a target that is [`OTHER_SHARD`].
pub fn shard_stats(stats: &mut [f32], logits: &[f32], targets: &[u32]) {
    if targets.is_empty() {
        return;
    }
    let v = logits.len() / targets.len();
    stats.par_chunks_mut(3).zip(logits.par_chunks(v)).zip(targets.par_iter()).for_each(
        |((stats, row), &target)| {
            let row_max = max(row);
            let sum_exp = lane_sum3(row, row, row, |x, _, _| exp(x - row_max));
            let target_logit = if target == OTHER_SHARD { 0.0 } else { row[target as usize] };
            stats.copy_from_slice(&[row_max, sum_exp, target_logit]);
        },
    );
}

/// The whole rows from the group's statistics `stats` [t, N, 3] (every rank's
/// [`shard_stats`], in rank order), combined in rank order: the max of the maxima, each sum
/// rescaled to it, the one target logit (the others report 0). losses [N] = log(sum) -
/// (target - max); rows [N,2] = (max, sum), what [`shard_dlogits`] takes.
pub fn shard_combine(losses: &mut [f32], rows: &mut [f32], stats: &[f32]) {
    let n = losses.len();
    let members: Vec<&[f32]> = stats.chunks(3 * n.max(1)).collect();
    for (i, (loss, row)) in losses.iter_mut().zip(rows.chunks_mut(2)).enumerate() {
        let stat = |m: &[f32], k: usize| m[3 * i + k];
        let max = members.iter().map(|m| stat(m, 0)).fold(f32::NEG_INFINITY, f32::max);
        let sum_exp: f32 = members.iter().map(|m| stat(m, 1) * (stat(m, 0) - max).exp()).sum();
        let target: f32 = members.iter().map(|m| stat(m, 2)).sum();
        *loss = sum_exp.ln() - (target - max);
        row.copy_from_slice(&[max, sum_exp]);
    }
}

/// Overwrites a shard's logits [N, V/t] with s * (softmax - onehot(target)) on its columns,
/// the softmax the whole row's: `rows` [N,2] holds the whole row's max and its sum of
/// exp(logit - max).
pub fn shard_dlogits(logits: &mut [f32], rows: &[f32], targets: &[u32], s: f32) {
    if targets.is_empty() {
        return;
    }
    let v = logits.len() / targets.len();
    logits.par_chunks_mut(v).zip(rows.par_chunks(2)).zip(targets.par_iter()).for_each(
        |((row, whole), &target)| {
            let (row_max, k) = (whole[0], s / whole[1]);
            row.iter_mut().for_each(|x| *x = exp(*x - row_max) * k);
            if target != OTHER_SHARD {
                row[target as usize] -= s;
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::{assert_close, finite_diff, random, to_f64};

    const N: usize = 6;
    const V: usize = 37;
    const TARGETS: [u32; N] = [0, 36, 5, 17, 17, 2];

    fn reference(logits: &[f64]) -> Vec<f64> {
        (0..N)
            .map(|n| {
                let row = &logits[n * V..][..V];
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                lse - row[TARGETS[n] as usize]
            })
            .collect()
    }

    fn logits() -> Vec<f32> {
        let mut l = random(1, N * V, 4.0);
        l[2 * V..3 * V].iter_mut().for_each(|x| *x += 1000.0); // would overflow a naive exp
        l
    }

    #[test]
    fn loss_matches_f64_log_sum_exp_and_leaves_logits_alone() {
        let mut l = logits();
        let before = l.clone();
        let mut losses = vec![0.0; N];
        forward_backward(&mut losses, &mut l, &TARGETS, None);
        // Tolerance: 1e-6 of the largest loss.
        assert_close(&losses, &reference(&to_f64(&before)), 1e-6, "losses");
        assert_eq!(l, before);
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let s = 0.25;
        let mut l = logits();
        let fd = finite_diff(&l, |x| s as f64 * reference(x).iter().sum::<f64>());
        let mut losses = vec![0.0; N];
        forward_backward(&mut losses, &mut l, &TARGETS, Some(s));
        // Tolerance: 1e-5 of the largest gradient component.
        assert_close(&l, &fd, 1e-5, "dlogits");
        assert_close(&losses, &reference(&to_f64(&logits())), 1e-6, "losses with gradient");
    }

    /// A shard's rows, columns `cols` of each, and the targets as the shard numbers them.
    fn shard(logits: &[f32], cols: std::ops::Range<usize>) -> (Vec<f32>, Vec<u32>) {
        let rows = logits.chunks(V).flat_map(|row| row[cols.clone()].to_vec()).collect();
        let targets = TARGETS.map(|t| match cols.contains(&(t as usize)) {
            true => t - cols.start as u32,
            false => OTHER_SHARD,
        });
        (rows, targets.to_vec())
    }

    /// The vocabulary cut in two shards (15 and 22 columns, so that both hold targets), their
    /// statistics combined in rank order: the loss is the whole row's and each shard's
    /// dlogits are its columns of the whole row's, both against the fused op within f32
    /// rounding.
    #[test]
    fn two_shards_combine_to_the_whole_rows_loss_and_gradient() {
        let (s, l) = (0.25, logits());
        let (mut losses, mut want) = (vec![0.0; N], l.clone());
        forward_backward(&mut losses, &mut want, &TARGETS, Some(s));
        let halves = [shard(&l, 0..15), shard(&l, 15..V)];
        let stats: Vec<Vec<f32>> = halves
            .iter()
            .map(|(rows, targets)| {
                let mut stats = vec![f32::NAN; 3 * N];
                shard_stats(&mut stats, rows, targets);
                stats
            })
            .collect();
        let (mut combined, mut whole) = (vec![f32::NAN; N], vec![f32::NAN; 2 * N]);
        shard_combine(&mut combined, &mut whole, &stats.concat());
        for n in 0..N {
            // Exactly one shard holds the target; the other reports 0.
            let targets = [stats[0][3 * n + 2], stats[1][3 * n + 2]];
            assert!(targets.contains(&0.0), "row {n}: both shards report a target logit");
            let (loss, want) = (combined[n], losses[n]);
            assert!((loss - want).abs() <= 1e-6 * want.abs(), "row {n}: {loss} vs {want}");
        }
        let got: Vec<Vec<f32>> = halves
            .into_iter()
            .map(|(mut rows, targets)| {
                shard_dlogits(&mut rows, &whole, &targets, s);
                rows
            })
            .collect();
        let (left, right) = (shard(&want, 0..15).0, shard(&want, 15..V).0);
        assert_close(&got[0], &to_f64(&left), 1e-6, "first shard's dlogits");
        assert_close(&got[1], &to_f64(&right), 1e-6, "second shard's dlogits");
    }
}
