//! The transformers classes that build a model pipetrain describes with a [`LlamaConfig`]:
//! one row per class ([`CLASSES`]) saying what the class fixes of the architecture and
//! which config.json keys name the rest, read by `LlamaConfig::from_json` and written by
//! `LlamaConfig::to_json`. `LlamaForCausalLM` and its kin (Qwen2's biases on q, k and v,
//! Qwen3's QK-norm; Mistral, written for a Llama with a sliding window on every layer;
//! Phi-3, written for a Llama turning part of each head), `NemotronForCausalLM`,
//! `StableLmForCausalLM`, `GemmaForCausalLM`, `Olmo2ForCausalLM` and `Olmo3ForCausalLM`
//! (OLMo 2's with a sliding window); what no class builds is written as pipetrain's own
//! model_type, with Megatron's keys.

use kernels::RopeFrequencies;
use stages::{Activation, Architecture, LinearBiases, Norm, NormPlacement, Positions, QkNormSpan};

use super::hf_window::{Window, TRANSFORMERS_WINDOW};
use super::LlamaConfig;

/// How a class's config.json says which linear layers add a bias.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BiasKeys {
    /// `attention_bias` and `mlp_bias`, true both or neither: every layer's or none
    /// (LlamaConfig, NemotronConfig).
    AttentionAndMlp,
    /// `use_qkv_bias`: q's, k's and v's, or none (StableLmConfig).
    UseQkvBias,
    /// Fixed by the class: Qwen2's on q, k and v, Mistral's and Phi-3's none.
    Fixed(LinearBiases),
    /// None; `attention_bias` would put them on q, k, v and o but not the MLP, which
    /// pipetrain cannot express, so it is refused (Qwen3Config, GemmaConfig).
    NoneWithoutAttentionBias,
}

/// What one transformers class fixes of a model, and the config.json keys it reads.
#[derive(Debug)]
pub struct HfClass {
    pub model_type: &'static str,
    /// config.json's `architectures`; None for a class read as a Llama and written as one.
    pub architecture: Option<&'static str>,
    /// The family's name in errors.
    pub family: &'static str,
    pub norm: Norm,
    pub norm_placement: NormPlacement,
    /// The norms scale by 1 + weight.
    pub zero_centered_gamma: bool,
    /// The norm epsilon's key, and transformers' default for it.
    pub eps_key: &'static str,
    pub eps_default: f64,
    pub activation: Activation,
    /// The `hidden_act` values read as `activation`; the first is written.
    pub hidden_act: &'static [&'static str],
    pub qk_norm: bool,
    pub qk_norm_span: QkNormSpan,
    pub biases: BiasKeys,
    /// The class takes Llama 3.1's rope scaling.
    pub llama3_scaling: bool,
    /// The share of each head its rotary embedding turns where `partial_rotary_factor` is
    /// absent; None where it reads no share and turns every channel.
    pub rotary_share: Option<f64>,
    /// `head_dim` where config.json leaves it out; None: hidden_size / num_attention_heads.
    pub head_dim: Option<usize>,
    /// The class reads no `head_dim`: its heads are hidden_size / num_attention_heads wide.
    pub heads_fill_hidden: bool,
    /// The embedding is multiplied by sqrt(hidden_size) ([`gemma_multiplier`]).
    pub multiplies_embeddings: bool,
    /// `tie_word_embeddings` where config.json leaves it out.
    pub tied_by_default: bool,
    /// The files hold q, k, v as one tensor and gate, up as another, under pipetrain's
    /// fused names.
    pub fused_files: bool,
    /// Keys that, true, build what pipetrain does not: each refused in one line ("KEY is
    /// true: WHY"), and written false.
    pub refused: &'static [(&'static str, &'static str)],
    pub window: Window,
}

/// LlamaConfig: also the keys pipetrain's own model_type writes beside Megatron's.
pub const LLAMA: HfClass = HfClass {
    model_type: "llama",
    architecture: Some("LlamaForCausalLM"),
    family: "Llama",
    norm: Norm::RmsNorm,
    norm_placement: NormPlacement::Input,
    zero_centered_gamma: false,
    eps_key: "rms_norm_eps",
    eps_default: 1e-6,
    activation: Activation::SwiGlu,
    hidden_act: &["silu"],
    qk_norm: false,
    qk_norm_span: QkNormSpan::Head,
    biases: BiasKeys::AttentionAndMlp,
    llama3_scaling: true,
    rotary_share: None,
    head_dim: None,
    heads_fill_hidden: false,
    multiplies_embeddings: false,
    tied_by_default: false,
    fused_files: false,
    refused: &[],
    window: Window::Never,
};

const QWEN2: HfClass = HfClass {
    model_type: "qwen2",
    architecture: Some("Qwen2ForCausalLM"),
    biases: BiasKeys::Fixed(LinearBiases::QkvOnly),
    window: Window::Switched,
    ..LLAMA
};

const QWEN3: HfClass = HfClass {
    model_type: "qwen3",
    architecture: Some("Qwen3ForCausalLM"),
    family: "Qwen3",
    qk_norm: true,
    biases: BiasKeys::NoneWithoutAttentionBias,
    window: Window::Switched,
    ..LLAMA
};

/// Mistral: a Llama, and the class written for one with a sliding window on every layer
/// (Mistral 7B v0.1's); those without one it builds too, but LLAMA, before it, names them.
const MISTRAL: HfClass = HfClass {
    model_type: "mistral",
    architecture: Some("MistralForCausalLM"),
    biases: BiasKeys::Fixed(LinearBiases::NoBiases),
    window: Window::Count(Some(TRANSFORMERS_WINDOW)),
    ..LLAMA
};

/// Phi-3 and Phi-4: a Llama whose files hold q, k, v and gate, up fused (split on load,
/// stacked on write: `shapes::split_fused`, `shapes::stack_fused`). It turns a share of
/// each head (Phi-4 mini's 0.75), so it names the Llamas that turn part of one; those
/// that turn every channel it builds too, but LLAMA, before it, names them.
const PHI3: HfClass = HfClass {
    model_type: "phi3",
    architecture: Some("Phi3ForCausalLM"),
    biases: BiasKeys::Fixed(LinearBiases::NoBiases),
    llama3_scaling: false,
    rotary_share: Some(1.0),
    fused_files: true,
    window: Window::Count(None),
    ..LLAMA
};

/// Nemotron-4 and Minitron: LayerNorm1P, squared ReLU, half of each head turning.
const NEMOTRON: HfClass = HfClass {
    model_type: "nemotron",
    architecture: Some("NemotronForCausalLM"),
    family: "Nemotron",
    norm: Norm::LayerNorm,
    zero_centered_gamma: true,
    eps_key: "norm_eps",
    eps_default: 1e-5,
    activation: Activation::SquaredRelu,
    hidden_act: &["relu2"],
    llama3_scaling: false,
    rotary_share: Some(0.5),
    ..LLAMA
};

/// StableLM 2: LayerNorm, a quarter of each head turning.
const STABLELM: HfClass = HfClass {
    model_type: "stablelm",
    architecture: Some("StableLmForCausalLM"),
    norm: Norm::LayerNorm,
    eps_key: "layer_norm_eps",
    eps_default: 1e-5,
    biases: BiasKeys::UseQkvBias,
    llama3_scaling: false,
    rotary_share: Some(0.25),
    heads_fill_hidden: true,
    refused: &[
        (
            "qk_layernorm",
            "a LayerNorm over each head of q and k, where pipetrain's QK-norm is an RMSNorm, which pipetrain \
             does not build",
        ),
        (
            "use_parallel_residual",
            "attention and MLP side by side on one norm's output, which pipetrain does not build",
        ),
    ],
    ..LLAMA
};

/// Gemma 1: RMSNorm by 1 + weight, GeGLU, embeddings by sqrt(hidden_size), tied; its
/// releases' "gelu" is read as the tanh approximation, as transformers reads it.
const GEMMA: HfClass = HfClass {
    model_type: "gemma",
    architecture: Some("GemmaForCausalLM"),
    family: "Gemma",
    zero_centered_gamma: true,
    activation: Activation::GeGlu,
    hidden_act: &["gelu_pytorch_tanh", "gelu"],
    biases: BiasKeys::NoneWithoutAttentionBias,
    llama3_scaling: false,
    head_dim: Some(256),
    multiplies_embeddings: true,
    tied_by_default: true,
    refused: &[(
        "use_bidirectional_attention",
        "every query sees every key, where pipetrain's attention is causal",
    )],
    ..LLAMA
};

/// OLMo 2 (1B, 7B, 13B, and 32B with grouped-query attention): the norms on the branches'
/// outputs, QK-norm over the whole q and k projections.
const OLMO2: HfClass = HfClass {
    model_type: "olmo2",
    architecture: Some("Olmo2ForCausalLM"),
    family: "OLMo 2",
    norm_placement: NormPlacement::Output,
    eps_default: 1e-5,
    qk_norm: true,
    qk_norm_span: QkNormSpan::Projection,
    biases: BiasKeys::NoneWithoutAttentionBias,
    ..LLAMA
};

/// OLMo 3: OLMo 2 with a sliding window of 4096 keys on three layers in four. Those without
/// a window it builds too, but OLMO2, before it, names them.
const OLMO3: HfClass = HfClass {
    model_type: "olmo3",
    architecture: Some("Olmo3ForCausalLM"),
    family: "OLMo 3",
    window: Window::Layers { keys: TRANSFORMERS_WINDOW, full_every: 4 },
    ..OLMO2
};

/// Every class read. The first written that builds a model names it; of those, only
/// Mistral, Phi-3 and OLMo 3 build what another does (a test checks it).
pub const CLASSES: [&HfClass; 10] =
    [&LLAMA, &QWEN2, &QWEN3, &MISTRAL, &PHI3, &NEMOTRON, &STABLELM, &GEMMA, &OLMO2, &OLMO3];

/// Gemma's embedding multiplier for a width of `hidden`: sqrt(hidden_size), as the f32
/// tensor transformers' GemmaModel holds.
pub fn gemma_multiplier(hidden: usize) -> f32 {
    (hidden as f64).sqrt() as f32
}

impl HfClass {
    /// The class of a config.json's model_type, if pipetrain reads it.
    pub fn named(model_type: &str) -> Option<&'static HfClass> {
        CLASSES.into_iter().find(|c| c.model_type == model_type)
    }

    /// Whether the biases of a model are ones this class's config.json can say.
    fn takes(&self, biases: LinearBiases) -> bool {
        match self.biases {
            BiasKeys::AttentionAndMlp => biases != LinearBiases::QkvOnly,
            BiasKeys::UseQkvBias => biases != LinearBiases::All,
            BiasKeys::Fixed(fixed) => biases == fixed,
            BiasKeys::NoneWithoutAttentionBias => biases == LinearBiases::NoBiases,
        }
    }

    /// Whether this class, from the config.json `to_json` writes, builds model `c`.
    pub(super) fn builds(&self, c: &LlamaConfig) -> bool {
        let a = &c.arch;
        let Positions::Rotary(RopeFrequencies { llama3_factor, rotary_dims, .. }) = a.positions else {
            return false;
        };
        a.norm == self.norm
            && a.norm_placement == self.norm_placement
            && a.zero_centered_gamma == self.zero_centered_gamma
            && a.activation == self.activation
            && a.qk_norm == self.qk_norm
            && (!a.qk_norm || a.qk_norm_span == self.qk_norm_span)
            && self.takes(a.biases)
            && (self.llama3_scaling || llama3_factor.is_none())
            && (self.rotary_share.is_some() || rotary_dims.is_none())
            && a.embedding_multiplier == self.multiplies_embeddings.then(|| gemma_multiplier(c.hidden_size))
            && (!self.heads_fill_hidden || c.head_dim * c.num_attention_heads == c.hidden_size)
            && self.window.says(a.sliding_window)
    }
}

impl LlamaConfig {
    pub(super) fn with_biases(&self, biases: LinearBiases) -> LlamaConfig {
        LlamaConfig { arch: Architecture { biases, ..self.arch }, ..self.clone() }
    }

    /// The class config.json names for this model: the first written that builds it, None
    /// where none does (model_type "pipetrain").
    pub(super) fn hf_class(&self) -> Option<&'static HfClass> {
        CLASSES.into_iter().find(|c| c.architecture.is_some() && c.builds(self))
    }

    /// Why `transformers` has no class for this model, where it has none.
    pub fn missing_in_transformers(&self) -> Option<&'static str> {
        let a = &self.arch;
        if self.hf_class().is_some() {
            return None;
        }
        if a.sliding_window.is_some() {
            let unwindowed =
                LlamaConfig { arch: Architecture { sliding_window: None, ..*a }, ..self.clone() };
            if unwindowed.hf_class().is_some() {
                return Some(
                    "a sliding window on every layer is MistralForCausalLM's and Phi3ForCausalLM's, beside a Llama \
                     without biases or QK-norm, and one on some layers Olmo3ForCausalLM's alone, beside OLMo 2's \
                     norms",
                );
            }
        }
        if a.norm_placement == NormPlacement::Output
            || (a.qk_norm && a.qk_norm_span == QkNormSpan::Projection)
        {
            return Some(
                "only Olmo2ForCausalLM puts the norms on the attention's and MLP's outputs or normalises q and k over \
                 the whole projections, and it does both, beside RMSNorm, rope over every channel, SwiGLU and no \
                 biases",
            );
        }
        if a.embedding_multiplier.is_some() {
            return Some(
                "only GemmaForCausalLM multiplies its embeddings, by sqrt(hidden_size), beside RMSNorm, \
                 apply_layernorm_1p, rope over every channel, geglu and no biases",
            );
        }
        if NEMOTRON.builds(&self.with_biases(LinearBiases::NoBiases)) {
            return Some(
                "NemotronForCausalLM puts biases on every linear layer or none (attention_bias, mlp_bias), not on q, \
                 k and v alone",
            );
        }
        if a.zero_centered_gamma {
            return Some(
                "only NemotronForCausalLM's and GemmaForCausalLM's norms scale by 1 + weight (apply_layernorm_1p): \
                 Nemotron's beside LayerNorm, rope and squared_relu, Gemma's beside RMSNorm, rope, geglu and \
                 embeddings multiplied by sqrt(hidden_size)",
            );
        }
        if STABLELM.builds(&self.with_biases(LinearBiases::NoBiases)) {
            return Some(
                "StableLmForCausalLM puts biases on q, k and v or nowhere, not on every linear layer",
            );
        }
        let narrow = LlamaConfig { head_dim: self.hidden_size / self.num_attention_heads, ..self.clone() };
        if STABLELM.builds(&narrow) {
            return Some(
                "StableLmForCausalLM's heads are hidden_size / num_attention_heads wide, not kv_channels",
            );
        }
        if a.norm != Norm::RmsNorm || a.positions == Positions::Learned || a.activation != Activation::SwiGlu
        {
            return Some(
                "LlamaForCausalLM needs normalization RMSNorm, position_embedding_type rope and swiglu together, \
                 StableLmForCausalLM LayerNorm, rope and swiglu, NemotronForCausalLM LayerNorm, \
                 apply_layernorm_1p, rope and squared_relu",
            );
        }
        if a.qk_norm && a.biases != LinearBiases::NoBiases {
            return Some("Qwen3ForCausalLM's QK-norm comes without linear biases");
        }
        // What is left of a model no class builds is a Llama, a Qwen2 or a Qwen3 turning part
        // of each head: those three take every scaling and bias the checks above let pass,
        // and Phi-3, the one that turns part, takes a Llama without them.
        Some(
            "LlamaForCausalLM's rotary embedding turns every channel of a head, not rotary_percent of it, and \
             Phi3ForCausalLM's, which turns part, comes without biases, QK-norm or Llama 3.1's scaling",
        )
    }
}
