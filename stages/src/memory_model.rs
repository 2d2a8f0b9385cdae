//! The memory a chunk needs, predicted from the same declarations the layers obey at run
//! time (saved.rs): what the simulator reports and what the device ledger must measure.

use crate::params::{chunk_param_specs, ChunkLayout};
use crate::recompute::RecomputePolicy;
use crate::saved::{block_kept_bytes, head_kept_bytes, F32_BYTES};
use crate::shape::GptShape;

/// Bytes one microbatch's forward leaves stashed on a chunk until its backward.
pub fn stash_bytes(s: &GptShape, layout: &ChunkLayout, policy: &RecomputePolicy) -> usize {
    let blocks = layout.blocks.len();
    let mut bytes: usize =
        (0..blocks).map(|offset| block_kept_bytes(s, policy.block_keep(blocks, offset))).sum();
    if layout.head {
        bytes += head_kept_bytes(s);
    }
    bytes
}

/// Elements of a chunk's parameters (a head-only chunk counts its copy of wte).
pub fn param_elements(s: &GptShape, layout: &ChunkLayout) -> usize {
    chunk_param_specs(s, layout).iter().map(|p| p.shape.iter().product::<usize>()).sum()
}

/// Parameters, gradients (plus the LM head's separate tied gradient where one chunk holds
/// both ends) and the two AdamW moments, all fp32.
pub fn static_bytes(s: &GptShape, layout: &ChunkLayout) -> usize {
    let tied_head_grad = if layout.embedding && layout.head { s.vocab * s.hidden } else { 0 };
    (4 * param_elements(s, layout) + tied_head_grad) * F32_BYTES
}

/// Bytes a split backward's backward-input leaves for its backward-weight, per microbatch:
/// the input and output gradient of every matmul of the chunk (kept, recomputed or computed
/// by backward-input alike), which the runtime accounts as activations until W has run.
pub fn deferred_weight_grad_bytes(s: &GptShape, layout: &ChunkLayout) -> usize {
    let (n, c, f) = (s.tokens(), s.hidden, s.ffn);
    // (ln1, dqkv), (atty, dattproj), (ln2, dfch), (gelu, dfcproj) per block. The head's
    // matmul has none: its whole backward runs in forward.
    let per_block = (c + 3 * c) + (c + c) + (c + f) + (f + c);
    layout.blocks.len() * per_block * n * F32_BYTES
}
