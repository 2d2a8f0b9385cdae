//! How each kernel is launched: grid and block shapes, the fixed chunk sizes that decide
//! rounding, and the host-side layout the embedding's backward reads. Public so that the
//! SIMT emulation harness (kernels/tests/simt) launches the kernels exactly as the device
//! does.

use crate::attention::{
    attention_mma_fits, ATTENTION_MMA_FORWARD_HS128_SHARED, ATTENTION_MMA_FORWARD_ROWS, ATTENTION_MMA_K,
    ATTENTION_MMA_MAX_HEAD_SIZE, ATTENTION_MMA_TILE, FUSED_MAX_HEAD_SIZE,
};
use crate::op_args::OTHER_SHARD;
use crate::tensor::DType;
use cudarc::driver::LaunchConfig;

/// Threads per block of the elementwise and warp-per-row kernels.
pub const BLOCK: u32 = 256;
/// Threads per block of the block-per-row and block-reduction kernels.
pub const REDUCE_BLOCK: u32 = 512;
/// Rows per chunk in the first stage of a column sum. Fixed, not tuned to the GPU, so the
/// rounding of a parameter gradient is the same on every GPU.
pub const ROWS_PER_CHUNK: usize = 64;
/// Elements per block in the first stage of `sum_squares`, fixed for the same reason.
pub const SUM_SQUARES_CHUNK: usize = 1 << 16;

fn grid(blocks: usize, what: &str) -> u32 {
    u32::try_from(blocks)
        .unwrap_or_else(|_| panic!("cuda: {blocks} blocks of {what} is too many for one grid"))
}

/// One thread per item, `BLOCK` threads per block.
pub fn per_item(items: usize) -> LaunchConfig {
    let blocks = grid(items.div_ceil(BLOCK as usize), "items");
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The elements of `dtype` in one 128-bit access: 4 f32 or 8 bf16 (`Pack<T>::LEN` in
/// common.cuh).
pub fn pack_len(dtype: DType) -> usize {
    16 / dtype.size()
}

/// One thread per 128-bit pack of `items` elements of `dtype`, the last pack partial: the
/// elementwise kernels of elementwise.cu, gelu.cu and glu.cu, bias.cu's `bias_add`, and
/// cast.cu's (whose thread reads two packs of f32 for its pack of bf16).
pub fn per_pack(items: usize, dtype: DType) -> LaunchConfig {
    per_item(items.div_ceil(pack_len(dtype)))
}

/// One RoPE thread per row and the pairs it turns: a 128-bit pack of pairs where `half`, half
/// a head, is a multiple of the pack (rope.cu's `rope_pairs`), else one pair.
pub fn per_rope_thread(rows: usize, half: usize, dtype: DType) -> LaunchConfig {
    let pairs = if half.is_multiple_of(pack_len(dtype)) { pack_len(dtype) } else { 1 };
    per_item(rows * half / pairs)
}

/// One warp per row, `BLOCK / 32` rows per block.
pub fn per_row_warp(rows: usize) -> LaunchConfig {
    per_item(rows * 32)
}

/// One block of `REDUCE_BLOCK` threads per row (the fused classifier over the vocabulary).
pub fn per_row_block(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid(rows, "rows"), 1, 1),
        block_dim: (REDUCE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `REDUCE_BLOCK` threads: `loss_mean`, whose first thread adds in token order
/// while the others stage the losses.
pub fn one_block() -> LaunchConfig {
    LaunchConfig { grid_dim: (1, 1, 1), block_dim: (REDUCE_BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// Stage two of a column sum (`add_partials`): one block of `REDUCE_BLOCK` threads per 32
/// columns, a lane per column, its warps each summing a run of the chunks.
pub fn per_column_tile(cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid(cols.div_ceil(32), "column tiles"), 1, 1),
        block_dim: (REDUCE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Stage one of a column sum over `rows` rows of `cols` columns: one thread per column,
/// one block row per chunk of rows; and the number of chunks.
pub fn per_column_chunk(rows: usize, cols: usize) -> (LaunchConfig, usize) {
    let chunks = rows.div_ceil(ROWS_PER_CHUNK);
    let mut cfg = per_item(cols);
    cfg.grid_dim.1 = grid(chunks, "row chunks");
    (cfg, chunks)
}

/// [`per_column_chunk`] for `sums` column sums in one launch, block z summing the z-th
/// (QK-norm's two weights).
pub fn per_column_chunk_of_each(rows: usize, cols: usize, sums: usize) -> (LaunchConfig, usize) {
    let (mut cfg, chunks) = per_column_chunk(rows, cols);
    cfg.grid_dim.2 = grid(sums, "column sums");
    (cfg, chunks)
}

/// Many tensors of `lens` elements in one launch, one block per `chunk` of each: the first
/// block of each tensor (`first` in common.cuh's `owner`; `lens.len() + 1` entries, the last
/// the number of blocks). The chunk is `SUM_SQUARES_CHUNK` for the fused sums of squares,
/// [`ADAMW_CHUNK`] for AdamW and [`ZERO_CHUNK`] for zeroing.
pub fn first_blocks(lens: &[usize], chunk: usize) -> Vec<u64> {
    let mut first = vec![0u64];
    for &n in lens {
        first.push(first.last().copied().unwrap_or(0) + n.div_ceil(chunk) as u64);
    }
    first
}

/// Elements of a tensor an AdamW thread steps (`ADAMW_ELEMENTS` in adamw.cu): two packs of
/// f32, one of the bf16 copy.
pub const ADAMW_ELEMENTS: usize = 8;
/// Elements of a tensor an AdamW block steps.
pub const ADAMW_CHUNK: usize = ADAMW_ELEMENTS * BLOCK as usize;
/// Elements of a tensor a block of `zero_tensors` zeroes: a pack of 4 f32 a thread.
pub const ZERO_CHUNK: usize = 4 * BLOCK as usize;

/// A kernel over a table of tensors (adamw.cu, zero.cu): `blocks`, the last of
/// [`first_blocks`], of `BLOCK` threads.
pub fn per_table_chunk(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid(blocks, "chunks of tensors"), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Stage one (`sum_squares_chunks`, one block per chunk: `blocks` is the last of
/// [`first_blocks`]) and stage two (`sum_squares_totals`, one block per tensor).
pub fn sum_squares(blocks: usize, tensors: usize) -> (LaunchConfig, LaunchConfig) {
    (per_row_block(blocks), per_row_block(tensors))
}

/// Query or key rows per block of the fused attention kernels (`TILE` in
/// fused_attention.cu; their largest head size is [`FUSED_MAX_HEAD_SIZE`]).
pub const ATTENTION_TILE: usize = 64;

/// The fused attention kernels over `heads` heads (B * NH) of `t` rows each: one block per
/// tile of `ATTENTION_TILE` rows of one head, its `BLOCK` threads a 16 x 16 grid (`SIDE`
/// in fused_attention.cu).
pub fn per_attention_tile(t: usize, heads: usize, head_size: usize) -> LaunchConfig {
    assert!(
        head_size <= FUSED_MAX_HEAD_SIZE,
        "fused attention: head size {head_size} above {FUSED_MAX_HEAD_SIZE}"
    );
    LaunchConfig {
        grid_dim: (grid(t.div_ceil(ATTENTION_TILE), "attention tiles"), grid(heads, "heads"), 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The tensor-core (bf16) fused attention kernels over `heads` heads (B * NH) of `t` rows
/// each: one block of 4 warps per tile of `ATTENTION_MMA_TILE` rows of one head.
pub fn per_attention_tile_bf16(t: usize, heads: usize, head_size: usize) -> LaunchConfig {
    assert!(
        attention_mma_fits(head_size),
        "fused bf16 attention: head size {head_size} is not a multiple of {ATTENTION_MMA_K} up to {ATTENTION_MMA_MAX_HEAD_SIZE}"
    );
    LaunchConfig {
        grid_dim: (grid(t.div_ceil(ATTENTION_MMA_TILE), "attention tiles"), grid(heads, "heads"), 1),
        block_dim: (4 * 32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The tensor-core (bf16) fused attention forward compiled for head sizes up to 64, over
/// `heads` heads (B * NH) of `t` rows each: one block of 4 warps per
/// [`ATTENTION_MMA_FORWARD_ROWS`] queries of one head.
pub fn per_attention_forward_bf16(t: usize, heads: usize, head_size: usize) -> LaunchConfig {
    let tile = per_attention_tile_bf16(t, heads, head_size);
    LaunchConfig {
        grid_dim: (grid(t.div_ceil(ATTENTION_MMA_FORWARD_ROWS), "attention tiles"), tile.grid_dim.1, 1),
        ..tile
    }
}

/// The kernels whose launches give more dynamic shared memory than a kernel may take unless
/// told (48 KB), each with the most it takes: the device raises each one's limit as it loads
/// it (gpu.rs).
pub const DYNAMIC_SHARED: [(&str, u32); 1] =
    [("fused_attention_forward_bf16_hs128", ATTENTION_MMA_FORWARD_HS128_SHARED)];

/// The tensor-core fused attention forward compiled for head sizes up to 128:
/// [`per_attention_tile_bf16`]'s grid, with [`ATTENTION_MMA_FORWARD_HS128_SHARED`] bytes of
/// dynamic shared memory for its staged tiles.
pub fn per_attention_forward_bf16_hs128(t: usize, heads: usize, head_size: usize) -> LaunchConfig {
    LaunchConfig {
        shared_mem_bytes: ATTENTION_MMA_FORWARD_HS128_SHARED,
        ..per_attention_tile_bf16(t, heads, head_size)
    }
}

/// One block per distinct token of the embedding's backward (see [`rows_by_token`]).
pub fn per_token(groups: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid(groups, "tokens"), 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// [G distinct tokens, G+1 offsets, the rows of each token in ascending order], the layout
/// `embedding_backward_wte` reads, and G; the rows of another shard's tokens in none. The layout is padded with zeros to its longest,
/// 3N + 1 for N tokens (G = N), which the kernel never reads: its length, the upload's,
/// is then the same every step, so the device's arena reuses one buffer for it instead of
/// allocating one per distinct G.
pub fn rows_by_token(tokens: &[u32]) -> (Vec<u32>, usize) {
    let mut rows: Vec<u32> =
        (0..tokens.len() as u32).filter(|&r| tokens[r as usize] != OTHER_SHARD).collect();
    rows.sort_by_key(|&r| tokens[r as usize]); // stable: rows stay ascending per token
    let mut distinct = Vec::new();
    let mut offsets = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        if distinct.last() != Some(&tokens[r as usize]) {
            distinct.push(tokens[r as usize]);
            offsets.push(i as u32);
        }
    }
    offsets.push(rows.len() as u32);
    let groups = distinct.len();
    distinct.extend(offsets);
    distinct.extend(rows);
    distinct.resize(3 * tokens.len() + 1, 0);
    (distinct, groups)
}

#[cfg(test)]
mod tests {
    use super::rows_by_token;

    #[test]
    fn rows_are_grouped_by_token_in_ascending_order() {
        let (layout, groups) = rows_by_token(&[5, 2, 5, 7, 2, 5]);
        assert_eq!(groups, 3);
        // tokens | offsets | rows | padding to 3N + 1
        assert_eq!(layout, [2, 5, 7, 0, 2, 5, 6, 1, 4, 0, 2, 5, 3, 0, 0, 0, 0, 0, 0]);
        // Every token distinct: the longest layout, unpadded.
        assert_eq!(rows_by_token(&[3, 1]), (vec![1, 3, 0, 1, 2, 1, 0], 2));
        // Another shard's tokens are in no group.
        let other = super::OTHER_SHARD;
        assert_eq!(rows_by_token(&[other, 4, other]), (vec![4, 0, 1, 1, 0, 0, 0, 0, 0, 0], 1));
    }
}
