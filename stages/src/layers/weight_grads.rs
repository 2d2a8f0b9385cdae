//! Weight gradients of matmuls, computed at once (a plain backward) or deferred to a later
//! backward-weight action (zero-bubble schedules split backward into B and W).

use kernels::{Device, Tensor, WeightLayout};
use std::sync::Arc;

/// Where a weight gradient accumulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradTarget {
    /// `grads[weight]` and, with a bias, `grads[weight + 1]` (biases follow their weights).
    Param { weight: usize, bias: bool },
    /// The LM head's gradient of the tied token embedding.
    HeadWte,
}

/// One matmul's pending weight gradient: dW += inp^T @ dout (and db += colsum(dout)).
pub struct WeightGrad {
    pub target: GradTarget,
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
    pub fn push(
        &mut self,
        dev: &dyn Device,
        grads: &mut [Tensor],
        head_wte: Option<&mut Tensor>,
        wg: WeightGrad,
    ) {
        match self {
            WeightGrads::Now => apply(dev, grads, head_wte, &wg),
            WeightGrads::Deferred(list) => list.push(wg),
        }
    }

    /// Bytes the deferred gradients hold alive (their inputs and output gradients).
    pub fn held_bytes(&self) -> usize {
        match self {
            WeightGrads::Now => 0,
            WeightGrads::Deferred(list) => list.iter().map(|w| w.inp.bytes() + w.dout.bytes()).sum(),
        }
    }
}

/// Accumulates one weight gradient into its target.
pub fn apply(dev: &dyn Device, grads: &mut [Tensor], head_wte: Option<&mut Tensor>, wg: &WeightGrad) {
    match wg.target {
        GradTarget::Param { weight, bias: true } => {
            let (gw, gb) = grads[weight..].split_at_mut(1);
            dev.matmul_backward_weight(&mut gw[0], Some(&mut gb[0]), &wg.dout, &wg.inp, wg.layout);
        }
        GradTarget::Param { weight, bias: false } => {
            dev.matmul_backward_weight(&mut grads[weight], None, &wg.dout, &wg.inp, wg.layout);
        }
        GradTarget::HeadWte => {
            let g = head_wte.expect("HeadWte gradient without a head");
            dev.matmul_backward_weight(g, None, &wg.dout, &wg.inp, wg.layout);
        }
    }
}
