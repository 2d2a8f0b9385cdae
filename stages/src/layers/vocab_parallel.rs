//! The output layer and cross-entropy over a vocabulary split across the tensor-parallel
//! group (Megatron's `vocab_parallel_cross_entropy`): each rank multiplies by its rows of the
//! output layer, and the group exchanges only three numbers per token (the row's max, its
//! sum of exponentials below that max, and the target's logit where the rank holds it),
//! never the logits. From them every rank has the whole softmax's max and sum, so the loss
//! and its own columns of dloss/dlogits; its part of the input gradient is summed over the
//! group.
//!
//! Everything stays on the device: the statistics ([`Device::vocab_shard_stats`]), their
//! all-gather over the group ([t, N, 3], as sequence parallelism's rows are gathered), the
//! whole rows' combined in rank order ([`Device::vocab_shard_combine`]) and, from them, the
//! dlogits in place ([`Device::vocab_shard_dlogits`]): no host sync (MPI's bytes excepted).

use crate::dist::TensorGroup;
use kernels::{Category, ClassifierGrad, Device, Tensor, WeightLayout};

/// [`Device::classifier`]'s contract over this rank's rows `weight` [V/t, C] of the output
/// layer: losses [N] of the whole vocabulary; with `grad`, dinp [N,C] (overwrite: this rank's
/// part, which the caller sums over the group) and dweight [V/t, C] += this rank's rows.
/// `targets` [N] as this rank numbers its rows (another rank's as [`kernels::OTHER_SHARD`]).
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
    let mut logits = dev.empty_of(inp.dtype(), &[n, v], Category::Workspace); // [N,V/t]
    dev.matmul_forward(&mut logits, inp, weight, WeightLayout::OutIn, None);
    let mut stats = dev.empty(&[n, 3], Category::Workspace); // [N,3]
    dev.vocab_shard_stats(&mut stats, &logits, targets);
    let members = tp.all_gather_parts(&stats, dev, &[tp.size(), n, 3]); // [t,N,3]
    let mut rows = dev.empty(&[n, 2], Category::Workspace); // [N,2]
    dev.vocab_shard_combine(losses, &mut rows, &members);
    let Some(grad) = grad else { return };
    dev.vocab_shard_dlogits(&mut logits, &rows, targets, grad.scale);
    let dlogits = logits; // [N,V/t], overwritten in place
    dev.matmul_backward_input(grad.dinp, &dlogits, weight, WeightLayout::OutIn);
    dev.matmul_backward_weight(grad.dweight, None, &dlogits, inp, WeightLayout::OutIn);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::cpu::CpuDevice;
    use kernels::OTHER_SHARD;

    /// Two shards' statistics combine to the whole row's loss and gradient: the loss of
    /// log-sum-exp over both halves, and each half's columns of the whole gradient.
    #[test]
    fn two_shards_give_the_whole_rows_loss_and_gradient() {
        let dev = CpuDevice::new(1);
        // Two rows of 6 logits; targets 1 (first half) and 4 (second half).
        let logits = [0.5f32, 2.0, -1.0, 3.0, 0.25, 1.5, -2.0, 0.0, 1.0, 4.0, -0.5, 2.5];
        let targets = [1u32, 4];
        let whole = |row: &[f32], t: usize| {
            let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
            let grad: Vec<f64> = row.iter().map(|&x| (x as f64).exp() / lse.exp()).collect();
            (lse - row[t] as f64, grad)
        };
        let half = |h: usize| -> (Tensor, Vec<u32>) {
            let cols: Vec<f32> = logits.chunks(6).flat_map(|r| r[3 * h..3 * h + 3].to_vec()).collect();
            let t = targets.map(|t| {
                if (3 * h..3 * h + 3).contains(&(t as usize)) {
                    t - 3 * h as u32
                } else {
                    OTHER_SHARD
                }
            });
            (dev.from_host(&cols, &[2, 3], Category::Workspace), t.to_vec())
        };
        let mut halves = [half(0), half(1)];
        let stats: Vec<Vec<f32>> = halves
            .iter()
            .map(|(l, t)| {
                let mut stats = dev.empty(&[2, 3], Category::Workspace);
                dev.vocab_shard_stats(&mut stats, l, t);
                dev.to_host(&stats)
            })
            .collect();
        let stats = dev.from_host(&stats.concat(), &[2, 2, 3], Category::Workspace);
        let mut losses = dev.empty(&[2], Category::Workspace);
        let mut rows = dev.empty(&[2, 2], Category::Workspace);
        dev.vocab_shard_combine(&mut losses, &mut rows, &stats);
        for (n, loss) in dev.to_host(&losses).iter().enumerate() {
            let (want, _) = whole(&logits[6 * n..6 * n + 6], targets[n] as usize);
            assert!((*loss as f64 - want).abs() < 1e-6, "row {n}: {loss} vs {want}");
        }
        for (l, t) in &mut halves {
            dev.vocab_shard_dlogits(l, &rows, t, 0.5);
        }
        let [d0, d1] = halves.map(|(l, _)| dev.to_host(&l));
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
