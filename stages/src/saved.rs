//! What each layer keeps from forward for its backward: the single declaration that both the
//! layers (at run time) and the simulator's memory model (before any run) read.
//!
//! A transformer block's forward produces the tensors of [`BlockTensor`]; the recompute
//! policy decides, per tensor, whether it is kept until backward or dropped and recomputed
//! just before the backward that needs it. Dropout masks are never stored: they are
//! regenerated from the counter-based RNG.
//!
//! Each tensor is stored in the activations' element type (`ModelShape::activations`) but for
//! the row statistics, which the device keeps in f32 whatever its activations are: the
//! norms' mean and reciprocal std (QK-norm's per head) and the fused attention core's
//! log-sum-exp.

use crate::layers::norm::NormPlacement;
use crate::model::ModelShape;
use crate::recompute::{BlockKeep, SelectiveModules};
use crate::tensor_parallel::{Split, TensorParallel};
use kernels::{AttentionSaves, QkNormSpan};

/// Every tensor a block's backward reads. Shapes with B batch, T seq, C hidden, F ffn, NH
/// heads, QKV the fused projection's width ((NH + 2 KV) * hs), FC1 the MLP's first
/// projection's (F, or 2F for SwiGLU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockTensor {
    /// x [B,T,C]: the block's input, read by the first norm's backward (by the qkv
    /// projection's weight gradient where the norms are on the branches' outputs).
    Input,
    /// norm_1(x) [B,T,C]: input of the qkv projection, read by its weight gradient. Only
    /// where the norms are on the branches' inputs.
    Norm1Out,
    /// norm_1's row statistics, [B,T] each: mean and reciprocal std (LayerNorm), or the
    /// reciprocal root mean square (RMSNorm).
    Norm1Stats,
    /// q, k, v [B,T,QKV] as the qkv projection gives them, before QK-norm: the norm's
    /// backward reads them. Only under QK-norm (`Architecture::qk_norm`).
    QkNormIn,
    /// QK-norm's reciprocal root mean square of each query and key head, [B,T,NH+KV]. Only
    /// under QK-norm.
    QkNormStats,
    /// q, k, v [B,T,QKV] as the attention core reads them: the qkv projection's output,
    /// after QK-norm and the rotary embedding where the model has them (the rotary
    /// embedding's backward needs no input).
    Qkv,
    /// softmax(q k^T / sqrt(hs) + mask) [B,NH,T,T], before dropout: the softmax's backward
    /// reads it. Only where the attention core keeps probabilities (the CPU backend).
    AttProbs,
    /// dropout(AttProbs) [B,NH,T,T], the input of the product with v, whose backward reads
    /// it. Only where the core keeps probabilities and training drops them
    /// (`ModelShape::attention_dropout`).
    AttDropped,
    /// The log-sum-exp of each query row's scores [B,NH,T], from which the fused core's
    /// backward recomputes the probabilities (with q, k and the attention output). Only
    /// where the core is fused (the CUDA backend).
    AttLogSumExp,
    /// attention output [B,T,A] (A = NH * hs, C unless the head size is set apart): input of
    /// the output projection.
    AttOut,
    /// proj(att) [B,T,C]: norm_1's input where the norms are on the branches' outputs, read
    /// by its backward; only there.
    AttProj,
    /// The residual stream after attention [B,T,C]: x + dropout(proj(att)), norm_2's input;
    /// or x + dropout(norm_1(proj(att))), the MLP's first projection's, where the norms are
    /// on the branches' outputs.
    Residual,
    /// norm_2(residual) [B,T,C]: input of the MLP's first projection. Only where the norms
    /// are on the branches' inputs.
    Norm2Out,
    /// norm_2's row statistics, as Norm1Stats.
    Norm2Stats,
    /// fc1(norm_2(..)) [B,T,FC1]: the activation's input.
    FcOut,
    /// act(fc1(..)) [B,T,F]: GELU's or SwiGLU's output, input of the MLP's second projection.
    ActOut,
    /// fc2(act(..)) [B,T,C]: norm_2's input where the norms are on the branches' outputs,
    /// read by its backward; only there.
    FcProj,
}

impl BlockTensor {
    pub const ALL: [BlockTensor; 17] = [
        BlockTensor::Input,
        BlockTensor::Norm1Out,
        BlockTensor::Norm1Stats,
        BlockTensor::QkNormIn,
        BlockTensor::QkNormStats,
        BlockTensor::Qkv,
        BlockTensor::AttProbs,
        BlockTensor::AttDropped,
        BlockTensor::AttLogSumExp,
        BlockTensor::AttOut,
        BlockTensor::AttProj,
        BlockTensor::Residual,
        BlockTensor::Norm2Out,
        BlockTensor::Norm2Stats,
        BlockTensor::FcOut,
        BlockTensor::ActOut,
        BlockTensor::FcProj,
    ];

    /// Elements of this tensor for one microbatch.
    pub fn elements(self, s: &ModelShape) -> usize {
        let (n, c) = (s.tokens(), s.hidden);
        let on_inputs = s.arch.norm_placement == NormPlacement::Input;
        match self {
            BlockTensor::Norm1Out | BlockTensor::Norm2Out if !on_inputs => 0,
            BlockTensor::AttProj | BlockTensor::FcProj if on_inputs => 0,
            BlockTensor::Input
            | BlockTensor::Norm1Out
            | BlockTensor::AttProj
            | BlockTensor::Residual
            | BlockTensor::Norm2Out
            | BlockTensor::FcProj => n * c,
            BlockTensor::AttOut => n * s.attention_width(),
            BlockTensor::Norm1Stats | BlockTensor::Norm2Stats => s.arch.norm.stats_per_row() * n,
            BlockTensor::QkNormIn | BlockTensor::QkNormStats if !s.arch.qk_norm => 0,
            BlockTensor::QkNormIn | BlockTensor::Qkv => n * s.qkv_width(),
            BlockTensor::QkNormStats => n * s.qk_norm_rows().rows(),
            BlockTensor::AttProbs | BlockTensor::AttDropped
                if s.attention != AttentionSaves::Probabilities =>
            {
                0
            }
            BlockTensor::AttLogSumExp if s.attention != AttentionSaves::RowLogSumExp => 0,
            BlockTensor::AttProbs => s.micro_batch * s.heads * s.seq_len * s.seq_len,
            BlockTensor::AttDropped if s.attention_dropout => BlockTensor::AttProbs.elements(s),
            BlockTensor::AttDropped => 0,
            BlockTensor::AttLogSumExp => s.micro_batch * s.heads * s.seq_len,
            BlockTensor::FcOut => n * s.fc1_width(),
            BlockTensor::ActOut => n * s.ffn,
        }
    }

    /// Bytes per stored element: f32's for the row statistics, the activations' for the
    /// rest. The probabilities count as activations, as Megatron-LM stores them; the
    /// trainer keeps them only where it stores f32 (the CPU, and CUDA heads too large for
    /// the fused core, which bf16 does not take).
    pub fn element_bytes(self, s: &ModelShape) -> usize {
        match self {
            BlockTensor::Norm1Stats
            | BlockTensor::QkNormStats
            | BlockTensor::Norm2Stats
            | BlockTensor::AttLogSumExp => F32_BYTES,
            _ => s.activations.size(),
        }
    }

    /// How Megatron lays this tensor out over tensor-parallel ranks: the attention and MLP
    /// interiors split by heads or columns; the LayerNorms' and residual's tensors are whole
    /// on every rank, or split along the sequence with sequence parallelism. QK-norm's
    /// statistics over the whole projections are the whole rows', two a token on every rank.
    pub fn split(self, s: &ModelShape) -> Split {
        match self {
            BlockTensor::QkNormStats if s.arch.qk_norm_span == QkNormSpan::Projection => Split::Replicated,
            BlockTensor::QkNormIn
            | BlockTensor::QkNormStats
            | BlockTensor::Qkv
            | BlockTensor::AttProbs
            | BlockTensor::AttDropped
            | BlockTensor::AttLogSumExp
            | BlockTensor::AttOut
            | BlockTensor::FcOut
            | BlockTensor::ActOut => Split::Interior,
            BlockTensor::Input
            | BlockTensor::Norm1Out
            | BlockTensor::Norm1Stats
            | BlockTensor::AttProj
            | BlockTensor::Residual
            | BlockTensor::Norm2Out
            | BlockTensor::Norm2Stats
            | BlockTensor::FcProj => Split::Sequence,
        }
    }

    /// The tensor that stands for what the attention core keeps under `s.attention`
    /// (AttProbs for the probabilities, with AttDropped beside it under dropout): the
    /// block keeps or drops the core's tensors as it says.
    pub fn attention_saved(s: &ModelShape) -> BlockTensor {
        match s.attention {
            AttentionSaves::Probabilities => BlockTensor::AttProbs,
            AttentionSaves::RowLogSumExp => BlockTensor::AttLogSumExp,
        }
    }

    /// Whether selective recompute of `modules` drops this tensor (recomputing it in backward).
    /// The fused core's log-sum-exp is never dropped: its backward recomputes the
    /// probabilities from it in any case, so selective recompute of the core costs nothing
    /// more, and dropping the [B,NH,T] row statistics would save next to nothing at the
    /// price of a whole attention forward.
    pub fn dropped_by(self, modules: SelectiveModules) -> bool {
        match self {
            BlockTensor::AttProbs | BlockTensor::AttDropped => modules.core_attn,
            BlockTensor::ActOut => modules.mlp,
            BlockTensor::Norm1Out | BlockTensor::Norm2Out => modules.layernorm,
            _ => false,
        }
    }
}

/// Bytes per f32 element: parameters, gradients, AdamW moments and the row statistics.
pub const F32_BYTES: usize = 4;

/// Bytes of stored tensors given as (elements, bytes per element): the one sum behind every
/// activation figure, so a layer declared at other precisions (e.g. Megatron's 16-bit
/// tensors with 1-byte dropout masks) is counted the same way.
pub fn kept_bytes(entries: &[(usize, usize)]) -> usize {
    entries.iter().map(|(elements, bytes)| elements * bytes).sum()
}

/// The tensors one block keeps for one microbatch under `keep`, on one of `tp`'s ranks, each
/// with its (elements, bytes per element).
pub fn block_kept(s: &ModelShape, tp: TensorParallel, keep: BlockKeep) -> Vec<(BlockTensor, (usize, usize))> {
    let entry = |t: BlockTensor| (t, (tp.per_rank(t.elements(s), t.split(s)), t.element_bytes(s)));
    match keep {
        BlockKeep::Stored(modules) => {
            BlockTensor::ALL.into_iter().filter(|t| !t.dropped_by(modules)).map(entry).collect()
        }
        BlockKeep::InputOnly { group_start: true } if tp.distribute_saved => {
            let input = BlockTensor::Input;
            vec![(input, (tp.per_rank(input.elements(s), Split::Interior), input.element_bytes(s)))]
        }
        BlockKeep::InputOnly { group_start: true } => vec![entry(BlockTensor::Input)],
        BlockKeep::InputOnly { group_start: false } => vec![],
    }
}

/// Bytes one block keeps for one microbatch under `keep`, on one of `tp`'s ranks.
pub fn block_kept_bytes(s: &ModelShape, tp: TensorParallel, keep: BlockKeep) -> usize {
    let kept: Vec<(usize, usize)> = block_kept(s, tp, keep).into_iter().map(|(_, e)| e).collect();
    kept_bytes(&kept)
}

/// Bytes the head keeps per microbatch: what the final norm's backward reads, its input
/// and statistics (f32) and the gradient of its output, which the LM head's backward
/// computed in forward. (The embedding keeps only its token ids, on the host.) All of it
/// lies outside the vocab-parallel matmul: split along the sequence with sequence
/// parallelism.
pub fn head_kept_bytes(s: &ModelShape, tp: TensorParallel) -> usize {
    let (n, c) = (s.tokens(), s.hidden);
    let rows = |elements| tp.per_rank(elements, Split::Sequence);
    let stats = s.arch.norm.stats_per_row() * n;
    kept_bytes(&[(rows(2 * n * c), s.activations.size()), (rows(stats), F32_BYTES)])
}
