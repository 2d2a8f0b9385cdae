//! The head: final LayerNorm, LM head tied to the token embedding, softmax cross-entropy.
//!
//! The loss and dloss/dlogits are computed together in forward (the logits buffer becomes
//! the gradient in place), so the head keeps one [B,T,V] tensor, not two.

use super::weight_grads::{GradTarget, WeightGrad, WeightGrads};
use crate::shape::GptShape;
use kernels::{Category, Device, Tensor, WeightLayout};
use std::sync::Arc;

/// What the head keeps for backward.
pub struct HeadActs {
    /// The last block's output, ln_f's input [B,T,C].
    pub input: Tensor,
    /// ln_f(input) [B,T,C], the LM head's input.
    pub lnf: Tensor,
    /// [B,T] each
    pub mean: Tensor,
    pub rstd: Tensor,
    /// dloss/dlogits [B,T,V], already scaled by the loss's averaging factor.
    pub dlogits: Tensor,
}

/// Forward and loss. x [B,T,C]; targets [B*T]. Returns the per-token losses [B*T] (host)
/// and, when `grad_scale` is Some (training), what backward needs.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    dev: &dyn Device,
    s: &GptShape,
    wte: &Tensor,
    ln_w: &Tensor,
    ln_b: &Tensor,
    mut x: Tensor,
    targets: &[u32],
    grad_scale: Option<f32>,
) -> (Vec<f32>, Option<HeadActs>) {
    let (b, t, c) = (s.micro_batch, s.seq_len, s.hidden);
    let keep = if grad_scale.is_some() { Category::Activations } else { Category::Workspace };
    x.recategorize(keep);
    let mut lnf = dev.zeros(&[b, t, c], keep); // [B,T,C]
    let mut mean = dev.zeros(&[b, t], keep); // [B,T]
    let mut rstd = dev.zeros(&[b, t], keep); // [B,T]
    dev.layernorm_forward(&mut lnf, &mut mean, &mut rstd, &x, ln_w, ln_b);
    let mut logits = dev.zeros(&[b, t, s.vocab], keep); // [B,T,V]
    dev.matmul_forward(&mut logits, &lnf, wte, WeightLayout::OutIn, None);
    let mut losses = dev.zeros(&[b, t], Category::Workspace); // [B,T]
    dev.cross_entropy(&mut losses, &mut logits, targets, grad_scale);
    let losses = dev.to_host(&losses);
    let acts = grad_scale.map(|_| HeadActs { input: x, lnf, mean, rstd, dlogits: logits });
    (losses, acts)
}

/// Backward; returns dx [B,T,C]. ln_f's gradients accumulate into `dln_w`, `dln_b`; the
/// LM head's gradient of wte goes through `weight_grads` to `wte_target`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dev: &dyn Device,
    s: &GptShape,
    wte: &Tensor,
    ln_w: &Tensor,
    acts: HeadActs,
    grads: &mut [Tensor],
    ln_f_index: usize,
    head_wte: Option<&mut Tensor>,
    wte_target: GradTarget,
    weight_grads: &mut WeightGrads,
) -> Tensor {
    let (b, t, c) = (s.micro_batch, s.seq_len, s.hidden);
    let dlogits = Arc::new(acts.dlogits);
    let mut dlnf = dev.zeros(&[b, t, c], Category::Workspace); // [B,T,C]
    dev.matmul_backward_input(&mut dlnf, &dlogits, wte, WeightLayout::OutIn);
    let wg = WeightGrad {
        target: wte_target,
        layout: WeightLayout::OutIn,
        inp: Arc::new(acts.lnf),
        dout: dlogits,
    };
    weight_grads.push(dev, grads, head_wte, wg);
    let mut dx = dev.zeros(&[b, t, c], Category::Workspace); // [B,T,C]
    let (gw, gb) = grads[ln_f_index..].split_at_mut(1);
    dev.layernorm_backward(&mut dx, &mut gw[0], &mut gb[0], &dlnf, &acts.input, ln_w, &acts.mean, &acts.rstd);
    dx
}
