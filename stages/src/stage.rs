//! One pipeline stage: its device, its model chunks, the stash of in-flight microbatches,
//! and the optimizer step over its parameters. The stage runtime drives it action by action;
//! a single-stage run drives it directly.

use crate::chunk::{ChunkStash, DeferredWeightGrads, Microbatch, ModelChunk};
use crate::dist::TensorGroup;
use crate::optimizer_shard::OptimizerShard;
use crate::params::{Parameters, Role};
use crate::tensor_parallel::Split;
use kernels::{AdamWStep, AdamWTensor, Device, Readings, Readout, Tensor};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

pub struct Stage {
    pub device: Arc<dyn Device>,
    /// This stage's model chunks, in the order of the schedule's chunks (placed by its Shape).
    pub chunks: Vec<ModelChunk>,
    stash: HashMap<(usize, u32), ChunkStash>,
    deferred: HashMap<(usize, u32), DeferredWeightGrads>,
    /// This step's values for the host, on the device until [`Stage::read_step`]: the mean
    /// loss of each microbatch whose head forward ran here (slots from 0, in forward order),
    /// then the sum of squares of each gradient this stage owns (slots from
    /// `microbatches`). Kept by length, so a step and an evaluation each reuse theirs.
    readouts: HashMap<usize, Readout>,
    /// This step's: its microbatches, and the length of its readout.
    microbatches: usize,
    readout_len: usize,
    /// The global microbatch of each loss slot filled this step.
    loss_slots: Vec<usize>,
    /// The norm key ([`OptimizerShard::norm_key`]) of each sum-of-squares slot filled this
    /// step.
    norm_slots: Vec<usize>,
}

/// What a step leaves for the host, read with one synchronisation.
#[derive(Debug, Default, PartialEq)]
pub struct StepValues {
    /// (global microbatch, mean loss over its tokens), in forward order.
    pub losses: Vec<(usize, f64)>,
    /// (norm key, sum of squares of that part of a gradient), after
    /// [`Stage::grad_sum_squares`]: the key orders the parts by global parameter index,
    /// then by replica ([`OptimizerShard::norm_key`]).
    pub grad_sum_squares: Vec<(usize, f64)>,
}

impl Stage {
    pub fn new(device: Arc<dyn Device>, chunks: Vec<ModelChunk>) -> Self {
        Stage {
            device,
            chunks,
            stash: HashMap::new(),
            deferred: HashMap::new(),
            readouts: HashMap::new(),
            microbatches: 0,
            readout_len: 0,
            loss_slots: Vec::new(),
            norm_slots: Vec::new(),
        }
    }

    /// Starts a step (or an evaluation) of `microbatches` on this stage.
    pub fn begin_step(&mut self, microbatches: usize) {
        let len =
            microbatches + owned_grads(&self.chunks).count() * self.optimizer().norm_parts_per_gradient();
        let dev = &self.device;
        self.readouts.entry(len).or_insert_with(|| dev.readout(len));
        self.microbatches = microbatches;
        self.readout_len = len;
        self.loss_slots.clear();
        self.norm_slots.clear();
    }

    /// Which part of each parameter this stage's replica steps (every chunk's the same).
    pub fn optimizer(&self) -> OptimizerShard {
        self.chunks.first().map_or(OptimizerShard::WHOLE, |c| c.params.optimizer)
    }

    fn readout(&mut self) -> &mut Readout {
        self.readouts.get_mut(&self.readout_len).expect("begin_step makes the step's readout")
    }

    /// Forward of `mb` on chunk `chunk`; returns the activation to send on (None on the
    /// head, whose microbatch loss stays on the device for [`Stage::read_step`]).
    pub fn forward(
        &mut self,
        chunk: usize,
        mb: &Microbatch,
        input: Option<Tensor>,
        tp: &mut TensorGroup,
    ) -> Option<Tensor> {
        let out = self.chunks[chunk].forward(&*self.device, mb, input, tp);
        if let Some(stash) = out.stash {
            self.stash.insert((chunk, mb.index), stash);
        }
        if let Some(losses) = out.losses {
            let (dev, slot) = (self.device.clone(), self.loss_slots.len());
            dev.loss_mean(self.readout(), slot, &losses);
            self.loss_slots.push(mb.index as usize);
        }
        out.output
    }

    /// Backward of `microbatch` on `chunk` from `dout` (None on the head). With `split`, the
    /// matmul weight gradients wait for [`Stage::backward_weight`].
    pub fn backward(
        &mut self,
        chunk: usize,
        microbatch: u32,
        dout: Option<Tensor>,
        split: bool,
        tp: &mut TensorGroup,
    ) -> Option<Tensor> {
        let stash = self.stash.remove(&(chunk, microbatch)).expect("backward without its forward");
        let (dinput, deferred) = self.chunks[chunk].backward(&*self.device, stash, dout, split, tp);
        if let Some(d) = deferred {
            self.deferred.insert((chunk, microbatch), d);
        }
        dinput
    }

    pub fn backward_weight(&mut self, chunk: usize, microbatch: u32) {
        let d =
            self.deferred.remove(&(chunk, microbatch)).expect("backward-weight without its backward-input");
        self.chunks[chunk].backward_weight(&*self.device, d);
    }

    /// Adds the recompute timed since the last settle to each chunk's total, from the
    /// device clock's `readings`.
    pub fn settle_timing(&mut self, readings: &Readings) {
        for chunk in &mut self.chunks {
            chunk.recompute.settle(readings);
        }
    }

    /// Seconds this stage's chunks have spent recomputing, settled so far.
    pub fn recompute_s(&self) -> f64 {
        self.chunks.iter().map(|c| c.recompute.total_s).sum()
    }

    /// Microbatches whose activations this stage holds right now.
    pub fn in_flight(&self) -> usize {
        self.stash.len()
    }

    /// Zeroes every chunk's gradients in one call: one launch on CUDA, whose table of these
    /// tensors the device keeps from step to step.
    pub fn zero_grads(&mut self) {
        let mut grads: Vec<&mut Tensor> = self.chunks.iter_mut().flat_map(|c| c.params.grads_mut()).collect();
        self.device.fill_zero_tensors(&mut grads);
    }

    /// Sums the two gradients of the tied token embedding where this stage holds both the
    /// embedding and the head: in one chunk (a single stage) or in two (stage 0 of a V
    /// placement, whose two copies then both hold the sum, as two stages do after their
    /// exchange). Nothing for an untied model.
    pub fn fold_local_tied_grad(&mut self) {
        let dev = &*self.device;
        let embedding = self.chunks.iter().position(|c| c.layout.embedding);
        let head = self.chunks.iter().position(|c| c.layout.head);
        let (Some(e), Some(h)) = (embedding, head) else { return };
        if !self.chunks[e].shape.arch.tied_output {
            return;
        }
        if e == h {
            let p = &mut self.chunks[e].params;
            let (head, wte) =
                (p.head_wte_grad.as_ref().expect("the head's own gradient"), token_embedding(p));
            dev.accumulate(&mut p.grads[wte], head);
            return;
        }
        let (low, high) = self.chunks.split_at_mut(e.max(h));
        let (embedding, head) = if e < h { (&mut low[e], &mut high[0]) } else { (&mut high[0], &mut low[h]) };
        let (we, wh) = (token_embedding(&embedding.params), token_embedding(&head.params));
        dev.accumulate(&mut embedding.params.grads[we], &head.params.grads[wh]);
        dev.copy(&mut head.params.grads[wh], &embedding.params.grads[we]);
    }

    /// The gradient of this stage's copy of the tied token embedding where the other copy
    /// is on another stage: the embedding's (first stage) or the output layer's (last
    /// stage). Both holders sum the two, so both copies stay identical. None where this
    /// stage holds both (see [`Stage::fold_local_tied_grad`]), or the model is untied.
    pub fn tied_grad_mut(&mut self) -> Option<&mut Tensor> {
        let holds = |f: fn(&ModelChunk) -> bool| self.chunks.iter().any(f);
        if holds(|c| c.layout.embedding) && holds(|c| c.layout.head) {
            return None;
        }
        let c = self.chunks.iter_mut().find(|c| c.layout.embedding || c.layout.head)?;
        if !c.shape.arch.tied_output {
            return None;
        }
        let wte = c.params.index(Role::TokenEmbedding)?;
        Some(&mut c.params.grads[wte])
    }

    /// The gradients of whole parameters each tensor-parallel rank computes over its own
    /// part of the layer ([`crate::params::ParamSpec::grad_is_partial`]), for the group to sum; none at t = 1.
    pub fn partial_grads_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.chunks.iter_mut().filter(|c| c.shard.size > 1).flat_map(|c| {
            let (p, sequence) = (&mut c.params, c.shard.sequence);
            p.specs
                .iter()
                .zip(&mut p.grads)
                .filter(move |(spec, _)| spec.grad_is_partial(sequence))
                .map(|(_, g)| g)
        })
    }

    /// Every parameter gradient of this stage, chunk by chunk in parameter order.
    pub fn grads_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.chunks.iter_mut().flat_map(|c| c.params.grads.iter_mut())
    }

    /// The sum of squares of every gradient this stage owns, part by part
    /// ([`OptimizerShard::norm_parts`]), in one fused pass on the device, for
    /// [`Stage::read_step`] (the terms of the global gradient norm).
    pub fn grad_sum_squares(&mut self) {
        let optimizer = self.optimizer();
        let (keys, parts): (Vec<usize>, Vec<(&Tensor, Range<usize>)>) = owned_grads(&self.chunks)
            .flat_map(|(index, g)| {
                optimizer
                    .norm_parts(g.len())
                    .map(move |(j, range)| (optimizer.norm_key(index, j), (g, range)))
            })
            .unzip();
        let readout = self.readouts.get_mut(&self.readout_len).expect("begin_step makes the step's readout");
        self.device.sum_squares_of_parts_into(readout, self.microbatches, &parts);
        self.norm_slots = keys;
    }

    /// This step's losses and (after [`Stage::grad_sum_squares`]) sums of squares: the one
    /// download of the step.
    pub fn read_step(&mut self) -> StepValues {
        let dev = self.device.clone();
        let values = dev.read(self.readout());
        let m = self.microbatches;
        StepValues {
            losses: self.loss_slots.iter().zip(&values).map(|(&mb, &l)| (mb, l)).collect(),
            grad_sum_squares: self.norm_slots.iter().zip(&values[m..]).map(|(&i, &s)| (i, s)).collect(),
        }
    }

    /// AdamW on every parameter of this stage, in one call: on the part this replica steps,
    /// `hp`'s lr already scheduled and its grad_scale the step's clipping factor.
    pub fn optimizer_step(&mut self, hp: AdamWStep) {
        let mut tensors: Vec<AdamWTensor> = self
            .chunks
            .iter_mut()
            .flat_map(|c| {
                let p = &mut c.params;
                let optimizer = &p.optimizer;
                p.values
                    .iter_mut()
                    .zip(&p.grads)
                    .zip(p.exp_avg.iter_mut().zip(p.exp_avg_sq.iter_mut()))
                    .zip(&p.specs)
                    .map(|(((param, grad), (m, v)), spec)| AdamWTensor {
                        from: optimizer.part(param.len()).start,
                        param,
                        grad,
                        m,
                        v,
                        decay: spec.decay,
                    })
            })
            .collect();
        self.device.adamw_tensors(&mut tensors, hp);
    }
}

/// (global parameter index, gradient) of every parameter these chunks own, chunk by chunk in
/// parameter order; the tied LM head copy is owned by the embedding's stage, and a
/// parameter every tensor rank holds whole by tensor rank 0 (a split one's shards are each
/// their rank's).
fn owned_grads(chunks: &[ModelChunk]) -> impl Iterator<Item = (usize, &Tensor)> {
    chunks.iter().flat_map(|c| {
        c.params
            .specs
            .iter()
            .zip(&c.params.grads)
            .filter(|(spec, _)| spec.role != Role::TokenEmbedding || c.layout.embedding)
            .filter(|(spec, _)| spec.split != Split::Replicated || c.shard.rank == 0)
            .map(|(spec, g)| (spec.global_index, g))
    })
}

/// The global gradient norm from every stage's per-parameter sums of squares, added in
/// global parameter order so it is the same number whatever the partition (a split
/// parameter's shards in the order given: tensor rank order).
pub fn global_grad_norm(mut parts: Vec<(usize, f64)>) -> f64 {
    parts.sort_by_key(|(i, _)| *i);
    parts.iter().map(|(_, s)| s).sum::<f64>().sqrt()
}

/// The factor that clips the global norm to `clip` (1 when within it or clip is 0).
pub fn clip_factor(norm: f64, clip: f32) -> f32 {
    if clip > 0.0 && norm > clip as f64 {
        (clip as f64 / (norm + 1e-6)) as f32
    } else {
        1.0
    }
}

/// Index of the token embedding in a chunk that holds it (a tied model's head chunk does).
fn token_embedding(p: &Parameters) -> usize {
    p.index(Role::TokenEmbedding).expect("the chunk holds the tied token embedding")
}
