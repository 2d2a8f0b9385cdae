//! `pipetrain train`: the training loop around the pipeline stages.

mod lr;
#[cfg(test)]
mod memory_truth;
mod metrics;
pub mod model;
pub mod pipeline;
pub mod summary;
mod timeline;

use crate::checkpoint::{self, NamedTensor, TrainerState};
use crate::cli::TrainArgs;
use crate::config::{self, Config};
use crate::data::TokenFile;
use crate::error::{user_error, Interrupted};
use kernels::cpu::CpuDevice;
use pipeline::Pipeline;
use stages::runtime::FaultInjection;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The MFU denominator on a GPU unless `--peak-flops` says otherwise: H100 SXM dense bf16.
const H100_DENSE_BF16_FLOPS: f64 = 989e12;

pub fn run(args: &TrainArgs, overrides: &[(String, String)]) -> anyhow::Result<()> {
    let cfg = config::load(&args.config, overrides)?;
    if cfg.tensor_model_parallel_size > 1 {
        return Err(user_error(format!(
            "{}: key `tensor_model_parallel_size`: {}: the trainer runs 1; tensor parallelism is simulated only (pipetrain simulate)",
            args.config.display(),
            cfg.tensor_model_parallel_size
        )));
    }
    let train_path = cfg.train_data_path.clone().ok_or_else(|| {
        user_error(format!("{}: key `train_data_path` is required for training", args.config.display()))
    })?;
    let train_data = open_data(&train_path, &cfg)?;
    let valid_data = cfg.valid_data_path.as_deref().map(|p| open_data(p, &cfg)).transpose()?;

    let resume_from = prepare_run_dir(&args.run_dir, args.resume)?;
    let loaded = match (&resume_from, &cfg.load) {
        (Some(dir), _) => Some(checkpoint::load_checkpoint(dir)?),
        (None, Some(load)) => Some(checkpoint::load_checkpoint(load)?),
        (None, None) => None,
    };
    if let Some(ck) = &loaded {
        checkpoint::check_shapes(
            &ck.dir.join("model.safetensors"),
            &checkpoint::expected_shapes(&model::hf_config(&cfg)),
            &ck.model,
        )?;
    }
    let (weights, trainer) = match loaded {
        Some(ck) if resume_from.is_some() => (Some(ck.model), ck.trainer),
        Some(ck) => (Some(ck.model), None),
        None => (None, None),
    };
    let (state, optimizer) = match trainer {
        Some(t) => (Some(t.state), Some(t.optimizer)),
        None => (None, None),
    };
    let start_step = state.as_ref().map_or(0, |s| s.step as usize);

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut pipeline = Pipeline::build(&cfg, &args.config, weights.as_deref(), threads)?;
    if let Some(opt) = &optimizer {
        restore_optimizer(&mut pipeline, opt)?;
    }
    let fault = fault_injection()?;
    std::fs::write(args.run_dir.join("config.yaml"), serde_norway::to_string(&cfg)?)?;

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // Ctrl-C asks for a stop at the next step boundary, with a checkpoint.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }

    let shape = model::shape(&cfg);
    let microbatches = cfg.num_microbatches();
    let tokens_per_step = (cfg.global_batch_size * cfg.seq_length) as f64;
    let peak_flops = match (args.peak_flops, cfg.device.as_str()) {
        (Some(peak), _) => peak,
        (None, "cuda") => H100_DENSE_BF16_FLOPS,
        (None, _) => kernels::cpu::measure_matmul_peak(&CpuDevice::new(threads)),
    };
    let mut metrics =
        metrics::Metrics::open(&args.run_dir, start_step, cfg.train_iters, args.quiet, cfg.log_interval)?;
    let mut state = state.unwrap_or_else(|| TrainerState {
        step: 0,
        seed: cfg.seed,
        data_position: 0,
        lr: 0.0,
        config_yaml: serde_norway::to_string(&cfg).unwrap_or_default(),
        train_losses: vec![],
        val_losses: vec![],
    });
    for s in &pipeline.stages {
        s.device.ledger().reset_peaks();
    }
    let mut timeline = timeline::Timeline::new(pipeline.stages.len(), cfg.virtual_stages());
    let mut trained_steps = 0usize;
    let mut train_time = 0.0f64;
    let mut last_saved = start_step;
    let mut interrupted = false;
    for step in start_step + 1..=cfg.train_iters {
        let t0 = Instant::now();
        let outcome = pipeline.train_step(&cfg, &train_data, step, fault)?;
        let lr = lr::learning_rate(&cfg, step);
        let optimizer_s = pipeline.optimizer_step(&cfg, lr, step, outcome.grad_norm);
        let step_s = t0.elapsed().as_secs_f64();
        train_time += step_s;
        trained_steps += 1;
        timeline.record(step, step_s, &outcome.reports, &outcome.post_schedule_s(&optimizer_s));
        let mut record = metrics::step_record(
            step,
            outcome.loss,
            lr,
            outcome.grad_norm,
            tokens_per_step / step_s,
            step_s * 1e3,
        );
        state.step = step as u64;
        state.data_position = step as u64;
        state.lr = lr as f64;
        state.train_losses.push((step as u64, outcome.loss as f32));
        if let Some(valid) = &valid_data {
            if cfg.eval_interval > 0 && (step.is_multiple_of(cfg.eval_interval) || step == cfg.train_iters) {
                let v = pipeline.evaluate(&cfg, valid, cfg.eval_iters.max(1))?;
                record["val_loss"] = v.into();
                state.val_losses.push((step as u64, v as f32));
            }
        }
        metrics.step(record)?;
        interrupted = stop.load(Ordering::SeqCst);
        if (cfg.save_interval > 0 && step.is_multiple_of(cfg.save_interval))
            || step == cfg.train_iters
            || interrupted
        {
            save(&args.run_dir, &cfg, &pipeline, &state)?;
            last_saved = step;
        }
        if interrupted {
            metrics.println(&format!("interrupted: stopped after step {step}, checkpoint saved"));
            break;
        }
    }
    metrics.finish();
    if let Some(path) = &args.trace {
        timeline.write_trace(path)?;
    }
    let report = summary::Summary {
        steps: trained_steps,
        final_loss: state.train_losses.last().map(|x| x.1 as f64),
        final_val_loss: state.val_losses.last().map(|x| x.1 as f64),
        tokens_per_s: tokens_per_step * trained_steps as f64 / train_time.max(1e-9),
        model_flops_per_step: stages::flops::train_step_flops(&shape, microbatches),
        peak_flops,
        elapsed_s: train_time,
        memory: pipeline.stages.iter().map(|s| s.device.ledger().snapshot()).collect(),
        stage_descriptions: pipeline.describe_stages(),
        predicted_peaks: crate::simulate::predicted_stage_peaks(&cfg, &args.config)?,
        predicted_activations: pipeline.predicted_activation_peaks(),
        predicted_without_recompute: pipeline.predicted_activation_peaks_without_recompute(),
        recompute_s: pipeline.recompute_seconds(),
        max_in_flight: timeline.max_in_flight.clone(),
        bubble: timeline.bubble_rates(),
        last_checkpoint_step: last_saved,
    };
    report.print();
    report.write(&args.run_dir)?;
    if interrupted {
        return Err(anyhow::Error::new(Interrupted(format!(
            "interrupted: checkpoint of step {last_saved} saved in {}; continue with --resume",
            args.run_dir.display()
        ))));
    }
    Ok(())
}

/// `PIPETRAIN_INJECT_FAULT=STAGE:STEP[:panic]` makes a stage fail at a step: how the tests
/// check that one failing stage stops the whole run cleanly.
fn fault_injection() -> anyhow::Result<Option<FaultInjection>> {
    let Ok(spec) = std::env::var("PIPETRAIN_INJECT_FAULT") else { return Ok(None) };
    let parts: Vec<&str> = spec.split(':').collect();
    let parse = |s: &str| s.parse::<u32>().ok();
    match parts.as_slice() {
        [stage, step] | [stage, step, "panic"] if parse(stage).is_some() && parse(step).is_some() => {
            Ok(Some(FaultInjection {
                stage: parse(stage).unwrap_or(0) as usize,
                step: parse(step).unwrap_or(0),
                panic: parts.len() == 3,
            }))
        }
        _ => {
            Err(user_error(format!("PIPETRAIN_INJECT_FAULT={spec}: expected STAGE:STEP or STAGE:STEP:panic")))
        }
    }
}

fn open_data(path: &Path, cfg: &Config) -> anyhow::Result<TokenFile> {
    let f = TokenFile::open(path)?;
    f.check_seq_len(cfg.seq_length)?;
    f.check_vocab(cfg.vocab_size)?;
    Ok(f)
}

/// Creates the run dir; with `resume`, returns the checkpoint to continue from. A run dir
/// that already holds a run is never overwritten.
fn prepare_run_dir(run_dir: &Path, resume: bool) -> anyhow::Result<Option<std::path::PathBuf>> {
    let has_run = run_dir.join("metrics.jsonl").exists() || run_dir.join("checkpoints").exists();
    if resume {
        if !has_run {
            return Err(user_error(format!(
                "{}: --resume, but this run dir holds no run",
                run_dir.display()
            )));
        }
        return Ok(Some(run_dir.to_path_buf()));
    }
    if has_run {
        return Err(user_error(format!(
            "{}: already holds a run; pass --resume to continue it or choose another --run-dir",
            run_dir.display()
        )));
    }
    std::fs::create_dir_all(run_dir)
        .map_err(|e| user_error(format!("{}: cannot create run dir: {e}", run_dir.display())))?;
    Ok(None)
}

fn save(run_dir: &Path, cfg: &Config, pipeline: &Pipeline, state: &TrainerState) -> anyhow::Result<()> {
    let model = pipeline.named(|p, i| &p.values[i]);
    let renamed = |tensors: Vec<NamedTensor>, rename: fn(&str) -> String| {
        tensors.into_iter().map(|t| NamedTensor { name: rename(&t.name), ..t }).collect::<Vec<_>>()
    };
    let mut optimizer = renamed(pipeline.named(|p, i| &p.exp_avg[i]), checkpoint::exp_avg_name);
    optimizer.extend(renamed(pipeline.named(|p, i| &p.exp_avg_sq[i]), checkpoint::exp_avg_sq_name));
    checkpoint::save_checkpoint(run_dir, &model::hf_config(cfg), &model, state, &optimizer)?;
    Ok(())
}

fn restore_optimizer(pipeline: &mut Pipeline, optimizer: &[NamedTensor]) -> anyhow::Result<()> {
    for stage in &mut pipeline.stages {
        let dev = stage.device.clone();
        for chunk in &mut stage.chunks {
            let p = &mut chunk.params;
            for i in 0..p.specs.len() {
                for (name, target) in [
                    (checkpoint::exp_avg_name(&p.specs[i].name), &mut p.exp_avg[i]),
                    (checkpoint::exp_avg_sq_name(&p.specs[i].name), &mut p.exp_avg_sq[i]),
                ] {
                    let t = optimizer
                        .iter()
                        .find(|t| t.name == name)
                        .ok_or_else(|| user_error(format!("trainer state: no tensor `{name}`")))?;
                    let host = dev.from_host(&t.data, target.shape(), kernels::Category::Workspace);
                    dev.copy(target, &host);
                }
            }
        }
    }
    Ok(())
}
