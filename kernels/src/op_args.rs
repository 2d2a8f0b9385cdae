//! The arguments of the ops that are more than tensors: how a matmul weight lies, an
//! AdamW step and its share of each parameter, the classifier's backward half, and the token
//! of another vocabulary shard.

use crate::tensor::Tensor;

/// How a matmul weight is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[IC, OC]`: Hugging Face GPT-2's Conv1D layout (`c_attn`, `c_proj`, `c_fc`).
    InOut,
    /// `[OC, IC]`: `nn.Linear` layout; the tied LM head uses the token embedding `[V, C]` so.
    OutIn,
}

/// Hyper-parameters of one AdamW update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay, of the tensors that decay ([`AdamWTensor::decay`]).
    pub weight_decay: f32,
    /// 1-based step number, for bias correction.
    pub step: u32,
    /// Multiplies the gradient before the update (global grad-norm clipping).
    pub grad_scale: f32,
}

impl AdamWStep {
    /// The constants of this step that every element shares, computed once on the host (in
    /// f64 where they come from powers, as every backend computes them): `step_size` = lr /
    /// (1 - beta1^t), `bias2_sqrt` = sqrt(1 - beta2^t), and `decay` = 1 - lr * wd.
    pub fn constants(&self) -> AdamWConstants {
        let t = i32::try_from(self.step).expect("adamw step fits in i32");
        AdamWConstants {
            step_size: (self.lr as f64 / (1.0 - (self.beta1 as f64).powi(t))) as f32,
            bias2_sqrt: (1.0 - (self.beta2 as f64).powi(t)).sqrt() as f32,
            decay: 1.0 - self.lr * self.weight_decay,
        }
    }
}

/// [`AdamWStep::constants`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConstants {
    pub step_size: f32,
    pub bias2_sqrt: f32,
    pub decay: f32,
}

/// One parameter's share of an AdamW step ([`crate::Device::adamw_tensors`]): the elements
/// `from..from + m.len()` of param and grad, whose moments m and v hold.
pub struct AdamWTensor<'a> {
    pub param: &'a mut Tensor,
    pub grad: &'a Tensor,
    pub m: &'a mut Tensor,
    pub v: &'a mut Tensor,
    pub from: usize,
    /// Whether the step's weight decay applies: not to biases and norms.
    pub decay: bool,
}

/// The backward half of [`crate::Device::classifier`].
pub struct ClassifierGrad<'a> {
    /// s, multiplying dloss/dlogits: 1 / (B*T*microbatches) averages over the global batch.
    pub scale: f32,
    /// dloss/dinp [N,C], overwritten.
    pub dinp: &'a mut Tensor,
    /// The gradient of the output layer's weight [V,C]: the tied token embedding's, or the
    /// untied output weight's; accumulated.
    pub dweight: &'a mut Tensor,
}

/// The token id the embedding ops take for a token outside this tensor-parallel rank's
/// shard of the vocabulary (Megatron's vocab-parallel embedding masks it to a zero row).
pub const OTHER_SHARD: u32 = u32::MAX;
