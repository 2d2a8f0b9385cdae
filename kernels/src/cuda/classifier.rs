//! The LM head and its loss (`Device::classifier`): the logits GEMM into rows padded to
//! [`padded_vocab`] columns, the fused classifier kernel (softmax, loss and dlogits in place,
//! one block per row), then the head's two backward GEMMs reading dlogits from the same
//! buffer, which is freed on return. wte itself stays [V,C] (checkpoints, the embedding and
//! the optimizer never see the padding); only the logits' rows are padded, and, under bf16,
//! wte's bf16 copy. The logits are in the activations' dtype.

use super::device::CudaDevice;
use super::launch::{per_item, per_row_block};
use super::sources::kernel_name;
use super::views::{buf, buf_mut, cu, cu_mut, int};
use crate::backend::Classifier;
use crate::device::{padded_vocab, Device};
use crate::memory::Category;
use crate::op_args::ClassifierGrad;
use crate::tensor::Tensor;

impl Classifier for CudaDevice {
    fn classifier_impl(
        &self,
        losses: &mut Tensor,
        inp: &Tensor,
        wte: &Tensor,
        targets: &[u32],
        grad: Option<ClassifierGrad>,
        (n, v): (usize, usize),
    ) {
        if n == 0 {
            return;
        }
        let vp = padded_vocab(v);
        // [N,Vp] in the activations' dtype: the f32 GEMM writes each row's first V columns,
        // the bf16 one all Vp (zero in the padding, from the copy's zero rows); the kernel
        // never reads the padding and, with a gradient, writes it as zero.
        let mut logits = self.empty_of(inp.dtype(), &[n, vp], Category::Workspace);
        let weight = self.head_weight(wte, inp, vp);
        self.head_forward(&mut logits, inp, &weight);
        let targets = self.upload(targets);
        let scale = grad.as_ref().map_or(0.0, |g| g.scale);
        let (v_i, vp_i, write_grad) = (int(v), int(vp), grad.is_some() as i32);
        launch!(
            self,
            kernel_name("fused_classifier", logits.dtype()),
            per_row_block(n),
            cu_mut(losses),
            buf_mut(&mut logits),
            &*targets,
            &v_i,
            &vp_i,
            &write_grad,
            &scale
        );
        if let Some(grad) = grad {
            self.head_backward(grad.dinp, grad.dweight, &logits, inp, &weight);
        }
    }

    fn vocab_shard_stats_impl(
        &self,
        stats: &mut Tensor,
        logits: &Tensor,
        targets: &[u32],
        (n, v): (usize, usize),
    ) {
        if n == 0 {
            return;
        }
        let (targets, v) = (self.upload(targets), int(v));
        let kernel = kernel_name("vocab_shard_stats", logits.dtype());
        launch!(self, kernel, per_row_block(n), cu_mut(stats), buf(logits), &*targets, &v);
    }

    fn vocab_shard_combine_impl(
        &self,
        losses: &mut Tensor,
        rows: &mut Tensor,
        stats: &Tensor,
        (n, members): (usize, usize),
    ) {
        let (n_i, members) = (int(n), int(members));
        launch!(
            self,
            "vocab_shard_combine",
            per_item(n),
            cu_mut(losses),
            cu_mut(rows),
            cu(stats),
            &n_i,
            &members
        );
    }

    fn vocab_shard_dlogits_impl(
        &self,
        logits: &mut Tensor,
        rows: &Tensor,
        targets: &[u32],
        scale: f32,
        (n, v): (usize, usize),
    ) {
        if n == 0 {
            return;
        }
        let (targets, v) = (self.upload(targets), int(v));
        let kernel = kernel_name("vocab_shard_dlogits", logits.dtype());
        launch!(self, kernel, per_row_block(n), buf_mut(logits), cu(rows), &*targets, &v, &scale);
    }
}
