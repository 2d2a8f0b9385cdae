//! The trainer's pipeline: p stages (each its own device and thread), the lowered schedule
//! they execute, and what happens around a step: the tied-embedding gradient exchange, the
//! global grad norm and the per-stage optimizer step.

use super::model;
use crate::checkpoint::NamedTensor;
use crate::config::Config;
use crate::data::TokenFile;
use crate::error::user_error;
use kernels::cpu::CpuDevice;
use kernels::Device;
use schedules::{simulate, ChunkCosts, ChunkMemory, Link, LoweredSchedule, Shape, SimInput};
use stages::runtime::{
    forward_only, run_step, FaultInjection, MicrobatchData, StageStepReport, StepInputs, StepPlan,
};
use stages::stage::{clip_factor, global_grad_norm, OptimizerStep, Stage};
use stages::{memory_model, ModelChunk, RecomputePolicy, TensorParallel};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub struct Pipeline {
    pub stages: Vec<Stage>,
    pub schedule: LoweredSchedule,
}

/// A finished training step.
pub struct StepOutcome {
    /// Mean loss over every token of the global batch.
    pub loss: f64,
    pub grad_norm: f64,
    pub reports: Vec<StageStepReport>,
    /// Seconds from the end of the step's last action to the end of the global grad norm
    /// (the tied-gradient exchange, then the norm): every stage waits for it before AdamW.
    pub exchange_and_norm_s: f64,
}

impl StepOutcome {
    /// Per stage, the seconds from the end of the step's last action to the end of its
    /// optimizer step, given what [`Pipeline::optimizer_step`] returned.
    pub fn post_schedule_s(&self, optimizer_s: &[f64]) -> Vec<f64> {
        optimizer_s.iter().map(|t| self.exchange_and_norm_s + t).collect()
    }
}

/// When the step's last action ended, in seconds on the runtime's step clock.
pub fn last_action_end(reports: &[StageStepReport]) -> f64 {
    reports.iter().flat_map(|r| &r.timings).map(|t| t.end_s).fold(0.0, f64::max)
}

impl Pipeline {
    /// Builds the stages for `cfg` (from `weights` when given), splitting `threads` cores.
    pub fn build(
        cfg: &Config,
        cfg_path: &Path,
        weights: Option<&[NamedTensor]>,
        threads: usize,
    ) -> anyhow::Result<Self> {
        let (p, v) = (cfg.pipeline_model_parallel_size, cfg.virtual_stages());
        let (_, schedule) = model::lowered_schedule(cfg, cfg_path)?;
        let layouts = model::chunk_layouts(cfg, cfg_path)?;
        let sched_shape = schedule.schedule().shape();
        let per_stage_threads = (threads / p).max(1);
        let mut stages = Vec::with_capacity(p);
        for rank in 0..p {
            let device = stage_device(cfg, cfg_path, per_stage_threads)?;
            let policy = model::recompute_policy(cfg, rank);
            let chunks = (0..v)
                .map(|c| {
                    let layout = layouts[sched_shape.virtual_stage(rank, c)].clone();
                    model::build_chunk(&*device, cfg, layout, policy, weights)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            stages.push(Stage::new(device, chunks));
        }
        Ok(Pipeline { stages, schedule })
    }

    /// One line per stage: what it holds and how it recomputes.
    pub fn describe_stages(&self) -> Vec<String> {
        self.stages
            .iter()
            .map(|s| {
                let chunks: Vec<String> = s
                    .chunks
                    .iter()
                    .map(|c| {
                        let l = &c.layout;
                        let mut parts = Vec::new();
                        if l.embedding {
                            parts.push("embedding".to_string());
                        }
                        match l.blocks.len() {
                            0 => {}
                            1 => parts.push(format!("h.{}", l.blocks.start)),
                            _ => parts.push(format!("h.{}-h.{}", l.blocks.start, l.blocks.end - 1)),
                        }
                        if l.head {
                            parts.push("head".to_string());
                        }
                        parts.join(" + ")
                    })
                    .collect();
                format!("{}; recompute {}", chunks.join(" | "), s.chunks[0].policy.describe())
            })
            .collect()
    }

    /// Each stage's peak activation bytes as the simulator predicts them from the memory
    /// model (stages::memory_model) for this schedule: what the ledger must measure.
    pub fn predicted_activation_peaks(&self) -> Vec<u64> {
        self.predicted_peaks_under(|c| c.policy)
    }

    /// The same prediction without recompute: what the policies save is the difference.
    pub fn predicted_activation_peaks_without_recompute(&self) -> Vec<u64> {
        self.predicted_peaks_under(|_| RecomputePolicy::None)
    }

    /// Seconds each stage spent recomputing, over the whole run.
    pub fn recompute_seconds(&self) -> Vec<f64> {
        self.stages.iter().map(|s| s.chunks.iter().map(|c| c.recompute_s).sum()).collect()
    }

    fn predicted_peaks_under(&self, policy: impl Fn(&ModelChunk) -> RecomputePolicy) -> Vec<u64> {
        let shape = self.shape();
        let costs = self
            .stages
            .iter()
            .flat_map(|s| &s.chunks)
            .map(|c| ChunkCosts {
                forward: 1.0,
                backward_input: 1.0,
                backward_weight: 1.0,
                recompute: 0.0,
                memory: ChunkMemory {
                    activation_bytes: memory_model::stash_bytes(
                        &c.shape,
                        TensorParallel::NONE,
                        &c.layout,
                        &policy(c),
                    ) as u64,
                    weight_grad_bytes: memory_model::deferred_weight_grad_bytes(
                        &c.shape,
                        TensorParallel::NONE,
                        &c.layout,
                    ) as u64,
                    ..ChunkMemory::default()
                },
            })
            .collect();
        let input = SimInput::new(shape.stages, shape.chunks, costs, vec![0; shape.stages], Link::INSTANT)
            .expect("costs for every (stage, chunk)");
        let report = simulate(&self.schedule, &input).expect("a lowered schedule simulates");
        report.stages.iter().map(|s| s.peak_memory).collect()
    }

    fn shape(&self) -> Shape {
        self.schedule.schedule().shape()
    }

    /// Forward and backward of every microbatch of step `step` on every stage, then the
    /// gradient exchange of the tied embedding and the global grad norm. Gradients start at
    /// zero (as built, and as [`Self::optimizer_step`] leaves them) and are left for it.
    pub fn train_step(
        &mut self,
        cfg: &Config,
        data: &TokenFile,
        step: usize,
        fault: Option<FaultInjection>,
    ) -> anyhow::Result<StepOutcome> {
        let m = cfg.num_microbatches();
        let microbatches = (0..m)
            .map(|mb| {
                let b =
                    data.train_batch(cfg.seed, step as u32, mb as u32, cfg.micro_batch_size, cfg.seq_length)?;
                Ok(MicrobatchData { inputs: b.inputs, targets: b.targets })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let grad_scale = 1.0 / (cfg.micro_batch_size * cfg.seq_length * m) as f32;
        let inputs =
            StepInputs { step: step as u32, microbatches: &microbatches, grad_scale: Some(grad_scale) };
        // Started just before the runtime starts its own step clock (it only builds the
        // channels in between), so the two clocks agree to microseconds.
        let clock = Instant::now();
        let reports = run_step(&mut self.stages, &StepPlan::lowered(&self.schedule), &inputs, fault)?;
        self.exchange_tied_grads();
        let loss = mean_loss(&reports, m);
        let grad_norm = global_grad_norm(self.stages.iter().flat_map(|s| s.grad_sum_squares()).collect());
        let exchange_and_norm_s = clock.elapsed().as_secs_f64() - last_action_end(&reports);
        Ok(StepOutcome { loss, grad_norm, reports, exchange_and_norm_s })
    }

    /// Sums the two gradients of the tied token embedding on both of its holders.
    fn exchange_tied_grads(&mut self) {
        let last = self.stages.len() - 1;
        if self.stages.len() == 1 && self.shape().chunks == 1 {
            self.stages[0].fold_local_tied_grad();
            return;
        }
        let embedding_part = self.stages[0].tied_grad_part(true).expect("stage 0 holds the embedding");
        let head_part = self.stages[last].tied_grad_part(false).expect("the last stage holds the head");
        self.stages[0].add_tied_grad_part(true, &head_part);
        self.stages[last].add_tied_grad_part(false, &embedding_part);
    }

    /// AdamW on every stage at once (each on its own device), gradients clipped to the global
    /// norm, then the gradients zeroed for the next step. Returns each stage's seconds, from
    /// before its thread starts to its end (what the step waits for).
    pub fn optimizer_step(&mut self, cfg: &Config, lr: f32, step: usize, grad_norm: f64) -> Vec<f64> {
        let hp = OptimizerStep {
            lr,
            beta1: cfg.adam_beta1,
            beta2: cfg.adam_beta2,
            eps: cfg.adam_eps,
            weight_decay: cfg.weight_decay,
            step: step as u32,
            grad_scale: clip_factor(grad_norm, cfg.clip_grad),
        };
        let start = Instant::now();
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .map(|s| {
                    scope.spawn(move || {
                        s.optimizer_step(hp);
                        // Here rather than before the next step's lists: on every stage at
                        // once, and inside the post-schedule time the simulator models.
                        s.zero_grads();
                        start.elapsed().as_secs_f64()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        })
    }

    /// Mean loss of `iters` validation microbatches, forward only through the pipeline.
    pub fn evaluate(&mut self, cfg: &Config, data: &TokenFile, iters: usize) -> anyhow::Result<f64> {
        let microbatches = (0..iters)
            .map(|i| {
                let b = data.eval_batch(i, cfg.micro_batch_size, cfg.seq_length)?;
                Ok(MicrobatchData { inputs: b.inputs, targets: b.targets })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let shape = Shape { microbatches: iters, ..self.shape() };
        let (lists, channels) = forward_only(shape);
        let plan = StepPlan { shape, lists: &lists, channels: &channels, capacity: 1 };
        let inputs = StepInputs { step: 0, microbatches: &microbatches, grad_scale: None };
        let reports = run_step(&mut self.stages, &plan, &inputs, None)?;
        Ok(mean_loss(&reports, iters))
    }

    /// Every parameter (or optimizer moment, per `pick`) of the model in global order.
    pub fn named(
        &self,
        pick: impl Fn(&stages::Parameters, usize) -> &kernels::Tensor + Copy,
    ) -> Vec<NamedTensor> {
        model::in_global_order(
            self.stages.iter().flat_map(|s| model::named(&s.chunks, &*s.device, pick)).collect(),
        )
    }
}

/// The mean of the microbatches' mean losses, in microbatch order.
fn mean_loss(reports: &[StageStepReport], microbatches: usize) -> f64 {
    let mut losses: Vec<(usize, f64)> = reports.iter().flat_map(|r| r.losses.iter().copied()).collect();
    losses.sort_by_key(|(mb, _)| *mb);
    debug_assert_eq!(losses.len(), microbatches);
    losses.iter().map(|(_, l)| l).sum::<f64>() / microbatches as f64
}

/// A stage's device: a CPU with its share of the cores, or the GPU.
fn stage_device(cfg: &Config, cfg_path: &Path, cpu_threads: usize) -> anyhow::Result<Arc<dyn Device>> {
    match cfg.device.as_str() {
        "cuda" => cuda_device(cfg, cfg_path),
        _ => Ok(Arc::new(CpuDevice::new(cpu_threads))),
    }
}

/// Every stage on the one GPU (ordinal 0), each with its own stream; `precision: bf16` runs
/// the matmuls in bf16 with fp32 accumulation and master weights.
#[cfg(feature = "cuda")]
fn cuda_device(cfg: &Config, cfg_path: &Path) -> anyhow::Result<Arc<dyn Device>> {
    use kernels::cuda::{CudaDevice, MatmulPrecision};
    let device = CudaDevice::new(0)
        .map_err(|e| user_error(format!("{}: key `device`: cuda: {e}", cfg_path.display())))?;
    let precision = if cfg.precision == "bf16" { MatmulPrecision::Bf16 } else { MatmulPrecision::Fp32 };
    Ok(Arc::new(device.with_matmul_precision(precision)))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_cfg: &Config, cfg_path: &Path) -> anyhow::Result<Arc<dyn Device>> {
    Err(user_error(format!(
        "{}: key `device`: cuda needs a build with `--features cuda`; use device: cpu",
        cfg_path.display()
    )))
}
