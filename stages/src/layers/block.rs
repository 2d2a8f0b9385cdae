//! One pre-LN transformer block, forward and backward:
//!
//! ```text
//! ln1  = ln_1(x)                         residual = x + dropout(attn.c_proj(attn(c_attn(ln1))))
//! ln2  = ln_2(residual)                  y        = residual + dropout(c_proj(gelu(c_fc(ln2))))
//! ```
//!
//! Forward keeps the tensors of [`BlockTensor`](crate::saved::BlockTensor) except those the
//! selective modules drop; backward recomputes a dropped tensor just before the step that
//! reads it and frees it after. Nothing else is recomputed: without a recompute policy,
//! backward runs on what forward kept (dropout masks, never stored, are regenerated from
//! their key).

use super::dropout_ctx::DropoutCtx;
use super::weight_grads::{WeightGrad, WeightGrads};
use crate::params::*;
use crate::recompute::SelectiveModules;
use crate::saved::BlockTensor;
use crate::shape::GptShape;
use kernels::{AttentionSaved, Category, Device, DropoutSite, DropoutSpec, Stopwatch, Tensor, WeightLayout};
use std::sync::Arc;

/// What a block's forward keeps for its backward (None: dropped, recomputed in backward).
pub struct BlockActs {
    /// x [B,T,C]
    pub input: Tensor,
    /// ln_1(x) [B,T,C]
    pub ln1: Option<Tensor>,
    /// [B,T] each
    pub ln1_mean: Tensor,
    pub ln1_rstd: Tensor,
    /// [B,T,3C]
    pub qkv: Tensor,
    /// what the attention core's backward reads besides q, k, v and its output: the
    /// probabilities or the per-row log-sum-exp, as the device keeps them
    pub att: Option<AttentionSaved>,
    /// attention output [B,T,C]
    pub atty: Tensor,
    /// x + dropout(attn proj) [B,T,C]
    pub residual: Tensor,
    /// ln_2(residual) [B,T,C]
    pub ln2: Option<Tensor>,
    /// [B,T] each
    pub ln2_mean: Tensor,
    pub ln2_rstd: Tensor,
    /// c_fc output [B,T,F]
    pub fch: Tensor,
    /// gelu(fch) [B,T,F]
    pub fch_gelu: Option<Tensor>,
}

/// Transformer block `layer` (global index) of a model of shape `s`.
pub struct Block<'a> {
    pub s: &'a GptShape,
    pub layer: usize,
    /// The block's twelve parameters, in [`BLOCK_PARAM_NAMES`] order.
    pub w: &'a [Tensor],
}

fn dropout_or_keep(dev: &dyn Device, t: Tensor, spec: Option<DropoutSpec>) -> Tensor {
    match spec {
        Some(spec) => {
            let mut out = dev.zeros_of(t.dtype(), t.shape(), Category::Workspace);
            dev.dropout_forward(&mut out, &t, spec);
            out
        }
        None => t,
    }
}

fn dropout_backward_or_keep(dev: &dyn Device, d: Arc<Tensor>, spec: Option<DropoutSpec>) -> Arc<Tensor> {
    match spec {
        Some(spec) => {
            let mut out = dev.zeros_of(d.dtype(), d.shape(), Category::Workspace);
            dev.dropout_backward(&mut out, &d, spec);
            Arc::new(out)
        }
        None => d,
    }
}

impl Block<'_> {
    /// Forward. Kept tensors are allocated under `keep_as` (Activations for a stash,
    /// Workspace when recomputing or when the caller discards them); dropped ones are freed
    /// before returning. Returns y [B,T,C] (Workspace) and the kept tensors.
    pub fn forward(
        &self,
        dev: &dyn Device,
        x: Tensor,
        dropout: &DropoutCtx,
        modules: SelectiveModules,
        keep_as: Category,
    ) -> (Tensor, BlockActs) {
        let s = self.s;
        let (b, t, c, f) = (s.micro_batch, s.seq_len, s.hidden, s.ffn);
        let cat = |dropped: bool| if dropped { Category::Workspace } else { keep_as };
        // Activations in the device's dtype; LayerNorm statistics in f32.
        let act = |shape: &[usize], category| dev.zeros_of(dev.activation_dtype(), shape, category);
        let w = self.w;

        // ---- attention ----
        let mut ln1 = act(&[b, t, c], cat(modules.layernorm)); // [B,T,C]
        let mut ln1_mean = dev.zeros(&[b, t], keep_as); // [B,T]
        let mut ln1_rstd = dev.zeros(&[b, t], keep_as); // [B,T]
        dev.layernorm_forward(&mut ln1, &mut ln1_mean, &mut ln1_rstd, &x, &w[LN1_W], &w[LN1_B], 1e-5);
        let mut qkv = act(&[b, t, 3 * c], keep_as); // [B,T,3C]
        dev.matmul_forward(&mut qkv, &ln1, &w[ATTN_W], WeightLayout::InOut, Some(&w[ATTN_B]));
        let att_drop = dropout.spec(self.layer, DropoutSite::AttentionProbs);
        let att_dropped = BlockTensor::attention_saved(s).dropped_by(modules);
        let mut att = attention_saved(dev, s, att_drop, cat(att_dropped)); // [B,NH,T,T] x 1|2, or [B,NH,T]
        let mut atty = act(&[b, t, c], keep_as); // [B,T,C]
        dev.attention_forward(Some(&mut atty), &mut att, att_drop, &qkv, s.heads, s.heads);
        let mut attproj = act(&[b, t, c], Category::Workspace); // [B,T,C]
        dev.matmul_forward(&mut attproj, &atty, &w[ATTN_PROJ_W], WeightLayout::InOut, Some(&w[ATTN_PROJ_B]));
        let attproj = dropout_or_keep(dev, attproj, dropout.spec(self.layer, DropoutSite::AttentionResidual));
        let mut residual = act(&[b, t, c], keep_as); // [B,T,C]
        dev.add(&mut residual, &x, &attproj);
        drop(attproj);

        // ---- MLP ----
        let mut ln2 = act(&[b, t, c], cat(modules.layernorm)); // [B,T,C]
        let mut ln2_mean = dev.zeros(&[b, t], keep_as); // [B,T]
        let mut ln2_rstd = dev.zeros(&[b, t], keep_as); // [B,T]
        dev.layernorm_forward(&mut ln2, &mut ln2_mean, &mut ln2_rstd, &residual, &w[LN2_W], &w[LN2_B], 1e-5);
        let mut fch = act(&[b, t, f], keep_as); // [B,T,F]
        dev.matmul_forward(&mut fch, &ln2, &w[FC_W], WeightLayout::InOut, Some(&w[FC_B]));
        let mut fch_gelu = act(&[b, t, f], cat(modules.mlp)); // [B,T,F]
        dev.gelu_forward(&mut fch_gelu, &fch);
        let mut fcproj = act(&[b, t, c], Category::Workspace); // [B,T,C]
        dev.matmul_forward(&mut fcproj, &fch_gelu, &w[FC_PROJ_W], WeightLayout::InOut, Some(&w[FC_PROJ_B]));
        let fcproj = dropout_or_keep(dev, fcproj, dropout.spec(self.layer, DropoutSite::MlpResidual));
        let mut y = act(&[b, t, c], Category::Workspace); // [B,T,C]
        dev.add(&mut y, &residual, &fcproj);

        let acts = BlockActs {
            input: x,
            ln1: (!modules.layernorm).then_some(ln1),
            ln1_mean,
            ln1_rstd,
            qkv,
            att: (!att_dropped).then_some(att),
            atty,
            residual,
            ln2: (!modules.layernorm).then_some(ln2),
            ln2_mean,
            ln2_rstd,
            fch,
            fch_gelu: (!modules.mlp).then_some(fch_gelu),
        };
        (y, acts)
    }

    /// Backward from dy [B,T,C]; returns dx [B,T,C]. Parameter gradients accumulate into
    /// `grads` (this block's twelve, same order as `w`), matmul weight gradients through
    /// `weight_grads` (at once or deferred), whose targets are offset by `grad_base`. The
    /// recomputing of dropped tensors is timed on `recompute`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &dyn Device,
        acts: BlockActs,
        dy: Tensor,
        dropout: &DropoutCtx,
        grads: &mut [Tensor],
        grad_base: usize,
        weight_grads: &mut WeightGrads,
        recompute: &mut Stopwatch,
    ) -> Tensor {
        let s = self.s;
        let (b, t, c, f) = (s.micro_batch, s.seq_len, s.hidden, s.ffn);
        let w = self.w;
        // Activation gradients, in the activations' dtype.
        let ws = |shape: &[usize]| dev.zeros_of(dev.activation_dtype(), shape, Category::Workspace);
        let target = |weight: usize| grad_base + weight;
        let push = |wg: &mut WeightGrads, grads: &mut [Tensor], weight, inp, dout| {
            wg.push(dev, grads, WeightGrad { weight, inp, dout })
        };
        let block_grads = grad_base..grad_base + 12;
        let dy = Arc::new(dy);

        // ---- MLP ----
        let dfcproj =
            dropout_backward_or_keep(dev, dy.clone(), dropout.spec(self.layer, DropoutSite::MlpResidual));
        let fch_gelu = acts.fch_gelu.unwrap_or_else(|| {
            recompute.time(dev, || {
                let mut g = ws(&[b, t, f]);
                dev.gelu_forward(&mut g, &acts.fch);
                g
            })
        });
        let mut dgelu = ws(&[b, t, f]); // [B,T,F]
        dev.matmul_backward_input(&mut dgelu, &dfcproj, &w[FC_PROJ_W], WeightLayout::InOut);
        push(weight_grads, grads, target(FC_PROJ_W), Arc::new(fch_gelu), dfcproj);
        let mut dfch = ws(&[b, t, f]); // [B,T,F]
        dev.gelu_backward(&mut dfch, &acts.fch, &dgelu);
        drop(dgelu);
        let dfch = Arc::new(dfch);
        let ln2 = acts
            .ln2
            .unwrap_or_else(|| recompute_layernorm(dev, &acts.residual, &w[LN2_W], &w[LN2_B], &[b, t, c]));
        let mut dln2 = ws(&[b, t, c]); // [B,T,C]
        dev.matmul_backward_input(&mut dln2, &dfch, &w[FC_W], WeightLayout::InOut);
        push(weight_grads, grads, target(FC_W), Arc::new(ln2), dfch);
        let mut dresidual = ws(&[b, t, c]); // [B,T,C]
        {
            let g = &mut grads[block_grads.clone()];
            let (gw, gb) = g[LN2_W..].split_at_mut(1);
            dev.layernorm_backward(
                &mut dresidual,
                &mut gw[0],
                &mut gb[0],
                &dln2,
                &acts.residual,
                &w[LN2_W],
                &acts.ln2_mean,
                &acts.ln2_rstd,
            );
        }
        drop(dln2);
        dev.accumulate(&mut dresidual, &dy);
        drop(dy);
        drop(acts.residual);

        // ---- attention ----
        let dresidual = Arc::new(dresidual);
        let dattproj = dropout_backward_or_keep(
            dev,
            dresidual.clone(),
            dropout.spec(self.layer, DropoutSite::AttentionResidual),
        );
        let mut datty = ws(&[b, t, c]); // [B,T,C]
        dev.matmul_backward_input(&mut datty, &dattproj, &w[ATTN_PROJ_W], WeightLayout::InOut);
        let att_drop = dropout.spec(self.layer, DropoutSite::AttentionProbs);
        let att = acts.att.unwrap_or_else(|| {
            recompute.time(dev, || {
                let mut att = attention_saved(dev, s, att_drop, Category::Workspace);
                dev.attention_forward(None, &mut att, att_drop, &acts.qkv, s.heads, s.heads);
                att
            })
        });
        let mut dqkv = ws(&[b, t, 3 * c]); // [B,T,3C]
        dev.attention_backward(&mut dqkv, &datty, &acts.atty, &acts.qkv, &att, att_drop, s.heads, s.heads);
        push(weight_grads, grads, target(ATTN_PROJ_W), Arc::new(acts.atty), dattproj);
        drop(att);
        drop(datty);
        drop(acts.qkv);
        let dqkv = Arc::new(dqkv);
        let ln1 = acts
            .ln1
            .unwrap_or_else(|| recompute_layernorm(dev, &acts.input, &w[LN1_W], &w[LN1_B], &[b, t, c]));
        let mut dln1 = ws(&[b, t, c]); // [B,T,C]
        dev.matmul_backward_input(&mut dln1, &dqkv, &w[ATTN_W], WeightLayout::InOut);
        push(weight_grads, grads, target(ATTN_W), Arc::new(ln1), dqkv);
        let mut dx = ws(&[b, t, c]); // [B,T,C]
        {
            let g = &mut grads[block_grads];
            let (gw, gb) = g[LN1_W..].split_at_mut(1);
            dev.layernorm_backward(
                &mut dx,
                &mut gw[0],
                &mut gb[0],
                &dln1,
                &acts.input,
                &w[LN1_W],
                &acts.ln1_mean,
                &acts.ln1_rstd,
            );
        }
        dev.accumulate(&mut dx, &dresidual);
        dx
    }
}

/// What the attention core keeps, of the kind `s` declares, for its forward to fill.
fn attention_saved(
    dev: &dyn Device,
    s: &GptShape,
    dropout: Option<DropoutSpec>,
    category: Category,
) -> AttentionSaved {
    AttentionSaved::empty(dev, s.attention, [s.micro_batch, s.heads, s.seq_len], dropout.is_some(), category)
}

/// ln(inp) into a fresh workspace tensor; statistics recomputed bitwise equal to the saved.
fn recompute_layernorm(dev: &dyn Device, inp: &Tensor, w: &Tensor, b: &Tensor, shape: &[usize]) -> Tensor {
    let mut out = dev.zeros_of(inp.dtype(), shape, Category::Workspace);
    let rows = &shape[..shape.len() - 1];
    let mut mean = dev.zeros(rows, Category::Workspace);
    let mut rstd = dev.zeros(rows, Category::Workspace);
    dev.layernorm_forward(&mut out, &mut mean, &mut rstd, inp, w, b, 1e-5);
    out
}
