//! One pipeline stage: its device, its model chunks, the stash of in-flight microbatches,
//! and the optimizer step over its parameters. The stage runtime drives it action by action;
//! a single-stage run drives it directly.

use crate::chunk::{ChunkStash, DeferredWeightGrads, Microbatch, ModelChunk};
use kernels::{AdamWStep, Device, Readings, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Optimizer hyper-parameters of one step (the lr already scheduled).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimizerStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based.
    pub step: u32,
    /// Global grad-norm clipping factor (1 when not clipping).
    pub grad_scale: f32,
}

pub struct Stage {
    pub device: Arc<dyn Device>,
    /// This stage's model chunks, in the order of the schedule's chunks (placed by its Shape).
    pub chunks: Vec<ModelChunk>,
    stash: HashMap<(usize, u32), ChunkStash>,
    deferred: HashMap<(usize, u32), DeferredWeightGrads>,
}

impl Stage {
    pub fn new(device: Arc<dyn Device>, chunks: Vec<ModelChunk>) -> Self {
        Stage { device, chunks, stash: HashMap::new(), deferred: HashMap::new() }
    }

    /// Forward of `mb` on chunk `chunk`; returns the activation to send on (None on the head)
    /// and, on the head, the per-token losses.
    pub fn forward(
        &mut self,
        chunk: usize,
        mb: &Microbatch,
        input: Option<Tensor>,
    ) -> (Option<Tensor>, Option<Vec<f32>>) {
        let out = self.chunks[chunk].forward(&*self.device, mb, input);
        if let Some(stash) = out.stash {
            self.stash.insert((chunk, mb.index), stash);
        }
        (out.output, out.losses)
    }

    /// Backward of `microbatch` on `chunk` from `dout` (None on the head). With `split`, the
    /// matmul weight gradients wait for [`Stage::backward_weight`].
    pub fn backward(
        &mut self,
        chunk: usize,
        microbatch: u32,
        dout: Option<Tensor>,
        split: bool,
    ) -> Option<Tensor> {
        let stash = self.stash.remove(&(chunk, microbatch)).expect("backward without its forward");
        let (dinput, deferred) = self.chunks[chunk].backward(&*self.device, stash, dout, split);
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

    pub fn zero_grads(&mut self) {
        for c in &mut self.chunks {
            c.params.zero_grads(&*self.device);
        }
    }

    /// Sums the two gradients of the tied token embedding where this stage holds both the
    /// embedding and the head: in one chunk (a single stage) or in two (stage 0 of a V
    /// placement, whose two copies then both hold the sum, as two stages do after their
    /// exchange).
    pub fn fold_local_tied_grad(&mut self) {
        let dev = &*self.device;
        let embedding = self.chunks.iter().position(|c| c.layout.embedding);
        let head = self.chunks.iter().position(|c| c.layout.head);
        let (Some(e), Some(h)) = (embedding, head) else { return };
        if e == h {
            let p = &mut self.chunks[e].params;
            let (head, wte) = (p.head_wte_grad.as_ref().expect("the head's own gradient"), p.wte_index());
            dev.accumulate(&mut p.grads[wte.expect("embedding chunk holds wte")], head);
            return;
        }
        let (low, high) = self.chunks.split_at_mut(e.max(h));
        let (embedding, head) = if e < h { (&mut low[e], &mut high[0]) } else { (&mut high[0], &mut low[h]) };
        let (we, wh) = (embedding.params.wte_index(), head.params.wte_index());
        let (we, wh) = (we.expect("embedding chunk holds wte"), wh.expect("head chunk holds wte"));
        dev.accumulate(&mut embedding.params.grads[we], &head.params.grads[wh]);
        dev.copy(&mut head.params.grads[wh], &embedding.params.grads[we]);
    }

    /// The gradient of this stage's copy of the tied token embedding where the other copy
    /// is on another stage: the embedding's (first stage) or the LM head's (last stage).
    /// Both holders sum the two, so both copies stay identical. None where this stage holds
    /// both (see [`Stage::fold_local_tied_grad`]).
    pub fn tied_grad_mut(&mut self) -> Option<&mut Tensor> {
        let holds = |f: fn(&ModelChunk) -> bool| self.chunks.iter().any(f);
        if holds(|c| c.layout.embedding) && holds(|c| c.layout.head) {
            return None;
        }
        let c = self.chunks.iter_mut().find(|c| c.layout.embedding || c.layout.head)?;
        let wte = c.params.wte_index()?;
        Some(&mut c.params.grads[wte])
    }

    /// Every parameter gradient of this stage, chunk by chunk in parameter order.
    pub fn grads_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.chunks.iter_mut().flat_map(|c| c.params.grads.iter_mut())
    }

    /// (global parameter index, sum of squares of its gradient) for every parameter this
    /// stage owns; the tied LM head copy is owned by the embedding's stage.
    pub fn grad_sum_squares(&self) -> Vec<(usize, f64)> {
        let mut out = Vec::new();
        for c in &self.chunks {
            for (spec, g) in c.params.specs.iter().zip(&c.params.grads) {
                if spec.global_index == 0 && !c.layout.embedding {
                    continue;
                }
                out.push((spec.global_index, self.device.sum_squares(g)));
            }
        }
        out
    }

    /// AdamW on every parameter of this stage.
    pub fn optimizer_step(&mut self, hp: OptimizerStep) {
        let dev = &*self.device;
        for c in &mut self.chunks {
            let p = &mut c.params;
            for i in 0..p.values.len() {
                let step = AdamWStep {
                    lr: hp.lr,
                    beta1: hp.beta1,
                    beta2: hp.beta2,
                    eps: hp.eps,
                    weight_decay: if p.specs[i].decay { hp.weight_decay } else { 0.0 },
                    step: hp.step,
                    grad_scale: hp.grad_scale,
                };
                dev.adamw(&mut p.values[i], &p.grads[i], &mut p.exp_avg[i], &mut p.exp_avg_sq[i], step);
            }
        }
    }
}

/// The global gradient norm from every stage's per-parameter sums of squares, added in
/// global parameter order so it is the same number whatever the partition.
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
