//! The gate of a gated linear unit (kernels/src/cpu/glu.rs, kernels/cuda/glu.cu): the
//! activation applied to the gate half before it multiplies the up half.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// silu(a) = a * sigmoid(a): SwiGLU (Llama, Megatron's `swiglu`).
    Silu,
    /// GPT-2's tanh GELU: GeGLU (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Gate {
    /// glu.cu's forward and backward kernels for this gate.
    pub fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Gate::Silu => ("swiglu_forward", "swiglu_backward"),
            Gate::GeluTanh => ("geglu_forward", "geglu_backward"),
        }
    }
}
