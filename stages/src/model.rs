//! The model description: what a model is, in Megatron-LM's terms. GPT-2 and the Llama family
//! are two values of it ([`Architecture::GPT2`], [`Architecture::llama`]), and every
//! combination Megatron's flags allow is another.
//!
//! Everything else derives from it: the parameters with their Hugging Face names
//! (`params.rs`), what a block keeps for its backward (`saved.rs`), the FLOPs (`flops.rs`),
//! the memory model, and the layers themselves (`layers/`).

use crate::layers::activation::Activation;
use crate::layers::norm::{Norm, NormLayer, NormPlacement};
use kernels::{
    AttentionSaves, CausalMask, DType, QkNormRows, QkNormSpan, RopeFrequencies, Tensor, WeightLayout,
};

/// How a token learns its position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Positions {
    /// A learned table [max_positions, C] added to the token embedding (GPT-2).
    Learned,
    /// Rotary embeddings on q and k in every block, Hugging Face's rotate-half layout, with
    /// frequencies base^(-2i/hs) (Llama: base 10000, Llama 3: 500000), Llama 3.1's scaling
    /// on top where it is set.
    Rotary(RopeFrequencies),
}

/// A sliding window over the keys (Megatron's `window_size` and `window_attn_skip_freq`):
/// each query of a windowed layer sees the `keys` keys up to itself, itself included
/// (Hugging Face's `sliding_window`); with `full_every` N, every Nth layer counting from 1
/// (the Nth, the 2Nth, ...) sees every key before it instead (OLMo 3's one in four, N = 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    pub keys: usize,
    pub full_every: Option<usize>,
}

impl SlidingWindow {
    /// Whether `layer` (global, from 0) is windowed.
    pub fn windows(self, layer: usize) -> bool {
        self.full_every.is_none_or(|n| !(layer + 1).is_multiple_of(n))
    }
}

/// Which linear layers add a bias: Megatron's `disable_bias_linear` and `add_qkv_bias`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearBiases {
    /// Every projection (GPT-2).
    All,
    /// The q, k and v projections alone (Qwen2: `disable_bias_linear` with `add_qkv_bias`).
    QkvOnly,
    /// No projection (Llama: `disable_bias_linear`).
    NoBiases,
}

impl LinearBiases {
    /// Whether the fused q, k, v projection adds a bias.
    pub fn on_qkv(self) -> bool {
        self != LinearBiases::NoBiases
    }

    /// Whether the attention's output projection and the MLP's projections add theirs.
    pub fn on_the_rest(self) -> bool {
        self == LinearBiases::All
    }
}

/// The family-level choices of a decoder: Megatron's `normalization`, `norm_epsilon`,
/// `position_embedding_type`, `swiglu`, `disable_bias_linear`, `add_qkv_bias`,
/// `qk_layernorm`, `untie_embeddings_and_output_weights` and `init_method_std`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Architecture {
    pub norm: Norm,
    pub norm_eps: f32,
    /// Whether each block normalises its branches' inputs (pre-norm) or their outputs.
    pub norm_placement: NormPlacement,
    /// Every norm but QK-norm scales by 1 + weight, its weight zero-centred and zero at
    /// init (Megatron's `apply_layernorm_1p`, Nemotron's LayerNorm1P).
    pub zero_centered_gamma: bool,
    pub positions: Positions,
    /// The MLP's activation: GELU or squared ReLU on one projection, or SwiGLU on a gate and
    /// an up projection.
    pub activation: Activation,
    pub biases: LinearBiases,
    /// Each query and key head is normalised by the model's norm before the rotary
    /// embedding, one weight [hs] for the query heads and one for the key heads (Megatron's
    /// `qk_layernorm`, Qwen3's `q_norm` and `k_norm`). RMSNorm only: pipetrain has no
    /// per-head LayerNorm.
    pub qk_norm: bool,
    /// What QK-norm spans, where the model has it: each head, or the whole projection.
    pub qk_norm_span: QkNormSpan,
    /// A sliding window on some or all layers' attention; None: every query sees every key
    /// before it.
    pub sliding_window: Option<SlidingWindow>,
    /// The output layer is the token embedding (not `untie_embeddings_and_output_weights`).
    pub tied_output: bool,
    /// The token embedding's output is multiplied by this (Gemma's sqrt(hidden_size), in
    /// f32); None leaves it as looked up.
    pub embedding_multiplier: Option<f32>,
    /// The std of every weight's normal init; the residual projections use
    /// std / sqrt(2 * layers), as GPT-2 and Megatron do.
    pub init_std: f32,
}

/// Whose Hugging Face names and layout a model's parameters take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// `GPT2LMHeadModel`: `h.{i}.attn.c_attn.weight`, Conv1D weights [in, out].
    Gpt2,
    /// `LlamaForCausalLM`: `model.layers.{i}.self_attn.q_proj.weight`, Linear weights
    /// [out, in]; pipetrain fuses q, k and v (and gate and up) into one matrix, whose rows
    /// are the Hugging Face matrices stacked.
    Llama,
}

impl Architecture {
    pub const GPT2: Architecture = Architecture {
        norm: Norm::LayerNorm,
        norm_eps: 1e-5,
        norm_placement: NormPlacement::Input,
        zero_centered_gamma: false,
        positions: Positions::Learned,
        activation: Activation::Gelu,
        biases: LinearBiases::All,
        qk_norm: false,
        qk_norm_span: QkNormSpan::Head,
        sliding_window: None,
        tied_output: true,
        embedding_multiplier: None,
        init_std: 0.02,
    };

    /// The Llama family: RMSNorm, rotary positions, SwiGLU, no biases, an untied output layer.
    pub fn llama(rotary_base: f32, norm_eps: f32) -> Architecture {
        Architecture {
            norm: Norm::RmsNorm,
            norm_eps,
            norm_placement: NormPlacement::Input,
            zero_centered_gamma: false,
            positions: Positions::Rotary(RopeFrequencies::plain(rotary_base)),
            activation: Activation::SwiGlu,
            biases: LinearBiases::NoBiases,
            qk_norm: false,
            qk_norm_span: QkNormSpan::Head,
            sliding_window: None,
            tied_output: false,
            embedding_multiplier: None,
            init_std: 0.02,
        }
    }

    /// The keys layer `layer` (global, from 0) attends to.
    pub fn attention_mask(&self, layer: usize) -> CausalMask {
        match self.sliding_window {
            Some(w) if w.windows(layer) => CausalMask::Window(w.keys),
            _ => CausalMask::Full,
        }
    }

    /// A norm layer of this model over `weight` [C] and, for LayerNorm, `bias` [C].
    pub fn norm_layer<'a>(&self, weight: &'a Tensor, bias: Option<&'a Tensor>) -> NormLayer<'a> {
        NormLayer {
            norm: self.norm,
            eps: self.norm_eps,
            weight,
            bias,
            zero_centered: self.zero_centered_gamma,
        }
    }

    /// GPT-2's own architecture, whatever its epsilon and init.
    fn is_gpt2(&self) -> bool {
        *self == Architecture { norm_eps: self.norm_eps, init_std: self.init_std, ..Architecture::GPT2 }
    }
}

/// A decoder's shape for one microbatch: its architecture and sizes, and what the device
/// keeps and stores. The layers, the memory model and the FLOP counts derive from it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    pub arch: Architecture,
    /// Transformer blocks in the whole model.
    pub num_layers: usize,
    /// C, the residual width.
    pub hidden: usize,
    /// NH, query heads.
    pub heads: usize,
    /// KV, key and value heads (Megatron's `num_query_groups`): NH without grouped-query
    /// attention.
    pub kv_heads: usize,
    /// hs, the head size, where it is not C / NH (Megatron's `kv_channels`, Hugging Face's
    /// `head_dim`: Mistral Nemo's 128 at C = 5120 over 32 heads).
    pub head_dim: Option<usize>,
    /// F, the MLP's inner width (4C for GPT-2).
    pub ffn: usize,
    /// T, tokens per sequence.
    pub seq_len: usize,
    /// The longest sequence the model takes (rows of a learned position table).
    pub max_positions: usize,
    /// V, vocabulary size.
    pub vocab: usize,
    /// B, sequences per microbatch.
    pub micro_batch: usize,
    /// Training drops attention probabilities (attention_dropout > 0): where the attention
    /// core keeps probabilities, each block then keeps the dropped ones beside them.
    pub attention_dropout: bool,
    /// What the device's attention core keeps for backward: the probabilities (CPU) or the
    /// per-row log-sum-exp (the CUDA backend's fused kernels).
    pub attention: AttentionSaves,
    /// The element type the device stores activations and their gradients in
    /// (`Device::activation_dtype`): bf16 on a CUDA device under `precision: bf16`, f32
    /// otherwise. The memory model reads it (`saved::BlockTensor::element_bytes`).
    pub activations: DType,
}

impl ModelShape {
    /// GPT-2 small (124M) at T = 1024, one sequence per microbatch: the shape tests check
    /// figures against.
    pub const GPT2_SMALL: ModelShape = ModelShape {
        arch: Architecture::GPT2,
        num_layers: 12,
        hidden: 768,
        heads: 12,
        kv_heads: 12,
        head_dim: None,
        ffn: 3072,
        seq_len: 1024,
        max_positions: 1024,
        vocab: 50257,
        micro_batch: 1,
        attention_dropout: false,
        attention: AttentionSaves::Probabilities,
        activations: DType::F32,
    };

    /// N = B*T, rows of every activation matrix.
    pub fn tokens(&self) -> usize {
        self.micro_batch * self.seq_len
    }

    /// hs: `head_dim`, else C / NH.
    pub fn head_size(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }

    /// A, the attention output's width: NH heads of hs (C unless `head_dim` says otherwise),
    /// the input of the output projection.
    pub fn attention_width(&self) -> usize {
        self.heads * self.head_size()
    }

    /// GPT-2's names exactly where the model is GPT-2's (`GPT2LMHeadModel` can load it), the
    /// Llama family's otherwise.
    pub fn naming(&self) -> Naming {
        if self.arch.is_gpt2() && self.kv_heads == self.heads && self.attention_width() == self.hidden {
            Naming::Gpt2
        } else {
            Naming::Llama
        }
    }

    /// How the blocks' matmul weights are laid out: Conv1D's [in, out] under GPT-2's names,
    /// Linear's [out, in] under Llama's.
    pub fn weight_layout(&self) -> WeightLayout {
        match self.naming() {
            Naming::Gpt2 => WeightLayout::InOut,
            Naming::Llama => WeightLayout::OutIn,
        }
    }

    /// The architecture in a line, e.g. `RMSNorm (eps 1e-5), rope (base 500000), SwiGLU,
    /// 8 query groups, no linear biases, untied output layer`.
    pub fn describe_architecture(&self) -> String {
        let a = &self.arch;
        let one_plus = if a.zero_centered_gamma { ", 1 + weight" } else { "" };
        let outputs = match a.norm_placement {
            NormPlacement::Input => "",
            NormPlacement::Output => ", on the branches' outputs",
        };
        let mut parts = vec![format!("{} (eps {:e}{one_plus}{outputs})", a.norm, a.norm_eps)];
        parts.push(match a.positions {
            Positions::Learned => "learned positions".into(),
            Positions::Rotary(freqs) => {
                let mut rope = vec![format!("base {}", freqs.base)];
                if let Some(factor) = freqs.llama3_factor {
                    rope.push(format!("Llama 3.1 scaling by {factor}"));
                }
                if let Some(rot) = freqs.rotary_dims {
                    rope.push(format!("on {rot} of {} channels", self.head_size()));
                }
                format!("rope ({})", rope.join(", "))
            }
        });
        parts.push(a.activation.name().into());
        if self.kv_heads != self.heads {
            parts.push(format!("{} query groups", self.kv_heads));
        }
        if self.attention_width() != self.hidden {
            parts.push(format!("heads of {}", self.head_size()));
        }
        match a.biases {
            LinearBiases::All => {}
            LinearBiases::QkvOnly => parts.push("biases on q, k and v alone".into()),
            LinearBiases::NoBiases => parts.push("no linear biases".into()),
        }
        match (a.qk_norm, a.qk_norm_span) {
            (false, _) => {}
            (true, QkNormSpan::Head) => parts.push("QK-norm".into()),
            (true, QkNormSpan::Projection) => parts.push("QK-norm over the projections".into()),
        }
        match a.sliding_window {
            None => {}
            Some(SlidingWindow { keys, full_every: None }) => parts.push(format!("a window of {keys} keys")),
            Some(SlidingWindow { keys, full_every: Some(n) }) => {
                parts.push(format!("a window of {keys} keys but on every {}", ordinal(n)))
            }
        }
        parts.push(if a.tied_output { "tied output layer" } else { "untied output layer" }.into());
        if let Some(m) = a.embedding_multiplier {
            parts.push(format!("embeddings x {m}"));
        }
        parts.join(", ")
    }

    /// The rows QK-norm normalises in each token's qkv, and its weights' widths.
    pub fn qk_norm_rows(&self) -> QkNormRows {
        self.arch.qk_norm_span.rows(self.heads, self.kv_heads, self.head_size())
    }

    /// Columns of the fused q, k, v projection: NH query heads, then KV key heads and KV
    /// value heads (3C without grouped-query attention).
    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_size()
    }

    /// Columns of the MLP's first projection: F, or 2F for SwiGLU's gate and up halves.
    pub fn fc1_width(&self) -> usize {
        self.arch.activation.fc1_width(self.ffn)
    }
}

/// Dropout probabilities (GPT-2: embd/resid = hidden, attn = attention).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct DropoutProbs {
    pub hidden: f32,
    pub attention: f32,
}

/// "2nd", "3rd", "4th", ...: the layer a window skips.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix} layer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naming_follows_the_architecture() {
        let with = |arch| ModelShape { arch, ..ModelShape::GPT2_SMALL };
        assert_eq!(with(Architecture::GPT2).naming(), Naming::Gpt2);
        let eps = Architecture { norm_eps: 1e-6, init_std: 0.01, ..Architecture::GPT2 };
        assert_eq!(with(eps).naming(), Naming::Gpt2);
        assert_eq!(with(Architecture::llama(1e4, 1e-5)).naming(), Naming::Llama);
        // Any departure from GPT2LMHeadModel's architecture takes the Llama family's names.
        let untied = with(Architecture { tied_output: false, ..Architecture::GPT2 });
        let rms = with(Architecture { norm: Norm::RmsNorm, ..Architecture::GPT2 });
        let gqa = ModelShape { kv_heads: 4, ..ModelShape::GPT2_SMALL };
        assert_eq!([untied.naming(), rms.naming(), gqa.naming()], [Naming::Llama; 3]);
        assert_eq!(with(Architecture::GPT2).weight_layout(), WeightLayout::InOut);
        assert_eq!(untied.weight_layout(), WeightLayout::OutIn);
    }

    #[test]
    fn describes_the_architecture_in_a_line() {
        let llama3 = ModelShape {
            arch: Architecture::llama(500000.0, 1e-5),
            heads: 32,
            kv_heads: 8,
            ..ModelShape::GPT2_SMALL
        };
        assert_eq!(
            llama3.describe_architecture(),
            "RMSNorm (eps 1e-5), rope (base 500000), SwiGLU, 8 query groups, no linear biases, untied output layer"
        );
        let scaled = RopeFrequencies { llama3_factor: Some(32.0), ..RopeFrequencies::plain(500000.0) };
        let llama32 = ModelShape {
            arch: Architecture { positions: Positions::Rotary(scaled), tied_output: true, ..llama3.arch },
            ..llama3
        };
        assert_eq!(
            llama32.describe_architecture(),
            "RMSNorm (eps 1e-5), rope (base 500000, Llama 3.1 scaling by 32), SwiGLU, 8 query groups, no linear \
             biases, tied output layer"
        );
        assert_eq!(
            ModelShape::GPT2_SMALL.describe_architecture(),
            "LayerNorm (eps 1e-5), learned positions, GELU, tied output layer"
        );
        for (full_every, said) in
            [(None, "a window of 4096 keys"), (Some(4), "a window of 4096 keys but on every 4th layer")]
        {
            let sliding_window = Some(SlidingWindow { keys: 4096, full_every });
            let windowed = ModelShape { arch: Architecture { sliding_window, ..llama3.arch }, ..llama3 };
            assert!(windowed
                .describe_architecture()
                .ends_with(&format!("no linear biases, {said}, untied output layer")));
        }
        let half = RopeFrequencies { rotary_dims: Some(12), ..RopeFrequencies::plain(10000.0) };
        let partial =
            ModelShape { arch: Architecture { positions: Positions::Rotary(half), ..llama3.arch }, ..llama3 };
        assert_eq!(
            partial.describe_architecture(),
            "RMSNorm (eps 1e-5), rope (base 10000, on 12 of 24 channels), SwiGLU, 8 query groups, no linear \
             biases, untied output layer"
        );
        // Mistral Nemo: 32 heads of 128 at a width of 5120.
        let nemo = ModelShape {
            arch: Architecture::llama(1e6, 1e-5),
            hidden: 5120,
            heads: 32,
            kv_heads: 8,
            head_dim: Some(128),
            ..ModelShape::GPT2_SMALL
        };
        assert_eq!(
            nemo.describe_architecture(),
            "RMSNorm (eps 1e-5), rope (base 1000000), SwiGLU, 8 query groups, heads of 128, no linear biases, \
             untied output layer"
        );
        assert_eq!((nemo.head_size(), nemo.attention_width(), nemo.qkv_width()), (128, 4096, 6144));
        // GPT2LMHeadModel cannot hold heads of another size: the Llama family's names.
        let wide = ModelShape { head_dim: Some(128), ..ModelShape::GPT2_SMALL };
        assert_eq!(wide.naming(), Naming::Llama);
        assert_eq!(ModelShape { head_dim: Some(64), ..ModelShape::GPT2_SMALL }.naming(), Naming::Gpt2);
        let qwen2 = ModelShape {
            arch: Architecture { biases: LinearBiases::QkvOnly, ..Architecture::llama(1e6, 1e-6) },
            hidden: 3584,
            heads: 28,
            kv_heads: 4,
            ..ModelShape::GPT2_SMALL
        };
        assert_eq!(
            qwen2.describe_architecture(),
            "RMSNorm (eps 1e-6), rope (base 1000000), SwiGLU, 4 query groups, biases on q, k and v alone, untied \
             output layer"
        );
    }

    #[test]
    fn widths_of_the_fused_projections() {
        let gqa = ModelShape {
            arch: Architecture::llama(1e4, 1e-5),
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            ffn: 14336,
            ..ModelShape::GPT2_SMALL
        };
        assert_eq!((gqa.head_size(), gqa.qkv_width(), gqa.fc1_width()), (128, 6144, 28672));
        let s = ModelShape::GPT2_SMALL;
        assert_eq!((s.qkv_width(), s.fc1_width()), (3 * 768, 3072));
    }
}
