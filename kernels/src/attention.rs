//! What the attention core's forward keeps for its backward: the backend's choice, named
//! here so that the layers allocate it and the memory model counts it from one declaration.
//!
//! The CPU backend keeps the probabilities P = softmax(q k^T / sqrt(hs) + causal mask) and,
//! under dropout, P' = dropout(P), both [B,NH,T,T], and its backward reads them. The CUDA
//! backend's fused kernels (kernels/cuda/fused_attention.cu) keep only the log-sum-exp of
//! each query row's scores, [B,NH,T], and recompute P tile by tile in backward, as
//! FlashAttention does: no [T,T] tensor exists at any time.

use crate::tensor::{DType, Tensor};

/// The largest head size the fp32 fused kernels take (`HS_MAX` in fused_attention.cu: the
/// micro-tiles of a row of 16 threads cover 64 dimensions).
pub const FUSED_MAX_HEAD_SIZE: usize = 64;

/// The k of one bf16 m16n8k16 product: the tensor-core attention kernels (the only ones
/// for bf16 activations) take head sizes that are multiples of it, up to
/// [`ATTENTION_MMA_MAX_HEAD_SIZE`].
pub const ATTENTION_MMA_K: usize = 16;

/// The largest head size the tensor-core attention kernels take (fused_attention_mma.cu is
/// compiled for heads up to 64 and up to 128, Llama's).
pub const ATTENTION_MMA_MAX_HEAD_SIZE: usize = 128;

/// Query or key rows per block of the tensor-core attention kernels (`ROWS` in
/// fused_attention_mma.cu), 16 per warp: the rows of one m16n8k16 product.
pub const ATTENTION_MMA_TILE: usize = 64;

/// Query rows per block of the tensor-core forward compiled for head sizes up to 64: each of
/// its 4 warps takes two tiles of 16 queries (`M` in fused_attention_mma.cu), so that each
/// fragment of keys and values it reads from shared memory feeds two products. The one
/// compiled for 128, whose [16, 128] outputs fill a warp's registers, takes one, as every
/// other kernel does ([`ATTENTION_MMA_TILE`]).
pub const ATTENTION_MMA_FORWARD_ROWS: usize = 2 * ATTENTION_MMA_TILE;

/// The dynamic shared memory of the tensor-core forward compiled for head size 128, in
/// bytes: two buffers of 64 staged key rows and two of value rows, a row 64 words of bf16
/// pairs padded by 4 (`Staged<Forward128>` in fused_attention_mma.cu), past the 48 KB of
/// static shared memory. The SIMT emulator fails a launch that gives the kernel fewer.
pub const ATTENTION_MMA_FORWARD_HS128_SHARED: u32 = 2 * 2 * 64 * (128 / 2 + 4) * 4;

/// The head size the tensor-core kernels that run `head_size` are compiled for: 64, or 128
/// (Llama's) above it.
pub fn attention_mma_compiled_head_size(head_size: usize) -> usize {
    if head_size <= 64 {
        64
    } else {
        ATTENTION_MMA_MAX_HEAD_SIZE
    }
}

/// Rows of the query tiles the tensor-core backward streams (`STREAM` of its shapes in
/// fused_attention_mma.cu): 64 for the kernels compiled at head size 64, 32 at 128, so that
/// its staged tiles fit 48 KB of static shared memory and its scores beside dk and dv a
/// warp's registers. Its dq is summed a streamed query tile at a time. (The forward streams
/// 64 keys at both.)
pub fn attention_mma_stream(head_size: usize) -> usize {
    if attention_mma_compiled_head_size(head_size) == 64 {
        64
    } else {
        32
    }
}

/// The scratch of the tensor-core backward beside delta, in elements: dq's fp32 partial
/// sums, a [stream, compiled head size] tile ([`attention_mma_stream`],
/// [`attention_mma_compiled_head_size`], whatever the run's head size) for each streamed
/// query tile of each of B*NH query heads, and the turns' u32 counters, one for each of
/// those tiles and a ticket for each of B*KV key/value heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainedDq {
    pub partials: usize,
    pub turns: usize,
}

impl ChainedDq {
    /// The scratch of the backward over `heads` (B*NH) query heads and `kv_heads` (B*KV) of
    /// `t` rows; None where the backward is not chained (f32 activations).
    pub fn of(dtype: DType, head_size: usize, t: usize, heads: usize, kv_heads: usize) -> Option<ChainedDq> {
        let stream = attention_mma_stream(head_size);
        let tiles = t.div_ceil(stream);
        ChainedDq::chains(dtype).then_some(ChainedDq {
            partials: heads * tiles * stream * attention_mma_compiled_head_size(head_size),
            turns: heads * tiles + kv_heads,
        })
    }

    /// Whether the CUDA backend's backward over activations of `dtype` is chained: one
    /// kernel from the key side that sums dq too, each query tile's over the key tiles'
    /// blocks in turn (the tensor-core kernels, bf16). The fp32 kernels' is two-sided.
    pub fn chains(dtype: DType) -> bool {
        dtype == DType::Bf16
    }

    /// Its bytes: 4 an element of either.
    pub fn bytes(&self) -> usize {
        4 * (self.partials + self.turns)
    }
}

/// Whether the tensor-core attention kernels take head size `head_size`.
pub fn attention_mma_fits(head_size: usize) -> bool {
    head_size.is_multiple_of(ATTENTION_MMA_K) && head_size <= ATTENTION_MMA_MAX_HEAD_SIZE
}

/// Which keys each query attends to: every key up to itself, or a sliding window of the
/// last W keys up to itself, itself included (Mistral 7B v0.1's, OLMo 3's: Hugging Face's
/// `sliding_window` W; Megatron's `window_size` (W - 1, 0)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CausalMask {
    Full,
    Window(usize),
}

impl CausalMask {
    /// The mask over sequences of `t` positions: a window of `t` keys or more is the full
    /// mask there, and is run as it, bit for bit.
    pub fn over(self, t: usize) -> CausalMask {
        match self {
            CausalMask::Window(w) if w < t => self,
            _ => CausalMask::Full,
        }
    }

    /// The most keys a query of a sequence of `t` sees: the window's, `t` under the causal
    /// mask (the CUDA kernels' `window` argument).
    pub fn keys(self, t: usize) -> usize {
        match self.over(t) {
            CausalMask::Full => t,
            CausalMask::Window(w) => w,
        }
    }

    /// The first key query `i` sees.
    pub fn first_key(self, i: usize) -> usize {
        match self {
            CausalMask::Full => 0,
            CausalMask::Window(w) => (i + 1).saturating_sub(w),
        }
    }

    /// One past the last of `t` queries that sees a key before `j`: all `t` but where
    /// a window ends earlier.
    pub fn queries_end(self, j: usize, t: usize) -> usize {
        match self {
            CausalMask::Full => t,
            CausalMask::Window(w) => (j + w).saturating_sub(1).min(t),
        }
    }

    /// The (query, key) pairs a sequence of `t` positions scores: t (t + 1) / 2 causally,
    /// fewer under a window. The attention core's FLOPs are proportional to it.
    pub fn pairs(self, t: usize) -> usize {
        match self.over(t) {
            CausalMask::Full => t * (t + 1) / 2,
            CausalMask::Window(w) => w * (w + 1) / 2 + (t - w) * w,
        }
    }
}

/// Which tensors the attention core keeps for its backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionSaves {
    /// P [B,NH,T,T], and under dropout P' [B,NH,T,T]: the unfused core (the CPU backend,
    /// and the CUDA backend's fp32 activations at head sizes above [`FUSED_MAX_HEAD_SIZE`]).
    Probabilities,
    /// lse [B,NH,T], max + log(sum of exp) of each query row's scaled scores: the fused core.
    RowLogSumExp,
}

impl AttentionSaves {
    /// What the CUDA backend keeps at head size `head_size` over activations of `dtype`: the
    /// fused core wherever its kernels take the head size (bf16 activations run only the
    /// tensor-core kernels, which the trainer checks take it).
    pub fn cuda(head_size: usize, dtype: DType) -> AttentionSaves {
        if dtype == DType::Bf16 || head_size <= FUSED_MAX_HEAD_SIZE {
            AttentionSaves::RowLogSumExp
        } else {
            AttentionSaves::Probabilities
        }
    }
}

/// The tensors themselves, filled by [`crate::Device::attention_forward`] and read by
/// [`crate::Device::attention_backward`].
pub enum AttentionSaved {
    Probabilities {
        /// P [B,NH,T,T]
        probs: Tensor,
        /// P' = dropout(P) [B,NH,T,T], under attention dropout
        dropped: Option<Tensor>,
    },
    RowLogSumExp {
        /// lse [B,NH,T]
        lse: Tensor,
    },
}

impl AttentionSaved {
    pub fn kind(&self) -> AttentionSaves {
        match self {
            AttentionSaved::Probabilities { .. } => AttentionSaves::Probabilities,
            AttentionSaved::RowLogSumExp { .. } => AttentionSaves::RowLogSumExp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts and bounds a mask gives are those of its definition, counted pair by pair:
    /// query i sees key j where j <= i and, under a window of w, j > i - w.
    #[test]
    fn a_mask_counts_and_bounds_the_pairs_it_defines() {
        let t = 11;
        for mask in [CausalMask::Full, CausalMask::Window(1), CausalMask::Window(4), CausalMask::Window(11)] {
            let w = match mask {
                CausalMask::Full => t,
                CausalMask::Window(w) => w,
            };
            let sees = |i: usize, j: usize| j <= i && j + w > i;
            let pairs = (0..t).flat_map(|i| (0..t).map(move |j| (i, j))).filter(|&(i, j)| sees(i, j)).count();
            assert_eq!(mask.pairs(t), pairs, "{mask:?}");
            for i in 0..t {
                assert_eq!(mask.first_key(i), (0..t).find(|&j| sees(i, j)).unwrap(), "{mask:?} query {i}");
            }
            for j in 1..=t {
                let end = (0..t).rev().find(|&i| (0..j).any(|k| sees(i, k))).unwrap() + 1;
                assert_eq!(mask.queries_end(j, t), end, "{mask:?} keys before {j}");
            }
        }
        assert_eq!(CausalMask::Window(11).over(t), CausalMask::Full);
        assert_eq!(CausalMask::Window(10).over(t), CausalMask::Window(10));
    }

    /// dq's chain runs over the streamed query tiles of the kernels that run the head size:
    /// at GPT-2's 64, tiles of 64 rows and a [64, 64] partial sum each; at Llama's 128 (and
    /// at 80, which the same kernels run), tiles of 32 and a [32, 128] sum each, twice the
    /// counters; none in fp32, whose backward is two-sided.
    #[test]
    fn the_chain_counts_the_streamed_query_tiles_of_the_kernels_that_run() {
        let (t, heads, kv_heads) = (1000, 32, 8);
        let gpt2 = ChainedDq::of(DType::Bf16, 64, t, heads, kv_heads).unwrap();
        assert_eq!(gpt2, ChainedDq { partials: 32 * 16 * 64 * 64, turns: 32 * 16 + 8 });
        for head_size in [80, 128] {
            let llama = ChainedDq::of(DType::Bf16, head_size, t, heads, kv_heads).unwrap();
            assert_eq!(llama, ChainedDq { partials: 32 * 32 * 32 * 128, turns: 32 * 32 + 8 });
        }
        assert_eq!(ChainedDq::of(DType::Bf16, 32, t, heads, kv_heads), Some(gpt2));
        assert_eq!(ChainedDq::of(DType::F32, 64, t, heads, kv_heads), None);
    }
}
