//! The memory a chunk needs, predicted from the same declarations the layers obey at run
//! time (saved.rs): what the simulator reports and what the device ledger must measure.
//! Every figure is one tensor-parallel rank's (`TensorParallel::NONE`: the whole chunk, as
//! the trainer holds it).

use crate::model::ModelShape;
use crate::offload::{ActivationOffload, OffloadModule};
use crate::optimizer_shard::OptimizerShard;
use crate::params::{chunk_param_specs, ChunkLayout, ParamSpec};
use crate::recompute::{BlockKeep, RecomputePolicy};
use crate::saved::{block_kept, block_kept_bytes, head_kept_bytes, kept_bytes, F32_BYTES};
use crate::tensor_parallel::{Split, TensorParallel};
use kernels::{bf16_copy_len, DType};

/// Bytes one microbatch's forward leaves stashed on a chunk until its backward: on the
/// device, and in host memory (what `offload` moves there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stash {
    pub device: usize,
    pub host: usize,
}

pub fn stash_bytes(
    s: &ModelShape,
    tp: TensorParallel,
    layout: &ChunkLayout,
    policy: &RecomputePolicy,
    offload: &ActivationOffload,
) -> Stash {
    let blocks = layout.blocks.len();
    let mut stash = Stash::default();
    for offset in 0..blocks {
        let block = block_stash(s, tp, (policy, offload), blocks, offset);
        stash.device += block.device;
        stash.host += block.host;
    }
    if layout.head {
        stash.device += head_kept_bytes(s, tp);
    }
    stash
}

/// What block `offset` of a chunk of `blocks` blocks keeps for one microbatch under the
/// chunk's recompute policy and offload.
pub fn block_stash(
    s: &ModelShape,
    tp: TensorParallel,
    (policy, offload): (&RecomputePolicy, &ActivationOffload),
    blocks: usize,
    offset: usize,
) -> Stash {
    let kept = block_kept_bytes(s, tp, policy.block_keep(blocks, offset));
    let host = block_offload_groups(s, tp, (policy, offload), blocks, offset).iter().map(|(_, b)| b).sum();
    Stash { device: kept - host, host }
}

/// What block `offset` of a chunk of `blocks` blocks moves to host memory per microbatch, by
/// tensor group: each offload module's tensors (in block order), and full recompute's kept
/// input; groups it moves nothing of are left out.
pub fn block_offload_groups(
    s: &ModelShape,
    tp: TensorParallel,
    (policy, offload): (&RecomputePolicy, &ActivationOffload),
    blocks: usize,
    offset: usize,
) -> Vec<(&'static str, usize)> {
    let keep = policy.block_keep(blocks, offset);
    let offloaded = block_kept(s, tp, keep).into_iter().filter(|&(t, _)| offload.offloads(offset, keep, t));
    tally_groups(offloaded.map(|(t, entry)| {
        let group = match keep {
            BlockKeep::Stored(_) => OffloadModule::of(t).name(),
            BlockKeep::InputOnly { .. } => "recompute input",
        };
        (group, kept_bytes(&[entry]))
    }))
}

/// Bytes by group, each group once, in the order groups first appear.
pub fn tally_groups(bytes: impl IntoIterator<Item = (&'static str, usize)>) -> Vec<(&'static str, usize)> {
    let mut groups: Vec<(&'static str, usize)> = Vec::new();
    for (group, b) in bytes {
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, total)) => *total += b,
            None => groups.push((group, b)),
        }
    }
    groups
}

/// Elements of a chunk's parameters (a head-only chunk counts its copy of wte).
pub fn param_elements(s: &ModelShape, tp: TensorParallel, layout: &ChunkLayout) -> usize {
    chunk_param_specs(s, layout).iter().map(|p| tp.per_rank(p.shape.iter().product::<usize>(), p.split)).sum()
}

/// Parameters, gradients (plus the output layer's separate gradient of a tied embedding
/// where one chunk holds both ends) and the two AdamW moments of the parts `optimizer` steps
/// (all of each parameter, or one replica's under the distributed optimizer), all fp32, and
/// the bf16 weight copy of a device storing bf16 activations, beside which the distributed
/// optimizer keeps one replica's part of a matrix's fp32 master
/// ([`ParamSpec::master_shards`](crate::params::ParamSpec::master_shards)).
pub fn static_bytes(
    s: &ModelShape,
    tp: TensorParallel,
    layout: &ChunkLayout,
    optimizer: OptimizerShard,
) -> usize {
    let wte = tp.per_rank(s.vocab * s.hidden, Split::Interior);
    let tied_head_grad = if s.arch.tied_output && layout.embedding && layout.head { wte } else { 0 };
    let specs = chunk_param_specs(s, layout);
    let per_rank = specs.iter().map(|p| tp.per_rank(p.elements(), p.split));
    let moments = 2 * optimizer.moment_elements(per_rank);
    let sharded = |p: &ParamSpec| optimizer.distributed && s.activations == DType::Bf16 && p.master_shards();
    let masters: usize = (specs.iter())
        .map(|p| {
            let n = tp.per_rank(p.elements(), p.split);
            if sharded(p) {
                optimizer.part(n).len()
            } else {
                n
            }
        })
        .sum();
    (param_elements(s, tp, layout) + masters + moments + tied_head_grad) * F32_BYTES
        + weight_copy_bytes(s, tp, layout)
}

/// The bf16 copies a device storing bf16 activations keeps beside the parameters
/// ([`bf16_copy_len`]: every parameter, a matrix's rows padded).
fn weight_copy_bytes(s: &ModelShape, tp: TensorParallel, layout: &ChunkLayout) -> usize {
    if s.activations != DType::Bf16 {
        return 0;
    }
    let elements: usize =
        chunk_param_specs(s, layout).iter().map(|p| tp.per_rank(bf16_copy_len(&p.shape), p.split)).sum();
    elements * DType::Bf16.size()
}

/// Bytes a split backward's backward-input leaves for its backward-weight, per microbatch:
/// the input and output gradient of every matmul of the chunk (kept, recomputed or computed
/// by backward-input alike), in the activations' element type, which the runtime accounts
/// as activations until W has run.
/// Under tensor parallelism a column-parallel matmul's input and a row-parallel one's output
/// gradient lie outside the split, whole: with sequence parallelism the weight gradient
/// keeps the tensor gathered from the ranks' rows (Megatron gathers it again instead); the
/// others lie inside it.
pub fn deferred_weight_grad_bytes(s: &ModelShape, tp: TensorParallel, layout: &ChunkLayout) -> usize {
    let (n, c, f) = (s.tokens(), s.hidden, s.ffn);
    let outside = |e: usize| tp.per_rank(e, Split::Replicated);
    let inside = |e: usize| tp.per_rank(e, Split::Interior);
    // (norm1, dqkv), (atty, dattproj), (norm2, dfc1), (act, dfc2) per block. The head's
    // matmul has none: its whole backward runs in forward.
    let per_block = (outside(n * c) + inside(n * s.qkv_width()))
        + (inside(n * s.attention_width()) + outside(n * c))
        + (outside(n * c) + inside(n * s.fc1_width()))
        + (inside(n * f) + outside(n * c));
    layout.blocks.len() * per_block * s.activations.size()
}
