//! From the config to the model: its shape, the chunks a stage holds, their recompute
//! policies, and the conversion of their parameters to and from named tensors.

use crate::checkpoint::{HfGpt2Config, NamedTensor};
use crate::config::Config;
use crate::error::user_error;
use kernels::{AttentionSaves, Category, DType, Device};
use schedules::{generate, lower, LoweredSchedule, ScheduleKind};
use stages::params::chunk_param_specs;
use stages::partition;
use stages::{
    ChunkLayout, DropoutProbs, FullMethod, GptShape, ModelChunk, Parameters, RecomputePolicy,
    SelectiveModules, TensorParallel,
};
use std::path::Path;

pub fn shape(c: &Config) -> GptShape {
    GptShape {
        num_layers: c.num_layers,
        hidden: c.hidden_size,
        heads: c.num_attention_heads,
        ffn: c.ffn_size(),
        seq_len: c.seq_length,
        max_positions: c.max_position_embeddings,
        vocab: c.vocab_size,
        micro_batch: c.micro_batch_size,
        attention_dropout: c.attention_dropout > 0.0,
        attention: match c.device.as_str() {
            "cuda" => AttentionSaves::cuda(c.hidden_size / c.num_attention_heads),
            _ => AttentionSaves::Probabilities,
        },
        // As the device the trainer builds stores them (rank.rs); the CPU stores f32 only,
        // and validation allows bf16 only on CUDA.
        activations: match (c.device.as_str(), c.precision.as_str()) {
            ("cuda", "bf16") => DType::Bf16,
            _ => DType::F32,
        },
    }
}

pub fn dropout(c: &Config) -> DropoutProbs {
    DropoutProbs { hidden: c.hidden_dropout, attention: c.attention_dropout }
}

/// The recompute policy of pipeline stage `stage` (the config was validated).
pub fn recompute_policy(c: &Config, stage: usize) -> RecomputePolicy {
    match c.recompute_granularity.as_deref() {
        Some("full") => {
            let method = if c.recompute_method.as_deref() == Some("block") {
                FullMethod::Block
            } else {
                FullMethod::Uniform
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
        Some("selective") => RecomputePolicy::Selective(
            SelectiveModules::from_names(c.recompute_modules.as_deref().unwrap_or(&[]))
                .expect("validated recompute_modules"),
        ),
        _ => RecomputePolicy::None,
    }
}

/// Builds a chunk from initial or given parameters.
pub fn build_chunk(
    dev: &dyn Device,
    c: &Config,
    layout: ChunkLayout,
    policy: RecomputePolicy,
    weights: Option<&[NamedTensor]>,
) -> anyhow::Result<ModelChunk> {
    let s = shape(c);
    let params = match weights {
        None => Parameters::init(dev, &s, &layout, c.seed),
        Some(named) => {
            let specs = chunk_param_specs(&s, &layout);
            let values = specs
                .iter()
                .map(|spec| {
                    let t = named.iter().find(|t| t.name == spec.name).ok_or_else(|| {
                        user_error(format!(
                            "weights: no tensor `{}` (needed by the config's model)",
                            spec.name
                        ))
                    })?;
                    if t.shape != spec.shape {
                        return Err(user_error(format!(
                            "weights: `{}` has shape {:?}, the config needs {:?}",
                            spec.name, t.shape, spec.shape
                        )));
                    }
                    Ok(dev.from_host(&t.data, &spec.shape, Category::Parameters))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Parameters::with_values(dev, &layout, specs, values)
        }
    };
    Ok(ModelChunk::new(s, layout, params, policy, dropout(c), c.seed))
}

/// The named tensors of `chunks` (on `dev`), tagged with their global index. `pick` chooses
/// values, exp_avg or exp_avg_sq.
pub fn named(
    chunks: &[ModelChunk],
    dev: &dyn Device,
    pick: impl Fn(&Parameters, usize) -> &kernels::Tensor,
) -> Vec<(usize, NamedTensor)> {
    let mut out = Vec::new();
    for chunk in chunks {
        let p = &chunk.params;
        for (i, spec) in p.specs.iter().enumerate() {
            let data = dev.to_host(pick(p, i));
            out.push((
                spec.global_index,
                NamedTensor { name: spec.name.clone(), shape: spec.shape.clone(), data },
            ));
        }
    }
    out
}

/// Named tensors gathered from every stage, in global order, each once (the tied LM head's
/// copy is identical to the embedding's).
pub fn in_global_order(mut tagged: Vec<(usize, NamedTensor)>) -> Vec<NamedTensor> {
    tagged.sort_by_key(|(g, _)| *g);
    tagged.dedup_by_key(|(g, _)| *g);
    tagged.into_iter().map(|(_, t)| t).collect()
}

/// The checkpoint's config.json for this model.
pub fn hf_config(c: &Config) -> HfGpt2Config {
    HfGpt2Config {
        vocab_size: c.vocab_size,
        n_positions: c.max_position_embeddings,
        n_embd: c.hidden_size,
        n_layer: c.num_layers,
        n_head: c.num_attention_heads,
        n_inner: c.ffn_hidden_size,
        resid_pdrop: c.hidden_dropout,
        embd_pdrop: c.hidden_dropout,
        attn_pdrop: c.attention_dropout,
    }
}

/// A config for running a checkpoint's model (eval): its shape, dropout off.
pub fn config_from_hf(h: &HfGpt2Config, seq_length: usize, micro_batch_size: usize) -> Config {
    Config {
        num_layers: h.n_layer,
        hidden_size: h.n_embd,
        num_attention_heads: h.n_head,
        ffn_hidden_size: h.n_inner,
        seq_length,
        max_position_embeddings: h.n_positions,
        vocab_size: h.vocab_size,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        micro_batch_size,
        global_batch_size: micro_batch_size,
        ..Config::default()
    }
}

fn key_error(path: &Path, key: &str, msg: impl std::fmt::Display) -> anyhow::Error {
    user_error(format!("{}: key `{key}`: {msg}", path.display()))
}

/// The schedule `cfg` asks for, generated and lowered; an impossible shape is a user error
/// naming `pipeline_schedule` (the config read from `path`).
pub fn lowered_schedule(cfg: &Config, path: &Path) -> anyhow::Result<(ScheduleKind, LoweredSchedule)> {
    let (p, v, m) = (cfg.pipeline_model_parallel_size, cfg.virtual_stages(), cfg.num_microbatches());
    let kind = cfg.schedule_kind().map_err(|e| key_error(path, "pipeline_schedule", e))?;
    let schedule = generate(kind, p, v, m).and_then(|s| lower(&s)).map_err(|e| {
        key_error(
            path,
            "pipeline_schedule",
            format!("{} with p={p}, v={v}, m={m}: {e}", cfg.pipeline_schedule),
        )
    })?;
    Ok((kind, schedule))
}

/// What each virtual stage holds: `num_layers_per_stage` when given, else balanced by cost.
pub fn chunk_layouts(cfg: &Config, path: &Path) -> anyhow::Result<Vec<ChunkLayout>> {
    let virtual_stages = cfg.pipeline_model_parallel_size * cfg.virtual_stages();
    let counts = match &cfg.num_layers_per_stage {
        Some(counts) => partition::explicit(cfg.num_layers, counts, virtual_stages)
            .map_err(|e| key_error(path, "num_layers_per_stage", e))?,
        None => partition::balanced(&shape(cfg), virtual_stages)
            .map_err(|e| key_error(path, "pipeline_model_parallel_size", e))?,
    };
    Ok(partition::layouts(&counts))
}

/// The layouts of stage `stage`'s chunks, placed as the schedule's [`schedules::Shape`] says
/// (interleaved: chunk c is virtual stage c*p + stage; V: stage and 2p-1-stage).
pub fn stage_layouts(cfg: &Config, path: &Path, stage: usize) -> anyhow::Result<Vec<ChunkLayout>> {
    let layouts = chunk_layouts(cfg, path)?;
    let shape = schedule_shape(cfg, path)?;
    Ok((0..shape.chunks).map(|c| layouts[shape.virtual_stage(stage, c)].clone()).collect())
}

/// The shape of the schedule `cfg` asks for; an impossible one is a user error naming
/// `pipeline_schedule`.
pub fn schedule_shape(cfg: &Config, path: &Path) -> anyhow::Result<schedules::Shape> {
    let (p, v, m) = (cfg.pipeline_model_parallel_size, cfg.virtual_stages(), cfg.num_microbatches());
    let kind = cfg.schedule_kind().map_err(|e| key_error(path, "pipeline_schedule", e))?;
    kind.shape(p, v, m)
        .map_err(|e| key_error(path, "pipeline_schedule", format!("{kind} with p={p}, v={v}, m={m}: {e}")))
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
    format!("{}; recompute {}", chunks.join(" | "), recompute_policy(cfg, stage).describe())
}

/// Each stage's peak activation bytes as the simulator predicts them from the memory model
/// (stages::memory_model) for this schedule — what the ledger must measure — under each
/// stage's recompute policy, or under none (`with_recompute` false) to say what it saved.
pub fn predicted_activation_peaks(
    cfg: &Config,
    path: &Path,
    schedule: &LoweredSchedule,
    with_recompute: bool,
) -> anyhow::Result<Vec<u64>> {
    use schedules::{simulate, ChunkCosts, ChunkMemory, Link, SimInput};
    let s = shape(cfg);
    let p = cfg.pipeline_model_parallel_size;
    let mut costs = Vec::new();
    for stage in 0..p {
        let policy = if with_recompute { recompute_policy(cfg, stage) } else { RecomputePolicy::None };
        for layout in stage_layouts(cfg, path, stage)? {
            costs.push(ChunkCosts {
                forward: 1.0,
                backward_input: 1.0,
                backward_weight: 1.0,
                recompute: 0.0,
                memory: ChunkMemory {
                    activation_bytes: stages::memory_model::stash_bytes(
                        &s,
                        TensorParallel::NONE,
                        &layout,
                        &policy,
                    ) as u64,
                    weight_grad_bytes: stages::memory_model::deferred_weight_grad_bytes(
                        &s,
                        TensorParallel::NONE,
                        &layout,
                    ) as u64,
                    ..ChunkMemory::default()
                },
            });
        }
    }
    let input = SimInput::new(p, cfg.virtual_stages(), costs, vec![0; p], Link::INSTANT)
        .expect("costs for every (stage, chunk)");
    let report = simulate(schedule, &input).expect("a lowered schedule simulates");
    Ok(report.stages.iter().map(|s| s.peak_memory).collect())
}
