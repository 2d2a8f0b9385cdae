//! `pipetrain train`: the training loop around the pipeline stages.

mod lr;
mod metrics;
pub mod model;
mod summary;

use crate::checkpoint::{self, NamedTensor, TrainerState};
use crate::cli::TrainArgs;
use crate::config::{self, Config};
use crate::data::TokenFile;
use crate::error::user_error;
use kernels::cpu::CpuDevice;
use kernels::Device;
use stages::stage::{clip_factor, global_grad_norm, OptimizerStep, Stage};
use stages::{ChunkLayout, Microbatch};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub fn run(args: &TrainArgs, overrides: &[(String, String)]) -> anyhow::Result<()> {
    let cfg = config::load(&args.config, overrides)?;
    if cfg.device == "cuda" {
        return Err(user_error(format!(
            "{}: key `device`: cuda needs a build with `--features cuda` and a GPU; use device: cpu",
            args.config.display()
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
            &model::expected_shapes(&cfg),
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
    let device: Arc<dyn Device> = Arc::new(CpuDevice::new(threads));
    let mut stage = single_stage(&cfg, device.clone(), weights.as_deref())?;
    if let Some(opt) = &optimizer {
        restore_optimizer(&mut stage, opt)?;
    }
    std::fs::write(args.run_dir.join("config.yaml"), serde_norway::to_string(&cfg)?)?;

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second Ctrl-C while saving is ignored: the checkpoint write is atomic anyway.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }

    let shape = model::shape(&cfg);
    let microbatches = cfg.num_microbatches();
    let tokens_per_step = (cfg.global_batch_size * cfg.seq_length) as f64;
    let peak_flops = kernels::cpu::measure_matmul_peak(&CpuDevice::new(threads));
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
    device.ledger().reset_peaks();
    let run_start = Instant::now();
    let mut trained_steps = 0usize;
    let mut last_saved = start_step;
    let mut interrupted = false;
    for step in start_step + 1..=cfg.train_iters {
        let t0 = Instant::now();
        let loss = train_step(&mut stage, &cfg, &train_data, step, microbatches)?;
        let norm = global_grad_norm(stage.grad_sum_squares());
        let lr = lr::learning_rate(&cfg, step);
        stage.optimizer_step(OptimizerStep {
            lr,
            beta1: cfg.adam_beta1,
            beta2: cfg.adam_beta2,
            eps: cfg.adam_eps,
            weight_decay: cfg.weight_decay,
            step: step as u32,
            grad_scale: clip_factor(norm, cfg.clip_grad),
        });
        let step_s = t0.elapsed().as_secs_f64();
        trained_steps += 1;
        let mut record = metrics::step_record(step, loss, lr, norm, tokens_per_step / step_s, step_s * 1e3);
        state.step = step as u64;
        state.data_position = step as u64;
        state.lr = lr as f64;
        state.train_losses.push((step as u64, loss as f32));
        if let Some(valid) = &valid_data {
            if cfg.eval_interval > 0 && (step % cfg.eval_interval == 0 || step == cfg.train_iters) {
                let v = evaluate(&mut stage, &cfg, valid)?;
                record["val_loss"] = v.into();
                state.val_losses.push((step as u64, v as f32));
            }
        }
        metrics.step(record)?;
        interrupted = stop.load(Ordering::SeqCst);
        if (cfg.save_interval > 0 && step % cfg.save_interval == 0) || step == cfg.train_iters || interrupted
        {
            save(&args.run_dir, &cfg, &stage, &state)?;
            last_saved = step;
        }
        if interrupted {
            metrics.println(&format!("interrupted: stopped after step {step}, checkpoint saved"));
            break;
        }
    }
    metrics.finish();
    let elapsed = run_start.elapsed().as_secs_f64();
    let report = summary::Summary {
        steps: trained_steps,
        final_loss: state.train_losses.last().map(|x| x.1 as f64),
        final_val_loss: state.val_losses.last().map(|x| x.1 as f64),
        tokens_per_s: tokens_per_step * trained_steps as f64 / elapsed.max(1e-9),
        model_flops_per_step: stages::flops::train_step_flops(&shape, microbatches),
        peak_flops,
        elapsed_s: elapsed,
        memory: vec![device.ledger().snapshot()],
        last_checkpoint_step: last_saved,
    };
    report.print();
    report.write(&args.run_dir)?;
    if interrupted {
        return Err(user_error("training interrupted by Ctrl-C; resume with --resume"));
    }
    Ok(())
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

fn single_stage(
    cfg: &Config,
    device: Arc<dyn Device>,
    weights: Option<&[NamedTensor]>,
) -> anyhow::Result<Stage> {
    if cfg.pipeline_model_parallel_size != 1 {
        return Err(user_error("pipeline_model_parallel_size > 1 is not supported yet"));
    }
    let layout = ChunkLayout { blocks: 0..cfg.num_layers, embedding: true, head: true };
    let chunk = model::build_chunk(&*device, cfg, layout, model::recompute_policy(cfg, 0), weights)?;
    Ok(Stage::new(device, vec![chunk]))
}

/// One global batch: forward and backward of every microbatch, gradients accumulated.
/// Returns the mean loss over all tokens.
fn train_step(
    stage: &mut Stage,
    cfg: &Config,
    data: &TokenFile,
    step: usize,
    microbatches: usize,
) -> anyhow::Result<f64> {
    stage.zero_grads();
    let grad_scale = 1.0 / (cfg.micro_batch_size * cfg.seq_length * microbatches) as f32;
    let mut loss_sum = 0.0f64;
    for mb in 0..microbatches {
        let batch =
            data.train_batch(cfg.seed, step as u32, mb as u32, cfg.micro_batch_size, cfg.seq_length)?;
        let m = Microbatch {
            step: step as u32,
            index: mb as u32,
            tokens: &batch.inputs,
            targets: &batch.targets,
            grad_scale: Some(grad_scale),
        };
        let (_, losses) = stage.forward(0, &m, None);
        loss_sum += mean(&losses.expect("single stage holds the head"));
        stage.backward(0, mb as u32, None, false);
    }
    stage.fold_local_tied_grad();
    Ok(loss_sum / microbatches as f64)
}

/// Mean validation loss over eval_iters batches (dropout off).
fn evaluate(stage: &mut Stage, cfg: &Config, data: &TokenFile) -> anyhow::Result<f64> {
    let mut total = 0.0;
    let iters = cfg.eval_iters.max(1);
    for i in 0..iters {
        let batch = data.eval_batch(i, cfg.micro_batch_size, cfg.seq_length)?;
        let m = Microbatch {
            step: 0,
            index: i as u32,
            tokens: &batch.inputs,
            targets: &batch.targets,
            grad_scale: None,
        };
        let (_, losses) = stage.forward(0, &m, None);
        total += mean(&losses.expect("single stage holds the head"));
    }
    Ok(total / iters as f64)
}

/// Mean of per-token losses, summed in order in f64.
pub fn mean(losses: &[f32]) -> f64 {
    losses.iter().map(|&l| l as f64).sum::<f64>() / losses.len() as f64
}

fn save(run_dir: &Path, cfg: &Config, stage: &Stage, state: &TrainerState) -> anyhow::Result<()> {
    let dev = &*stage.device;
    let model = model::in_global_order(model::named(&stage.chunks, dev, |p, i| &p.values[i]));
    let renamed = |tagged: Vec<(usize, NamedTensor)>, rename: fn(&str) -> String| {
        model::in_global_order(tagged)
            .into_iter()
            .map(|t| NamedTensor { name: rename(&t.name), ..t })
            .collect::<Vec<_>>()
    };
    let mut optimizer = renamed(model::named(&stage.chunks, dev, |p, i| &p.exp_avg[i]), checkpoint::exp_avg_name);
    optimizer.extend(renamed(model::named(&stage.chunks, dev, |p, i| &p.exp_avg_sq[i]), checkpoint::exp_avg_sq_name));
    checkpoint::save_checkpoint(run_dir, &model::hf_config(cfg), &model, state, &optimizer)?;
    Ok(())
}

fn restore_optimizer(stage: &mut Stage, optimizer: &[NamedTensor]) -> anyhow::Result<()> {
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
    Ok(())
}
