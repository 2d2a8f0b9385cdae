//! Where the backends are chosen. Without a launcher (or as the only rank of one) every rank
//! is a thread of this process, p x dp of them. Under `mpirun` or Slurm's `srun`, each
//! process is one rank of an MPI job (feature `mpi`), world = p x dp.
//!
//! Failures: with threads, a failing rank's ends drop, every peer waiting on it stops with
//! `PeerStopped`, and the root cause is reported; a rank that waited on a peer past the
//! distributed timeout is the root cause at once, as its peer may never end. Under MPI, a
//! mistake every rank sees the same way (the config, the world size) is one line from rank
//! 0 and exit 2 on every rank; any other failure (a timeout included) is printed by its
//! rank, which then ends the job (`MPI_Abort`).

use super::launcher::{launched, on_signal, STOP};
use super::rank::Local;
use super::worker::{self, RankSetup};
use crate::cli::TrainArgs;
use crate::config::Config;
#[cfg(feature = "mpi")]
use crate::error::Quiet;
use crate::error::{is_user_error, user_error};
use crate::plan;
use stages::dist::{threads, DistError, Topology};
use stages::runtime::{Fault, FaultInjection};
use std::sync::{mpsc, Arc};

pub fn run(args: &TrainArgs, cfg: Config) -> anyhow::Result<()> {
    let _ = ctrlc::set_handler(on_signal);
    match launched() {
        Some((world, _)) if world > 1 => processes(args, cfg, world),
        _ => in_threads(args, &cfg),
    }
}

/// Every rank a thread of this process, sharing its cores. The threads are not joined but
/// report their ends: a rank that timed out waiting on a peer ends the run with that error
/// while the peer may still hang (the process's exit ends it).
fn in_threads(args: &TrainArgs, cfg: &Config) -> anyhow::Result<()> {
    let (_, schedule) = plan::lowered_schedule(cfg)?;
    let topology = Topology {
        tensor: cfg.tensor_model_parallel_size,
        pipeline: cfg.pipeline_model_parallel_size,
        data: cfg.data_parallel(),
        placement: schedule.schedule().shape().placement,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fault = fault_injection()?;
    let ends = threads::world(topology, schedule.required_capacity().get(), cfg.distributed_timeout());
    let (args, cfg) = (Arc::new(args.clone()), Arc::new(cfg.clone()));
    let (done, ended) = mpsc::channel();
    for (id, (transport, collective)) in ends.into_iter().enumerate() {
        let (args, cfg, done) = (args.clone(), cfg.clone(), done.clone());
        std::thread::spawn(move || {
            let setup = RankSetup {
                id,
                topology,
                transport: Box::new(transport),
                collective: Box::new(collective),
                local: Local { cpu_threads: cores / topology.world(), sole_rank: topology.world() == 1 },
                stop: &STOP,
                fault,
            };
            let run = std::panic::AssertUnwindSafe(|| worker::run(&args, &cfg, setup));
            let result =
                std::panic::catch_unwind(run).unwrap_or_else(|payload| Err(panic_error(id, payload)));
            let _ = done.send((id, result));
        });
    }
    let mut results: Vec<anyhow::Result<()>> = (0..topology.world()).map(|_| Ok(())).collect();
    for _ in 0..topology.world() {
        let (rank, result) = ended.recv().expect("every rank reports its end");
        match result {
            Err(e) if timed_out(&e) => return Err(name_rank(e, rank, topology)),
            result => results[rank] = result,
        }
    }
    root_cause(results, topology)
}

/// Whether a rank waited on a peer past the distributed timeout.
fn timed_out(e: &anyhow::Error) -> bool {
    e.chain().any(|c| matches!(c.downcast_ref::<DistError>(), Some(DistError::Timeout { .. })))
}

fn panic_error(rank: usize, payload: Box<dyn std::any::Any + Send>) -> anyhow::Error {
    if let Some(oom) = payload.downcast_ref::<kernels::OutOfMemory>() {
        return anyhow::anyhow!("rank {rank}: {oom}");
    }
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    anyhow::anyhow!("rank {rank} panicked: {message}")
}

/// Success, or the error of the rank that failed first-hand (not one that only saw a peer
/// stop), named by its rank when there are several.
fn root_cause(results: Vec<anyhow::Result<()>>, topology: Topology) -> anyhow::Result<()> {
    let peer_stopped = |e: &anyhow::Error| {
        e.chain().any(|c| matches!(c.downcast_ref::<DistError>(), Some(DistError::PeerStopped { .. })))
    };
    let mut secondary = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(()) => {}
            Err(e) if peer_stopped(&e) => {
                secondary.get_or_insert(e);
            }
            Err(e) => return Err(name_rank(e, rank, topology)),
        }
    }
    secondary.map_or(Ok(()), Err)
}

/// An internal failure says which rank it came from; a user mistake stays one plain line.
fn name_rank(e: anyhow::Error, rank: usize, topology: Topology) -> anyhow::Error {
    if is_user_error(&e)
        || e.is::<crate::error::Interrupted>()
        || e.is::<crate::error::NonFinite>()
        || topology.world() == 1
        || e.to_string().starts_with("rank ")
    {
        e
    } else {
        e.context(format!("rank {rank}"))
    }
}

/// `PIPETRAIN_INJECT_FAULT=RANK:STEP[:panic|:device|:nan|:stall]` makes a rank fail in the
/// middle of a step (or its device report an error, or a gradient of its turn NaN, at the
/// step's end, or the rank stop answering): how the tests check that one failing or hung
/// rank stops the whole run cleanly.
fn fault_injection() -> anyhow::Result<Option<FaultInjection>> {
    let Ok(spec) = std::env::var("PIPETRAIN_INJECT_FAULT") else { return Ok(None) };
    let parts: Vec<&str> = spec.split(':').collect();
    let (rank, step, kind) = match parts.as_slice() {
        [rank, step] => (*rank, *step, Fault::Error),
        [rank, step, "panic"] => (*rank, *step, Fault::Panic),
        [rank, step, "device"] => (*rank, *step, Fault::Device),
        [rank, step, "nan"] => (*rank, *step, Fault::NonFinite),
        [rank, step, "stall"] => (*rank, *step, Fault::Stall),
        _ => ("", "", Fault::Error),
    };
    match (rank.parse::<usize>(), step.parse::<u32>()) {
        (Ok(rank), Ok(step)) => Ok(Some(FaultInjection { rank, step, kind })),
        _ => Err(user_error(format!(
            "PIPETRAIN_INJECT_FAULT={spec}: expected RANK:STEP, RANK:STEP:panic, RANK:STEP:device, \
             RANK:STEP:nan or RANK:STEP:stall"
        ))),
    }
}

#[cfg(not(feature = "mpi"))]
fn processes(_args: &TrainArgs, _cfg: Config, world: usize) -> anyhow::Result<()> {
    Err(super::launcher::quiet_unless_root(user_error(format!(
        "started as one of {world} ranks by mpirun or srun, but this binary was built without the `mpi` \
         feature; rebuild with `cargo build --release --features mpi`, or run it without a launcher"
    ))))
}

/// This process is one rank of an MPI job.
#[cfg(feature = "mpi")]
fn processes(args: &TrainArgs, mut cfg: Config, _announced: usize) -> anyhow::Result<()> {
    use stages::dist::mpi::MpiWorld;
    let mpi = MpiWorld::init().map_err(|e| anyhow::anyhow!("MPI: {e}"))?;
    let (id, world) = (mpi.rank(), mpi.size());
    let result = agree_on_config(&mut cfg, &mpi, world).and_then(|topology| {
        let (transport, collective) = endpoints(&cfg, &mpi, topology)?;
        let setup = RankSetup {
            id,
            topology,
            transport,
            collective,
            local: Local {
                cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()) / mpi.local_ranks,
                sole_rank: true,
            },
            stop: &STOP,
            fault: fault_injection()?,
        };
        let run = std::panic::AssertUnwindSafe(|| worker::run(args, &cfg, setup));
        let result = std::panic::catch_unwind(run).unwrap_or_else(|payload| Err(panic_error(id, payload)));
        result.map_err(|e| {
            if e.is::<crate::error::Interrupted>() || e.is::<Quiet>() {
                return e;
            }
            // Every rank stopped at the same step on the same reports: rank 0 says why.
            if e.is::<crate::error::NonFinite>() {
                return if id == 0 { e } else { anyhow::Error::new(Quiet(1)) };
            }
            // Past the start, a failure is this rank's alone: say so, and end the job.
            let (line, code) = match is_user_error(&e) {
                true => (format!("error: {e}"), 2),
                false => (format!("error: rank {id}: {e:#}"), 1),
            };
            crate::error::print_line(&line);
            mpi.abort(code)
        })
    });
    result.map_err(|e| if id != 0 && is_user_error(&e) { anyhow::Error::new(Quiet(2)) } else { e })
}

#[cfg(feature = "mpi")]
type Endpoints = (Box<dyn stages::dist::Transport>, Box<dyn stages::dist::Collective>);

/// NCCL between GPUs where each rank on this machine has a GPU of its own (NCCL refuses
/// two ranks on one GPU); MPI otherwise.
#[cfg(all(feature = "mpi", feature = "cuda"))]
fn endpoints(
    cfg: &Config,
    mpi: &stages::dist::mpi::MpiWorld,
    topology: Topology,
) -> anyhow::Result<Endpoints> {
    if cfg.device == crate::config::DeviceKind::Cuda && mpi.local_ranks <= kernels::cuda::gpu_count() {
        let (t, c) = stages::dist::nccl::endpoints(
            mpi,
            topology,
            super::launcher::local_gpu(),
            cfg.distributed_timeout(),
        )?;
        return Ok((Box::new(t), Box::new(c)));
    }
    let (t, c) = mpi.endpoints(topology, cfg.distributed_timeout());
    Ok((Box::new(t), Box::new(c)))
}

#[cfg(all(feature = "mpi", not(feature = "cuda")))]
fn endpoints(
    cfg: &Config,
    mpi: &stages::dist::mpi::MpiWorld,
    topology: Topology,
) -> anyhow::Result<Endpoints> {
    let (t, c) = mpi.endpoints(topology, cfg.distributed_timeout());
    Ok((Box::new(t), Box::new(c)))
}

/// The world's layout from the config and the world size, and a check that every rank read
/// the same config; a mistake here every rank sees alike, so none aborts.
#[cfg(feature = "mpi")]
fn agree_on_config(
    cfg: &mut Config,
    mpi: &stages::dist::mpi::MpiWorld,
    world: usize,
) -> anyhow::Result<Topology> {
    let (t, p) = (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size);
    if !world.is_multiple_of(t * p) {
        let (key, what) = match t {
            1 => ("pipeline_model_parallel_size", format!("{p}")),
            _ => {
                ("tensor_model_parallel_size", format!("{t} x pipeline_model_parallel_size {p} = {}", t * p))
            }
        };
        return Err(cfg.key_error(key, format!("{what} does not divide the {world} ranks mpirun started")));
    }
    let dp = world / (t * p);
    if let Some(given) = cfg.data_parallel_size.filter(|&d| d != dp) {
        return Err(cfg.key_error(
            "data_parallel_size",
            format!("{given}, but {world} ranks / (tensor_model_parallel_size {t} x pipeline_model_parallel_size {p}) = {dp}"),
        ));
    }
    cfg.data_parallel_size = Some(dp);
    cfg.validate().map_err(|(key, msg)| cfg.key_error(key, msg))?;
    let mine = serde_norway::to_string(&*cfg)?;
    let probe =
        Topology { tensor: 1, pipeline: 1, data: world, placement: schedules::Placement::Interleaved };
    let (_, mut probe) = mpi.endpoints(probe, cfg.distributed_timeout());
    let all = stages::dist::Collective::all_gather(&mut probe, stages::dist::Group::World, mine.as_bytes())?;
    if let Some(other) = all.iter().position(|c| c != &all[0]) {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let differing = crate::config::first_difference(&text(&all[0]), &text(&all[other]));
        return Err(user_error(format!(
            "rank {other} read a config that differs from rank 0's: {differing}"
        )));
    }
    let placement = plan::schedule_shape(cfg)?.placement;
    Ok(Topology { tensor: t, pipeline: p, data: dp, placement })
}
