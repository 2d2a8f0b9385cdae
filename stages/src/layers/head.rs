//! The head: final norm, output layer (the token embedding where tied), softmax
//! cross-entropy.
//!
//! In training the output layer's whole backward runs in forward, as llm.c does, inside one
//! device op (`Device::classifier`): the loss and dloss/dlogits come out of one pass over the
//! logits (in place), dlogits goes straight into the gradients of the final norm's output
//! and of the output weight, and is freed. The head then keeps only what the norm's backward
//! reads, [B,T,C]-sized, instead of a [B,T,V] dlogits per microbatch in flight (for GPT-2
//! small at T = 1024, 6 MiB instead of 202 MiB). How the logits are laid out (the CUDA
//! device pads their rows) is the device's. Under tensor parallelism the output layer is
//! vocabulary-parallel ([`super::vocab_parallel`]).

use super::norm::{NormLayer, NormStats};
use super::vocab_parallel;
use crate::dist::TensorGroup;
use crate::model::ModelShape;
use crate::tensor_parallel::Shard;
use kernels::{Category, ClassifierGrad, Device, Tensor};

/// What the head keeps for backward: the final norm's backward.
pub struct HeadActs {
    /// The last block's output, the final norm's input [B,T,C] (the rank's rows [R,C] with
    /// sequence parallelism, as below).
    pub input: Tensor,
    /// [B,T] | [R] each
    pub stats: NormStats,
    /// dloss/d norm(input) [B,T,C] | [R,C], from the output layer's backward run in forward.
    pub dnorm: Tensor,
}

/// The loss's gradient, for a training forward.
pub struct LossGrad<'a> {
    /// Multiplies dloss/dlogits: 1 / (B*T*microbatches) averages over the global batch.
    pub scale: f32,
    /// The output layer's weight gradient [V,C], accumulated here.
    pub dweight: &'a mut Tensor,
}

/// Forward and loss. x [B,T,C] (this rank's rows [R,C] with sequence parallelism, gathered
/// whole after the final norm); targets [B*T]; `output` [V/t,C] the output layer's weight
/// (shard `shard` of its rows).
/// Returns the per-token losses [B,T] (on the device, as workspace: the caller reduces them
/// there) and, when `grad` is Some (training), what backward needs, having added the output
/// layer's gradient into `grad.dweight`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    dev: &dyn Device,
    s: &ModelShape,
    output: &Tensor,
    norm: &NormLayer,
    mut x: Tensor,
    targets: &[u32],
    grad: Option<LossGrad>,
    shard: Shard,
    tp: &mut TensorGroup,
) -> (Tensor, Option<HeadActs>) {
    let (b, t, c) = (s.micro_batch, s.seq_len, s.hidden);
    let keep = if grad.is_some() { Category::Activations } else { Category::Workspace };
    x.recategorize(keep);
    let mut normed = dev.empty_of(x.dtype(), x.shape(), Category::Workspace); // [B,T,C] | [R,C]
    let stats = norm.forward(dev, &mut normed, &x, keep); // [B,T] | [R]
    let normed = match shard.sequence {
        true => tp.all_gather_parts(&normed, dev, &[b, t, c]),
        false => normed,
    }; // [B,T,C]
    let mut losses = dev.empty(&[b, t], Category::Workspace); // [B,T]
    let mut classifier = |losses: &mut Tensor, grad: Option<ClassifierGrad>| match shard.size {
        1 => dev.classifier(losses, &normed, output, targets, grad),
        _ => vocab_parallel::classifier(dev, losses, &normed, output, &shard.vocab_ids(s, targets), grad, tp),
    };
    let Some(grad) = grad else {
        classifier(&mut losses, None);
        return (losses, None);
    };
    // The logits [B,T,V] and their gradient live only inside the classifier. Under tensor
    // parallelism each rank's dnorm is its part, summed over the group (into rows with
    // sequence parallelism).
    let kept = if shard.sequence { Category::Workspace } else { Category::Activations };
    let mut dnorm = dev.empty_of(x.dtype(), &[b, t, c], kept); // [B,T,C]
    let head_grad = ClassifierGrad { scale: grad.scale, dinp: &mut dnorm, dweight: grad.dweight };
    classifier(&mut losses, Some(head_grad));
    let dnorm = match (shard.size, shard.sequence) {
        (1, _) => dnorm,
        (_, true) => tp.reduce_scatter_rows(dnorm, dev, shard.rows(s), Category::Activations), // [R,C]
        (_, false) => {
            tp.all_reduce(&mut dnorm, dev);
            dnorm
        }
    };
    (losses, Some(HeadActs { input: x, stats, dnorm }))
}

/// Backward: the final norm's; returns dx [B,T,C] (rows [R,C] with sequence parallelism).
/// Its gradients accumulate into `dweight` and `dbias`.
pub fn backward(
    dev: &dyn Device,
    norm: &NormLayer,
    acts: HeadActs,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
) -> Tensor {
    let mut dx = dev.empty_of(acts.input.dtype(), acts.input.shape(), Category::Workspace); // [B,T,C] | [R,C]
    norm.backward(dev, &mut dx, None, (dweight, dbias), &acts.dnorm, &acts.input, &acts.stats);
    dx
}
