//! A model chunk: the contiguous part of the model that one pipeline stage (or one virtual
//! stage, with interleaving) holds, with its parameters and its recompute policy.
//!
//! `forward` runs one microbatch and returns what `backward` needs (the stash, shaped by the
//! recompute policy); `backward` consumes it, recomputing what the policy dropped just
//! before the layer that needs it.

use crate::dist::{own_part, TensorGroup};
use crate::layers::block::{Block, BlockActs};
use crate::layers::block_offload::bring_back;
use crate::layers::embedding::TokenEmbedding;
use crate::layers::head::{HeadActs, LossGrad};
use crate::layers::norm::NormLayer;
use crate::layers::weight_grads::{self, WeightGrad, WeightGrads};
use crate::layers::{embedding, head, pair_mut, DropoutCtx};
use crate::model::{DropoutProbs, ModelShape};
use crate::offload::ActivationOffload;
use crate::params::{ChunkLayout, Parameters, Role};
use crate::recompute::{BlockKeep, RecomputePolicy, SelectiveModules};
use crate::saved::BlockTensor;
use crate::tensor_parallel::Shard;
use kernels::{Category, Device, Stopwatch, Tensor};
use std::sync::Arc;

/// One microbatch as a chunk sees it.
#[derive(Clone, Copy)]
pub struct Microbatch<'a> {
    pub step: u32,
    pub index: u32,
    /// Inputs [B*T] (read by the chunk with the embedding).
    pub tokens: &'a [u32],
    /// Targets [B*T] (read by the chunk with the head).
    pub targets: &'a [u32],
    pub mode: Mode,
}

/// Whether a forward trains or evaluates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Dropout on, activations kept for backward; dloss/dlogits multiplied by `grad_scale`
    /// (1 / tokens of the global batch averages over it).
    Train { grad_scale: f32 },
    /// Forward only: no dropout, nothing kept.
    Eval,
}

/// What a segment of blocks keeps for backward.
enum SegmentStash {
    /// Every block's kept tensors, in block order, from block offset `start`.
    Stored { start: usize, acts: Vec<BlockActs> },
    /// Full recompute of blocks `start..end`: only the segment's input [B,T,C], or with
    /// distributed saves this rank's 1/t of it [B*T*C/t].
    Recompute { start: usize, end: usize, input: Tensor },
}

/// Everything one microbatch's forward left for its backward on this chunk.
pub struct ChunkStash {
    microbatch: u32,
    step: u32,
    tokens: Option<Vec<u32>>,
    segments: Vec<SegmentStash>,
    head: Option<HeadActs>,
}

/// A forward's results.
pub struct ForwardOutput {
    /// The activation to send to the next chunk [B,T,C] (None on the head's chunk).
    pub output: Option<Tensor>,
    /// Per-token losses [B,T] on the device (head chunk only).
    pub losses: Option<Tensor>,
    pub stash: Option<ChunkStash>,
}

pub struct ModelChunk {
    pub shape: ModelShape,
    pub layout: ChunkLayout,
    /// This rank's part of the tensor-parallel layers; `params` hold it.
    pub shard: Shard,
    /// Megatron's `distribute_saved_activations`: a full recompute keeps this rank's 1/t of
    /// its input, and the group gathers the whole before recomputing.
    pub distribute_saved: bool,
    pub params: Parameters,
    pub policy: RecomputePolicy,
    /// What the chunk's blocks keep in host memory instead (activation offload).
    pub offload: ActivationOffload,
    pub dropout: DropoutProbs,
    pub seed: u64,
    /// The device time of recomputing dropped activations: its `total_s` sums the chunk's
    /// backwards up to the last read of the device clock ([`Stage::settle_timing`](crate::stage::Stage::settle_timing)).
    pub recompute: Stopwatch,
}

/// Weight gradients a split backward left for the backward-weight action.
pub struct DeferredWeightGrads(Vec<WeightGrad>);

impl ModelChunk {
    pub fn new(
        shape: ModelShape,
        layout: ChunkLayout,
        shard: Shard,
        params: Parameters,
        policy: RecomputePolicy,
        dropout: DropoutProbs,
        seed: u64,
    ) -> Self {
        let recompute = Stopwatch::default();
        ModelChunk {
            shape,
            layout,
            shard,
            distribute_saved: false,
            params,
            policy,
            offload: ActivationOffload::NONE,
            dropout,
            seed,
            recompute,
        }
    }

    fn dropout_ctx(&self, step: u32, microbatch: u32, training: bool) -> DropoutCtx {
        DropoutCtx { seed: self.seed, step, microbatch, probs: self.dropout, training }
    }

    fn block(&self, offset: usize) -> Block<'_> {
        let layer = self.layout.blocks.start + offset;
        let at = self.params.block(&self.shape, layer);
        Block { s: &self.shape, layer, w: &self.params.values, at, shard: self.shard }
    }

    /// The token embedding's shard, where this chunk holds it.
    fn token_embedding(&self) -> TokenEmbedding<'_> {
        let p = &self.params;
        let wte = p.index(Role::TokenEmbedding).expect("the embedding's chunk holds the token embedding");
        TokenEmbedding { table: &p.values[wte], shard: self.shard }
    }

    fn selective_modules(&self) -> SelectiveModules {
        match self.policy {
            RecomputePolicy::Selective(m) => m,
            _ => SelectiveModules::NONE,
        }
    }

    /// Forward of one microbatch. `input` [B,T,C] is the previous chunk's output (None on the
    /// embedding's chunk). The tensor-parallel layers reduce over `tp`.
    pub fn forward(
        &mut self,
        dev: &dyn Device,
        mb: &Microbatch,
        input: Option<Tensor>,
        tp: &mut TensorGroup,
    ) -> ForwardOutput {
        let training = matches!(mb.mode, Mode::Train { .. });
        let dropout = self.dropout_ctx(mb.step, mb.index, training);
        let p = &self.params;
        let mut x = match input {
            Some(x) => x,
            None => {
                let wpe = p.index(Role::PositionEmbedding).map(|i| &p.values[i]);
                embedding::forward(dev, &self.shape, &self.token_embedding(), wpe, mb.tokens, &dropout, tp)
            }
        };
        let blocks = self.layout.blocks.len();
        let mut segments = Vec::new();
        for seg in self.policy.segments(blocks) {
            if !training {
                for offset in seg.start..seg.end {
                    x = self.forward_as_workspace(dev, offset, x, &dropout, tp).0;
                }
            } else if seg.recompute {
                // Keep only the segment's input; every other tensor is freed as we go.
                let mut kept_input = None;
                let group_input = BlockKeep::InputOnly { group_start: true };
                let offloaded = self.offload.offloads(seg.start, group_input, BlockTensor::Input);
                for offset in seg.start..seg.end {
                    let (y, acts) = self.forward_as_workspace(dev, offset, x, &dropout, tp);
                    if kept_input.is_none() {
                        // Workspace until it leaves for the host, where it does: after the
                        // group's first block, so it is never held beside the next one.
                        let kept = match offloaded {
                            true => Category::Workspace,
                            false => Category::Activations,
                        };
                        let mut input = match self.distributes_saves() {
                            // The whole input goes with the block's workspace.
                            true => {
                                let len = acts.input.len() / self.shard.size;
                                let mine = self.shard.rank * len..(self.shard.rank + 1) * len;
                                own_part(dev, &acts.input, mine, &[len], kept)
                            }
                            false => {
                                let mut input = acts.input;
                                input.recategorize(kept);
                                input
                            }
                        };
                        if offloaded {
                            dev.offload(&mut input);
                        }
                        kept_input = Some(input);
                    }
                    x = y;
                }
                let input = kept_input.expect("segment has a block");
                segments.push(SegmentStash::Recompute { start: seg.start, end: seg.end, input });
            } else {
                let mut stored = Vec::with_capacity(seg.end - seg.start);
                for offset in seg.start..seg.end {
                    let keep = self.policy.block_keep(blocks, offset);
                    let offloaded = |t| self.offload.offloads(offset, keep, t);
                    if !offloaded(BlockTensor::Input) {
                        x.recategorize(Category::Activations);
                    }
                    let (y, mut acts) = self.block(offset).forward(
                        dev,
                        x,
                        &dropout,
                        self.selective_modules(),
                        Category::Activations,
                        &offloaded,
                        tp,
                    );
                    acts.offload(dev, offloaded);
                    stored.push(acts);
                    x = y;
                }
                segments.push(SegmentStash::Stored { start: seg.start, acts: stored });
            }
        }
        let tokens = (self.layout.embedding && training).then(|| mb.tokens.to_vec());
        if !self.layout.head {
            let stash = training.then_some(ChunkStash {
                microbatch: mb.index,
                step: mb.step,
                tokens,
                segments,
                head: None,
            });
            return ForwardOutput { output: Some(x), losses: None, stash };
        }
        let s = self.shape;
        let p = &mut self.params;
        let output = p.output_layer_index();
        let (norm_w, norm_b) = final_norm_indices(p);
        // The output layer's gradient: for a tied token embedding, its own tensor where this
        // chunk also holds the embedding (the two are summed before the optimizer step).
        let doutput = match p.head_wte_grad.as_mut() {
            Some(g) => g,
            None => &mut p.grads[output],
        };
        let grad = match mb.mode {
            Mode::Train { grad_scale } => Some(LossGrad { scale: grad_scale, dweight: doutput }),
            Mode::Eval => None,
        };
        let norm = final_norm(&s, &p.values, norm_w, norm_b);
        let (losses, head) =
            head::forward(dev, &s, &p.values[output], &norm, x, mb.targets, grad, self.shard, tp);
        let stash =
            training.then_some(ChunkStash { microbatch: mb.index, step: mb.step, tokens, segments, head });
        ForwardOutput { output: None, losses: Some(losses), stash }
    }

    /// Backward of one microbatch from `dout` [B,T,C] (None on the head's chunk). Returns
    /// the gradient of the chunk's input (None on the embedding's chunk) and, when `split`,
    /// the weight gradients left for [`ModelChunk::backward_weight`].
    pub fn backward(
        &mut self,
        dev: &dyn Device,
        stash: ChunkStash,
        dout: Option<Tensor>,
        split: bool,
        tp: &mut TensorGroup,
    ) -> (Option<Tensor>, Option<DeferredWeightGrads>) {
        let dropout = self.dropout_ctx(stash.step, stash.microbatch, true);
        let mut wg = if split { WeightGrads::Deferred(Vec::new()) } else { WeightGrads::Now };
        let s = self.shape;
        let mut dx = match stash.head {
            Some(acts) => {
                let p = &mut self.params;
                let (w, b) = final_norm_indices(p);
                let norm = final_norm(&s, &p.values, w, b);
                let (dw, db) = match b {
                    Some(b) => {
                        let (dw, db) = pair_mut(&mut p.grads, w, b);
                        (dw, Some(db))
                    }
                    None => (&mut p.grads[w], None),
                };
                head::backward(dev, &norm, acts, dw, db)
            }
            None => dout.expect("a chunk without the head needs the output gradient"),
        };
        for seg in stash.segments.into_iter().rev() {
            let (start, mut stored) = match seg {
                SegmentStash::Stored { start, acts } => (start, acts),
                SegmentStash::Recompute { start, end, mut input } => {
                    bring_back(dev, &mut input);
                    let input = match self.distributes_saves() {
                        true => tp.all_gather_parts(&input, dev, &[s.micro_batch, s.seq_len, s.hidden]),
                        false => input,
                    };
                    // Out of `self` while the segment, which borrows `self`, runs under it.
                    let mut watch = std::mem::take(&mut self.recompute);
                    let acts =
                        watch.time(dev, || self.recompute_segment(dev, start..end, input, &dropout, tp));
                    self.recompute = watch;
                    (start, acts)
                }
            };
            // Each block's offloaded tensors start back while the block after it runs its
            // backward (the memory model counts both blocks' copies at once), so on a GPU the
            // copy hides behind that backward.
            while let Some(mut acts) = stored.pop() {
                acts.reload(dev);
                dev.await_reloads();
                if let Some(previous) = stored.last_mut() {
                    previous.reload(dev);
                }
                let layer = self.layout.blocks.start + start + stored.len();
                let p = &mut self.params;
                let at = p.block(&s, layer);
                let block = Block { s: &s, layer, w: &p.values, at, shard: self.shard };
                dx = block.backward(dev, acts, dx, &dropout, &mut p.grads, &mut wg, &mut self.recompute, tp);
            }
        }
        if self.layout.embedding {
            let p = &mut self.params;
            let wte = p.index(Role::TokenEmbedding).expect("the embedding's chunk holds the token embedding");
            let tokens = stash.tokens.expect("embedding stash keeps its tokens");
            let (dwte, dwpe) = match p.index(Role::PositionEmbedding) {
                Some(wpe) => {
                    let (dwte, dwpe) = pair_mut(&mut p.grads, wte, wpe);
                    (dwte, Some(dwpe))
                }
                None => (&mut p.grads[wte], None),
            };
            let table = TokenEmbedding { table: &p.values[wte], shard: self.shard };
            embedding::backward(dev, &s, &table, dwte, dwpe, dx, &tokens, &dropout, tp);
            return (None, deferred(wg));
        }
        (Some(dx), deferred(wg))
    }

    /// Block `offset`'s forward keeping every tensor as workspace (evaluation, and full
    /// recompute's forwards, whose tensors live only as long as the caller holds them).
    fn forward_as_workspace(
        &self,
        dev: &dyn Device,
        offset: usize,
        x: Tensor,
        dropout: &DropoutCtx,
        tp: &mut TensorGroup,
    ) -> (Tensor, BlockActs) {
        let keep = SelectiveModules::NONE;
        self.block(offset).forward(dev, x, dropout, keep, Category::Workspace, &|_| false, tp)
    }

    fn distributes_saves(&self) -> bool {
        self.distribute_saved && self.shard.size > 1
    }

    /// Runs blocks `range` forward again from their segment's input, keeping everything
    /// (as workspace: it lives only until this backward has consumed it).
    fn recompute_segment(
        &self,
        dev: &dyn Device,
        range: std::ops::Range<usize>,
        input: Tensor,
        dropout: &DropoutCtx,
        tp: &mut TensorGroup,
    ) -> Vec<BlockActs> {
        let mut x = input;
        let mut acts = Vec::with_capacity(range.len());
        for offset in range {
            let (y, a) = self.forward_as_workspace(dev, offset, x, dropout, tp);
            acts.push(a);
            x = y;
        }
        acts
    }

    /// The backward-weight action of a split backward: the deferred matmul weight gradients.
    pub fn backward_weight(&mut self, dev: &dyn Device, deferred: DeferredWeightGrads) {
        let p = &mut self.params;
        for wg in &deferred.0 {
            weight_grads::apply(dev, &mut p.grads, wg);
        }
    }
}

/// The chunk indices of the final norm's weight and bias.
fn final_norm_indices(p: &Parameters) -> (usize, Option<usize>) {
    (
        p.index(Role::FinalNormWeight).expect("the head's chunk holds the final norm"),
        p.index(Role::FinalNormBias),
    )
}

fn final_norm<'a>(s: &ModelShape, values: &'a [Tensor], weight: usize, bias: Option<usize>) -> NormLayer<'a> {
    s.arch.norm_layer(&values[weight], bias.map(|b| &values[b]))
}

/// The weight gradients left for backward-weight, now accounted as activations: what W
/// will read is held like a stash until it runs.
fn deferred(wg: WeightGrads) -> Option<DeferredWeightGrads> {
    match wg {
        WeightGrads::Now => None,
        WeightGrads::Deferred(mut list) => {
            for w in &mut list {
                for t in [&mut w.inp, &mut w.dout] {
                    Arc::get_mut(t)
                        .expect("backward holds no other reference once it is done")
                        .recategorize(Category::Activations);
                }
            }
            Some(DeferredWeightGrads(list))
        }
    }
}
