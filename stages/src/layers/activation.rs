//! The MLP's activation: GELU (GPT-2's tanh approximation) on one projection, or SwiGLU
//! (Megatron's `swiglu`: silu(gate) * up) on the two halves of a fused projection.

use kernels::{Device, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Gelu,
    SwiGlu,
}

impl Activation {
    /// Columns of the MLP's first projection for an inner width F: F, or 2F for SwiGLU's
    /// gate and up halves side by side (Megatron's fused linear_fc1).
    pub fn fc1_width(self, ffn: usize) -> usize {
        match self {
            Activation::Gelu => ffn,
            Activation::SwiGlu => 2 * ffn,
        }
    }

    /// out [N,F] = act(inp [N, fc1_width(F)]).
    pub fn forward(self, dev: &dyn Device, out: &mut Tensor, inp: &Tensor) {
        match self {
            Activation::Gelu => dev.gelu_forward(out, inp),
            Activation::SwiGlu => dev.swiglu_forward(out, inp),
        }
    }

    /// dinp [N, fc1_width(F)] (overwrite) from dout [N,F] and the forward's input.
    pub fn backward(self, dev: &dyn Device, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        match self {
            Activation::Gelu => dev.gelu_backward(dinp, inp, dout),
            Activation::SwiGlu => dev.swiglu_backward(dinp, inp, dout),
        }
    }
}
