//! One transformer block, forward and backward, as the model description shapes it
//! (GPT-2: LayerNorm, GELU, biases; Llama: RMSNorm, rotary q and k, grouped-query
//! attention, SwiGLU, no biases; Qwen3 adds QK-norm, Llama leaves it out). Pre-norm, the
//! norms on the branches' inputs:
//!
//! ```text
//! n1  = norm_1(x)                     qkv = rope(qk_norm(qkv_proj(n1)))     att = attn(qkv)
//! residual = x + dropout(proj(att))
//! n2  = norm_2(residual)              y   = residual + dropout(fc2(act(fc1(n2))))
//! ```
//!
//! or with the norms on the branches' outputs (`NormPlacement::Output`, OLMo 2's):
//!
//! ```text
//! qkv = rope(qk_norm(qkv_proj(x)))    att = attn(qkv)
//! residual = x + dropout(norm_1(proj(att)))
//! y   = residual + dropout(norm_2(fc2(act(fc1(residual)))))
//! ```
//!
//! Under tensor parallelism (Megatron's layout, Shoeybi et al. 2019) the block runs on its
//! [`Shard`]: qkv_proj and fc1 are column-parallel (this shard's heads and groups, its MLP
//! columns), proj and fc2 row-parallel, whose partial outputs are summed over the group
//! (`g`), the bias added once, by tensor rank 0; the input gradients of qkv_proj and fc1 are
//! summed the same way (`f`). Everything else is whole and the same on every rank; with
//! sequence parallelism (Korthikanti et al. 2022) it runs on the shard's rows [R,C] instead,
//! each sum becomes a reduce-scatter into rows, and the column-parallel inputs (and, in
//! backward, the row-parallel output gradients) are all-gathered from rows. The weight
//! gradients keep the gathered tensors.
//!
//! Pre-norm, the residual add and norm_2 run as one device op, and each norm's backward adds
//! the gradient arriving along the residual stream in the same op (llm.c's fused residual
//! forward and LayerNorm backward): the same bits on the CPU as the separate ops. With the
//! norms on the outputs, each norm and its add are separate ops.
//!
//! Forward keeps the tensors of [`BlockTensor`](crate::saved::BlockTensor) except those the
//! selective modules drop; backward recomputes a dropped tensor just before the step that
//! reads it and frees it after. Nothing else is recomputed: without a recompute policy,
//! backward runs on what forward kept (dropout masks, never stored, are regenerated from
//! their key).

use super::dropout_ctx::{dropout_backward_or_keep, dropout_or_keep, DropoutCtx};
use super::norm::{NormLayer, NormPlacement, NormStats};
use super::pair_mut;
use super::qk_norm::{QkNorm, QkNormActs};
use super::weight_grads::{WeightGrad, WeightGrads};
use crate::dist::TensorGroup;
use crate::model::{ModelShape, Positions};
use crate::params::{BlockIndices, BlockParam};
use crate::recompute::SelectiveModules;
use crate::saved::BlockTensor;
use crate::tensor_parallel::Shard;
use kernels::{
    AttentionSaved, Category, CausalMask, Device, DropoutSite, DropoutSpec, HeadRange, QkNormSpan, Stopwatch,
    Tensor,
};
use std::sync::Arc;

/// What a block's forward keeps for its backward (None: dropped, recomputed in backward).
pub struct BlockActs {
    /// x [B,T,C] (the shard's rows [R,C] with sequence parallelism, as below)
    pub input: Tensor,
    /// norm_1(x) [B,T,C] | [R,C]
    pub n1: Option<Tensor>,
    /// [B,T] each
    pub n1_stats: NormStats,
    /// What QK-norm's backward reads, where the model has it.
    pub qk_norm: Option<QkNormActs>,
    /// [B,T,QKV], after QK-norm and the rotary embedding (QKV: this shard's heads)
    pub qkv: Tensor,
    /// what the attention core's backward reads besides q, k, v and its output: the
    /// probabilities or the per-row log-sum-exp, as the device keeps them
    pub att: Option<AttentionSaved>,
    /// attention output [B,T,A] (A = C / t: this shard's heads)
    pub atty: Tensor,
    /// attn proj [B,T,C] | [R,C], norm_1's input where the norms are on the outputs
    pub attproj: Option<Tensor>,
    /// x + dropout(attn proj), or x + dropout(norm_1(attn proj)) [B,T,C] | [R,C]
    pub residual: Tensor,
    /// norm_2(residual) [B,T,C] | [R,C]
    pub n2: Option<Tensor>,
    /// [B,T] each
    pub n2_stats: NormStats,
    /// fc1 output [B,T,FC1]
    pub fch: Tensor,
    /// act(fch) [B,T,F] (F: this shard's columns)
    pub fch_act: Option<Tensor>,
    /// fc2 output [B,T,C] | [R,C], norm_2's input where the norms are on the outputs
    pub fcproj: Option<Tensor>,
}

/// Transformer block `layer` (global index) of a model of shape `s`.
pub struct Block<'a> {
    pub s: &'a ModelShape,
    pub layer: usize,
    /// The chunk's parameters, the block's at `at`.
    pub w: &'a [Tensor],
    pub at: BlockIndices,
    /// This rank's part of the block's tensor-parallel layers.
    pub shard: Shard,
}

impl Block<'_> {
    fn param(&self, p: BlockParam) -> &Tensor {
        &self.w[self.at.of(p)]
    }

    fn bias(&self, weight: BlockParam) -> Option<&Tensor> {
        self.at.get(weight.bias().expect("a matmul weight")).map(|i| &self.w[i])
    }

    fn norm(&self, weight: BlockParam, bias: BlockParam) -> NormLayer<'_> {
        self.s.arch.norm_layer(self.param(weight), self.at.get(bias).map(|i| &self.w[i]))
    }

    fn norm1(&self) -> NormLayer<'_> {
        self.norm(BlockParam::Norm1Weight, BlockParam::Norm1Bias)
    }

    fn norm2(&self) -> NormLayer<'_> {
        self.norm(BlockParam::Norm2Weight, BlockParam::Norm2Bias)
    }

    /// QK-norm over `heads` query and `kv_heads` key heads, where the model has it: over
    /// each, or over the whole projections, cut across the tensor ranks.
    fn qk_norm(&self, heads: usize, kv_heads: usize) -> Option<QkNorm<'_>> {
        let parts = match self.s.arch.qk_norm_span {
            QkNormSpan::Head => 1,
            QkNormSpan::Projection => self.shard.size,
        };
        self.s.arch.qk_norm.then(|| QkNorm {
            q_weight: self.param(BlockParam::QNormWeight),
            k_weight: self.param(BlockParam::KNormWeight),
            eps: self.s.arch.norm_eps,
            heads,
            kv_heads,
            span: self.s.arch.qk_norm_span,
            parts,
        })
    }

    /// The keys this block's queries attend to.
    fn mask(&self) -> CausalMask {
        self.s.arch.attention_mask(self.layer)
    }

    /// out = inp @ W (+ b) for matmul weight `weight`, in the model's weight layout.
    fn linear(&self, dev: &dyn Device, out: &mut Tensor, inp: &Tensor, weight: BlockParam) {
        dev.matmul_forward(out, inp, self.param(weight), self.s.weight_layout(), self.bias(weight));
    }

    /// inp @ W (+ b) for the row-parallel `weight`: this shard's partial product, summed over
    /// the group, with the bias added by tensor rank 0 alone; [B,T,C], or this shard's rows
    /// [R,C] of it with sequence parallelism, allocated under `keep_as`.
    fn row_parallel(
        &self,
        dev: &dyn Device,
        tp: &mut TensorGroup,
        inp: &Tensor,
        weight: BlockParam,
        keep_as: Category,
    ) -> Tensor {
        let s = self.s;
        let partial_as = if self.shard.sequence { Category::Workspace } else { keep_as };
        let mut out = dev.empty_of(dev.activation_dtype(), &[s.micro_batch, s.seq_len, s.hidden], partial_as);
        let bias = self.bias(weight).filter(|_| self.shard.rank == 0);
        dev.matmul_forward(&mut out, inp, self.param(weight), s.weight_layout(), bias);
        self.summed(dev, tp, out, keep_as)
    }

    /// A partial [B,T,C] summed over the group (Megatron's `g` forward, `f` backward): whole,
    /// in place, or this shard's rows of the sum with sequence parallelism, allocated under
    /// `rows_as`.
    fn summed(
        &self,
        dev: &dyn Device,
        tp: &mut TensorGroup,
        mut partial: Tensor,
        rows_as: Category,
    ) -> Tensor {
        match self.shard.sequence {
            true => tp.reduce_scatter_rows(partial, dev, self.shard.rows(self.s), rows_as),
            false => {
                tp.all_reduce(&mut partial, dev);
                partial
            }
        }
    }

    /// The whole [B,T,C] (workspace) of a tensor of the shard's rows under sequence
    /// parallelism, its all-gather; None without, where the tensor is whole.
    fn gathered(&self, dev: &dyn Device, tp: &mut TensorGroup, part: &Tensor) -> Option<Tensor> {
        let s = self.s;
        self.shard.sequence.then(|| tp.all_gather_parts(part, dev, &[s.micro_batch, s.seq_len, s.hidden]))
    }

    /// [`Block::gathered`], or the tensor itself where it is whole.
    fn whole(&self, dev: &dyn Device, tp: &mut TensorGroup, part: Arc<Tensor>) -> Arc<Tensor> {
        self.gathered(dev, tp, &part).map_or(part, Arc::new)
    }

    /// The shape of the tensors of the residual stream: [B,T,C], or the shard's rows [R,C].
    fn stream_shape(&self) -> Vec<usize> {
        let s = self.s;
        match self.shard.sequence {
            true => vec![self.shard.rows(s).len(), s.hidden],
            false => vec![s.micro_batch, s.seq_len, s.hidden],
        }
    }

    /// The attention's dropout: this shard's heads' part of the whole layer's mask.
    fn attention_dropout(&self, dropout: &DropoutCtx) -> Option<DropoutSpec> {
        let (s, shard) = (self.s, self.shard);
        let heads =
            (shard.size > 1).then(|| HeadRange { first: shard.rank * shard.heads(s), total: s.heads });
        dropout.spec(self.layer, DropoutSite::AttentionProbs).map(|d| DropoutSpec { heads, ..d })
    }

    /// The dropout of the residual stream at `site`: the shard's rows of the whole mask.
    fn stream_dropout(&self, dropout: &DropoutCtx, site: DropoutSite) -> Option<DropoutSpec> {
        let first = self.shard.rows(self.s).start * self.s.hidden;
        dropout.spec(self.layer, site).map(|d| DropoutSpec { first, ..d })
    }

    /// dinp = dout @ W^T for matmul weight `weight`.
    fn linear_backward_input(&self, dev: &dyn Device, dinp: &mut Tensor, dout: &Tensor, weight: BlockParam) {
        dev.matmul_backward_input(dinp, dout, self.param(weight), self.s.weight_layout());
    }

    /// The weight gradient of matmul `weight` from its input and output gradient.
    fn weight_grad(&self, weight: BlockParam, inp: Arc<Tensor>, dout: Arc<Tensor>) -> WeightGrad {
        let bias = weight.bias().and_then(|b| self.at.get(b));
        WeightGrad { weight: self.at.of(weight), bias, layout: self.s.weight_layout(), inp, dout }
    }

    /// Forward. Kept tensors are allocated under `keep_as` (Activations for a stash,
    /// Workspace when recomputing or when the caller discards them), but for those the
    /// caller will move to host memory (`offloaded`), which are workspace until it does;
    /// dropped ones are freed before returning. Returns y [B,T,C] | [R,C] (Workspace) and
    /// the kept tensors.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &dyn Device,
        x: Tensor,
        dropout: &DropoutCtx,
        modules: SelectiveModules,
        keep_as: Category,
        offloaded: &dyn Fn(BlockTensor) -> bool,
        tp: &mut TensorGroup,
    ) -> (Tensor, BlockActs) {
        let (s, shard) = (self.s, self.shard);
        let (b, t, f, a) = (s.micro_batch, s.seq_len, shard.ffn(s), shard.attention_width(s));
        let (heads, kv_heads) = (shard.heads(s), shard.kv_heads(s));
        let cat = |t: BlockTensor| match t.dropped_by(modules) || offloaded(t) {
            true => Category::Workspace,
            false => keep_as,
        };
        // Activations in the device's dtype; norm statistics in f32. Each op below writes
        // every element of its output, so none is zeroed first (on a GPU, a memset each).
        let act = |shape: &[usize], category| dev.empty_of(dev.activation_dtype(), shape, category);
        let stream = self.stream_shape(); // [B,T,C], or [R,C] with sequence parallelism

        let on_inputs = s.arch.norm_placement == NormPlacement::Input;

        // ---- attention ----
        // Pre-norm, the qkv projection reads norm_1(x); else x itself.
        let n1_pre = on_inputs.then(|| {
            let mut n1 = act(&stream, cat(BlockTensor::Norm1Out)); // [B,T,C] | [R,C]
            let stats = self.norm1().forward(dev, &mut n1, &x, cat(BlockTensor::Norm1Stats)); // [B,T] | [R]
            (n1, stats)
        });
        let qkv_in = n1_pre.as_ref().map_or(&x, |(n1, _)| n1); // [B,T,C] | [R,C]
        let qkv_in_all = self.gathered(dev, tp, qkv_in); // [B,T,C] with sequence parallelism
        let mut qkv = act(&[b, t, shard.qkv_width(s)], cat(BlockTensor::Qkv)); // [B,T,QKV]
        self.linear(dev, &mut qkv, qkv_in_all.as_ref().unwrap_or(qkv_in), BlockParam::QkvWeight);
        drop(qkv_in_all);
        let qk_norm = self.qk_norm(heads, kv_heads).map(|norm| {
            norm.forward(dev, tp, &mut qkv, cat(BlockTensor::QkNormIn), cat(BlockTensor::QkNormStats))
        });
        if let Positions::Rotary(freqs) = s.arch.positions {
            dev.rope_forward(&mut qkv, heads, kv_heads, freqs, 0);
        }
        let att_drop = self.attention_dropout(dropout);
        let att_saved = BlockTensor::attention_saved(s);
        let att_dropped = att_saved.dropped_by(modules);
        let mut att = self.attention_saved(dev, att_drop, cat(att_saved)); // [B,NH,T,T] x 1|2, or [B,NH,T]
        let mut atty = act(&[b, t, a], cat(BlockTensor::AttOut)); // [B,T,A]
        dev.attention_forward(Some(&mut atty), &mut att, att_drop, &qkv, heads, kv_heads, self.mask());
        let attproj_as = if on_inputs { Category::Workspace } else { cat(BlockTensor::AttProj) };
        let attproj = self.row_parallel(dev, tp, &atty, BlockParam::ProjWeight, attproj_as); // [B,T,C] | [R,C]
        let attention_residual = self.stream_dropout(dropout, DropoutSite::AttentionResidual);

        // ---- MLP ----
        // Pre-norm, residual = x + dropout(attproj) and n2 = norm_2(residual) in one op, fc1
        // reading n2; else residual = x + dropout(norm_1(attproj)), fc1 reading it.
        let (residual, n1_stats, attproj, n2_pre) = match n1_pre {
            Some((n1, n1_stats)) => {
                let attproj = dropout_or_keep(dev, attproj, attention_residual);
                let mut residual = act(&stream, cat(BlockTensor::Residual)); // [B,T,C] | [R,C]
                let mut n2 = act(&stream, cat(BlockTensor::Norm2Out)); // [B,T,C] | [R,C]
                let n2_stats = self.norm2().residual_forward(
                    dev,
                    &mut residual,
                    &mut n2,
                    (&x, &attproj),
                    cat(BlockTensor::Norm2Stats),
                ); // [B,T] | [R]
                (residual, n1_stats, None, Some((n1, n2, n2_stats)))
            }
            None => {
                let mut n1 = act(&stream, Category::Workspace); // [B,T,C] | [R,C]
                let n1_stats = self.norm1().forward(dev, &mut n1, &attproj, cat(BlockTensor::Norm1Stats)); // [B,T] | [R]
                let n1 = dropout_or_keep(dev, n1, attention_residual);
                let mut residual = act(&stream, cat(BlockTensor::Residual)); // [B,T,C] | [R,C]
                dev.add(&mut residual, &x, &n1);
                (residual, n1_stats, Some(attproj), None)
            }
        };
        let fc1_in = n2_pre.as_ref().map_or(&residual, |(_, n2, _)| n2); // [B,T,C] | [R,C]
        let fc1_in_all = self.gathered(dev, tp, fc1_in); // [B,T,C] with sequence parallelism
        let mut fch = act(&[b, t, shard.fc1_width(s)], cat(BlockTensor::FcOut)); // [B,T,FC1]
        self.linear(dev, &mut fch, fc1_in_all.as_ref().unwrap_or(fc1_in), BlockParam::Fc1Weight);
        drop(fc1_in_all);
        let mut fch_act = act(&[b, t, f], cat(BlockTensor::ActOut)); // [B,T,F]
        s.arch.activation.forward(dev, &mut fch_act, &fch);
        let fcproj_as = if on_inputs { Category::Workspace } else { cat(BlockTensor::FcProj) };
        let fcproj = self.row_parallel(dev, tp, &fch_act, BlockParam::Fc2Weight, fcproj_as); // [B,T,C] | [R,C]
        let mlp_residual = self.stream_dropout(dropout, DropoutSite::MlpResidual);
        let (y, n1, n2, n2_stats, fcproj) = match n2_pre {
            Some((n1, n2, n2_stats)) => {
                let fcproj = dropout_or_keep(dev, fcproj, mlp_residual);
                let mut y = act(&stream, Category::Workspace); // [B,T,C] | [R,C]
                dev.add(&mut y, &residual, &fcproj);
                (y, Some(n1), Some(n2), n2_stats, None)
            }
            None => {
                let mut n2 = act(&stream, Category::Workspace); // [B,T,C] | [R,C]
                let n2_stats = self.norm2().forward(dev, &mut n2, &fcproj, cat(BlockTensor::Norm2Stats)); // [B,T] | [R]
                let n2 = dropout_or_keep(dev, n2, mlp_residual);
                let mut y = act(&stream, Category::Workspace); // [B,T,C] | [R,C]
                dev.add(&mut y, &residual, &n2);
                (y, None, None, n2_stats, Some(fcproj))
            }
        };

        let acts = BlockActs {
            input: x,
            n1: n1.filter(|_| !modules.layernorm),
            n1_stats,
            qk_norm,
            qkv,
            att: (!att_dropped).then_some(att),
            atty,
            attproj,
            residual,
            n2: n2.filter(|_| !modules.layernorm),
            n2_stats,
            fch,
            fch_act: (!modules.mlp).then_some(fch_act),
            fcproj,
        };
        (y, acts)
    }

    /// Backward from dy [B,T,C] | [R,C]; returns dx of the same shape. Parameter gradients accumulate into
    /// `grads` (the chunk's, indexed as `self.w`), matmul weight gradients through
    /// `weight_grads` (at once or deferred). The recomputing of dropped tensors is timed on
    /// `recompute`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &dyn Device,
        acts: BlockActs,
        dy: Tensor,
        dropout: &DropoutCtx,
        grads: &mut [Tensor],
        weight_grads: &mut WeightGrads,
        recompute: &mut Stopwatch,
        tp: &mut TensorGroup,
    ) -> Tensor {
        let (s, shard) = (self.s, self.shard);
        let (b, t, f, a) = (s.micro_batch, s.seq_len, shard.ffn(s), shard.attention_width(s));
        let (heads, kv_heads) = (shard.heads(s), shard.kv_heads(s));
        // Activation gradients, in the activations' dtype, each overwritten by its op.
        let ws = |shape: &[usize]| dev.empty_of(dev.activation_dtype(), shape, Category::Workspace);
        let dy = Arc::new(dy);

        // ---- MLP ----
        // dfcproj: through the dropout, and norm_2's backward where it is on the output.
        let mlp_residual = self.stream_dropout(dropout, DropoutSite::MlpResidual);
        let dfcproj = dropout_backward_or_keep(dev, dy.clone(), mlp_residual); // [B,T,C] | [R,C]
        let norm2 = self.norm2();
        let norm2_grads = (&norm2, BlockParam::Norm2Weight, BlockParam::Norm2Bias);
        let dfcproj =
            self.branch_output_backward(dev, grads, dfcproj, acts.fcproj, norm2_grads, &acts.n2_stats);
        let dfcproj = self.whole(dev, tp, dfcproj); // [B,T,C]
        let fch_act = acts.fch_act.unwrap_or_else(|| {
            recompute.time(dev, || {
                let mut a = ws(&[b, t, f]);
                s.arch.activation.forward(dev, &mut a, &acts.fch);
                a
            })
        });
        let mut dfch = ws(&[b, t, shard.fc1_width(s)]); // [B,T,FC1]
        let fc2 = (self.param(BlockParam::Fc2Weight), s.weight_layout());
        s.arch.activation.backward_through_fc2(dev, &mut dfch, &acts.fch, &dfcproj, fc2);
        weight_grads.push(dev, grads, self.weight_grad(BlockParam::Fc2Weight, Arc::new(fch_act), dfcproj));
        let dfch = Arc::new(dfch);
        let residual = Arc::new(acts.residual);
        let fc1_in = self.branch_input(dev, acts.n2, &residual, &norm2);
        let dfc1_in = self.column_parallel_backward(
            dev,
            tp,
            (grads, weight_grads),
            BlockParam::Fc1Weight,
            fc1_in,
            dfch,
        );
        let dresidual =
            self.stream_backward(dev, grads, &dy, &dfc1_in, norm2_grads, &residual, &acts.n2_stats);
        drop(dfc1_in);
        drop(dy);
        drop(residual);

        // ---- attention ----
        let dresidual = Arc::new(dresidual);
        let attention_residual = self.stream_dropout(dropout, DropoutSite::AttentionResidual);
        let dattproj = dropout_backward_or_keep(dev, dresidual.clone(), attention_residual); // [B,T,C] | [R,C]
        let norm1 = self.norm1();
        let norm1_grads = (&norm1, BlockParam::Norm1Weight, BlockParam::Norm1Bias);
        let dattproj =
            self.branch_output_backward(dev, grads, dattproj, acts.attproj, norm1_grads, &acts.n1_stats);
        let dattproj = self.whole(dev, tp, dattproj); // [B,T,C]
        let mut datty = ws(&[b, t, a]); // [B,T,A]
        self.linear_backward_input(dev, &mut datty, &dattproj, BlockParam::ProjWeight);
        let att_drop = self.attention_dropout(dropout);
        let att = acts.att.unwrap_or_else(|| {
            recompute.time(dev, || {
                let mut att = self.attention_saved(dev, att_drop, Category::Workspace);
                dev.attention_forward(None, &mut att, att_drop, &acts.qkv, heads, kv_heads, self.mask());
                att
            })
        });
        let mut dqkv = ws(&[b, t, shard.qkv_width(s)]); // [B,T,QKV]
        dev.attention_backward(
            &mut dqkv,
            &datty,
            &acts.atty,
            &acts.qkv,
            &att,
            att_drop,
            heads,
            kv_heads,
            self.mask(),
        );
        weight_grads.push(
            dev,
            grads,
            self.weight_grad(BlockParam::ProjWeight, Arc::new(acts.atty), dattproj),
        );
        drop(att);
        drop(datty);
        drop(acts.qkv);
        if let Positions::Rotary(freqs) = s.arch.positions {
            dev.rope_backward(&mut dqkv, heads, kv_heads, freqs);
        }
        if let (Some(norm), Some(saved)) = (self.qk_norm(heads, kv_heads), acts.qk_norm) {
            let dweights =
                pair_mut(grads, self.at.of(BlockParam::QNormWeight), self.at.of(BlockParam::KNormWeight));
            norm.backward(dev, tp, &mut dqkv, saved, dweights);
        }
        let dqkv = Arc::new(dqkv);
        let input = Arc::new(acts.input);
        let qkv_in = self.branch_input(dev, acts.n1, &input, &norm1);
        let dqkv_in = self.column_parallel_backward(
            dev,
            tp,
            (grads, weight_grads),
            BlockParam::QkvWeight,
            qkv_in,
            dqkv,
        );
        self.stream_backward(dev, grads, &dresidual, &dqkv_in, norm1_grads, &input, &acts.n1_stats)
    }

    /// The gradient of a branch's output projection [B,T,C] | [R,C] from `d`, that of what
    /// the branch added to the stream: `d` itself pre-norm; through the norm on the branch's
    /// output from its input `projected` (kept by forward) else, the norm's weight's and
    /// bias's gradients accumulating.
    fn branch_output_backward(
        &self,
        dev: &dyn Device,
        grads: &mut [Tensor],
        d: Arc<Tensor>,
        projected: Option<Tensor>,
        (norm, weight, bias): (&NormLayer, BlockParam, BlockParam),
        stats: &NormStats,
    ) -> Arc<Tensor> {
        let Some(projected) = projected else { return d };
        let mut dprojected = dev.empty_of(dev.activation_dtype(), d.shape(), Category::Workspace); // [B,T,C] | [R,C]
        norm.backward(
            dev,
            &mut dprojected,
            None,
            norm_grads(grads, &self.at, weight, bias),
            &d,
            &projected,
            stats,
        );
        Arc::new(dprojected)
    }

    /// What a branch's first projection read, from the stream [B,T,C] | [R,C] into the
    /// branch: norm(stream) pre-norm (kept as `normed`, or recomputed where it was
    /// dropped), else the stream itself.
    fn branch_input(
        &self,
        dev: &dyn Device,
        normed: Option<Tensor>,
        stream: &Arc<Tensor>,
        norm: &NormLayer,
    ) -> Arc<Tensor> {
        match (self.s.arch.norm_placement, normed) {
            (_, Some(normed)) => Arc::new(normed),
            (NormPlacement::Input, None) => Arc::new(norm.recompute(dev, stream)),
            (NormPlacement::Output, None) => stream.clone(),
        }
    }

    /// The backward of the column-parallel projection `weight` (qkv, fc1) from its output
    /// gradient `dout`: its input's gradient, summed over the group ([B,T,C] | [R,C]); its
    /// weight gradient is pushed with its input `inp` (gathered with sequence parallelism).
    fn column_parallel_backward(
        &self,
        dev: &dyn Device,
        tp: &mut TensorGroup,
        (grads, weight_grads): (&mut [Tensor], &mut WeightGrads),
        weight: BlockParam,
        inp: Arc<Tensor>,
        dout: Arc<Tensor>,
    ) -> Tensor {
        let s = self.s;
        let inp = self.whole(dev, tp, inp); // [B,T,C]
        let mut dinp =
            dev.empty_of(dev.activation_dtype(), &[s.micro_batch, s.seq_len, s.hidden], Category::Workspace); // [B,T,C]
        self.linear_backward_input(dev, &mut dinp, &dout, weight);
        let dinp = self.summed(dev, tp, dinp, Category::Workspace); // [B,T,C] | [R,C]
        weight_grads.push(dev, grads, self.weight_grad(weight, inp, dout));
        dinp
    }

    /// The gradient of the stream `stream` [B,T,C] | [R,C] that fed a branch: `d`, the
    /// gradient arriving along the stream, plus the branch's input gradient `dbranch`,
    /// through the branch's norm in one op pre-norm (its weight's and bias's gradients
    /// accumulating), an add else.
    #[allow(clippy::too_many_arguments)]
    fn stream_backward(
        &self,
        dev: &dyn Device,
        grads: &mut [Tensor],
        d: &Tensor,
        dbranch: &Tensor,
        (norm, weight, bias): (&NormLayer, BlockParam, BlockParam),
        stream: &Tensor,
        stats: &NormStats,
    ) -> Tensor {
        let mut dstream = dev.empty_of(dev.activation_dtype(), d.shape(), Category::Workspace); // [B,T,C] | [R,C]
        match self.s.arch.norm_placement {
            NormPlacement::Input => {
                let dnorm = norm_grads(grads, &self.at, weight, bias);
                norm.backward(dev, &mut dstream, Some(d), dnorm, dbranch, stream, stats);
            }
            NormPlacement::Output => dev.add(&mut dstream, d, dbranch),
        }
        dstream
    }
}

/// A norm's weight gradient and, where it has one, its bias's.
fn norm_grads<'g>(
    grads: &'g mut [Tensor],
    at: &BlockIndices,
    weight: BlockParam,
    bias: BlockParam,
) -> (&'g mut Tensor, Option<&'g mut Tensor>) {
    let w = at.of(weight);
    match at.get(bias) {
        Some(b) => {
            let (dw, db) = pair_mut(grads, w, b);
            (dw, Some(db))
        }
        None => (&mut grads[w], None),
    }
}

/// Inference one position at a time (`generate`, with a KV cache): the block's pieces
/// around the attention core, which the caller computes over its cache. No dropout, nothing
/// kept.
impl Block<'_> {
    /// q, k, v [1,QKV] of x [1,C] at sequence position `position` (rotated there).
    pub fn decode_qkv(&self, dev: &dyn Device, x: &Tensor, position: usize) -> Tensor {
        let s = self.s;
        let n1 = (s.arch.norm_placement == NormPlacement::Input).then(|| {
            let mut n1 = dev.empty_of(x.dtype(), x.shape(), Category::Workspace); // [1,C]
            self.norm1().forward(dev, &mut n1, x, Category::Workspace);
            n1
        });
        let mut qkv = dev.empty_of(x.dtype(), &[1, 1, s.qkv_width()], Category::Workspace); // [1,1,QKV]
        self.linear(dev, &mut qkv, n1.as_ref().unwrap_or(x), BlockParam::QkvWeight);
        if let Some(norm) = self.qk_norm(s.heads, s.kv_heads) {
            norm.normalize(dev, &mut TensorGroup::whole(), &mut qkv, Category::Workspace);
        }
        if let Positions::Rotary(freqs) = s.arch.positions {
            dev.rope_forward(&mut qkv, s.heads, s.kv_heads, freqs, position);
        }
        qkv
    }

    /// The block's output y [1,C] from its input x [1,C] and the attention's output att [1,A].
    pub fn decode_rest(&self, dev: &dyn Device, x: &Tensor, att: &Tensor) -> Tensor {
        let s = self.s;
        let new = |width: usize| dev.empty_of(x.dtype(), &[1, width], Category::Workspace);
        let on_inputs = s.arch.norm_placement == NormPlacement::Input;
        // A branch's output as it joins the stream: itself pre-norm, else normalised.
        let joining = |out: Tensor, norm: NormLayer| -> Tensor {
            if on_inputs {
                return out;
            }
            let mut normed = new(s.hidden); // [1,C]
            norm.forward(dev, &mut normed, &out, Category::Workspace);
            normed
        };
        let mut proj = new(s.hidden); // [1,C]
        self.linear(dev, &mut proj, att, BlockParam::ProjWeight);
        let mut residual = new(s.hidden); // [1,C]
        let n2 = match on_inputs {
            true => {
                let mut n2 = new(s.hidden); // [1,C]
                self.norm2().residual_forward(dev, &mut residual, &mut n2, (x, &proj), Category::Workspace);
                Some(n2)
            }
            false => {
                dev.add(&mut residual, x, &joining(proj, self.norm1()));
                None
            }
        };
        let mut fch = new(s.fc1_width()); // [1,FC1]
        self.linear(dev, &mut fch, n2.as_ref().unwrap_or(&residual), BlockParam::Fc1Weight);
        let mut act = new(s.ffn); // [1,F]
        s.arch.activation.forward(dev, &mut act, &fch);
        let mut fcproj = new(s.hidden); // [1,C]
        self.linear(dev, &mut fcproj, &act, BlockParam::Fc2Weight);
        let mut y = new(s.hidden); // [1,C]
        dev.add(&mut y, &residual, &joining(fcproj, self.norm2()));
        y
    }
}

impl Block<'_> {
    /// What the attention core of this shard's heads keeps, of the kind the shape declares,
    /// for its forward to fill.
    fn attention_saved(
        &self,
        dev: &dyn Device,
        dropout: Option<DropoutSpec>,
        category: Category,
    ) -> AttentionSaved {
        let s = self.s;
        let dims = [s.micro_batch, self.shard.heads(s), s.seq_len];
        dev.empty_attention_saved(s.attention, dims, dropout.is_some(), category)
    }
}
