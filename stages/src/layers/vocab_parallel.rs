//! The output layer and cross-entropy over a vocabulary split across the tensor-parallel
//! group (Megatron's `vocab_parallel_cross_entropy`): each rank multiplies by its rows of the
//! output layer, and the group exchanges only three numbers per token (the row's max, its
//! sum of exponentials below that max, and the target's logit where the rank holds it),
//! never the logits. From them every rank has the whole softmax's max and sum, so the loss
//! and its own columns of dloss/dlogits; its part of the input gradient is summed over the
//! group.
//!
//! The statistics cross the host (the collective's bytes); the logits stay where they are
//! computed. A device kernel for the row statistics is the step left for the GPU.

use crate::dist::{Reader, TensorGroup, Writer};
use kernels::{Category, ClassifierGrad, Device, Tensor, WeightLayout, OTHER_SHARD};

/// One rank's statistics of one row of its logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    pub max: f32,
    /// sum over the rank's columns of exp(logit - max)
    pub sum_exp: f32,
    /// The target's logit, 0 where another rank's columns hold the target.
    pub target: f32,
}

/// The whole row's softmax, combined from every rank's [`RowStats`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSoftmax {
    pub max: f32,
    pub sum_exp: f32,
    /// -log softmax(logits)[target]
    pub loss: f32,
}

/// The statistics of each row of `logits` [N, V/t]; `targets` [N] numbered as this rank's
/// columns, another rank's as [`OTHER_SHARD`].
pub fn row_stats(logits: &[f32], targets: &[u32]) -> Vec<RowStats> {
    let v = logits.len() / targets.len();
    logits
        .chunks_exact(v)
        .zip(targets)
        .map(|(row, &target)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum_exp = row.iter().map(|&x| (x - max).exp()).sum();
            let target = if target == OTHER_SHARD { 0.0 } else { row[target as usize] };
            RowStats { max, sum_exp, target }
        })
        .collect()
}

/// The whole rows from every member's statistics, combined in member order: the max of the
/// maxima, each sum rescaled to it, the one target logit.
pub fn combine(members: &[Vec<RowStats>]) -> Vec<RowSoftmax> {
    (0..members[0].len())
        .map(|n| {
            let max = members.iter().map(|m| m[n].max).fold(f32::NEG_INFINITY, f32::max);
            let sum_exp: f32 = members.iter().map(|m| m[n].sum_exp * (m[n].max - max).exp()).sum();
            let target: f32 = members.iter().map(|m| m[n].target).sum();
            RowSoftmax { max, sum_exp, loss: sum_exp.ln() - (target - max) }
        })
        .collect()
}

/// Overwrites `logits` [N, V/t] with scale * (softmax - onehot(target)) on this rank's
/// columns: the gradient of scale * sum(losses).
pub fn dlogits(logits: &mut [f32], rows: &[RowSoftmax], targets: &[u32], scale: f32) {
    let v = logits.len() / targets.len();
    for ((row, r), &target) in logits.chunks_exact_mut(v).zip(rows).zip(targets) {
        let k = scale / r.sum_exp;
        row.iter_mut().for_each(|x| *x = (*x - r.max).exp() * k);
        if target != OTHER_SHARD {
            row[target as usize] -= scale;
        }
    }
}

fn encode(stats: &[RowStats]) -> Vec<u8> {
    let flat: Vec<f32> = stats.iter().flat_map(|r| [r.max, r.sum_exp, r.target]).collect();
    let mut w = Writer::default();
    w.f32s(&flat);
    w.0
}

fn decode(bytes: &[u8]) -> Vec<RowStats> {
    let flat = Reader(bytes).f32s().expect("the group's members encode their statistics alike");
    flat.chunks_exact(3).map(|r| RowStats { max: r[0], sum_exp: r[1], target: r[2] }).collect()
}

/// [`Device::classifier`]'s contract over this rank's rows `weight` [V/t, C] of the output
/// layer: losses [N] of the whole vocabulary; with `grad`, dinp [N,C] (overwrite: this rank's
/// part, which the caller sums over the group) and dweight [V/t, C] += this rank's rows. `targets` [N] as this rank numbers
/// its rows (another rank's as [`OTHER_SHARD`]).
pub fn classifier(
    dev: &dyn Device,
    losses: &mut Tensor,
    inp: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    grad: Option<ClassifierGrad>,
    tp: &mut TensorGroup,
) {
    let (n, v) = (targets.len(), weight.shape()[0]);
    let mut logits = dev.empty(&[n, v], Category::Workspace); // [N,V/t]
    dev.matmul_forward(&mut logits, inp, weight, WeightLayout::OutIn, None);
    let mut host = dev.to_host(&logits);
    drop(logits);
    let members: Vec<Vec<RowStats>> =
        tp.all_gather(&encode(&row_stats(&host, targets))).iter().map(|b| decode(b)).collect();
    let rows = combine(&members);
    let row_losses: Vec<f32> = rows.iter().map(|r| r.loss).collect();
    dev.copy(losses, &dev.from_host(&row_losses, losses.shape(), Category::Workspace));
    let Some(grad) = grad else { return };
    dlogits(&mut host, &rows, targets, grad.scale);
    let dlogits = dev.from_host(&host, &[n, v], Category::Workspace); // [N,V/t]
    dev.matmul_backward_input(grad.dinp, &dlogits, weight, WeightLayout::OutIn);
    dev.matmul_backward_weight(grad.dweight, None, &dlogits, inp, WeightLayout::OutIn);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two shards' statistics combine to the whole row's loss and gradient: the loss of
    /// log-sum-exp over both halves, and each half's columns of the whole gradient.
    #[test]
    fn two_shards_give_the_whole_rows_loss_and_gradient() {
        // Two rows of 6 logits; targets 1 (first half) and 4 (second half).
        let logits = [0.5f32, 2.0, -1.0, 3.0, 0.25, 1.5, -2.0, 0.0, 1.0, 4.0, -0.5, 2.5];
        let targets = [1u32, 4];
        let whole = |row: &[f32], t: usize| {
            let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
            let grad: Vec<f64> = row.iter().map(|&x| (x as f64).exp() / lse.exp()).collect();
            (lse - row[t] as f64, grad)
        };
        let half = |h: usize| -> (Vec<f32>, Vec<u32>) {
            let cols: Vec<f32> = logits.chunks(6).flat_map(|r| r[3 * h..3 * h + 3].to_vec()).collect();
            let t = targets.map(|t| {
                if (3 * h..3 * h + 3).contains(&(t as usize)) {
                    t - 3 * h as u32
                } else {
                    OTHER_SHARD
                }
            });
            (cols, t.to_vec())
        };
        let (h0, h1) = (half(0), half(1));
        let rows = combine(&[row_stats(&h0.0, &h0.1), row_stats(&h1.0, &h1.1)]);
        for (n, r) in rows.iter().enumerate() {
            let (loss, _) = whole(&logits[6 * n..6 * n + 6], targets[n] as usize);
            assert!((r.loss as f64 - loss).abs() < 1e-6, "row {n}: {} vs {loss}", r.loss);
        }
        let (mut d0, mut d1) = (h0.0.clone(), h1.0.clone());
        dlogits(&mut d0, &rows, &h0.1, 0.5);
        dlogits(&mut d1, &rows, &h1.1, 0.5);
        for n in 0..2 {
            let (_, mut grad) = whole(&logits[6 * n..6 * n + 6], targets[n] as usize);
            grad[targets[n] as usize] -= 1.0;
            let got = [&d0[3 * n..3 * n + 3], &d1[3 * n..3 * n + 3]].concat();
            for (g, w) in got.iter().zip(&grad) {
                assert!((*g as f64 - 0.5 * w).abs() < 1e-7, "row {n}: {got:?} vs {grad:?}");
            }
        }
    }
}
