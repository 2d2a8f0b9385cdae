//! The attention kernel a simulation assumes, and what it changes in a block's memory and
//! time. `stages::saved` declares what the trainer's attention keeps today: the
//! probabilities before and after dropout, [B,NH,T,T] each. The CUDA backend's fused kernel
//! (`kernels/cuda/fused_attention.cu`) keeps the output, which the block keeps anyway as
//! c_proj's input, and the log-sum-exp of each row, [B,NH,T] fp32; its backward rebuilds
//! the probabilities tile by tile from q, k and that log-sum-exp. The GPU hardware profiles
//! assume it; `simulate` on the CPU profile, and the trainer's own prediction, keep the
//! declared kernel, since no trainer device runs the fused one yet.

use stages::saved::{block_kept_bytes, BlockKeep, F32_BYTES};
use stages::tensor_parallel::Split;
use stages::{GptShape, SelectiveModules, TensorParallel};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// P and P' kept for backward, as `stages::saved` declares: O(T^2) per head.
    Materialized,
    /// The output and the log-sum-exp kept, P rebuilt in backward: O(T) per head.
    Fused,
}

impl AttentionKernel {
    pub fn describe(self) -> &'static str {
        match self {
            AttentionKernel::Materialized => "materialized attention (P, P' [B,NH,T,T] kept)",
            AttentionKernel::Fused => "fused attention (output and log-sum-exp [B,NH,T] kept)",
        }
    }

    /// Bytes one block keeps for one microbatch under `keep`, on one of `tp`'s ranks,
    /// activations at `bytes_per_element` (the log-sum-exp stays fp32, as the kernel keeps it).
    pub fn block_kept(
        self,
        s: &GptShape,
        tp: TensorParallel,
        keep: BlockKeep,
        bytes_per_element: usize,
    ) -> u64 {
        let at_precision = |fp32_bytes: usize| (fp32_bytes / F32_BYTES * bytes_per_element) as u64;
        let declared = block_kept_bytes(s, tp, keep);
        match (self, keep) {
            (AttentionKernel::Fused, BlockKeep::Stored(modules)) if !modules.core_attn => {
                at_precision(declared - probabilities_bytes(s, tp, modules)) + row_stat_bytes(s, tp)
            }
            _ => at_precision(declared),
        }
    }

    /// The attention part of one block's backward scratch: the [B,NH,T,T] gradient of the
    /// scores, or the fused backward's per-row sum of dO * O, [B,NH,T] fp32.
    pub fn backward_scratch(self, s: &GptShape, tp: TensorParallel, bytes_per_element: usize) -> u64 {
        match self {
            AttentionKernel::Materialized => {
                (tp.per_rank(s.micro_batch * s.heads * s.seq_len * s.seq_len, Split::Interior)
                    * bytes_per_element) as u64
            }
            AttentionKernel::Fused => row_stat_bytes(s, tp),
        }
    }

    /// FLOPs one block's backward adds beyond the model's count, on one rank: the fused
    /// backward computes q k^T again to rebuild P (2 B T^2 C, full T x T as `stages::flops`
    /// counts the core).
    pub fn backward_extra_flops(self, s: &GptShape, tp: TensorParallel) -> f64 {
        match self {
            AttentionKernel::Materialized => 0.0,
            AttentionKernel::Fused => {
                2.0 * s.micro_batch as f64 * (s.seq_len * s.seq_len) as f64 * s.hidden as f64 / tp.size as f64
            }
        }
    }
}

/// fp32 bytes of the probabilities a block keeps under `Stored(modules)` (none when the
/// modules drop the attention core): what selective recompute of the core drops, from the
/// same declaration.
fn probabilities_bytes(s: &GptShape, tp: TensorParallel, modules: SelectiveModules) -> usize {
    let without_core = SelectiveModules { core_attn: true, ..modules };
    block_kept_bytes(s, tp, BlockKeep::Stored(modules))
        - block_kept_bytes(s, tp, BlockKeep::Stored(without_core))
}

/// One fp32 figure per attention row, [B,NH,T], split by heads.
fn row_stat_bytes(s: &GptShape, tp: TensorParallel) -> u64 {
    (tp.per_rank(s.micro_batch * s.heads * s.seq_len, Split::Interior) * F32_BYTES) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP_ALL: BlockKeep = BlockKeep::Stored(SelectiveModules::NONE);

    /// GPT-2 small at B = 4, T = 1024 with attention dropout: the fused kernel keeps, per
    /// block, 4 x 12 x 1024 x 4 bytes of log-sum-exp instead of two 4 x 12 x 1024^2 x 4-byte
    /// probability tensors.
    #[test]
    fn fused_attention_keeps_a_row_statistic_instead_of_the_probabilities() {
        let s = GptShape { micro_batch: 4, attention_dropout: true, ..GptShape::GPT2_SMALL };
        let tp = TensorParallel::NONE;
        let declared = block_kept_bytes(&s, tp, KEEP_ALL) as u64;
        let probabilities = 2 * 4 * 12 * 1024 * 1024 * 4;
        let lse = 4 * 12 * 1024 * 4;
        assert_eq!(AttentionKernel::Materialized.block_kept(&s, tp, KEEP_ALL, 4), declared);
        assert_eq!(AttentionKernel::Fused.block_kept(&s, tp, KEEP_ALL, 4), declared - probabilities + lse);
        // bf16 halves the activations; the log-sum-exp stays fp32.
        assert_eq!(
            AttentionKernel::Fused.block_kept(&s, tp, KEEP_ALL, 2),
            (declared - probabilities) / 2 + lse
        );
        // Selective recompute of the core drops the same either way: only q, k, v stay.
        let core = BlockKeep::Stored(SelectiveModules { core_attn: true, ..SelectiveModules::NONE });
        assert_eq!(
            AttentionKernel::Fused.block_kept(&s, tp, core, 4),
            AttentionKernel::Materialized.block_kept(&s, tp, core, 4)
        );
        assert_eq!(AttentionKernel::Fused.block_kept(&s, tp, core, 4), declared - probabilities);
        // Full recompute keeps only inputs, whatever the kernel.
        let input = BlockKeep::InputOnly { group_start: true };
        assert_eq!(AttentionKernel::Fused.block_kept(&s, tp, input, 4), 4 * 1024 * 768 * 4);
    }

    #[test]
    fn fused_backward_scratch_is_linear_in_t_and_its_extra_work_is_one_product() {
        let s = GptShape { micro_batch: 4, ..GptShape::GPT2_SMALL };
        let tp4 = TensorParallel { size: 4, ..TensorParallel::NONE };
        assert_eq!(
            AttentionKernel::Materialized.backward_scratch(&s, TensorParallel::NONE, 4),
            4 * 12 * 1024 * 1024 * 4
        );
        assert_eq!(AttentionKernel::Fused.backward_scratch(&s, TensorParallel::NONE, 4), 4 * 12 * 1024 * 4);
        assert_eq!(AttentionKernel::Fused.backward_scratch(&s, tp4, 2), 4 * 3 * 1024 * 4);
        assert_eq!(AttentionKernel::Materialized.backward_extra_flops(&s, tp4), 0.0);
        assert_eq!(
            AttentionKernel::Fused.backward_extra_flops(&s, tp4),
            2.0 * 4.0 * 1024.0 * 1024.0 * 768.0 / 4.0
        );
    }
}
