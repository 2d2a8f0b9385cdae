//! The head: final LayerNorm, LM head tied to the token embedding, softmax cross-entropy.
//!
//! In training the LM head's whole backward runs in forward, as llm.c does, inside one
//! device op (`Device::classifier`): the loss and dloss/dlogits come out of one pass over the
//! logits (in place), dlogits goes straight into the gradients of ln_f's output and of wte,
//! and is freed. The head then keeps only what ln_f's backward reads, [B,T,C]-sized, instead
//! of a [B,T,V] dlogits per microbatch in flight (for GPT-2 small at T = 1024, 6 MiB instead
//! of 202 MiB). How the logits are laid out (the CUDA device pads their rows) is the device's.

use crate::shape::GptShape;
use kernels::{Category, ClassifierGrad, Device, Tensor};

/// What the head keeps for backward: ln_f's backward.
pub struct HeadActs {
    /// The last block's output, ln_f's input [B,T,C].
    pub input: Tensor,
    /// [B,T] each
    pub mean: Tensor,
    pub rstd: Tensor,
    /// dloss/d ln_f(input) [B,T,C], from the LM head's backward run in forward.
    pub dlnf: Tensor,
}

/// The loss's gradient, for a training forward.
pub struct LossGrad<'a> {
    /// Multiplies dloss/dlogits: 1 / (B*T*microbatches) averages over the global batch.
    pub scale: f32,
    /// The LM head's gradient of the tied token embedding [V,C], accumulated here.
    pub dwte: &'a mut Tensor,
}

/// Forward and loss. x [B,T,C]; targets [B*T]. Returns the per-token losses [B,T] (on the
/// device, as workspace: the caller reduces them there) and, when `grad` is Some
/// (training), what backward needs, having added the LM head's gradient into `grad.dwte`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    dev: &dyn Device,
    s: &GptShape,
    wte: &Tensor,
    ln_w: &Tensor,
    ln_b: &Tensor,
    mut x: Tensor,
    targets: &[u32],
    grad: Option<LossGrad>,
) -> (Tensor, Option<HeadActs>) {
    let (b, t, c) = (s.micro_batch, s.seq_len, s.hidden);
    let keep = if grad.is_some() { Category::Activations } else { Category::Workspace };
    x.recategorize(keep);
    let mut lnf = dev.zeros_of(x.dtype(), &[b, t, c], Category::Workspace); // [B,T,C]
    let mut mean = dev.zeros(&[b, t], keep); // [B,T]
    let mut rstd = dev.zeros(&[b, t], keep); // [B,T]
    dev.layernorm_forward(&mut lnf, &mut mean, &mut rstd, &x, ln_w, ln_b, 1e-5);
    let mut losses = dev.zeros(&[b, t], Category::Workspace); // [B,T]
    let Some(grad) = grad else {
        dev.classifier(&mut losses, &lnf, wte, targets, None);
        return (losses, None);
    };
    // The logits [B,T,V] and their gradient live only inside the classifier.
    let mut dlnf = dev.zeros_of(x.dtype(), &[b, t, c], Category::Activations); // [B,T,C]
    let head_grad = ClassifierGrad { scale: grad.scale, dinp: &mut dlnf, dweight: grad.dwte };
    dev.classifier(&mut losses, &lnf, wte, targets, Some(head_grad));
    (losses, Some(HeadActs { input: x, mean, rstd, dlnf }))
}

/// Backward: ln_f's; returns dx [B,T,C]. Its gradients accumulate into `dln_w`, `dln_b`.
pub fn backward(
    dev: &dyn Device,
    s: &GptShape,
    ln_w: &Tensor,
    acts: HeadActs,
    dln_w: &mut Tensor,
    dln_b: &mut Tensor,
) -> Tensor {
    let mut dx = dev.zeros_of(acts.input.dtype(), &[s.micro_batch, s.seq_len, s.hidden], Category::Workspace); // [B,T,C]
    dev.layernorm_backward(&mut dx, dln_w, dln_b, &acts.dlnf, &acts.input, ln_w, &acts.mean, &acts.rstd);
    dx
}
