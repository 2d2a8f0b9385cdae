//! One rank of a run: its pipeline stage (its own chunks' parameters, gradients and AdamW
//! moments, nothing else), the lowered schedule, and its two ends of the seam: the
//! transport that carries the action lists' tensors and the collective that does
//! everything after them. Every rank calls the same methods in the same order, whether it
//! is a thread (the threads backend) or a process (MPI).

use super::report::StepReport;
use crate::checkpoint::NamedTensor;
use crate::config::{Config, DeviceKind};
use crate::data::TokenData;
use crate::plan;
use kernels::cpu::CpuDevice;
use kernels::{AdamWStep, Device};
use schedules::{LoweredSchedule, Shape};
use stages::dist::{Collective, Group, Reader, Topology, Transport, Writer};
use stages::runtime::{forward_only, run_stage, Fault, FaultInjection, MicrobatchData, StepInputs};
use stages::stage::{clip_factor, global_grad_norm, Stage};
use stages::{Mode, Shard, TensorGroup};
use std::sync::Arc;

pub struct Rank {
    pub id: usize,
    pub topology: Topology,
    /// Dropped before the stage (fields drop in order): NCCL communicators abort as they
    /// drop, which releases device streams still waiting on a silent peer, and only then
    /// can the stage's device, which waits for its stream as it drops, go.
    transport: Box<dyn Transport>,
    collective: Box<dyn Collective>,
    pub stage: Stage,
    pub schedule: LoweredSchedule,
    /// The AdamW update of the last step's gradients, not applied yet: it runs at the start
    /// of the next step, or at [`Rank::apply_pending_update`] before anything reads the
    /// weights. So a step waits for its device once, at its readout, and not again for the
    /// end of its update.
    pending_update: Option<AdamWStep>,
}

/// What one training step left on this rank.
pub struct StepResult {
    /// This rank's part of the step, as every rank will see it.
    pub report: StepReport,
    pub grad_norm: f64,
}

/// What a rank shares with the other ranks of its process and machine.
#[derive(Clone, Copy, Debug)]
pub struct Local {
    /// The CPU threads its device may use (device: cpu): its share of the cores.
    pub cpu_threads: usize,
    /// Whether it is its process's only rank, so the only user of its GPU in the process
    /// (device: cuda): no tensor of another stage crosses its streams.
    pub sole_rank: bool,
}

impl Rank {
    /// Builds this rank's stage from `weights` (the tensors its chunks need; None
    /// initialises them from the seed) with a CPU device of its share of the cores, or the
    /// GPU.
    pub fn build(
        cfg: &Config,
        weights: Option<&[NamedTensor]>,
        local: Local,
        id: usize,
        topology: Topology,
        transport: Box<dyn Transport>,
        collective: Box<dyn Collective>,
    ) -> anyhow::Result<Rank> {
        let stage_index = topology.stage_of(id);
        let (_, schedule) = plan::lowered_schedule(cfg)?;
        let layouts = plan::stage_layouts(cfg, stage_index)?;
        let device = stage_device(cfg, local)?;
        // The memory model counts activations in the shape's dtype: it must be what the
        // device stores, or every prediction of this run is off.
        assert_eq!(plan::shape(cfg).activations, device.activation_dtype(), "{}", device.name());
        let policy = plan::recompute_policy(cfg, stage_index);
        let shard =
            Shard { size: topology.tensor, rank: topology.tensor_of(id), sequence: cfg.sequence_parallel };
        let optimizer = plan::optimizer_shard(cfg, topology.replica_of(id));
        let chunks = layouts
            .into_iter()
            .map(|layout| {
                let mut chunk =
                    plan::build_chunk(&*device, cfg, layout, (shard, optimizer), policy, weights)?;
                chunk.offload = plan::activation_offload(cfg, stage_index);
                Ok(chunk)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Rank {
            id,
            topology,
            stage: Stage::new(device, chunks),
            schedule,
            transport,
            collective,
            pending_update: None,
        })
    }

    /// Every rank of `cfg`'s pipeline (one replica, each stage on its tensor-parallel ranks)
    /// as threads of this process, built from the seed with one CPU thread each: for tests
    /// that drive the steps themselves.
    #[cfg(test)]
    pub fn all_in_threads(cfg: &Config) -> Vec<Rank> {
        let schedule = plan::lowered_schedule(cfg).unwrap().1;
        let placement = schedule.schedule().shape().placement;
        let (tensor, pipeline) = (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size);
        let topology = Topology { tensor, pipeline, data: 1, placement };
        let local = Local { cpu_threads: 1, sole_rank: false };
        stages::dist::threads::world(topology, schedule.required_capacity().get(), cfg.distributed_timeout())
            .into_iter()
            .enumerate()
            .map(|(id, (t, c))| {
                Rank::build(cfg, None, local, id, topology, Box::new(t), Box::new(c)).unwrap()
            })
            .collect()
    }

    pub fn stage_index(&self) -> usize {
        self.topology.stage_of(self.id)
    }

    pub fn replica(&self) -> usize {
        self.topology.replica_of(self.id)
    }

    /// This rank's place in its tensor-parallel group.
    pub fn tensor_rank(&self) -> usize {
        self.topology.tensor_of(self.id)
    }

    pub fn collective(&mut self) -> &mut dyn Collective {
        &mut *self.collective
    }

    /// Waits until the peers have taken every tensor this rank sent: the last wait on them
    /// before the process may end.
    pub fn complete_sends(&mut self) -> Result<(), stages::dist::DistError> {
        self.transport.complete_sends()
    }

    fn shape(&self) -> Shape {
        self.schedule.schedule().shape()
    }

    /// One training step: the last step's AdamW update (pending until now), then this
    /// stage's action list for this replica's microbatches, the gradient reductions
    /// (data-parallel, then the tied embedding) and the global grad norm; this step's update
    /// is left pending. Gradients start at zero and are left for the update. Times are the
    /// device clock's, started here and read at the step's one host sync (its readout), when
    /// the device's recorded errors are checked.
    pub fn train_step(
        &mut self,
        cfg: &Config,
        data: &TokenData,
        step: usize,
        lr: f32,
        fault: Option<FaultInjection>,
    ) -> anyhow::Result<StepResult> {
        let dev = self.stage.device.clone();
        dev.clock_start();
        let update = match self.pending_update {
            Some(_) => {
                let start = dev.clock_mark();
                self.apply_pending_update()?;
                Some((start, dev.clock_mark()))
            }
            None => None,
        };
        let (m, dp) = (cfg.num_microbatches(), self.topology.data);
        let first = self.replica() * m;
        let microbatches = (first..first + m)
            .map(|mb| {
                let b =
                    data.train_batch(cfg.seed, step as u32, mb as u32, cfg.micro_batch_size, cfg.seq_length)?;
                Ok(MicrobatchData { inputs: b.inputs, targets: b.targets })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let grad_scale = 1.0 / (cfg.micro_batch_size * cfg.seq_length * m * dp) as f32;
        let inputs = StepInputs {
            step: step as u32,
            microbatches: &microbatches,
            first_microbatch: first,
            mode: Mode::Train { grad_scale },
        };
        let (stage_index, shape) = (self.stage_index(), self.shape());
        let fault = fault.filter(|f| f.rank == self.id && f.step == step as u32);
        let lists = self.schedule.schedule().stages();
        let stage_report = run_stage(
            &mut self.stage,
            stage_index,
            shape,
            &lists[stage_index],
            &mut *self.transport,
            &mut TensorGroup::of(&mut *self.collective),
            &inputs,
            fault,
        )?;
        if fault.is_some_and(|f| f.kind == Fault::NonFinite) {
            self.poison_last_grad();
        }
        self.reduce_grads()?;
        self.stage.grad_sum_squares();
        let end = dev.clock_mark();
        // The step's one host sync: its losses and the gradients' sums of squares together.
        // Every mark above precedes it, so reading the clock waits for nothing more.
        self.collective.wait_for_device(&*dev)?;
        let mut values = self.stage.read_step();
        // Every tensor rank of the head's stage has the same losses; rank 0 of each reports.
        if self.tensor_rank() != 0 {
            values.losses.clear();
        }
        let grad_norm = self.grad_norm(&values.grad_sum_squares)?;
        let readings = dev.clock_read();
        self.check_device(step, fault)?;
        self.pending_update = Some(AdamWStep {
            lr,
            beta1: cfg.adam_beta1,
            beta2: cfg.adam_beta2,
            eps: cfg.adam_eps,
            weight_decay: cfg.weight_decay,
            step: step as u32,
            grad_scale: clip_factor(grad_norm, cfg.clip_grad),
        });
        self.stage.settle_timing(&readings);
        let mut report = StepReport::new(&stage_report, values.losses, &readings, update, end);
        report.non_finite_grad = super::non_finite::highest_non_finite(&values.grad_sum_squares);
        Ok(StepResult { report, grad_norm })
    }

    /// Applies the pending AdamW update, if any, then zeroes the gradients for the next
    /// step. Whatever reads the weights (evaluation, a checkpoint) calls this first. Under
    /// the distributed optimizer each replica steps its own part of every parameter, and the
    /// replicas then gather the parts: every replica of the stage calls this together.
    pub fn apply_pending_update(&mut self) -> anyhow::Result<()> {
        if let Some(update) = self.pending_update.take() {
            self.stage.optimizer_step(update);
            if self.stage.optimizer().distributed {
                self.gather_stepped_parts()?;
            }
            self.stage.zero_grads();
        }
        Ok(())
    }

    /// Every replica's freshly stepped part of each parameter, gathered in replica order into
    /// the whole parameter on every replica, for the next forward (a parameter whose fp32
    /// master is sharded takes the whole into its bf16 copy, its master keeping its part).
    fn gather_stepped_parts(&mut self) -> anyhow::Result<()> {
        let dev = self.stage.device.clone();
        for chunk in &mut self.stage.chunks {
            for value in &mut chunk.params.values {
                self.collective.all_gather_param(Group::DataParallel, value, &*dev)?;
            }
        }
        Ok(())
    }

    /// The injected fault `nan`: the gradient of this stage's highest-numbered parameter
    /// turns NaN, as a backward that overflowed there would leave it.
    fn poison_last_grad(&mut self) {
        let dev = self.stage.device.clone();
        let last = (self.stage.chunks.iter_mut())
            .flat_map(|c| c.params.specs.iter().zip(&mut c.params.grads))
            .max_by_key(|(spec, _)| spec.global_index);
        if let Some((_, grad)) = last {
            let nan = dev.from_host(&vec![f32::NAN; grad.len()], grad.shape(), kernels::Category::Workspace);
            dev.copy(grad, &nan);
        }
    }

    /// An error the device recorded during the step (or an injected one), as one line
    /// naming the step and the device; the launcher names the rank.
    fn check_device(&self, step: usize, fault: Option<FaultInjection>) -> anyhow::Result<()> {
        let dev = &self.stage.device;
        let injected = fault.filter(|f| f.kind == Fault::Device).map(|_| "injected device error".to_string());
        match injected.or_else(|| dev.take_error()) {
            Some(error) => Err(anyhow::anyhow!("step {step}: {}: {error}", dev.name())),
            None => Ok(()),
        }
    }

    /// Sums over the tensor-parallel group the gradients each rank computed over its part
    /// (the norms' where sequence parallelism split their rows, QK-norm's), then the tied
    /// embedding's two halves within this replica, then every gradient across replicas. In
    /// this order the tied gradient is sum over replicas r of (embedding_r + head_r) whether
    /// one stage holds both halves or two do, so the bits do not depend on the partition. Under the distributed optimizer the replicas reduce-scatter: each is
    /// left the sum of its own part, the same bits as the all-reduce's there.
    fn reduce_grads(&mut self) -> anyhow::Result<()> {
        let dev = self.stage.device.clone();
        for g in self.stage.partial_grads_mut() {
            self.collective.all_reduce_sum(Group::Tensor, g, &*dev)?;
        }
        self.stage.fold_local_tied_grad();
        if let Some(g) = self.stage.tied_grad_mut() {
            self.collective.all_reduce_sum(Group::TiedEmbedding, g, &*dev)?;
        }
        if self.topology.data > 1 {
            let optimizer = self.stage.optimizer();
            for g in self.stage.grads_mut() {
                if optimizer.distributed {
                    self.collective.reduce_scatter_sum(Group::DataParallel, g, &*dev)?;
                } else {
                    self.collective.all_reduce_sum(Group::DataParallel, g, &*dev)?;
                }
            }
        }
        Ok(())
    }

    /// The global gradient norm: every stage's and tensor rank's sums of squares of its
    /// gradients' parts, added in global parameter order, then replica part order (a split
    /// parameter's shards in tensor rank order), so every rank gets the same number whatever
    /// the partition. Replicas holding only their own parts (the distributed optimizer) add
    /// every replica's; others hold all parts of the whole gradient themselves.
    fn grad_norm(&mut self, sum_squares: &[(usize, f64)]) -> anyhow::Result<f64> {
        let group = if self.stage.optimizer().distributed { Group::World } else { Group::ModelParallel };
        let all = self.all_gather_indexed(group, sum_squares)?;
        Ok(global_grad_norm(all))
    }

    /// Mean loss of `iters` validation windows, forward only. The replicas split the
    /// windows in contiguous blocks; the mean is taken in window order, so it is the same
    /// bits for any data-parallel size.
    pub fn evaluate(&mut self, cfg: &Config, data: &TokenData, iters: usize) -> anyhow::Result<f64> {
        self.apply_pending_update()?;
        let per_replica = iters.div_ceil(self.topology.data);
        let first = (self.replica() * per_replica).min(iters);
        let count = per_replica.min(iters - first);
        let microbatches = (first..first + count)
            .map(|i| {
                let b = data.eval_batch(i, cfg.micro_batch_size, cfg.seq_length)?;
                Ok(MicrobatchData { inputs: b.inputs, targets: b.targets })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let shape = Shape { microbatches: count, ..self.shape() };
        let (lists, _) = forward_only(shape);
        let inputs =
            StepInputs { step: 0, microbatches: &microbatches, first_microbatch: first, mode: Mode::Eval };
        let stage_index = self.stage_index();
        // Its marks go unread; a fresh start keeps them from piling up on the device.
        self.stage.device.clock_start();
        run_stage(
            &mut self.stage,
            stage_index,
            shape,
            &lists[stage_index],
            &mut *self.transport,
            &mut TensorGroup::of(&mut *self.collective),
            &inputs,
            None,
        )?;
        self.collective.wait_for_device(&*self.stage.device)?;
        let mut losses = self.stage.read_step().losses;
        if self.tensor_rank() != 0 {
            losses.clear();
        }
        let losses = self.all_gather_indexed(Group::World, &losses)?;
        Ok(super::report::mean_loss(losses))
    }

    /// Every member's (index, value) pairs, concatenated in member order.
    fn all_gather_indexed(
        &mut self,
        group: Group,
        pairs: &[(usize, f64)],
    ) -> anyhow::Result<Vec<(usize, f64)>> {
        let mut all = Vec::new();
        for bytes in self.collective.all_gather(group, &Writer::default().indexed(pairs).0)? {
            all.extend(Reader(&bytes).indexed()?);
        }
        Ok(all)
    }

    /// This stage's parameters (or optimizer moments) as Hugging Face tensors, tagged with
    /// their place in the model's order: whole, the tensor-parallel group's shards gathered
    /// (every member of the group takes part), and under the distributed optimizer the
    /// replica parts of a moment, or of a parameter whose fp32 master is sharded, gathered
    /// first (every replica takes part).
    pub fn named(&mut self, held: Held) -> anyhow::Result<Vec<((usize, usize), NamedTensor)>> {
        assert!(
            self.pending_update.is_none(),
            "weights read with an update pending: apply_pending_update first"
        );
        let (dev, collective) = (&*self.stage.device, &mut *self.collective);
        let read = |p: &stages::Parameters, i: usize| match held {
            Held::Values => {
                let mine = p.master_part(i);
                (dev.to_host_part(&p.values[i], mine.clone()), mine.len() != p.values[i].len())
            }
            Held::ExpAvg => (dev.to_host(&p.exp_avg[i]), p.optimizer.distributed),
            Held::ExpAvgSq => (dev.to_host(&p.exp_avg_sq[i]), p.optimizer.distributed),
        };
        let t = self.topology.tensor;
        let mut whole =
            |spec: &stages::params::ParamSpec, s: &stages::ModelShape, part: Vec<f32>, replica_part| {
                let shard = match replica_part {
                    true => collective.all_gather_parts(Group::DataParallel, &part)?,
                    false => part,
                };
                if spec.cut(s, Shard { size: t, ..Shard::WHOLE }).is_none() {
                    return Ok(shard);
                }
                let mut w = Writer::default();
                w.f32s(&shard);
                let mut data = vec![0.0; spec.elements()];
                for (rank, bytes) in collective.all_gather(Group::Tensor, &w.0)?.iter().enumerate() {
                    let cut =
                        spec.cut(s, Shard { size: t, rank, ..Shard::WHOLE }).expect("a split parameter");
                    cut.place(&spec.shape, &Reader(bytes).f32s()?, &mut data);
                }
                Ok::<_, anyhow::Error>(data)
            };
        plan::named(&self.stage.chunks, read, &mut whole)
    }

    /// Writes this stage's optimizer moments from `optimizer` (the trainer state's names):
    /// the part of each this replica steps.
    pub fn restore_optimizer(&mut self, optimizer: &[NamedTensor]) -> anyhow::Result<()> {
        let dev = self.stage.device.clone();
        for chunk in &mut self.stage.chunks {
            let p = &mut chunk.params;
            for i in 0..p.specs.len() {
                let moment = |name_of: fn(&str) -> String| {
                    plan::gather(&p.specs[i], optimizer, name_of)
                        .map_err(|e| anyhow::anyhow!("trainer state: {e}"))
                };
                let (m, v) =
                    (moment(crate::checkpoint::exp_avg_name)?, moment(crate::checkpoint::exp_avg_sq_name)?);
                for (target, data) in [(&mut p.exp_avg[i], m), (&mut p.exp_avg_sq[i], v)] {
                    let data = p.specs[i].shard_of(&chunk.shape, chunk.shard, data);
                    dev.write_at(target, 0, &data[p.optimizer.part(data.len())]);
                }
            }
        }
        Ok(())
    }
}

/// What [`Rank::named`] reads: the parameters, or one of the AdamW moments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Values,
    ExpAvg,
    ExpAvgSq,
}

/// A stage's device: a CPU with its share of the cores, or the GPU.
fn stage_device(cfg: &Config, local: Local) -> anyhow::Result<Arc<dyn Device>> {
    match cfg.device {
        DeviceKind::Cuda => cuda_device(cfg, local.sole_rank),
        DeviceKind::Cpu => Ok(Arc::new(CpuDevice::new(local.cpu_threads.max(1)))),
    }
}

/// The GPU of this process (each stage its own stream; a sole rank's GPU without cudarc's
/// per-buffer event tracking); `precision: bf16` stores activations in bf16 and runs the
/// matmuls on bf16 operands with fp32 accumulation and master weights; `bias_gelu_fusion`
/// says whether matmuls fold in the bias and GELU's backward.
#[cfg(feature = "cuda")]
fn cuda_device(cfg: &Config, sole_rank: bool) -> anyhow::Result<Arc<dyn Device>> {
    use kernels::cuda::CudaDevice;
    let device_error = |e: String| cfg.key_error("device", format!("cuda: {e}"));
    let ordinal = super::launcher::local_gpu();
    let device = if sole_rank { CudaDevice::sole(ordinal) } else { CudaDevice::new(ordinal) };
    let device = device.map_err(device_error)?;
    let device = device.with_matmul_precision(cfg.precision.matmul()).map_err(device_error)?;
    Ok(Arc::new(device.with_epilogue_fusion(cfg.bias_gelu_fusion)))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(cfg: &Config, _sole_rank: bool) -> anyhow::Result<Arc<dyn Device>> {
    Err(cfg.key_error("device", "cuda needs a build with `--features cuda`; use device: cpu"))
}
