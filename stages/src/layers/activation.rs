//! The MLP's activation: GELU (GPT-2's tanh approximation) or squared ReLU (Megatron's
//! `squared_relu`, Nemotron's) on one projection, or a gated linear unit on the two halves
//! of a fused projection: SwiGLU (Megatron's `swiglu`: silu(gate) * up) or GeGLU (Gemma's:
//! gelu(gate) * up, GELU's tanh approximation).

use kernels::{Category, Device, Gate, Tensor, WeightLayout};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Gelu,
    SquaredRelu,
    SwiGlu,
    GeGlu,
}

impl Activation {
    /// The gate of a gated linear unit; None for an activation of one projection.
    fn gate(self) -> Option<Gate> {
        match self {
            Activation::Gelu | Activation::SquaredRelu => None,
            Activation::SwiGlu => Some(Gate::Silu),
            Activation::GeGlu => Some(Gate::GeluTanh),
        }
    }

    /// Columns of the MLP's first projection for an inner width F: F, or 2F for a gated
    /// unit's gate and up halves side by side (Megatron's fused linear_fc1).
    pub fn fc1_width(self, ffn: usize) -> usize {
        match self.gate() {
            None => ffn,
            Some(_) => 2 * ffn,
        }
    }

    /// out [N,F] = act(inp [N, fc1_width(F)]).
    pub fn forward(self, dev: &dyn Device, out: &mut Tensor, inp: &Tensor) {
        match self {
            Activation::Gelu => dev.gelu_forward(out, inp),
            Activation::SquaredRelu => dev.squared_relu_forward(out, inp),
            Activation::SwiGlu | Activation::GeGlu => {
                dev.glu_forward(out, inp, self.gate().expect("a gated unit"))
            }
        }
    }

    /// Megatron's name for it, as the simulator's report and the model's line print it.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Gelu => "GELU",
            Activation::SquaredRelu => "squared ReLU",
            Activation::SwiGlu => "SwiGLU",
            Activation::GeGlu => "GeGLU",
        }
    }

    /// dinp [N, fc1_width(F)] (overwrite) from the gradient dout [N,C] at the output of
    /// fc2, the matmul that read act(inp): fc2's input gradient [N,F], then the
    /// activation's. GELU's are one op, which CUDA runs as one product.
    pub fn backward_through_fc2(
        self,
        dev: &dyn Device,
        dinp: &mut Tensor,
        inp: &Tensor,
        dout: &Tensor,
        fc2: (&Tensor, WeightLayout),
    ) {
        let (weight, layout) = fc2;
        match self {
            Activation::Gelu => dev.matmul_backward_input_gelu(dinp, dout, weight, layout, inp),
            Activation::SquaredRelu => {
                let mut dact = dev.empty_of(dev.activation_dtype(), dinp.shape(), Category::Workspace); // [N,F]
                dev.matmul_backward_input(&mut dact, dout, weight, layout);
                dev.squared_relu_backward(dinp, inp, &dact);
            }
            Activation::SwiGlu | Activation::GeGlu => {
                let f = dinp.shape().last().expect("a [N, 2F] gradient") / 2;
                let mut dact =
                    dev.empty_of(dev.activation_dtype(), &[dinp.len() / (2 * f), f], Category::Workspace); // [N,F]
                dev.matmul_backward_input(&mut dact, dout, weight, layout);
                dev.glu_backward(dinp, inp, &dact, self.gate().expect("a gated unit"));
            }
        }
    }
}
