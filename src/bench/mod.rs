//! `pipetrain bench`: benchmarks that print figures, comparing variants of one config
//! measured in one process, round-robin step by step so that a noisy machine's drift falls
//! on every variant alike.
//!
//! - `recompute`: step time of each recompute policy relative to none, and the activation
//!   memory each keeps (measured by the ledger, and as the memory model predicts).
//! - `pipeline`: tokens/s of p = 1 against p = 2 (and more) on the same cores.
//! - `family`: the config's model as GPT-2 and as a Llama of the same width, for tokens/s
//!   and MFU side by side.
//! - `gpu`: the GPU path against the CPU and against its predictions (gpu.rs).

mod gpu;

use crate::cli::BenchArgs;
use crate::config::{self, Config, Named, RecomputeGranularity, RecomputeMethod, RecomputeModule};
use crate::data::TokenData;
use crate::error::user_error;
use crate::plan;
use crate::train::rank::{Local, Rank};
use crate::train::summary::human_bytes;
use kernels::Category;
use stages::dist::{threads, Topology};
use stages::OffloadModule;
use std::time::Instant;

struct Variant {
    name: String,
    cfg: Config,
    /// Its p stages, each a rank of the threads backend.
    ranks: Vec<Rank>,
    predicted_activations: u64,
    /// The largest per-stage peak of offloaded activations the memory model predicts.
    predicted_host: u64,
    step_s: Vec<f64>,
}

impl Variant {
    fn build(name: String, cfg: Config, threads: usize) -> anyhow::Result<Variant> {
        let (_, schedule) = plan::lowered_schedule(&cfg)?;
        let placement = schedule.schedule().shape().placement;
        let topology = Topology { tensor: 1, pipeline: cfg.pipeline_model_parallel_size, data: 1, placement };
        let predicted = plan::predicted_activation_peaks(&cfg, &schedule, true)?;
        let ranks = threads::world(topology, schedule.required_capacity().get(), cfg.distributed_timeout())
            .into_iter()
            .enumerate()
            .map(|(id, (t, c))| {
                Rank::build(
                    &cfg,
                    None,
                    Local { cpu_threads: threads / topology.pipeline, sole_rank: topology.pipeline == 1 },
                    id,
                    topology,
                    Box::new(t),
                    Box::new(c),
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Variant {
            name,
            cfg,
            ranks,
            predicted_activations: predicted.device.into_iter().max().unwrap_or(0),
            predicted_host: predicted.host.into_iter().max().unwrap_or(0),
            step_s: Vec::new(),
        })
    }

    /// One training step, every stage on its own thread; the step's mean loss.
    fn step(&mut self, data: &TokenData, step: usize) -> anyhow::Result<f64> {
        let cfg = &self.cfg;
        let losses = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .ranks
                .iter_mut()
                .map(|r| {
                    scope.spawn(move || r.train_step(cfg, data, step, cfg.lr, None).map(|o| o.report.losses))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        Ok(crate::train::mean_loss(losses.concat()))
    }
}

pub fn run(args: &BenchArgs, overrides: &[(String, String)]) -> anyhow::Result<()> {
    if args.steps == 0 {
        return Err(user_error("command line: --steps 0: a benchmark times 1 or more steps"));
    }
    let base = config::load(&args.config, overrides)?;
    match args.what.as_str() {
        "gpu" => return gpu::run(args, &base),
        "attention" => return gpu::run_attention(&base),
        _ => {}
    }
    let data = training_data(&base)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let configs = match args.what.as_str() {
        "recompute" => recompute_variants(&base),
        "pipeline" => pipeline_variants(&base, threads),
        "family" => family_variants(&base),
        other => {
            return Err(user_error(format!(
                "command line: bench {other}: expected recompute, pipeline, family, gpu or attention"
            )))
        }
    };
    let configs = match &args.variants {
        Some(wanted) => only(configs, wanted)?,
        None => configs,
    };
    let mut variants = Vec::new();
    for (name, cfg) in configs {
        variants.push(Variant::build(name, cfg, threads)?);
    }
    eprintln!("{} variants x ({} warm-up + {} timed) steps, round-robin", variants.len(), 1, args.steps);
    for round in 0..=args.steps {
        for v in &mut variants {
            let t0 = Instant::now();
            v.step(&data, round + 1)?;
            if round > 0 {
                v.step_s.push(t0.elapsed().as_secs_f64());
            } else {
                for r in &v.ranks {
                    r.stage.device.ledger().reset_peaks();
                    r.stage.device.host_ledger().reset_peaks();
                }
            }
        }
    }
    let peak = kernels::cpu::measure_matmul_peak(&kernels::cpu::CpuDevice::new(threads));
    print_table(&variants, &base, peak);
    Ok(())
}

/// The config's training tokens, checked against its shape.
fn training_data(cfg: &Config) -> anyhow::Result<TokenData> {
    let data_path = cfg
        .train_data_path
        .clone()
        .ok_or_else(|| cfg.key_error("train_data_path", "a benchmark needs one"))?;
    TokenData::open(&data_path, cfg.seq_length, cfg.vocab_size)
}

fn recompute_variants(base: &Config) -> Vec<(String, Config)> {
    let offload = |cfg: &Config, module| Config {
        fine_grained_activation_offloading: true,
        offload_modules: Some(vec![module]),
        ..cfg.clone()
    };
    let selective = |modules: &[RecomputeModule]| Config {
        recompute_granularity: Some(RecomputeGranularity::Selective),
        recompute_modules: Some(modules.to_vec()),
        ..base.clone()
    };
    let full = |method, n: usize| Config {
        recompute_granularity: Some(RecomputeGranularity::Full),
        recompute_method: Some(method),
        recompute_num_layers: Some(n),
        ..base.clone()
    };
    let none = Config {
        recompute_granularity: None,
        recompute_method: None,
        recompute_num_layers: None,
        recompute_modules: None,
        ..base.clone()
    };
    vec![
        ("none".into(), none.clone()),
        ("selective core_attn".into(), selective(&[RecomputeModule::CoreAttn])),
        ("selective mlp".into(), selective(&[RecomputeModule::Mlp])),
        ("selective layernorm".into(), selective(&[RecomputeModule::Layernorm])),
        ("selective all".into(), selective(RecomputeModule::ALL)),
        ("full uniform N=1".into(), full(RecomputeMethod::Uniform, 1)),
        ("full uniform N=2".into(), full(RecomputeMethod::Uniform, 2)),
        ("full block N=1".into(), full(RecomputeMethod::Block, 1)),
        ("offload core_attn".into(), offload(&none, OffloadModule::CoreAttn)),
        (
            "offload core_attn+sel".into(),
            offload(&selective(&[RecomputeModule::CoreAttn]), OffloadModule::CoreAttn),
        ),
        (
            "full N=1 offload input".into(),
            Config { cpu_offloading_activations: true, ..full(RecomputeMethod::Uniform, 1) },
        ),
    ]
}

/// The variants named in `wanted`, in the bench's order; an unknown name is a user error.
fn only(all: Vec<(String, Config)>, wanted: &[String]) -> anyhow::Result<Vec<(String, Config)>> {
    if let Some(unknown) = wanted.iter().find(|w| !all.iter().any(|(name, _)| name == *w)) {
        let names: Vec<&str> = all.iter().map(|(name, _)| name.as_str()).collect();
        return Err(user_error(format!(
            "command line: --variants: no variant `{unknown}`; expected some of {}",
            names.join(", ")
        )));
    }
    Ok(all.into_iter().filter(|(name, _)| wanted.contains(name)).collect())
}

/// The config's model with GPT-2's architecture, and with the Llama family's at the same
/// width, heads and layers: RMSNorm, rotary positions, SwiGLU of Llama's 8/3 x hidden
/// (rounded up to a multiple of 64), a key/value group per 4 heads where they divide, no
/// biases, an untied output layer.
fn family_variants(base: &Config) -> Vec<(String, Config)> {
    let gpt2 = Config {
        normalization: stages::Norm::LayerNorm,
        position_embedding_type: config::PositionEmbeddingType::LearnedAbsolute,
        swiglu: false,
        group_query_attention: false,
        num_query_groups: None,
        untie_embeddings_and_output_weights: false,
        disable_bias_linear: false,
        ..base.clone()
    };
    let heads = base.num_attention_heads;
    let groups = if heads.is_multiple_of(4) { heads / 4 } else { heads };
    let llama = Config {
        normalization: stages::Norm::RmsNorm,
        position_embedding_type: config::PositionEmbeddingType::Rope,
        swiglu: true,
        ffn_hidden_size: Some((8 * base.hidden_size).div_ceil(3).next_multiple_of(64)),
        group_query_attention: groups != heads,
        num_query_groups: (groups != heads).then_some(groups),
        untie_embeddings_and_output_weights: true,
        disable_bias_linear: true,
        ..base.clone()
    };
    vec![("gpt2".into(), gpt2), ("llama".into(), llama)]
}

fn pipeline_variants(base: &Config, threads: usize) -> Vec<(String, Config)> {
    let mut out = vec![("p=1".to_string(), Config { pipeline_model_parallel_size: 1, ..base.clone() })];
    for p in (2..=threads.max(2)).filter(|p| base.num_layers + 1 >= *p) {
        out.push((format!("p={p}"), Config { pipeline_model_parallel_size: p, ..base.clone() }));
    }
    out
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// The table, each variant's MFU against `peak`, the CPU's matmul FLOP/s measured here.
fn print_table(variants: &[Variant], base: &Config, peak: f64) {
    let tokens = (base.global_batch_size * base.seq_length) as f64;
    let reference = median(&variants[0].step_s);
    let reference_act: usize = activation_peak(&variants[0]);
    println!(
        "{:<22} {:>10} {:>9} {:>10} {:>6} {:>14} {:>14} {:>8} {:>12} {:>12}",
        "variant",
        "step s",
        "vs first",
        "tokens/s",
        "MFU",
        "activations",
        "predicted",
        "saved",
        "host",
        "predicted"
    );
    for v in variants {
        let step = median(&v.step_s);
        let act = activation_peak(v);
        let predicted = v.predicted_activations;
        let flops = stages::flops::train_step_flops(&plan::shape(&v.cfg), v.cfg.num_microbatches());
        println!(
            "{:<22} {:>10.3} {:>+8.1}% {:>10.0} {:>5.1}% {:>14} {:>14} {:>7.1}% {:>12} {:>12}",
            v.name,
            step,
            100.0 * (step / reference - 1.0),
            tokens / step,
            100.0 * flops / step / peak,
            human_bytes(act),
            human_bytes(predicted as usize),
            100.0 * (1.0 - act as f64 / reference_act as f64),
            human_bytes(host_peak(v)),
            human_bytes(v.predicted_host as usize),
        );
    }
    println!(
        "(median step of each variant; MFU: model FLOPs per step over the CPU's matmul peak, {:.1} GFLOP/s measured \
         here; activations: the largest per-stage peak the ledger measured; host: the same of offloaded activations)",
        peak / 1e9
    );
}

/// The largest per-stage peak of offloaded activations the host ledger measured.
fn host_peak(v: &Variant) -> usize {
    v.ranks.iter().map(|r| r.stage.device.host_ledger().peak_bytes()).max().unwrap_or(0)
}

/// The largest per-stage activation peak the ledger measured.
fn activation_peak(v: &Variant) -> usize {
    v.ranks.iter().map(|r| r.stage.device.ledger().peak(Category::Activations)).max().unwrap_or(0)
}
