//! Weight gradients of the blocks' matmuls, computed at once (a plain backward) or deferred
//! to a later backward-weight action (zero-bubble schedules split backward into B and W).

use super::pair_mut;
use kernels::{Device, Tensor, WeightLayout};
use std::sync::Arc;

/// One matmul's pending weight gradient: dW += inp^T @ dout (in `layout`) into
/// `grads[weight]` and, where the matmul has a bias, db += colsum(dout) into `grads[bias]`.
pub struct WeightGrad {
    pub weight: usize,
    pub bias: Option<usize>,
    pub layout: WeightLayout,
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

/// Accumulates one weight gradient into its targets.
pub fn apply(dev: &dyn Device, grads: &mut [Tensor], wg: &WeightGrad) {
    match wg.bias {
        Some(bias) => {
            let (dw, db) = pair_mut(grads, wg.weight, bias);
            dev.matmul_backward_weight(dw, Some(db), &wg.dout, &wg.inp, wg.layout);
        }
        None => dev.matmul_backward_weight(&mut grads[wg.weight], None, &wg.dout, &wg.inp, wg.layout),
    }
}
