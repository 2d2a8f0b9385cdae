//! `pipetrain bench`: benchmarks that print figures, comparing variants of one config
//! measured in one process, round-robin step by step so that a noisy machine's drift falls
//! on every variant alike.
//!
//! - `recompute`: step time of each recompute policy relative to none, and the activation
//!   memory each keeps (measured by the ledger, and as the memory model predicts).
//! - `pipeline`: tokens/s of p = 1 against p = 2 (and more) on the same cores.
//! - `gpu`: the GPU path against the CPU and against its predictions (gpu.rs).

mod gpu;

use crate::cli::BenchArgs;
use crate::config::{self, Config};
use crate::data::TokenFile;
use crate::error::user_error;
use crate::train::model;
use crate::train::rank::{Local, Rank};
use crate::train::summary::human_bytes;
use kernels::Category;
use stages::dist::{threads, Topology};
use std::path::Path;
use std::time::Instant;

struct Variant {
    name: String,
    cfg: Config,
    /// Its p stages, each a rank of the threads backend.
    ranks: Vec<Rank>,
    predicted_activations: u64,
    step_s: Vec<f64>,
}

impl Variant {
    fn build(name: String, cfg: Config, path: &Path, threads: usize) -> anyhow::Result<Variant> {
        let (_, schedule) = model::lowered_schedule(&cfg, path)?;
        let placement = schedule.schedule().shape().placement;
        let topology = Topology { pipeline: cfg.pipeline_model_parallel_size, data: 1, placement };
        let predicted = model::predicted_activation_peaks(&cfg, path, &schedule, true)?;
        let ranks = threads::world(topology, schedule.required_capacity().get(), cfg.distributed_timeout())
            .into_iter()
            .enumerate()
            .map(|(id, (t, c))| {
                Rank::build(
                    &cfg,
                    path,
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
            predicted_activations: predicted.into_iter().max().unwrap_or(0),
            step_s: Vec::new(),
        })
    }

    /// One training step, every stage on its own thread; the step's mean loss.
    fn step(&mut self, data: &TokenFile, step: usize) -> anyhow::Result<f64> {
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
    let base = config::load(&args.config, overrides)?;
    if args.what == "gpu" {
        return gpu::run(args, &base);
    }
    let data = training_data(&base, &args.config)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let configs = match args.what.as_str() {
        "recompute" => recompute_variants(&base),
        "pipeline" => pipeline_variants(&base, threads),
        other => {
            return Err(user_error(format!(
                "command line: bench {other}: expected recompute, pipeline or gpu"
            )))
        }
    };
    let configs = match &args.variants {
        Some(wanted) => only(configs, wanted)?,
        None => configs,
    };
    let mut variants = Vec::new();
    for (name, cfg) in configs {
        variants.push(Variant::build(name, cfg, &args.config, threads)?);
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
                }
            }
        }
    }
    print_table(&variants, &base);
    Ok(())
}

/// The config's training tokens, checked against its shape.
fn training_data(cfg: &Config, path: &Path) -> anyhow::Result<TokenFile> {
    let data_path = cfg.train_data_path.clone().ok_or_else(|| {
        user_error(format!("{}: key `train_data_path` is required for a benchmark", path.display()))
    })?;
    let data = TokenFile::open(&data_path)?;
    data.check_seq_len(cfg.seq_length)?;
    data.check_vocab(cfg.vocab_size)?;
    Ok(data)
}

fn recompute_variants(base: &Config) -> Vec<(String, Config)> {
    let selective = |modules: &[&str]| Config {
        recompute_granularity: Some("selective".into()),
        recompute_modules: Some(modules.iter().map(|m| m.to_string()).collect()),
        ..base.clone()
    };
    let full = |method: &str, n: usize| Config {
        recompute_granularity: Some("full".into()),
        recompute_method: Some(method.into()),
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
        ("none".into(), none),
        ("selective core_attn".into(), selective(&["core_attn"])),
        ("selective mlp".into(), selective(&["mlp"])),
        ("selective layernorm".into(), selective(&["layernorm"])),
        ("selective all".into(), selective(&["core_attn", "mlp", "layernorm"])),
        ("full uniform N=1".into(), full("uniform", 1)),
        ("full uniform N=2".into(), full("uniform", 2)),
        ("full block N=1".into(), full("block", 1)),
    ]
}

/// The variants named in `wanted`, in the bench's order; an unknown name is a user error.
fn only(all: Vec<(String, Config)>, wanted: &[String]) -> anyhow::Result<Vec<(String, Config)>> {
    if let Some(unknown) = wanted.iter().find(|w| !all.iter().any(|(name, _)| name == *w)) {
        let names: Vec<&str> = all.iter().map(|(name, _)| name.as_str()).collect();
        return Err(user_error(format!(
            "--variants: no variant `{unknown}`; expected some of {}",
            names.join(", ")
        )));
    }
    Ok(all.into_iter().filter(|(name, _)| wanted.contains(name)).collect())
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

fn print_table(variants: &[Variant], base: &Config) {
    let tokens = (base.global_batch_size * base.seq_length) as f64;
    let reference = median(&variants[0].step_s);
    let reference_act: usize = activation_peak(&variants[0]);
    println!(
        "{:<22} {:>10} {:>9} {:>10} {:>14} {:>14} {:>8}",
        "variant", "step s", "vs first", "tokens/s", "activations", "predicted", "saved"
    );
    for v in variants {
        let step = median(&v.step_s);
        let act = activation_peak(v);
        let predicted = v.predicted_activations;
        println!(
            "{:<22} {:>10.3} {:>+8.1}% {:>10.0} {:>14} {:>14} {:>7.1}%",
            v.name,
            step,
            100.0 * (step / reference - 1.0),
            tokens / step,
            human_bytes(act),
            human_bytes(predicted as usize),
            100.0 * (1.0 - act as f64 / reference_act as f64),
        );
    }
    println!("(median step of each variant; activations: the largest per-stage peak the ledger measured)");
}

/// The largest per-stage activation peak the ledger measured.
fn activation_peak(v: &Variant) -> usize {
    v.ranks.iter().map(|r| r.stage.device.ledger().peak(Category::Activations)).max().unwrap_or(0)
}
