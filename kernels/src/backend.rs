//! What a backend implements for the ops of [`Device`](crate::Device), one trait per kernel
//! family. [`Device`](crate::Device)'s op methods check the shapes (`shapes.rs`) and then
//! call these, so a backend's implementation assumes shapes that fit and gets the sizes the
//! checks derived. Each CUDA family implements its trait in its own file of `cuda/`, beside
//! its `.cu` source; callers use [`Device`](crate::Device), never these.
//!
//! Every method's contract is the [`Device`](crate::Device) method of the same name
//! without `_impl`.

use crate::attention::{AttentionSaved, CausalMask};
use crate::dropout::DropoutSpec;
use crate::gate::Gate;
use crate::memory::Category;
use crate::op_args::{AdamWStep, AdamWTensor, ClassifierGrad, WeightLayout};
use crate::qk_norm::QkNormRows;
use crate::readout::Readout;
use crate::rope_frequencies::RopeFrequencies;
use crate::shapes::{MatmulDims, QkvDims};
use crate::tensor::{DType, Tensor};
use std::ops::Range;

/// Buffers with a shape to check: uploads and copies.
pub trait Buffers {
    /// `data` holds as many values as `shape` has elements. (A device method, as
    /// [`Device::from_host_of`](crate::Device::from_host_of) is.)
    #[allow(clippy::wrong_self_convention)]
    fn from_host_of_impl(&self, dtype: DType, data: &[f32], shape: &[usize], category: Category) -> Tensor;
    /// dst[at..at + part.len()] = src[part], of one dtype, both ranges within their tensors.
    fn copy_impl(&self, dst: &mut Tensor, at: usize, src: &Tensor, part: Range<usize>);
    /// t is f32 and holds `from + data.len()` elements.
    fn write_at_impl(&self, t: &mut Tensor, from: usize, data: &[f32]);
    /// t is on the device; it becomes its copy in the host ledger, as activations.
    fn offload_impl(&self, t: &mut Tensor);
    /// t is a host copy [`Buffers::offload_impl`] made; it becomes its copy on the device.
    fn reload_impl(&self, t: &mut Tensor, category: Category);
}

/// acc += x and out = a + b, all of one length.
pub trait Elementwise {
    fn accumulate_impl(&self, acc: &mut Tensor, x: &Tensor);
    fn add_impl(&self, out: &mut Tensor, a: &Tensor, b: &Tensor);
    fn add_scalar_impl(&self, out: &mut Tensor, a: &Tensor, s: f32);
    fn scale_impl(&self, t: &mut Tensor, s: f32);
}

/// The values a step leaves for the host; the slots are within the readout.
pub trait Readouts {
    fn loss_mean_impl(&self, out: &mut Readout, slot: usize, losses: &Tensor);
    /// Each part's range lies within its tensor.
    fn sum_squares_into_impl(&self, out: &mut Readout, first: usize, parts: &[(&Tensor, Range<usize>)]);
}

/// `btc` is [B,T,C] of out (dout), the tokens below wte's rows.
pub trait Embedding {
    fn embedding_forward_impl(
        &self,
        out: &mut Tensor,
        tokens: &[u32],
        wte: &Tensor,
        wpe: Option<&Tensor>,
        btc: [usize; 3],
    );
    fn embedding_backward_impl(
        &self,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
        dout: &Tensor,
        tokens: &[u32],
        btc: [usize; 3],
    );
}

/// The backward's `dresidual`, where given, is the gradient added to the input gradient:
/// `layernorm_residual_backward`'s; None for `layernorm_backward`.
pub trait LayerNorm {
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward_impl(
        &self,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    );
    #[allow(clippy::too_many_arguments)]
    fn layernorm_residual_forward_impl(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    );
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward_impl(
        &self,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        dweight: &mut Tensor,
        dbias: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
    );
}

/// As [`LayerNorm`]: the backward's `dresidual` is `rmsnorm_residual_backward`'s.
pub trait RmsNorm {
    fn rmsnorm_forward_impl(
        &self,
        out: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        eps: f32,
    );
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_residual_forward_impl(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        eps: f32,
    );
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward_impl(
        &self,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        dweight: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
    );
    /// As [`crate::Device::qk_norm_forward`], or with `summed` (the parts of a row) as
    /// [`crate::Device::qk_norm_forward_summed`], `rstd` then holding the group's sums of
    /// squares on entry: weights [q, k].
    fn qk_norm_forward_impl(
        &self,
        qkv: &mut Tensor,
        rstd: &mut Tensor,
        weights: [&Tensor; 2],
        rows: QkNormRows,
        summed: Option<usize>,
        eps: f32,
    );
    /// As [`crate::Device::qk_norm_sum_squares`].
    fn qk_norm_sum_squares_impl(&self, qkv: &Tensor, sums: &mut Tensor, rows: QkNormRows);
    /// As [`crate::Device::qk_norm_backward`], or with `summed` (the group's dots and the
    /// parts of a row) as [`crate::Device::qk_norm_backward_summed`]: dweights and weights
    /// [q, k].
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_backward_impl(
        &self,
        dqkv: &mut Tensor,
        dweights: [&mut Tensor; 2],
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        rows: QkNormRows,
        summed: Option<(&Tensor, usize)>,
    );
    /// As [`crate::Device::qk_norm_backward_dots`].
    fn qk_norm_backward_dots_impl(
        &self,
        dqkv: &Tensor,
        inp: &Tensor,
        weights: [&Tensor; 2],
        rstd: &Tensor,
        dots: &mut Tensor,
        rows: QkNormRows,
    );
}

/// `dims` as the weight's layout reads them; a bias (gradient) has OC elements.
pub trait Matmul {
    fn matmul_forward_impl(
        &self,
        out: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        bias: Option<&Tensor>,
        dims: MatmulDims,
    );
    fn matmul_backward_input_impl(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        dims: MatmulDims,
    );
    /// `gelu_input` [N,IC] is the GELU's input whose output the matmul read.
    fn matmul_backward_input_gelu_impl(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        gelu_input: &Tensor,
        dims: MatmulDims,
    );
    fn matmul_backward_weight_impl(
        &self,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
        dout: &Tensor,
        inp: &Tensor,
        layout: WeightLayout,
        dims: MatmulDims,
    );
}

/// `matmul_backward_input_gelu` as two ops, the product into a gradient of its own and then
/// GELU's backward: the CPU's way, and CUDA's where cuBLASLt does not fuse the two.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_backward_input_then_gelu<D: crate::Device + ?Sized>(
    dev: &D,
    dinp: &mut Tensor,
    dout: &Tensor,
    weight: &Tensor,
    layout: WeightLayout,
    gelu_input: &Tensor,
    dims: MatmulDims,
) {
    let mut dact = dev.empty_of(dinp.dtype(), dinp.shape(), Category::Workspace);
    dev.matmul_backward_input_impl(&mut dact, dout, weight, layout, dims);
    dev.gelu_backward_impl(dinp, gelu_input, &dact);
}

/// `dims` of qkv; out, dout and dqkv fit them. What `saved` holds is the backend's to check.
pub trait Attention {
    fn attention_forward_impl(
        &self,
        out: Option<&mut Tensor>,
        saved: &mut AttentionSaved,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        dims: QkvDims,
        mask: CausalMask,
    );
    #[allow(clippy::too_many_arguments)]
    fn attention_backward_impl(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        out: &Tensor,
        qkv: &Tensor,
        saved: &AttentionSaved,
        dropout: Option<DropoutSpec>,
        dims: QkvDims,
        mask: CausalMask,
    );
}

/// `dims` of qkv (dqkv), the head size even.
pub trait Rope {
    fn rope_forward_impl(
        &self,
        qkv: &mut Tensor,
        dims: QkvDims,
        freqs: RopeFrequencies,
        first_position: usize,
    );
    fn rope_backward_impl(&self, dqkv: &mut Tensor, dims: QkvDims, freqs: RopeFrequencies);
}

/// All tensors of one length.
pub trait Gelu {
    fn gelu_forward_impl(&self, out: &mut Tensor, inp: &Tensor);
    fn gelu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor);
}

/// All tensors of one length.
pub trait SquaredRelu {
    fn squared_relu_forward_impl(&self, out: &mut Tensor, inp: &Tensor);
    fn squared_relu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor);
}

/// `f` is F: out (dout) [N,F], inp and dinp [N,2F].
pub trait Glu {
    fn glu_forward_impl(&self, out: &mut Tensor, inp: &Tensor, f: usize, gate: Gate);
    fn glu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor, f: usize, gate: Gate);
}

/// out = inp * the mask, of one length: dropout's forward on activations and its backward
/// on gradients alike.
pub trait Dropout {
    fn dropout_impl(&self, out: &mut Tensor, inp: &Tensor, dropout: &DropoutSpec);
}

/// `rows` is (N, V): N rows (losses and targets) over a vocabulary of V, every target below it.
/// The vocab_shard ops are the classifier's loss split around a tensor-parallel exchange.
pub trait Classifier {
    fn classifier_impl(
        &self,
        losses: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        targets: &[u32],
        grad: Option<ClassifierGrad>,
        rows: (usize, usize),
    );
    /// `rows` is (N, V/t), checked by [`crate::Device::vocab_shard_stats`].
    fn vocab_shard_stats_impl(
        &self,
        stats: &mut Tensor,
        logits: &Tensor,
        targets: &[u32],
        rows: (usize, usize),
    );
    /// `dims` is (N, t), checked by [`crate::Device::vocab_shard_combine`].
    fn vocab_shard_combine_impl(
        &self,
        losses: &mut Tensor,
        rows: &mut Tensor,
        stats: &Tensor,
        dims: (usize, usize),
    );
    /// `dims` is (N, V/t), checked by [`crate::Device::vocab_shard_dlogits`].
    fn vocab_shard_dlogits_impl(
        &self,
        logits: &mut Tensor,
        rows: &Tensor,
        targets: &[u32],
        scale: f32,
        dims: (usize, usize),
    );
}

/// AdamW on many tensors, each checked by [`crate::Device::adamw_tensors`]: param and grad of
/// one length, m and v of another, the part `from..from + m.len()` of param and grad that
/// they hold the moments of.
pub trait AdamW {
    fn adamw_impl(&self, tensors: &mut [AdamWTensor<'_>], hp: &AdamWStep);
}
