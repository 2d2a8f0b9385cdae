//! Softmax cross-entropy over the vocabulary, fused with its gradient.

use super::math::{exp, lane_sum3, max, sum};
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
}
