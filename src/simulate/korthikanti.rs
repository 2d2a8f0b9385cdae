//! The published activation memory of one transformer layer (Korthikanti et al. 2022,
//! "Reducing Activation Recomputation in Large Transformer Models", Table 2), printed next
//! to ours so a reader can check the model against the paper.
//!
//! The paper counts 16-bit activations and 1-byte dropout masks, and no LayerNorm
//! statistics. We never store a mask (the counter-based RNG regenerates it) and keep the
//! statistics (in fp32, as under bf16 the trainer does), so at 16 bits: ours + masks -
//! statistics = the paper's, exactly (a test holds it). The two residual dropouts' masks
//! lie outside the tensor-parallel split, the attention dropout's inside it. The fused
//! attention core of the CUDA device stores no softmax at all, only each row's log-sum-exp
//! (fp32 too): there ours - log-sum-exp + masks - statistics + the core the paper counts =
//! the paper's.
//!
//! The paper's 34 sbh is GPT's layer: q, k, v of width 3h, an MLP of 4h with one GELU. The
//! formula here counts the same tensors at the model's own widths, term by term, so it is
//! the paper's for GPT and its generalisation for the rest ([`differences`] says what
//! differs): grouped-query attention narrows k and v to the groups' width, SwiGLU keeps a
//! 2F-wide input and an F-wide output where GELU kept 4h and 4h, RMSNorm keeps one
//! statistic per row where LayerNorm keeps two (statistics the paper leaves out either way),
//! and QK-norm keeps q, k, v from before it too (and a statistic per head, left out).

use kernels::AttentionSaves;
use stages::recompute::RecomputePolicy;
use stages::saved::BlockTensor;
use stages::tensor_parallel::Split;
use stages::{ModelShape, TensorParallel};

/// What a layer keeps, in the paper's three cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// No recompute.
    Everything,
    /// Selective recompute of the attention core.
    SelectiveCoreAttention,
    /// Full recompute, one layer per group: the layer's input.
    Input,
}

impl Kept {
    /// The paper's case for a stage's policy; None where the paper has no formula (other
    /// selective modules, or groups of more than one layer).
    pub fn of(policy: &RecomputePolicy) -> Option<Kept> {
        match policy {
            RecomputePolicy::None => Some(Kept::Everything),
            RecomputePolicy::Selective(m) if m.core_attn && !m.mlp && !m.layernorm => {
                Some(Kept::SelectiveCoreAttention)
            }
            RecomputePolicy::Full { num_layers: 1, .. } => Some(Kept::Input),
            _ => None,
        }
    }
}

/// Table 2: bytes per layer on one GPU. sbh(34 + 5as/h) without parallelism; with t:
/// sbh(10 + 24/t + 5as/(ht)); with sequence parallelism sbh/t (34 + 5as/h); selective
/// recompute drops the 5as/h term; full recompute keeps 2sbh (a sequence shard of it with
/// sequence parallelism, as Megatron stores it). The 24 inside the split is 2 x (q, k, v:
/// 3h; the projection's input: h; the activation's input and output: 4h + 4h) / h, counted
/// at the model's widths.
pub fn layer_bytes(s: &ModelShape, tp: TensorParallel, kept: Kept) -> f64 {
    let sbh = (s.seq_len * s.micro_batch * s.hidden) as f64;
    let (a, sq, h, t) = (s.heads as f64, s.seq_len as f64, s.hidden as f64, tp.size as f64);
    let qkv = s.qkv_width() * if s.arch.qk_norm { 2 } else { 1 };
    let widths = qkv + s.attention_width() + s.fc1_width() + s.ffn;
    let inside = 2.0 * widths as f64 / h;
    let attention = if kept == Kept::Everything { 5.0 * a * sq / h } else { 0.0 };
    match (kept, tp.sequence && tp.size > 1) {
        (Kept::Input, sp) => 2.0 * sbh / if sp { t } else { 1.0 },
        (_, false) => sbh * (10.0 + inside / t + attention / t),
        (_, true) => sbh / t * (10.0 + inside + attention),
    }
}

/// What the model's layer changes in the paper's GPT formula, for the report; empty for GPT.
pub fn differences(s: &ModelShape) -> Vec<String> {
    let mut out = Vec::new();
    if s.kv_heads != s.heads {
        out.push(format!(
            "k, v over {} groups (q, k, v {}h, not 3h)",
            s.kv_heads,
            ratio(s.qkv_width(), s.hidden)
        ));
    }
    if s.attention_width() != s.hidden {
        out.push(format!(
            "heads of {} (the projection's input {}h, not h)",
            s.head_size(),
            ratio(s.attention_width(), s.hidden)
        ));
    }
    if s.fc1_width() != 4 * s.hidden || s.ffn != 4 * s.hidden {
        out.push(format!(
            "{} input {}h and output {}h (not 4h and 4h)",
            s.arch.activation.name(),
            ratio(s.fc1_width(), s.hidden),
            ratio(s.ffn, s.hidden)
        ));
    }
    if s.arch.norm.stats_per_row() != 2 {
        out.push(format!("{} keeps 1 statistic per row", s.arch.norm));
    }
    if s.arch.qk_norm {
        out.push(format!(
            "QK-norm keeps q, k, v before it too (another {}h)",
            ratio(s.qkv_width(), s.hidden)
        ));
    }
    out
}

/// `x / h` to three decimals at most, e.g. 1.5 or 9.333.
fn ratio(x: usize, h: usize) -> String {
    let r = (x as f64 / h as f64 * 1000.0).round() / 1000.0;
    format!("{r}")
}

/// The 1-byte dropout masks the paper stores and we regenerate: the attention dropout's
/// (unless the attention core is recomputed) and the two residual dropouts'.
pub fn mask_bytes(s: &ModelShape, tp: TensorParallel, kept: Kept) -> usize {
    let residual = 2 * tp.per_rank(s.tokens() * s.hidden, Split::Sequence);
    match kept {
        Kept::Everything => residual + tp.per_rank(BlockTensor::AttProbs.elements(s), Split::Interior),
        Kept::SelectiveCoreAttention => residual,
        Kept::Input => 0,
    }
}

/// Bytes of the norm statistics we keep and the paper leaves out.
pub fn statistics_bytes(s: &ModelShape, tp: TensorParallel, kept: Kept) -> usize {
    match kept {
        Kept::Input => 0,
        _ => [BlockTensor::Norm1Stats, BlockTensor::QkNormStats, BlockTensor::Norm2Stats]
            .into_iter()
            .map(|t| stored_bytes(s, tp, t))
            .sum(),
    }
}

fn stored_bytes(s: &ModelShape, tp: TensorParallel, t: BlockTensor) -> usize {
    tp.per_rank(t.elements(s), t.split(s)) * t.element_bytes(s)
}

/// What the fused attention core changes, at 16 bits: (the log-sum-exp it keeps and the
/// paper does not count, the core the paper counts and it never stores: softmax output,
/// dropout mask and dropout output, 5as/h sbh/t, outside selective recompute). Zeros where
/// attention keeps its probabilities.
pub fn fused_core_bytes(s: &ModelShape, tp: TensorParallel, kept: Kept) -> (usize, usize) {
    if s.attention != AttentionSaves::RowLogSumExp || kept == Kept::Input {
        return (0, 0);
    }
    let core = match kept {
        Kept::Everything => 5 * tp.per_rank(s.micro_batch * s.heads * s.seq_len * s.seq_len, Split::Interior),
        _ => 0,
    };
    (stored_bytes(s, tp, BlockTensor::AttLogSumExp), core)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::DType;
    use stages::recompute::BlockKeep;
    use stages::saved::block_kept_bytes;
    use stages::{FullMethod, SelectiveModules};

    /// GPT-3 175B's layer at s = 2048, b = 1 (h = 12288, a = 96), with attention dropout,
    /// stored at 16 bits as the paper counts it.
    const GPT3: ModelShape = ModelShape {
        arch: stages::Architecture::GPT2,
        num_layers: 96,
        hidden: 12288,
        heads: 96,
        kv_heads: 96,
        head_dim: None,
        ffn: 4 * 12288,
        seq_len: 2048,
        max_positions: 2048,
        vocab: 51200,
        micro_batch: 1,
        attention_dropout: true,
        attention: AttentionSaves::Probabilities,
        activations: DType::Bf16,
    };

    /// Llama 3 70B's layer at s = 8192, b = 1 (h = 8192, 64 heads over 8 groups, SwiGLU of
    /// 28672), with attention dropout so that every term of the formula is present.
    const LLAMA3_70B: ModelShape = ModelShape {
        arch: stages::Architecture {
            norm: stages::Norm::RmsNorm,
            norm_eps: 1e-5,
            norm_placement: stages::NormPlacement::Input,
            zero_centered_gamma: false,
            positions: stages::Positions::Rotary(kernels::RopeFrequencies::plain(500000.0)),
            activation: stages::Activation::SwiGlu,
            biases: stages::LinearBiases::NoBiases,
            qk_norm: false,
            qk_norm_span: stages::QkNormSpan::Head,
            sliding_window: None,
            tied_output: false,
            embedding_multiplier: None,
            init_std: 0.02,
        },
        num_layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        ffn: 28672,
        seq_len: 8192,
        max_positions: 8192,
        vocab: 128256,
        ..GPT3
    };

    /// Qwen3 8B's layer at s = 4096, b = 1 (h = 4096, 32 heads of 128 over 8 groups, SwiGLU
    /// of 12288, QK-norm).
    const QWEN3_8B: ModelShape = ModelShape {
        arch: stages::Architecture { qk_norm: true, ..LLAMA3_70B.arch },
        num_layers: 36,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: Some(128),
        ffn: 12288,
        seq_len: 4096,
        max_positions: 32768,
        vocab: 151936,
        ..LLAMA3_70B
    };

    #[test]
    fn the_differences_from_gpt_are_named() {
        assert!(differences(&GPT3).is_empty());
        assert_eq!(
            differences(&LLAMA3_70B),
            [
                "k, v over 8 groups (q, k, v 1.25h, not 3h)",
                "SwiGLU input 7h and output 3.5h (not 4h and 4h)",
                "RMSNorm keeps 1 statistic per row"
            ]
        );
        assert_eq!(
            differences(&QWEN3_8B).last().unwrap(),
            "QK-norm keeps q, k, v before it too (another 1.5h)"
        );
    }

    /// At 16 bits, for every t, with and without sequence parallelism, and each of the
    /// paper's recompute cases: ours + masks - statistics is the paper's figure, exactly
    /// (for GPT), and its generalisation (for Llama).
    #[test]
    fn ours_plus_masks_less_statistics_is_the_papers() {
        let core_attn = SelectiveModules { core_attn: true, ..SelectiveModules::NONE };
        let cases = [
            (RecomputePolicy::None, BlockKeep::Stored(SelectiveModules::NONE)),
            (RecomputePolicy::Selective(core_attn), BlockKeep::Stored(core_attn)),
            (
                RecomputePolicy::Full { method: FullMethod::Uniform, num_layers: 1 },
                BlockKeep::InputOnly { group_start: true },
            ),
        ];
        for shape in [GPT3, LLAMA3_70B, QWEN3_8B] {
            for t in [1, 2, 8] {
                for sequence in [false, true] {
                    let tp = TensorParallel { size: t, sequence, distribute_saved: false };
                    for (policy, keep) in cases {
                        let kept = Kept::of(&policy).unwrap();
                        let ours = block_kept_bytes(&shape, tp, keep);
                        let stats = statistics_bytes(&shape, tp, kept);
                        let relation = ours + mask_bytes(&shape, tp, kept) - stats;
                        assert_eq!(
                            relation as f64,
                            layer_bytes(&shape, tp, kept),
                            "{:?} t={t} sp={sequence} {policy:?}",
                            shape.arch
                        );
                    }
                }
            }
        }
        // The fused core keeps each row's log-sum-exp instead of the paper's 5as/h.
        let fused = ModelShape { attention: AttentionSaves::RowLogSumExp, ..GPT3 };
        for t in [1, 2, 8] {
            for sequence in [false, true] {
                let tp = TensorParallel { size: t, sequence, distribute_saved: false };
                for (policy, keep) in &cases[..2] {
                    let kept = Kept::of(policy).unwrap();
                    let ours = block_kept_bytes(&fused, tp, *keep);
                    let (lse, core) = fused_core_bytes(&fused, tp, kept);
                    // One fp32 value per head and query row.
                    assert_eq!(lse, 4 * 96 * 2048 / t);
                    let stats = statistics_bytes(&fused, tp, kept);
                    let relation = ours - lse + mask_bytes(&fused, tp, kept) - stats + core;
                    assert_eq!(
                        relation as f64,
                        layer_bytes(&fused, tp, kept),
                        "fused t={t} sp={sequence} {policy:?}"
                    );
                }
            }
        }
        // The paper's own numbers for this layer at t = 8 with SP: 34 sbh / t and 5as/h = 80.
        let sp = TensorParallel { size: 8, sequence: true, distribute_saved: false };
        let sbh = 2048.0 * 12288.0;
        assert_eq!(layer_bytes(&GPT3, sp, Kept::Everything), sbh / 8.0 * (34.0 + 80.0));
        assert_eq!(layer_bytes(&GPT3, sp, Kept::SelectiveCoreAttention), sbh * 34.0 / 8.0);
    }

    /// With sequence parallelism every byte a layer keeps divides by t; t = 1 is the
    /// trainer's layer.
    #[test]
    fn sequence_parallelism_divides_every_byte() {
        let modules = [
            SelectiveModules::NONE,
            SelectiveModules { core_attn: true, ..SelectiveModules::NONE },
            SelectiveModules { core_attn: true, mlp: true, layernorm: true },
        ];
        let keeps =
            modules.map(BlockKeep::Stored).into_iter().chain([BlockKeep::InputOnly { group_start: true }]);
        for keep in keeps {
            let one = block_kept_bytes(&GPT3, TensorParallel::NONE, keep);
            assert_eq!(
                block_kept_bytes(
                    &GPT3,
                    TensorParallel { size: 1, sequence: true, distribute_saved: false },
                    keep
                ),
                one
            );
            for t in [2, 4, 8] {
                assert_eq!(
                    block_kept_bytes(
                        &GPT3,
                        TensorParallel { size: t, sequence: true, distribute_saved: false },
                        keep
                    ) * t,
                    one
                );
            }
        }
    }
}
