//! Dropout masks from a counter-based RNG: Philox4x32-10 keyed by
//! (seed, step, microbatch, layer, site), so a recompute regenerates the same mask with no
//! RNG state to save, and the CPU and CUDA backends draw identical masks.

/// Where in the model a dropout happens; part of the RNG counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DropoutSite {
    /// After the token + position embedding (GPT-2 `embd_pdrop`).
    Embedding = 0,
    /// On the attention probabilities (GPT-2 `attn_pdrop`).
    AttentionProbs = 1,
    /// After the attention output projection (`resid_pdrop`).
    AttentionResidual = 2,
    /// After the MLP output projection (`resid_pdrop`).
    MlpResidual = 3,
}

/// Identifies one dropout mask of one training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutKey {
    pub seed: u64,
    pub step: u32,
    pub microbatch: u32,
    /// Transformer block index in the whole model (0 for the embedding site).
    pub layer: u32,
    pub site: DropoutSite,
}

/// A dropout to apply: probability of dropping and the mask's key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutSpec {
    pub p: f32,
    pub key: DropoutKey,
    /// The mask's element index of the tensor's first element (the elementwise dropout op's):
    /// 0, or where a sequence-parallel rank's rows begin in the whole tensor, so that the
    /// ranks' masks are the whole tensor's.
    pub first: usize,
    /// The attention's: where a tensor-parallel rank's query heads sit among the whole
    /// layer's, whose (batch, head) pairs key the mask; None for a layer's own heads.
    pub heads: Option<HeadRange>,
}

/// A tensor-parallel rank's query heads `first..first + its own` of the layer's `total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadRange {
    pub first: usize,
    pub total: usize,
}
