//! The training loop of one rank. Every rank runs it, in lockstep through its collective;
//! rank 0 alone touches the run dir (metrics, checkpoints, report, trace) and the terminal.

use super::rank::{Local, Rank};
use super::report::{mean_loss, RankSummary, StepReport};
use super::run_lock::RunLock;
use super::{loss_chart, lr, metrics, non_finite, peak, resume_changes, shards, summary, timeline};
use crate::checkpoint::{self, NamedTensor, TrainerState};
use crate::cli::TrainArgs;
use crate::config::Config;
use crate::data::{TokenData, TokenizerSpec};
use crate::error::{is_user_error, user_error, Interrupted, NonFinite};
use crate::plan;
use stages::dist::{Collective, DistError, Group, Topology, Transport};
use stages::runtime::FaultInjection;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Length of the greedy sample that ends the summary: a line's worth.
const SAMPLE_TOKENS: usize = 24;

/// What a launcher hands one rank.
pub struct RankSetup<'a> {
    pub id: usize,
    pub topology: Topology,
    pub transport: Box<dyn Transport>,
    pub collective: Box<dyn Collective>,
    /// What it shares with the other ranks of its process.
    pub local: Local,
    /// Set when this process is asked to stop (Ctrl-C, SIGTERM).
    pub stop: &'a AtomicBool,
    pub fault: Option<FaultInjection>,
}

pub fn run(args: &TrainArgs, cfg: &Config, setup: RankSetup) -> anyhow::Result<()> {
    let RankSetup { id, topology, transport, mut collective, local, stop, fault } = setup;
    let root = id == 0;
    if root && cfg.use_distributed_optimizer && topology.data == 1 {
        eprintln!(
            "note: {}: with one data-parallel replica it shards nothing; the optimizer runs unsharded",
            cfg.origins.of("use_distributed_optimizer")
        );
    }
    let train_path =
        cfg.train_data_path.as_ref().ok_or_else(|| cfg.key_error("train_data_path", "training needs one"))?;
    // A file's error names the file; the key names which of the two paths led to it.
    let open = |key, path| {
        TokenData::open(path, cfg.seq_length, cfg.vocab_size).map_err(|e| {
            if is_user_error(&e) {
                cfg.key_error(key, e)
            } else {
                e
            }
        })
    };
    let train_data = open("train_data_path", train_path)?;
    let valid_data = cfg.valid_data_path.as_ref().map(|p| open("valid_data_path", p)).transpose()?;

    // Rank 0 prepares the run dir and reads the checkpoint; each rank gets its share. Rank
    // 0 holds the run dir's lock until it returns.
    let (parts, mut state, _lock) = match root {
        true => {
            let (parts, state, lock) = root_start(args, cfg, topology, train_data.tokenizer.clone())?;
            (Some(parts), Some(state), Some(lock))
        }
        false => (None, None, None),
    };
    let start = shards::decode_start(&collective.scatter(parts)?)?;
    let mut rank = Rank::build(cfg, start.weights.as_deref(), local, id, topology, transport, collective)?;
    if let Some(opt) = &start.optimizer {
        rank.restore_optimizer(opt)?;
    }
    let device = std::sync::Arc::clone(&rank.stage.device);
    let (peak_flops, peak_source) =
        peak::job_peak(args.peak_flops, cfg, &*device, local.cpu_threads, rank.collective())?;

    let start_step = start.step;
    let microbatches = cfg.num_microbatches();
    let tokens_per_step = (cfg.global_batch_size * cfg.seq_length) as f64;
    // Tokens each source has served: a pure function of the steps taken, as the windows are.
    let served_in = |steps| {
        let all_microbatches = microbatches * topology.data;
        train_data.served(cfg.seed, steps, all_microbatches, cfg.micro_batch_size, cfg.seq_length)
    };
    let mut served = match root {
        true => served_in(1..=start_step),
        false => vec![],
    };
    let mut metrics = match root {
        true => Some(metrics::Metrics::open(
            &args.run_dir,
            start_step,
            cfg.train_iters,
            args.quiet,
            cfg.log_interval,
        )?),
        false => None,
    };
    rank.stage.device.ledger().reset_peaks();
    rank.stage.device.host_ledger().reset_peaks();
    let lists: Vec<Vec<schedules::Action>> = (0..topology.world())
        .map(|r| rank.schedule.schedule().stages()[topology.stage_of(r)].clone())
        .collect();
    let mut timeline = timeline::Timeline::new(topology, cfg.virtual_stages());
    let mut trained_steps = 0usize;
    let mut train_time = 0.0f64;
    let mut last_saved = start_step;
    let mut interrupted = false;
    // Rank 0's copy of the whole model at the last save, for the summary's sample.
    let mut final_model = None;
    for step in start_step + 1..=cfg.train_iters {
        // Every rank starts the step together (rank 0 writes between steps).
        rank.collective().all_gather(Group::World, &[]).map_err(|e| at_step(e.into(), step))?;
        let (t0, wall) = (Instant::now(), std::time::SystemTime::now());
        let lr = lr::learning_rate(cfg, step);
        let mut outcome = rank.train_step(cfg, &train_data, step, lr, fault).map_err(|e| at_step(e, step))?;
        outcome.report.stop = stop.load(Ordering::SeqCst);
        outcome.report.start_wall_s =
            wall.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let reports = rank
            .collective()
            .all_gather(Group::World, &outcome.report.encode())
            .map_err(|e| at_step(e.into(), step))?
            .iter()
            .zip(&lists)
            .map(|(bytes, actions)| StepReport::decode(bytes, actions))
            .collect::<Result<Vec<_>, _>>()?;
        let loss = mean_loss(reports.iter().flat_map(|r| r.losses.iter().copied()).collect());
        // A non-finite loss or gradient ends the run here: before anything applies this
        // step's update (pending in `rank` until the next step, an evaluation or a save) or
        // records the step. Every rank reads the same reports, so all stop here together.
        if let Some(origin) = non_finite::origin(&reports).filter(|_| cfg.check_for_nan_in_loss_and_grad) {
            let newest = (last_saved > 0).then_some(last_saved);
            return Err(anyhow::Error::new(NonFinite(non_finite::message(step, origin, topology, newest))));
        }
        // Every rank stops at the same step boundary once any was asked to.
        interrupted = reports.iter().any(|r| r.stop);
        let step_s = t0.elapsed().as_secs_f64();
        super::launcher::note_step(step_s);
        train_time += step_s;
        trained_steps += 1;
        let mut record =
            metrics::step_record(step, loss, lr, outcome.grad_norm, tokens_per_step / step_s, step_s * 1e3);
        if let Some(state) = &mut state {
            served.iter_mut().zip(served_in(step..=step)).for_each(|(total, n)| *total += n);
            record["tokens_served"] = metrics::tokens_served(&train_data.describe(), &served);
            timeline.record(step, step_s, &reports);
            state.step = step as u64;
            state.data_position = step as u64;
            state.lr = lr as f64;
            state.train_losses.push((step as u64, loss as f32));
        }
        let mut evaluated = false;
        if let Some(valid) = &valid_data {
            if cfg.eval_interval > 0 && (step.is_multiple_of(cfg.eval_interval) || step == cfg.train_iters) {
                let v = rank.evaluate(cfg, valid, cfg.eval_iters.max(1)).map_err(|e| at_step(e, step))?;
                record["val_loss"] = v.into();
                evaluated = true;
                if let Some(state) = &mut state {
                    state.val_losses.push((step as u64, v as f32));
                }
            }
        }
        if let Some(m) = &mut metrics {
            m.step(record)?;
            if evaluated {
                loss_chart::write(&args.run_dir)?;
            }
        }
        if (cfg.save_interval > 0 && step.is_multiple_of(cfg.save_interval))
            || step == cfg.train_iters
            || interrupted
        {
            final_model =
                save(&args.run_dir, cfg, &mut rank, state.as_ref()).map_err(|e| at_step(e, step))?;
            last_saved = step;
        }
        if interrupted {
            if let Some(m) = &metrics {
                m.println(&format!("interrupted: stopped after step {step}, checkpoint saved"));
            }
            break;
        }
    }
    rank.complete_sends()?;
    let device = &rank.stage.device;
    let mine = RankSummary {
        memory: device.ledger().snapshot(),
        recompute_s: rank.stage.recompute_s(),
        host_peak_bytes: device.host_ledger().peak_bytes() as u64,
    };
    let summaries = rank.collective().gather(&mine.encode())?;
    let (Some(m), Some(state), Some(summaries)) = (metrics, state, summaries) else { return Ok(()) };
    m.finish();
    loss_chart::write(&args.run_dir)?;
    let summaries = summaries.iter().map(|b| RankSummary::decode(b)).collect::<Result<Vec<_>, _>>()?;
    let per_rank =
        |per_stage: Vec<u64>| (0..topology.world()).map(|r| per_stage[topology.stage_of(r)]).collect();
    let predicted = plan::predicted_activation_peaks(cfg, &rank.schedule, true)?;
    let report = summary::Summary {
        steps: trained_steps,
        final_loss: state.train_losses.last().map(|x| x.1 as f64),
        final_val_loss: state.val_losses.last().map(|x| x.1 as f64),
        tokens_per_s: tokens_per_step * trained_steps as f64 / train_time.max(1e-9),
        model_flops_per_step: stages::flops::train_step_flops(
            &plan::shape(cfg),
            microbatches * topology.data,
        ),
        peak_flops,
        peak_source,
        elapsed_s: train_time,
        topology,
        memory: summaries.iter().map(|s| s.memory.clone()).collect(),
        stage_descriptions: (0..topology.world())
            .map(|r| {
                let stage = topology.stage_of(r);
                Ok(plan::describe_stage(cfg, &plan::stage_layouts(cfg, stage)?, stage))
            })
            .collect::<anyhow::Result<_>>()?,
        predicted_peaks: per_rank(crate::simulate::predicted_stage_peaks(cfg)?),
        predicted_activations: per_rank(predicted.device),
        predicted_without_recompute: per_rank(
            plan::predicted_activation_peaks(cfg, &rank.schedule, false)?.device,
        ),
        host_peaks: summaries.iter().map(|s| s.host_peak_bytes).collect(),
        predicted_host_peaks: per_rank(predicted.host),
        recompute_s: summaries.iter().map(|s| s.recompute_s).collect(),
        max_in_flight: timeline.max_in_flight.clone(),
        bubble: timeline.bubble_rates(),
        last_checkpoint_step: last_saved,
        data_sources: train_data.describe().into_iter().zip(served).map(|((n, w), t)| (n, w, t)).collect(),
        loss_chart: loss_chart::path(&args.run_dir),
        aliases: cfg.aliases.clone(),
        sample: match (&final_model, args.quiet) {
            (Some(model), false) => crate::generate::greedy_sample(
                &checkpoint::ModelConfig::of(cfg),
                model,
                train_data.tokenizer.as_ref(),
                SAMPLE_TOKENS,
            ),
            _ => None,
        },
    };
    report.print();
    report.write(&args.run_dir)?;
    // After the report, so that a trace that cannot be written costs only itself.
    if let Some(path) = &args.trace {
        timeline.write_trace(path, &plan::describe_run(cfg), &report.stage_descriptions)?;
    }
    if interrupted {
        return Err(anyhow::Error::new(Interrupted(format!(
            "interrupted: checkpoint of step {last_saved} saved in {}; continue with --resume",
            args.run_dir.display()
        ))));
    }
    Ok(())
}

/// A failed crossing with a peer (a timeout, a peer that stopped) says at which step; other
/// errors name their step themselves, or have none.
fn at_step(e: anyhow::Error, step: usize) -> anyhow::Error {
    match e.chain().any(|c| c.is::<DistError>()) {
        true => e.context(format!("step {step}")),
        false => e,
    }
}

/// Rank 0's start: the run dir made (or the one to resume checked) and locked, the
/// checkpoint or `load` weights read, and every rank's share of them; the trainer state to
/// continue.
fn root_start(
    args: &TrainArgs,
    cfg: &Config,
    topology: Topology,
    tokenizer: Option<TokenizerSpec>,
) -> anyhow::Result<(Vec<Vec<u8>>, TrainerState, RunLock)> {
    let (resume_from, lock) = prepare_run_dir(&args.run_dir, args.resume)?;
    let loaded = match (&resume_from, &cfg.load) {
        (Some(dir), _) => Some(checkpoint::load_checkpoint(dir)?),
        (None, Some(load)) => Some(checkpoint::load_checkpoint(load)?),
        (None, None) => None,
    };
    if let Some(ck) = &loaded {
        checkpoint::check_shapes(
            &ck.dir.join("model.safetensors"),
            &checkpoint::expected_shapes(&checkpoint::ModelConfig::of(cfg)),
            &ck.model,
        )?;
        checkpoint::check_same_model(cfg, &ck.config, &ck.dir)?;
    }
    let (weights, trainer) = match loaded {
        Some(ck) if resume_from.is_some() => (Some(ck.model), ck.trainer),
        Some(ck) => (Some(ck.model), None),
        None => (None, None),
    };
    let (mut state, optimizer) = match trainer {
        Some(t) => (Some(t.state), Some(t.optimizer)),
        None => (None, None),
    };
    let now = cfg.to_yaml()?;
    if let Some(s) = &mut state {
        for change in resume_changes::changed_keys(&s.config_yaml, &now) {
            eprintln!("note: resuming {} at step {} with {change}", args.run_dir.display(), s.step);
        }
        // The steps from here are trained with this config and data; a later resume compares
        // with the one, generate writes text with the other's tokenizer.
        s.config_yaml = now.clone();
        s.tokenizer = tokenizer.clone();
    }
    let step = state.as_ref().map_or(0, |s| s.step as usize);
    let parts = shards::start_parts(cfg, topology, step, weights.as_deref(), optimizer.as_deref())?;
    std::fs::write(args.run_dir.join("config.yaml"), &now)?;
    let state = state.unwrap_or_else(|| TrainerState {
        step: 0,
        seed: cfg.seed,
        data_position: 0,
        lr: 0.0,
        config_yaml: now,
        tokenizer,
        train_losses: vec![],
        val_losses: vec![],
    });
    Ok((parts, state, lock))
}

/// Every rank sends its stage (the first replica's); rank 0 writes the checkpoint and
/// returns the whole model.
fn save(
    run_dir: &Path,
    cfg: &Config,
    rank: &mut Rank,
    state: Option<&TrainerState>,
) -> anyhow::Result<Option<Vec<NamedTensor>>> {
    rank.apply_pending_update()?;
    let mine = shards::encode_stage(rank)?;
    let Some(parts) = rank.collective().gather(&mine)? else { return Ok(None) };
    let (model, optimizer) = shards::assemble(&parts)?;
    let state = state.expect("rank 0 keeps the trainer state");
    checkpoint::save_checkpoint(run_dir, &checkpoint::ModelConfig::of(cfg), &model, state, &optimizer)?;
    Ok(Some(model))
}

/// Creates the run dir and locks it; with `resume`, returns the checkpoint to continue from.
/// A run dir that already holds a run is never overwritten, and one that another train is
/// writing is refused before anything in it is read or written: the lock comes first, and
/// what the dir holds is judged only under it.
fn prepare_run_dir(run_dir: &Path, resume: bool) -> anyhow::Result<(Option<std::path::PathBuf>, RunLock)> {
    let no_run = || user_error(format!("{}: --resume, but this run dir holds no run", run_dir.display()));
    if resume && !run_dir.is_dir() {
        return Err(no_run());
    }
    std::fs::create_dir_all(run_dir)
        .map_err(|e| user_error(format!("{}: cannot create run dir: {e}", run_dir.display())))?;
    let lock = RunLock::acquire(run_dir)?;
    let has_run = run_dir.join("metrics.jsonl").exists() || run_dir.join("checkpoints").exists();
    if resume && !has_run {
        return Err(no_run());
    }
    if has_run && !resume {
        return Err(user_error(format!(
            "{}: already holds a run; pass --resume to continue it or choose another --run-dir",
            run_dir.display()
        )));
    }
    Ok((resume.then(|| run_dir.to_path_buf()), lock))
}
