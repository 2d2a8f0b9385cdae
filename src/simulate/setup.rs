//! From a config to what the simulator needs: the model's shape, the schedule, the split of
//! the blocks over the virtual stages and each stage's recompute policy — chosen exactly as
//! the trainer chooses them (stages::partition, plan::recompute_policy).

use crate::config::{Config, DeviceKind};
use crate::plan;
use schedules::{generate, lower, LoweredSchedule, ScheduleKind};
use stages::tensor_parallel::Split;
use stages::{Activation, ActivationOffload, ChunkLayout, ModelShape, RecomputePolicy, TensorParallel};
use std::sync::{Arc, OnceLock};

pub struct Setup {
    pub cfg: Config,
    pub shape: ModelShape,
    /// How every layer splits over t ranks; figures are one rank's.
    pub tp: TensorParallel,
    /// Data-parallel replicas of the pipeline.
    pub dp: usize,
    pub kind: ScheduleKind,
    /// Stages, chunks per stage and microbatches.
    pub p: usize,
    pub v: usize,
    pub m: usize,
    /// One per virtual stage (see [`Setup::layout`] for which chunk of which stage holds it).
    pub layouts: Vec<ChunkLayout>,
    /// One per stage; every chunk of a stage follows it.
    pub policies: Vec<RecomputePolicy>,
    /// One per stage, as the policies: what its chunks keep in host memory.
    pub offloads: Vec<ActivationOffload>,
    /// Lowered on first use and shared: the planner bounds a shape's time before it pays for
    /// the lowering, and the sweep simulates one schedule under many recompute settings.
    schedule: Arc<OnceLock<Result<LoweredSchedule, String>>>,
}

impl Setup {
    /// The simulation of `cfg` (validated). Impossible shapes are user errors naming the
    /// key, as the trainer names them.
    pub fn new(cfg: &Config) -> anyhow::Result<Setup> {
        let (kind, schedule) = plan::lowered_schedule(cfg)?;
        let setup = Self::unlowered(cfg, kind)?;
        setup.schedule.get_or_init(|| Ok(schedule));
        Ok(setup)
    }

    /// As [`Setup::new`], the schedule `kind` lowered only when first simulated.
    pub fn unlowered(cfg: &Config, kind: ScheduleKind) -> anyhow::Result<Setup> {
        Ok(Self::with_layouts(cfg, kind, plan::chunk_layouts(cfg)?))
    }

    /// As [`Setup::unlowered`] with the split already made (`plan::chunk_layouts` of `cfg`:
    /// the sweep shares one per layout and v).
    pub fn with_layouts(cfg: &Config, kind: ScheduleKind, layouts: Vec<ChunkLayout>) -> Setup {
        let (p, v, m) = (cfg.pipeline_model_parallel_size, cfg.virtual_stages(), cfg.num_microbatches());
        let shape = plan::shape(cfg);
        let policies = (0..p).map(|r| plan::recompute_policy(cfg, r)).collect();
        let offloads = (0..p).map(|r| plan::activation_offload(cfg, r)).collect();
        let (tp, dp) = (cfg.tensor_parallel(), cfg.data_parallel());
        let schedule = Arc::new(OnceLock::new());
        Setup { cfg: cfg.clone(), shape, tp, dp, kind, p, v, m, layouts, policies, offloads, schedule }
    }

    /// The same model, schedule and split under `cfg`'s recompute settings.
    pub fn with_recompute(&self, cfg: &Config) -> Setup {
        Setup {
            cfg: cfg.clone(),
            policies: (0..self.p).map(|r| plan::recompute_policy(cfg, r)).collect(),
            offloads: (0..self.p).map(|r| plan::activation_offload(cfg, r)).collect(),
            layouts: self.layouts.clone(),
            schedule: Arc::clone(&self.schedule),
            ..*self
        }
    }

    /// The lowered lists the trainer would run.
    pub fn schedule(&self) -> anyhow::Result<&LoweredSchedule> {
        let lowered = self.schedule.get_or_init(|| {
            generate(self.kind, self.p, self.v, self.m).and_then(|s| lower(&s)).map_err(|e| e.to_string())
        });
        lowered
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{} with p={}, v={}, m={}: {e}", self.kind, self.p, self.v, self.m))
    }

    /// The layout of chunk `chunk` of stage `stage`, placed as the schedule's Shape says.
    pub fn layout(&self, stage: usize, chunk: usize) -> &ChunkLayout {
        let placed = schedules::Shape {
            stages: self.p,
            chunks: self.v,
            microbatches: self.m,
            placement: self.kind.placement(),
        };
        &self.layouts[placed.virtual_stage(stage, chunk)]
    }

    /// Bytes per stored activation or activation gradient element: 2 under bf16, which the
    /// trainer stores as bf16 tensors, fp32's 4 otherwise ([`ModelShape::activations`]).
    pub fn activation_bytes_per_element(&self) -> usize {
        self.shape.activations.size()
    }

    /// Whether CUDA adds a linear layer's bias inside its forward product (a cuBLASLt
    /// epilogue, under `bias_gelu_fusion`); the CPU, and CUDA with the key off, add it in a
    /// pass of its own.
    pub fn fuses_bias(&self) -> bool {
        self.cfg.device == DeviceKind::Cuda && self.cfg.bias_gelu_fusion
    }

    /// Whether CUDA computes GELU's gradient inside fc2's input-gradient product
    /// (`Device::matmul_backward_input_gelu`, under `bias_gelu_fusion`), as the trainer
    /// decides it on a rank's width of the FFN ([`kernels::cuda_fuses_gelu_backward`]).
    pub fn fuses_gelu_backward(&self) -> bool {
        self.cfg.device == DeviceKind::Cuda
            && self.cfg.bias_gelu_fusion
            && self.shape.arch.activation == Activation::Gelu
            && kernels::cuda_fuses_gelu_backward(self.tp.per_rank(self.shape.ffn, Split::Interior))
    }

    /// Columns of a row of the head's logits: the vocabulary, padded on CUDA as its device
    /// pads them ([`kernels::padded_vocab`]); the CPU keeps V, and so does a
    /// tensor-parallel rank's shard of it (split by t after this, never padded).
    pub fn logits_columns(&self) -> usize {
        if self.cfg.device == DeviceKind::Cuda && self.tp.size == 1 {
            kernels::padded_vocab(self.shape.vocab)
        } else {
            self.shape.vocab
        }
    }

    /// The stages that hold the embedding and the head of a tied model, when they differ:
    /// then each holds its own part of the tied embedding's gradient and the two are
    /// exchanged.
    pub fn tied_holders(&self) -> Option<(usize, usize)> {
        if !self.shape.arch.tied_output {
            return None;
        }
        let stage_with = |part: fn(&ChunkLayout) -> bool| {
            (0..self.p).find(|&r| (0..self.v).any(|c| part(self.layout(r, c))))
        };
        match (stage_with(|l| l.embedding), stage_with(|l| l.head)) {
            (Some(e), Some(h)) if e != h => Some((e, h)),
            _ => None,
        }
    }

    /// GPUs: t x p x dp.
    pub fn world_size(&self) -> usize {
        self.tp.size * self.p * self.dp
    }

    /// Global batch times sequence length.
    pub fn tokens_per_iteration(&self) -> f64 {
        (self.cfg.global_batch_size * self.cfg.seq_length) as f64
    }

    /// What stage `stage` holds, e.g. `h.0-h.5 + embedding`; chunks joined by ", ".
    pub fn stage_layers(&self, stage: usize) -> String {
        let chunks: Vec<String> = (0..self.v)
            .map(|c| {
                let l = self.layout(stage, c);
                let mut parts = Vec::new();
                match l.blocks.len() {
                    0 => {}
                    1 => parts.push(format!("h.{}", l.blocks.start)),
                    _ => parts.push(format!("h.{}-h.{}", l.blocks.start, l.blocks.end - 1)),
                }
                if l.embedding {
                    parts.push("embedding".into());
                }
                if l.head {
                    parts.push("head".into());
                }
                parts.join(" + ")
            })
            .collect();
        chunks.join(", ")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// GPT-2 small at T=1024 on `p` stages under `schedule`.
    pub fn gpt2_small(p: usize, schedule: &str, v: usize, global_batch: usize) -> Config {
        Config {
            pipeline_model_parallel_size: p,
            pipeline_schedule: schedule.parse().unwrap(),
            virtual_pipeline_model_parallel_size: (v > 1).then_some(v),
            global_batch_size: global_batch,
            ..Config::default()
        }
    }

    #[test]
    fn splits_as_the_trainer_and_names_the_layers() {
        let s = Setup::new(&gpt2_small(4, "1f1b", 1, 8)).unwrap();
        assert_eq!((s.p, s.v, s.m), (4, 1, 8));
        let names: Vec<String> = (0..4).map(|r| s.stage_layers(r)).collect();
        assert_eq!(names, ["h.0-h.3 + embedding", "h.4-h.7", "h.8-h.11", "head"]);
        let s = Setup::new(&gpt2_small(2, "interleaved-1f1b", 2, 4)).unwrap();
        assert_eq!(s.stage_layers(0), "h.0-h.3 + embedding, h.8-h.11");
        assert_eq!(s.stage_layers(1), "h.4-h.7, head");
    }

    #[test]
    fn a_v_holds_the_embedding_and_the_head_on_stage_0_with_nothing_to_exchange() {
        // 12 blocks over 4 virtual stages: stage 0 holds virtual stages 0 and 3, stage 1
        // virtual stages 1 and 2.
        let s = Setup::new(&gpt2_small(2, "zb-v", 1, 4)).unwrap();
        assert_eq!((s.p, s.v), (2, 2));
        assert!(s.layout(0, 0).embedding && s.layout(0, 1).head);
        assert_eq!(s.layout(1, 0).blocks, s.layouts[1].blocks);
        assert_eq!(s.layout(1, 1).blocks, s.layouts[2].blocks);
        assert_eq!(s.tied_holders(), None);
    }

    #[test]
    fn impossible_shapes_name_the_key() {
        let err = |cfg: Config| Setup::new(&cfg).err().unwrap().to_string();
        assert_eq!(
            err(gpt2_small(4, "interleaved-1f1b", 2, 6)),
            "key `pipeline_schedule`: interleaved-1f1b with p=4, v=2, m=6: interleaved-1f1b: the number \
             of microbatches (6) must be a multiple of pipeline_model_parallel_size (4), as in Megatron-LM: \
             microbatches go through the model chunks in groups of 4"
        );
        assert_eq!(
            err(Config { num_layers: 3, ..gpt2_small(8, "1f1b", 1, 8) }),
            "key `pipeline_model_parallel_size`: cannot split 3 layers over 8 pipeline stages (chunks)"
        );
        assert_eq!(
            err(Config { num_layers_per_stage: Some(vec![6, 5]), ..gpt2_small(2, "1f1b", 1, 8) }),
            "key `num_layers_per_stage`: [6, 5] sums to 11, num_layers is 12"
        );
    }
}
