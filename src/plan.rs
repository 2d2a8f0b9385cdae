//! The run's plan, from its config: the model description (its shape, the device's
//! activation dtype and attention kind), the schedule and its shape, the chunks each stage
//! holds and their recompute policies, and the conversion of their parameters to and from
//! Hugging Face tensors. `train`, `simulate`, `bench`, `eval`, `generate` and the checkpoints
//! read the run through it.

use crate::config::{
    Config, DeviceKind, Named, Precision, RecomputeGranularity, RecomputeMethod, RecomputeModule,
};
use crate::error::user_error;
use kernels::{AttentionSaves, Category, DType, Device};
use schedules::{generate, lower, LoweredSchedule, ScheduleKind};
use stages::params::{chunk_param_specs, ParamSpec};
use stages::partition;
use stages::NamedTensor;
use stages::{
    ActivationOffload, ChunkLayout, DropoutProbs, FullMethod, ModelChunk, ModelShape, OptimizerShard,
    Parameters, RecomputePolicy, SelectiveModules, Shard,
};

/// The model's shape for one microbatch: the config's architecture and sizes, and what the
/// device it runs on keeps and stores.
pub fn shape(c: &Config) -> ModelShape {
    // As the device the trainer builds stores them (rank.rs); the CPU stores f32 only, and
    // validation allows bf16 only on CUDA.
    let activations = match (c.device, c.precision) {
        (DeviceKind::Cuda, Precision::Bf16) => DType::Bf16,
        _ => DType::F32,
    };
    ModelShape {
        arch: c.architecture(),
        num_layers: c.num_layers,
        hidden: c.hidden_size,
        heads: c.num_attention_heads,
        kv_heads: c.kv_heads(),
        head_dim: c.kv_channels,
        ffn: c.ffn_size(),
        seq_len: c.seq_length,
        max_positions: c.max_position_embeddings,
        vocab: c.vocab_size,
        micro_batch: c.micro_batch_size,
        attention_dropout: c.attention_dropout > 0.0,
        attention: match c.device {
            DeviceKind::Cuda => AttentionSaves::cuda(c.head_size(), activations),
            DeviceKind::Cpu => AttentionSaves::Probabilities,
        },
        activations,
    }
}

pub fn dropout(c: &Config) -> DropoutProbs {
    DropoutProbs { hidden: c.hidden_dropout, attention: c.attention_dropout }
}

/// The recompute policy of pipeline stage `stage` (the config was validated).
pub fn recompute_policy(c: &Config, stage: usize) -> RecomputePolicy {
    match c.granularity() {
        RecomputeGranularity::Full => {
            let method = match c.recompute_method {
                Some(RecomputeMethod::Block) => FullMethod::Block,
                _ => FullMethod::Uniform,
            };
            let num_layers = match &c.recompute_num_layers_per_stage {
                Some(per_stage) => per_stage[stage],
                None => c.recompute_num_layers.unwrap_or(1),
            };
            if num_layers == 0 {
                RecomputePolicy::None
            } else {
                RecomputePolicy::Full { method, num_layers }
            }
        }
        RecomputeGranularity::Selective => RecomputePolicy::Selective(selective_modules(c)),
        RecomputeGranularity::None => RecomputePolicy::None,
    }
}

/// The modules selective recompute drops: `recompute_modules`, the attention core where
/// none are named (Megatron's default).
fn selective_modules(c: &Config) -> SelectiveModules {
    let modules = c.recompute_modules.as_deref().unwrap_or(&[]);
    if modules.is_empty() {
        return SelectiveModules { core_attn: true, ..SelectiveModules::NONE };
    }
    let has = |m| modules.contains(&m);
    SelectiveModules {
        core_attn: has(RecomputeModule::CoreAttn),
        mlp: has(RecomputeModule::Mlp),
        layernorm: has(RecomputeModule::Layernorm),
    }
}

/// Which part of each parameter data-parallel replica `replica` steps: its own under
/// `use_distributed_optimizer`, all of it otherwise.
pub fn optimizer_shard(c: &Config, replica: usize) -> OptimizerShard {
    OptimizerShard { replicas: c.data_parallel(), replica, distributed: c.use_distributed_optimizer }
}

/// Builds a chunk from initial or given parameters (Hugging Face tensors, as a checkpoint
/// holds them), with the moments of the parts `optimizer` steps.
pub fn build_chunk(
    dev: &dyn Device,
    c: &Config,
    layout: ChunkLayout,
    (shard, optimizer): (Shard, OptimizerShard),
    policy: RecomputePolicy,
    weights: Option<&[NamedTensor]>,
) -> anyhow::Result<ModelChunk> {
    let s = shape(c);
    let params = match weights {
        None => Parameters::init(dev, &s, &layout, c.seed, shard, optimizer),
        Some(named) => {
            let specs = chunk_param_specs(&s, &layout);
            let values = specs
                .iter()
                .map(|spec| {
                    let whole = gather(spec, named, |name| name.to_string())
                        .map_err(|e| user_error(format!("weights: {e}")))?;
                    let data = spec.shard_of(&s, shard, whole);
                    Ok(dev.from_host(&data, &spec.shard_shape(&s, shard), Category::Parameters))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Parameters::with_values(dev, &s, &layout, specs, values, optimizer)
        }
    };
    let mut chunk = ModelChunk::new(s, layout, shard, params, policy, dropout(c), c.seed);
    chunk.distribute_saved = c.distribute_saved_activations;
    Ok(chunk)
}

/// The values of `spec` from its Hugging Face parts in `named`, each found under
/// `name_of(part)` (a moment's name, for optimizer state) and stacked by rows.
pub fn gather(
    spec: &ParamSpec,
    named: &[NamedTensor],
    name_of: impl Fn(&str) -> String,
) -> Result<Vec<f32>, String> {
    let mut data = Vec::with_capacity(spec.elements());
    for (part, shape) in spec.hf_shapes() {
        let name = name_of(&part);
        let t = named
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| format!("no tensor `{name}` (needed by the config's model)"))?;
        if t.shape != shape {
            return Err(format!("`{name}` has shape {:?}, the config needs {shape:?}", t.shape));
        }
        data.extend_from_slice(&t.data);
    }
    Ok(data)
}

/// Turns what a chunk holds of a parameter (its shard's, under tensor parallelism; with
/// `true`, one data-parallel replica's part of that) into the whole parameter's.
pub type WholeParameter<'a> =
    dyn FnMut(&ParamSpec, &ModelShape, Vec<f32>, bool) -> anyhow::Result<Vec<f32>> + 'a;

/// The named tensors of `chunks` as Hugging Face tensors, each tagged with its place in the
/// model's order: (global index, part). `read` downloads values, exp_avg or exp_avg_sq, and
/// says whether it read a replica's part; `whole` makes each parameter whole.
pub fn named(
    chunks: &[ModelChunk],
    read: impl Fn(&Parameters, usize) -> (Vec<f32>, bool),
    whole: &mut WholeParameter,
) -> anyhow::Result<Vec<((usize, usize), NamedTensor)>> {
    let mut out = Vec::new();
    for chunk in chunks {
        let p = &chunk.params;
        for (i, spec) in p.specs.iter().enumerate() {
            let (data, replica_part) = read(p, i);
            let data = whole(spec, &chunk.shape, data, replica_part)?;
            for (k, (name, shape, part)) in spec.to_hf(&data).enumerate() {
                let t = NamedTensor { name: name.to_string(), shape, data: part.to_vec() };
                out.push(((spec.global_index, k), t));
            }
        }
    }
    Ok(out)
}

/// Named tensors gathered from every stage, in the model's order, each once (a tied output
/// layer's copy is identical to the embedding's).
pub fn in_global_order(mut tagged: Vec<((usize, usize), NamedTensor)>) -> Vec<NamedTensor> {
    tagged.sort_by_key(|(g, _)| *g);
    tagged.dedup_by_key(|(g, _)| *g);
    tagged.into_iter().map(|(_, t)| t).collect()
}

/// The schedule `cfg` asks for, generated and lowered; an impossible shape is a user error
/// naming `pipeline_schedule`.
pub fn lowered_schedule(cfg: &Config) -> anyhow::Result<(ScheduleKind, LoweredSchedule)> {
    let (p, v, m) = (cfg.pipeline_model_parallel_size, cfg.virtual_stages(), cfg.num_microbatches());
    let kind = cfg.pipeline_schedule;
    let schedule = generate(kind, p, v, m)
        .and_then(|s| lower(&s))
        .map_err(|e| cfg.key_error("pipeline_schedule", format!("{kind} with p={p}, v={v}, m={m}: {e}")))?;
    Ok((kind, schedule))
}

/// What each virtual stage holds: `num_layers_per_stage` when given, else balanced by cost.
pub fn chunk_layouts(cfg: &Config) -> anyhow::Result<Vec<ChunkLayout>> {
    let virtual_stages = cfg.pipeline_model_parallel_size * cfg.virtual_stages();
    let counts = match &cfg.num_layers_per_stage {
        Some(counts) => partition::explicit(cfg.num_layers, counts, virtual_stages)
            .map_err(|e| cfg.key_error("num_layers_per_stage", e))?,
        None => partition::balanced(&shape(cfg), virtual_stages)
            .map_err(|e| cfg.key_error("pipeline_model_parallel_size", e))?,
    };
    Ok(partition::layouts(&counts))
}

/// The layouts of stage `stage`'s chunks, placed as the schedule's [`schedules::Shape`] says
/// (interleaved: chunk c is virtual stage c*p + stage; V: stage and 2p-1-stage).
pub fn stage_layouts(cfg: &Config, stage: usize) -> anyhow::Result<Vec<ChunkLayout>> {
    let layouts = chunk_layouts(cfg)?;
    let shape = schedule_shape(cfg)?;
    Ok((0..shape.chunks).map(|c| layouts[shape.virtual_stage(stage, c)].clone()).collect())
}

/// The shape of the schedule `cfg` asks for; an impossible one is a user error naming
/// `pipeline_schedule`.
pub fn schedule_shape(cfg: &Config) -> anyhow::Result<schedules::Shape> {
    let (p, v, m) = (cfg.pipeline_model_parallel_size, cfg.virtual_stages(), cfg.num_microbatches());
    let kind = cfg.pipeline_schedule;
    kind.shape(p, v, m)
        .map_err(|e| cfg.key_error("pipeline_schedule", format!("{kind} with p={p}, v={v}, m={m}: {e}")))
}

/// One line for what a run's op times depend on beyond each stage's holdings: the model and
/// what each microbatch computes on. A measured trace carries it (`train --trace`), and
/// `simulate --measured` takes a trace only for a config of the same line.
pub fn describe_run(cfg: &Config) -> String {
    let s = shape(cfg);
    let sequence_parallel = if cfg.sequence_parallel { " (sequence parallel)" } else { "" };
    format!(
        "{} layers, hidden {}, {} heads over {} groups, ffn {}, seq {}, vocab {}, {}; micro batch {}, \
         tensor parallel {}{sequence_parallel}, {} {}",
        s.num_layers,
        s.hidden,
        s.heads,
        s.kv_heads,
        s.ffn,
        s.seq_len,
        s.vocab,
        s.describe_architecture(),
        s.micro_batch,
        cfg.tensor_model_parallel_size,
        cfg.device.name(),
        cfg.precision.name(),
    )
}

/// One line for a stage: what it holds and how it recomputes.
pub fn describe_stage(cfg: &Config, layouts: &[ChunkLayout], stage: usize) -> String {
    let chunks: Vec<String> = layouts
        .iter()
        .map(|l| {
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
    let offload = activation_offload(cfg, stage);
    let offload = if offload.is_none() { String::new() } else { format!("; offload {}", offload.describe()) };
    format!("{}; recompute {}{offload}", chunks.join(" | "), recompute_policy(cfg, stage).describe())
}

/// The activation offload of pipeline stage `stage`: the modules of
/// `fine_grained_activation_offloading` and full recompute's inputs under
/// `cpu_offloading_activations`, on each chunk's first `offload_num_layers_per_stage[stage]`
/// blocks, or all of them (the config was validated).
pub fn activation_offload(c: &Config, stage: usize) -> ActivationOffload {
    let modules = match c.fine_grained_activation_offloading {
        true => c.offload_modules.clone().unwrap_or_default(),
        false => Vec::new(),
    };
    let num_layers =
        c.offload_num_layers_per_stage.as_ref().map_or(ActivationOffload::EVERY_LAYER, |n| n[stage]);
    ActivationOffload { modules, recompute_inputs: c.cpu_offloading_activations, num_layers }
}

/// Each stage's predicted peaks of kept activations: on the device and in host memory.
pub struct ActivationPeaks {
    pub device: Vec<u64>,
    pub host: Vec<u64>,
}

/// Each stage's peak activation bytes as the simulator predicts them from the memory model
/// (stages::memory_model) for this schedule — what the device's ledger and its host ledger
/// must measure — under each stage's recompute and offload, or under neither
/// (`with_levers` false) to say what they saved.
pub fn predicted_activation_peaks(
    cfg: &Config,
    schedule: &LoweredSchedule,
    with_levers: bool,
) -> anyhow::Result<ActivationPeaks> {
    use schedules::{simulate, ChunkCosts, ChunkMemory, Link, SimInput};
    let s = shape(cfg);
    let p = cfg.pipeline_model_parallel_size;
    let mut costs = Vec::new();
    for stage in 0..p {
        let (policy, offload) = match with_levers {
            true => (recompute_policy(cfg, stage), activation_offload(cfg, stage)),
            false => (RecomputePolicy::None, ActivationOffload::NONE),
        };
        for layout in stage_layouts(cfg, stage)? {
            let tp = cfg.tensor_parallel();
            let stash = stages::memory_model::stash_bytes(&s, tp, &layout, &policy, &offload);
            let memory = ChunkMemory {
                activation_bytes: stash.device as u64,
                weight_grad_bytes: stages::memory_model::deferred_weight_grad_bytes(&s, tp, &layout) as u64,
                host_bytes: stash.host as u64,
                ..ChunkMemory::default()
            };
            costs.push(ChunkCosts {
                forward: 1.0,
                backward_input: 1.0,
                backward_weight: 1.0,
                recompute: 0.0,
                memory,
            });
        }
    }
    let input = SimInput::new(p, cfg.virtual_stages(), costs, vec![0; p], Link::INSTANT)
        .expect("costs for every (stage, chunk)");
    let report = simulate(schedule, &input).expect("a lowered schedule simulates");
    Ok(ActivationPeaks {
        device: report.stages.iter().map(|s| s.peak_memory).collect(),
        host: report.stages.iter().map(|s| s.peak_host).collect(),
    })
}
