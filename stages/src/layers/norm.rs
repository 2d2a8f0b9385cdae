//! The normalisation layers a model may use, Megatron's `normalization`: LayerNorm (GPT-2)
//! or RMSNorm (Llama), forward and backward, and what each keeps for its backward; and
//! where a block places them.
//!
//! Adding a variant is its kernels (`kernels::Device`) and a case in each match of this
//! file: the config parses it by [`Norm::name`].

use kernels::{Category, Device, Tensor};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// (x - mean) / sqrt(var + eps) * weight + bias.
    LayerNorm,
    /// x / sqrt(mean(x^2) + eps) * weight: no mean, no bias.
    RmsNorm,
}

impl Norm {
    pub const ALL: [Norm; 2] = [Norm::LayerNorm, Norm::RmsNorm];

    /// Megatron's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Norm::LayerNorm => "LayerNorm",
            Norm::RmsNorm => "RMSNorm",
        }
    }

    pub fn has_bias(self) -> bool {
        match self {
            Norm::LayerNorm => true,
            Norm::RmsNorm => false,
        }
    }

    /// f32 statistics kept per row for the backward: mean and reciprocal std, or the
    /// reciprocal root mean square alone.
    pub fn stats_per_row(self) -> usize {
        match self {
            Norm::LayerNorm => 2,
            Norm::RmsNorm => 1,
        }
    }
}

/// Where a block's two norms sit on its branches, the attention and the MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPlacement {
    /// On each branch's input: y = x + f(norm(x)) (pre-norm: GPT-2, Llama).
    Input,
    /// On each branch's output, before it joins the residual stream: y = x + norm(f(x))
    /// (OLMo 2's reordered norm, Swin v2's res-post-norm). Not the first transformer's
    /// post-norm, which normalises the stream after the add.
    Output,
}

impl NormPlacement {
    pub const ALL: [NormPlacement; 2] = [NormPlacement::Input, NormPlacement::Output];

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            NormPlacement::Input => "input",
            NormPlacement::Output => "output",
        }
    }
}

impl fmt::Display for Norm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A norm layer of a model: its kind and epsilon, its weight [C] and, for LayerNorm, bias [C].
#[derive(Clone, Copy)]
pub struct NormLayer<'a> {
    pub norm: Norm,
    pub eps: f32,
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    /// The norm scales by 1 + weight, the weight zero-centred (Megatron's
    /// `apply_layernorm_1p`, Nemotron's LayerNorm1P): the kernels take the shifted weight,
    /// whose gradient is the weight's.
    pub zero_centered: bool,
}

/// What a norm's backward reads besides its input: the row statistics [N] (f32).
pub struct NormStats {
    /// LayerNorm's mean; None for RMSNorm.
    pub mean: Option<Tensor>,
    pub rstd: Tensor,
}

impl<'a> NormLayer<'a> {
    /// The weight the kernels scale by, [C]: 1 + weight (f32, as transformers' LayerNorm1P
    /// and Transformer Engine's zero-centred gamma add it) into a workspace tensor where
    /// the weight is zero-centred, else the weight itself.
    fn shifted_weight(&self, dev: &dyn Device) -> Option<Tensor> {
        self.zero_centered.then(|| {
            let mut shifted = dev.empty_of(self.weight.dtype(), self.weight.shape(), Category::Workspace); // [C]
            dev.add_scalar(&mut shifted, self.weight, 1.0);
            shifted
        })
    }

    /// out [N,C] = norm(inp [N,C]); the statistics [N] are allocated under `keep_as`.
    pub fn forward(&self, dev: &dyn Device, out: &mut Tensor, inp: &Tensor, keep_as: Category) -> NormStats {
        let rows = &inp.shape()[..inp.shape().len() - 1];
        let shifted = self.shifted_weight(dev);
        let w = shifted.as_ref().unwrap_or(self.weight);
        match self.norm {
            Norm::LayerNorm => {
                let mut mean = dev.empty(rows, keep_as); // [N]
                let mut rstd = dev.empty(rows, keep_as); // [N]
                let bias = self.bias.expect("LayerNorm has a bias");
                dev.layernorm_forward(out, &mut mean, &mut rstd, inp, w, bias, self.eps);
                NormStats { mean: Some(mean), rstd }
            }
            Norm::RmsNorm => {
                let mut rstd = dev.empty(rows, keep_as); // [N]
                dev.rmsnorm_forward(out, &mut rstd, inp, w, self.eps);
                NormStats { mean: None, rstd }
            }
        }
    }

    /// residual [N,C] = a + b and out [N,C] = norm(residual) in one device op (the residual
    /// add fused with the norm after it); the statistics [N] are allocated under `keep_as`.
    /// The same bits as the add and then [`NormLayer::forward`].
    pub fn residual_forward(
        &self,
        dev: &dyn Device,
        residual: &mut Tensor,
        out: &mut Tensor,
        (a, b): (&Tensor, &Tensor),
        keep_as: Category,
    ) -> NormStats {
        let rows = &residual.shape()[..residual.shape().len() - 1];
        let shifted = self.shifted_weight(dev);
        let w = shifted.as_ref().unwrap_or(self.weight);
        match self.norm {
            Norm::LayerNorm => {
                let mut mean = dev.empty(rows, keep_as); // [N]
                let mut rstd = dev.empty(rows, keep_as); // [N]
                let bias = self.bias.expect("LayerNorm has a bias");
                dev.layernorm_residual_forward(residual, out, &mut mean, &mut rstd, a, b, w, bias, self.eps);
                NormStats { mean: Some(mean), rstd }
            }
            Norm::RmsNorm => {
                let mut rstd = dev.empty(rows, keep_as); // [N]
                dev.rmsnorm_residual_forward(residual, out, &mut rstd, a, b, w, self.eps);
                NormStats { mean: None, rstd }
            }
        }
    }

    /// norm(inp) into a fresh workspace tensor, the statistics recomputed bitwise equal to
    /// the saved ones and dropped: the recompute of a dropped norm output.
    pub fn recompute(&self, dev: &dyn Device, inp: &Tensor) -> Tensor {
        let mut out = dev.empty_of(inp.dtype(), inp.shape(), Category::Workspace);
        self.forward(dev, &mut out, inp, Category::Workspace);
        out
    }

    /// dinp [N,C] (overwrite) from dout [N,C], plus `dresidual` [N,C] where given (the
    /// gradient reaching the norm's input along the residual stream, added in the same
    /// device op); dweight [C] and dbias [C] accumulate.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &dyn Device,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        (dweight, dbias): (&mut Tensor, Option<&mut Tensor>),
        dout: &Tensor,
        inp: &Tensor,
        stats: &NormStats,
    ) {
        let shifted = self.shifted_weight(dev);
        let w = shifted.as_ref().unwrap_or(self.weight);
        match self.norm {
            Norm::LayerNorm => {
                let mean = stats.mean.as_ref().expect("LayerNorm keeps its mean");
                let dbias = dbias.expect("LayerNorm has a bias");
                let rstd = &stats.rstd;
                match dresidual {
                    Some(dres) => {
                        dev.layernorm_residual_backward(dinp, dres, dweight, dbias, dout, inp, w, mean, rstd)
                    }
                    None => dev.layernorm_backward(dinp, dweight, dbias, dout, inp, w, mean, rstd),
                }
            }
            Norm::RmsNorm => match dresidual {
                Some(dres) => dev.rmsnorm_residual_backward(dinp, dres, dweight, dout, inp, w, &stats.rstd),
                None => dev.rmsnorm_backward(dinp, dweight, dout, inp, w, &stats.rstd),
            },
        }
    }
}
