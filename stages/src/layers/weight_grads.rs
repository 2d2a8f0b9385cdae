//! Weight gradients of the blocks' matmuls, computed at once (a plain backward) or deferred
//! to a later backward-weight action (zero-bubble schedules split backward into B and W).

use kernels::{Device, Tensor, WeightLayout};
use std::sync::Arc;

/// One matmul's pending weight gradient: dW += inp^T @ dout and db += colsum(dout), into
/// `grads[weight]` ([IC, OC], Conv1D layout) and `grads[weight + 1]` (biases follow their
/// weights).
pub struct WeightGrad {
    pub weight: usize,
    /// The matmul's input [.., IC].
    pub inp: Arc<Tensor>,
    /// The gradient of the matmul's output [.., OC].
    pub dout: Arc<Tensor>,
}

/// Collects the weight gradients of a backward pass.
pub enum WeightGrads {
    /// Compute each as soon as it is known.
    Now,
    /// Keep them, in order, for a backward-weight action.
    Deferred(Vec<WeightGrad>),
}

impl WeightGrads {
    pub fn push(&mut self, dev: &dyn Device, grads: &mut [Tensor], wg: WeightGrad) {
        match self {
            WeightGrads::Now => apply(dev, grads, &wg),
            WeightGrads::Deferred(list) => list.push(wg),
        }
    }
}

/// Accumulates one weight gradient into its target.
pub fn apply(dev: &dyn Device, grads: &mut [Tensor], wg: &WeightGrad) {
    let (gw, gb) = grads[wg.weight..].split_at_mut(1);
    dev.matmul_backward_weight(&mut gw[0], Some(&mut gb[0]), &wg.dout, &wg.inp, WeightLayout::InOut);
}
