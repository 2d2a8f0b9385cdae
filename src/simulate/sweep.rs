//! `--sweep` and `--plan`: every schedule x memory lever x micro batch size of a config,
//! simulated and ranked by iteration time, each marked by whether every stage fits the
//! memory limit (and the host's, for offload); the plan is the fastest that fits, as config
//! lines.
//!
//! Schedules: gpipe, 1f1b, zb-h1, interleaved-1f1b with v in {2, 4} (and the config's own v),
//! and the V schedules zb-v and dualpipe-v (two chunks per stage, stage 0 holding both the
//! embedding and the head), each where its shape allows (DualPipeV: m >= 2p). Micro batch
//! sizes: the powers of two that divide the global batch (and the config's own). Memory
//! levers (lever.rs): none; selective core_attn; selective core_attn + mlp; full uniform and
//! full block with N = 1 .. the most blocks of a chunk; offload of each chunk's first N
//! blocks, N = 1 .. the most, of every module, of the attention core alone, and of every
//! other module beside selective recompute of the core; and, per stage, the smallest
//! full-block N and the smallest N of each offload set with which that stage fits (1F1B's
//! early stages hold more microbatches, so they need more than later ones), and the mix
//! that offloads on the stages where offload fits and recomputes on the others.
//!
//! With `--gpus N` the parallel layout is searched too: every t x p x dp = N of cluster.rs.
//!
//! One schedule is generated and lowered per (layout, schedule, v, micro batch size) and
//! simulated under every lever; the shapes run in parallel. The planner skips what cannot
//! win: a shape whose parameters and optimizer state alone exceed the limit is not lowered,
//! and a shape that fits without a lever tries none. Of equal times, no lever ranks first.

use super::durations::from_hardware;
use super::hardware::Hardware;
use super::input;
use super::lever::{Lever, OffloadSet};
use super::memory::stage_static_bytes;
use super::report::{ranges, seconds};
use super::setup::Setup;
use super::units::format_bytes;
use crate::config::{Config, Named, RecomputeMethod, RecomputeModule};
use rayon::prelude::*;
use schedules::{Placement, ScheduleKind};
use serde_json::{json, Value};
use stages::ChunkLayout;
use std::collections::HashMap;

/// One simulated candidate.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The candidate's whole config.
    pub cfg: Config,
    pub kind: ScheduleKind,
    pub v: usize,
    pub micro_batch_size: usize,
    pub lever: Lever,
    pub iteration_time: f64,
    pub bubble_rate: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    /// Per stage.
    pub peak_memory: Vec<u64>,
    /// Per stage, offloaded activations in host memory.
    pub host_memory: Vec<u64>,
    /// Every stage's peak fits the device memory limit, and its host peak the host's.
    pub fits: bool,
}

impl Outcome {
    pub fn max_peak(&self) -> u64 {
        self.peak_memory.iter().copied().max().unwrap_or(0)
    }

    /// t, p and dp.
    fn layout(&self) -> (usize, usize, usize) {
        (self.cfg.tensor_model_parallel_size, self.cfg.pipeline_model_parallel_size, self.cfg.data_parallel())
    }

    fn shape(&self) -> ShapeKey {
        ShapeKey::of(&self.cfg, self.kind, self.v)
    }
}

/// What makes a candidate's shape: its layout, optimizer, schedule, v and micro batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShapeKey {
    layout: (usize, usize, usize),
    distributed_optimizer: bool,
    kind: ScheduleKind,
    v: usize,
    micro_batch_size: usize,
}

impl ShapeKey {
    fn of(cfg: &Config, kind: ScheduleKind, v: usize) -> ShapeKey {
        ShapeKey {
            layout: (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.data_parallel()),
            distributed_optimizer: cfg.use_distributed_optimizer,
            kind,
            v,
            micro_batch_size: cfg.micro_batch_size,
        }
    }
}

/// How much of the candidate space to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Every candidate, for the sweep's table.
    Everything,
    /// Only what can be among the `fitting` fastest that fit (see the module docs), for the
    /// plan and its runners-up.
    Plan { fitting: usize },
}

/// Sets the schedule, v (unset where the schedule implies it) and micro batch size; an
/// explicit split only applies to the v it was written for.
fn shape_config(cfg: &mut Config, base: &Config, kind: ScheduleKind, v: usize, micro_batch_size: usize) {
    cfg.pipeline_schedule = kind;
    cfg.virtual_pipeline_model_parallel_size = (v != kind.default_chunks()).then_some(v);
    cfg.micro_batch_size = micro_batch_size;
    if v != base.virtual_stages() {
        cfg.num_layers_per_stage = None;
    }
}

/// The (schedule, v, micro batch size) shapes to try.
fn shapes(base: &Config) -> Vec<(ScheduleKind, usize, usize)> {
    let gbs = base.global_batch_size;
    let mut sizes: Vec<usize> = (0..usize::BITS).map(|k| 1usize << k).take_while(|&b| b <= gbs).collect();
    sizes.push(base.micro_batch_size);
    sizes.retain(|b| gbs.is_multiple_of(*b));
    sizes.sort_unstable();
    sizes.dedup();
    let mut interleave = vec![2, 4, base.virtual_stages()];
    interleave.retain(|&v| v > 1);
    interleave.sort_unstable();
    interleave.dedup();
    let mut out = Vec::new();
    for kind in ScheduleKind::ALL {
        let vs = if kind == ScheduleKind::Interleaved1F1B {
            interleave.clone()
        } else {
            vec![kind.default_chunks()]
        };
        for v in vs {
            for &b in &sizes {
                out.push((kind, v, b));
            }
        }
    }
    out
}

/// Simulates the candidates of every layout in `bases` on `hw`; sorted fastest first.
pub fn sweep(bases: &[Config], hw: &Hardware, limit: Option<u64>, search: Search) -> Vec<Outcome> {
    let bases = with_and_without_the_distributed_optimizer(bases);
    let bases = &bases[..];
    let shapes: Vec<(usize, (ScheduleKind, usize, usize))> =
        (0..bases.len()).flat_map(|i| shapes(&bases[i]).into_iter().map(move |shape| (i, shape))).collect();
    // The split over stages depends on the layout and v alone, its static memory also on
    // where the schedule places the chunks: one per (layout, placement, v), made with the
    // first schedule of that placement.
    let mut split_kinds: HashMap<(usize, Placement, usize), ScheduleKind> = HashMap::new();
    for &(i, (kind, v, _)) in &shapes {
        split_kinds.entry((i, kind.placement(), v)).or_insert(kind);
    }
    let splits: HashMap<(usize, Placement, usize), Split> = split_kinds
        .into_par_iter()
        .filter_map(|((i, placement, v), kind)| Some(((i, placement, v), Split::new(&bases[i], kind, v)?)))
        .collect();
    let planning = matches!(search, Search::Plan { .. });
    let mut shapes: Vec<Shape> = shapes
        .into_par_iter()
        .filter_map(|(i, (kind, v, mbs))| {
            let split = splits.get(&(i, kind.placement(), v))?;
            if planning && limit.is_some_and(|l| split.static_floor > l) {
                return None;
            }
            Shape::new(&bases[i], &split.layouts, hw, kind, v, mbs)
        })
        .collect();
    let mut outcomes: Vec<Outcome> = match search {
        Search::Everything => {
            shapes.into_par_iter().flat_map_iter(|s| shape_outcomes(&s, hw, limit, search)).collect()
        }
        Search::Plan { fitting } => {
            // Fastest bound first; once `fitting` plans that fit beat a shape's bound, no
            // shape from there on can place among them.
            shapes.sort_by(|a, b| a.bound.total_cmp(&b.bound));
            let mut outcomes: Vec<Outcome> = Vec::new();
            for batch in shapes.chunks(2 * rayon::current_num_threads()) {
                let mut times: Vec<f64> =
                    outcomes.iter().filter(|o| o.fits).map(|o| o.iteration_time).collect();
                times.sort_by(f64::total_cmp);
                let beaten = |s: &Shape| times.len() >= fitting && s.bound > times[fitting - 1];
                if beaten(&batch[0]) {
                    break;
                }
                let found: Vec<Outcome> = batch
                    .par_iter()
                    .filter(|s| !beaten(s))
                    .flat_map_iter(|s| shape_outcomes(s, hw, limit, search))
                    .collect();
                outcomes.extend(found);
            }
            // The plan's `# optimizer:` line weighs it against the other choice on its
            // shape, which the bound may have left out.
            let best = outcomes
                .iter()
                .filter(|o| o.fits)
                .min_by(|a, b| a.iteration_time.total_cmp(&b.iteration_time));
            let twin = best.map(|best| ShapeKey {
                distributed_optimizer: !best.cfg.use_distributed_optimizer,
                ..best.shape()
            });
            let twin = twin.filter(|key| !outcomes.iter().any(|o| o.shape() == *key)).and_then(|key| {
                shapes.iter().find(|s| ShapeKey::of(&s.setup.cfg, s.setup.kind, s.setup.v) == key)
            });
            if let Some(twin) = twin {
                outcomes.extend(shape_outcomes(twin, hw, limit, search));
            }
            outcomes
        }
    };
    // Of equal times, no lever first (an offload whose copies hide behind compute still
    // takes PCIe and host memory), then the least memory.
    let lever_used = |o: &Outcome| o.lever != Lever::None;
    outcomes.sort_by(|a, b| {
        a.iteration_time
            .total_cmp(&b.iteration_time)
            .then(lever_used(a).cmp(&lever_used(b)))
            .then(a.max_peak().cmp(&b.max_peak()))
    });
    outcomes
}

/// Each layout with data-parallel replicas twice, its optimizer unsharded and distributed
/// (cutting the moments' bytes by dp; the reduce-scatter and all-gather move the
/// all-reduce's bytes, and each replica steps 1/dp of the parameters); one without as given.
fn with_and_without_the_distributed_optimizer(bases: &[Config]) -> Vec<Config> {
    bases
        .iter()
        .flat_map(|base| match base.data_parallel() {
            1 => vec![base.clone()],
            _ => [false, true].map(|on| Config { use_distributed_optimizer: on, ..base.clone() }).to_vec(),
        })
        .collect()
}

/// The split of a layout's blocks over p x v chunks, and the most any stage's GPU holds all
/// along (parameters, gradients, optimizer state; a V's stage 0 both the embedding and the
/// head): no schedule or recompute goes below it.
struct Split {
    layouts: Vec<ChunkLayout>,
    static_floor: u64,
}

impl Split {
    /// The split for `kind`'s placement of v chunks per stage; its static bytes are those
    /// `simulate` reports for every schedule of that placement.
    fn new(base: &Config, kind: ScheduleKind, v: usize) -> Option<Split> {
        let mut cfg = base.clone();
        shape_config(&mut cfg, base, kind, v, base.micro_batch_size);
        let layouts = crate::plan::chunk_layouts(&cfg).ok()?;
        let setup = Setup::with_layouts(&cfg, kind, layouts);
        let static_floor = (0..setup.p).map(|r| stage_static_bytes(&setup, r)).max()?;
        Some(Split { layouts: setup.layouts, static_floor })
    }
}

/// One (layout, schedule, v, micro batch size) with no recompute, its schedule not yet
/// lowered, and a lower bound on its iteration time under any recompute setting: the
/// busiest stage's compute without recompute, then its optimizer phase.
struct Shape {
    setup: Setup,
    bound: f64,
}

impl Shape {
    /// None when the shape is impossible. `layouts` is `base`'s split for `v`.
    fn new(
        base: &Config,
        layouts: &[ChunkLayout],
        hw: &Hardware,
        kind: ScheduleKind,
        v: usize,
        mbs: usize,
    ) -> Option<Shape> {
        let mut cfg = base.clone();
        shape_config(&mut cfg, base, kind, v, mbs);
        Lever::None.apply(&mut cfg);
        cfg.validate().ok()?;
        kind.shape(cfg.pipeline_model_parallel_size, v, cfg.num_microbatches()).ok()?;
        let setup = Setup::with_layouts(&cfg, kind, layouts.to_vec());
        let d = from_hardware(&setup, hw);
        let bound = (0..setup.p)
            .map(|r| {
                let chunks = &d.chunks[r * setup.v..(r + 1) * setup.v];
                let busy: f64 = chunks.iter().map(|c| c.forward + c.backward_input + c.backward_weight).sum();
                setup.m as f64 * busy + d.optimizer[r]
            })
            .fold(0.0, f64::max);
        Some(Shape { setup, bound })
    }
}

/// Every recompute setting on one shape (planning: only those that can win).
fn shape_outcomes(shape: &Shape, hw: &Hardware, limit: Option<u64>, search: Search) -> Vec<Outcome> {
    let setup = &shape.setup;
    let (cfg, p, kind, v) = (&setup.cfg, setup.p, setup.kind, setup.v);
    let mbs = cfg.micro_batch_size;
    if setup.schedule().is_err() {
        return Vec::new();
    }
    let most_blocks = setup.layouts.iter().map(|l| l.blocks.len()).max().unwrap_or(0);
    let limits = Limits { device: limit, host: hw.host_memory_bytes };
    let mut settings = vec![
        Lever::None,
        Lever::Selective(vec![RecomputeModule::CoreAttn]),
        Lever::Selective(vec![RecomputeModule::CoreAttn, RecomputeModule::Mlp]),
    ];
    for method in [RecomputeMethod::Uniform, RecomputeMethod::Block] {
        settings.extend((1..=most_blocks).map(|num_layers| Lever::Full { method, num_layers }));
    }
    for set in OffloadSet::ALL {
        settings.extend((1..=most_blocks).map(|n| Lever::Offload { set, layers: vec![n; p] }));
    }
    let simulate = |lever: Lever| {
        let mut c = cfg.clone();
        lever.apply(&mut c);
        c.validate().ok()?;
        let s = setup.with_recompute(&c);
        let sim = input::run(&s, &from_hardware(&s, hw)).ok()?;
        let fits_in = |peaks: &[u64], limit: Option<u64>| limit.is_none_or(|l| peaks.iter().all(|&b| b <= l));
        let peak_memory: Vec<u64> = sim.stages.iter().map(|st| st.peak_memory).collect();
        let host_memory: Vec<u64> = sim.stages.iter().map(|st| st.peak_host).collect();
        Some(Outcome {
            cfg: c,
            kind,
            v,
            micro_batch_size: mbs,
            lever,
            iteration_time: sim.iteration_time,
            bubble_rate: sim.bubble_rate,
            tokens_per_s: sim.tokens_per_second(s.tokens_per_iteration()),
            mfu: super::report::mfu(&s, &sim, hw),
            fits: fits_in(&peak_memory, limits.device) && fits_in(&host_memory, limits.host),
            peak_memory,
            host_memory,
        })
    };
    if matches!(search, Search::Plan { .. }) {
        return planned_outcomes(simulate, most_blocks, p, limits);
    }
    let mut outcomes: Vec<Outcome> = settings.into_iter().filter_map(simulate).collect();
    for family in per_stage_families() {
        if let Some(per_stage) = limit.and_then(|_| smallest_fitting_n(&outcomes, p, limits, &family)) {
            outcomes.extend(simulate(family.with_counts(per_stage)));
        }
    }
    if let Some(mix) = limit.and_then(|_| block_or_offload(&outcomes, p, limits)) {
        outcomes.extend(simulate(mix));
    }
    outcomes
}

/// The levers with a count per stage: full block recompute, and offload of each set.
fn per_stage_families() -> impl Iterator<Item = Lever> {
    let offload = OffloadSet::ALL.into_iter().map(|set| Lever::Offload { set, layers: Vec::new() });
    std::iter::once(Lever::BlockPerStage(Vec::new())).chain(offload)
}

/// The planner's few runs on one shape: none; if it does not fit, the selective settings,
/// full block N and the N of each offload set each bisected to the smallest that fits every
/// stage, the per-stage mix of what those runs found for each, and as a last resort full
/// uniform over whole chunks (the least memory).
fn planned_outcomes(
    simulate: impl Fn(Lever) -> Option<Outcome>,
    most_blocks: usize,
    p: usize,
    limits: Limits,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = simulate(Lever::None).into_iter().collect();
    let Some(limit) = limits.device else { return outcomes };
    if outcomes.iter().any(|o| o.fits) {
        return outcomes;
    }
    outcomes.extend(simulate(Lever::Selective(vec![RecomputeModule::CoreAttn])));
    outcomes.extend(simulate(Lever::Selective(vec![RecomputeModule::CoreAttn, RecomputeModule::Mlp])));
    for family in per_stage_families() {
        let uniform = |n| match &family {
            Lever::Offload { set, .. } => Lever::Offload { set: *set, layers: vec![n; p] },
            _ => Lever::Full { method: RecomputeMethod::Block, num_layers: n },
        };
        let (mut low, mut high) = (1, most_blocks);
        while low < high {
            let mid = (low + high) / 2;
            let Some(o) = simulate(uniform(mid)) else { break };
            if o.fits {
                high = mid;
            } else {
                low = mid + 1;
            }
            outcomes.push(o);
        }
        if !outcomes.iter().any(|o| o.lever == uniform(high)) {
            outcomes.extend(simulate(uniform(high)));
        }
        if let Some(per_stage) =
            smallest_fitting_n(&outcomes, p, Limits { device: Some(limit), ..limits }, &family)
        {
            outcomes.extend(simulate(family.with_counts(per_stage)));
        }
    }
    if let Some(mix) = block_or_offload(&outcomes, p, Limits { device: Some(limit), ..limits }) {
        outcomes.extend(simulate(mix));
    }
    if !outcomes.iter().any(|o| o.fits) {
        outcomes.extend(simulate(Lever::Full { method: RecomputeMethod::Uniform, num_layers: most_blocks }));
    }
    outcomes
}

/// The memory a plan must fit, per GPU: the device's, and the host's for offload.
#[derive(Clone, Copy, Debug)]
struct Limits {
    device: Option<u64>,
    host: Option<u64>,
}

/// Per stage, the smallest N of `family` (full block recompute or offload, 0: neither) among
/// the runs whose run fits `limits` on that stage; None for a stage no run fits. A stage's
/// peaks depend only on its own setting (its memory changes only at its own actions, in
/// list order), so the uniform runs tell each stage's peaks under any mix.
fn fitting_n_per_stage(outcomes: &[Outcome], p: usize, limits: Limits, family: &Lever) -> Vec<Option<usize>> {
    let fits = |o: &Outcome, r: usize| {
        limits.device.is_none_or(|l| o.peak_memory[r] <= l)
            && limits.host.is_none_or(|l| o.host_memory[r] <= l)
    };
    (0..p)
        .map(|r| {
            let mut runs: Vec<(usize, &Outcome)> =
                outcomes.iter().filter_map(|o| Some((o.lever.stage_n(family, r)?, o))).collect();
            runs.sort_by_key(|(n, _)| *n);
            runs.iter().find(|(_, o)| fits(o, r)).map(|(n, _)| *n)
        })
        .collect()
}

/// [`fitting_n_per_stage`] where every stage fits, unless one N suits every stage (already
/// a candidate).
fn smallest_fitting_n(outcomes: &[Outcome], p: usize, limits: Limits, family: &Lever) -> Option<Vec<usize>> {
    let ns = fitting_n_per_stage(outcomes, p, limits, family).into_iter().collect::<Option<Vec<usize>>>()?;
    (ns.iter().any(|&n| n != ns[0])).then_some(ns)
}

/// Offload of every module where a stage fits with it, full block recompute where only that
/// fits: the per-stage mix of the two families' runs, where both take part.
fn block_or_offload(outcomes: &[Outcome], p: usize, limits: Limits) -> Option<Lever> {
    let block = fitting_n_per_stage(outcomes, p, limits, &Lever::BlockPerStage(Vec::new()));
    let every = Lever::Offload { set: OffloadSet::Every, layers: Vec::new() };
    let offload = fitting_n_per_stage(outcomes, p, limits, &every);
    let (mut b, mut o) = (vec![0; p], vec![0; p]);
    for r in 0..p {
        match (offload[r], block[r]) {
            (Some(n), _) => o[r] = n,
            (None, Some(n)) => b[r] = n,
            (None, None) => return None,
        }
    }
    let both = b.iter().any(|&n| n > 0) && o.iter().any(|&n| n > 0);
    both.then_some(Lever::BlockOrOffload { block: b, offload: o })
}

pub fn print(outcomes: &[Outcome], limit: Option<u64>, top: Option<usize>) {
    let fitting = outcomes.iter().filter(|o| o.fits).count();
    match limit {
        Some(l) => println!(
            "{} candidates, {fitting} fit {} per device; fastest first",
            outcomes.len(),
            format_bytes(l)
        ),
        None => println!("{} candidates (no memory limit); fastest first", outcomes.len()),
    }
    print!("{}", table(outcomes.iter().take(top.unwrap_or(usize::MAX)), 1, ""));
}

/// The candidates as a table ranked from `first_rank`, each line after `prefix`.
fn table<'a>(outcomes: impl Iterator<Item = &'a Outcome> + Clone, first_rank: usize, prefix: &str) -> String {
    let width = outcomes.clone().map(|o| o.lever.describe().len()).max().unwrap_or(0).max(9);
    let mut out = format!(
        "{prefix}{:>4}  {:>2} {:>3} {:>4} {:>8}  {:16} {:>2} {:>4}  {:width$}  {:>11} {:>7} {:>6}  {:>12}  fits\n",
        "rank",
        "t",
        "p",
        "dp",
        "dist-opt",
        "schedule",
        "v",
        "mbs",
        "memory lever",
        "iteration",
        "bubble",
        "MFU",
        "peak memory"
    );
    for (i, o) in outcomes.enumerate() {
        let (t, p, dp) = o.layout();
        out += &format!(
            "{prefix}{:>4}  {t:>2} {p:>3} {dp:>4} {:>8}  {:16} {:>2} {:>4}  {:width$}  {:>11} {:>6.2}% {:>5.1}%  {:>12}  {}\n",
            first_rank + i,
            if o.cfg.use_distributed_optimizer { "yes" } else { "no" },
            o.kind.name(),
            o.v,
            o.micro_batch_size,
            o.lever.describe(),
            seconds(o.iteration_time),
            100.0 * o.bubble_rate,
            100.0 * o.mfu,
            format_bytes(o.max_peak()),
            if o.fits { "yes" } else { "no" }
        );
    }
    out
}

pub fn json(outcomes: &[Outcome], limit: Option<u64>) -> Value {
    let candidates: Vec<Value> = outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let (t, p, dp) = o.layout();
            json!({
                "rank": i + 1,
                "tensor_model_parallel_size": t,
                "pipeline_model_parallel_size": p,
                "data_parallel_size": dp,
                "use_distributed_optimizer": o.cfg.use_distributed_optimizer,
                "pipeline_schedule": o.kind.name(),
                "virtual_pipeline_model_parallel_size": o.v,
                "micro_batch_size": o.micro_batch_size,
                "memory_lever": o.lever.describe(),
                "stage_host_memory_bytes": o.host_memory,
                "iteration_time_ms": o.iteration_time * 1e3,
                "bubble_rate": o.bubble_rate,
                "tokens_per_s": o.tokens_per_s,
                "mfu": o.mfu,
                "peak_memory_bytes": o.max_peak(),
                "stage_peak_memory_bytes": o.peak_memory,
                "fits": o.fits,
            })
        })
        .collect();
    json!({"memory_limit_bytes": limit, "candidates": candidates})
}

/// The config lines of the fastest candidate that fits, with comments saying what it is
/// and each stage's peak, and the next `runners_up` that fit as a commented table. Every key
/// the plan decides is written, null where it must be unset, so pasting the lines over the
/// config's own gives exactly the plan.
pub fn plan_yaml(
    outcomes: &[Outcome],
    base: &Config,
    limit: Option<u64>,
    runners_up: usize,
) -> Option<String> {
    let mut fitting = outcomes.iter().filter(|o| o.fits);
    let best = fitting.next()?;
    let cfg = &best.cfg;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    let list = |v: &Option<Vec<RecomputeModule>>| {
        v.as_ref().map(|l| format!("[{}]", l.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")))
    };
    let fits = limit.map_or("no memory limit".into(), |l| format!("fits {} per device", format_bytes(l)));
    let mut lines = vec![
        format!("# pipetrain simulate --plan: the fastest of the sweep that {fits}"),
        format!(
            "# {}, v={}, micro batch {}, memory lever {}: iteration {}, bubble {:.2}%, MFU {:.1}%, peak {}",
            best.kind,
            best.v,
            best.micro_batch_size,
            best.lever.describe(),
            seconds(best.iteration_time),
            100.0 * best.bubble_rate,
            100.0 * best.mfu,
            format_bytes(best.max_peak())
        ),
        format!("# peak memory per stage: {}", stages_by_peak(&best.peak_memory)),
        format!("# memory levers: {}", lever_comment(best, outcomes)),
        format!("# optimizer: {}", optimizer_comment(best, outcomes, limit)),
        format!("tensor_model_parallel_size: {}", cfg.tensor_model_parallel_size),
        format!("sequence_parallel: {}", cfg.sequence_parallel),
        format!("pipeline_model_parallel_size: {}", cfg.pipeline_model_parallel_size),
        format!("data_parallel_size: {}", cfg.data_parallel()),
        format!("use_distributed_optimizer: {}", cfg.use_distributed_optimizer),
        format!("pipeline_schedule: {}", cfg.pipeline_schedule),
        format!(
            "virtual_pipeline_model_parallel_size: {}",
            opt(cfg.virtual_pipeline_model_parallel_size.map(|v| v.to_string()))
        ),
        format!("micro_batch_size: {}", cfg.micro_batch_size),
        format!("recompute_granularity: {}", opt(cfg.recompute_granularity.map(|g| g.name().to_string()))),
        format!("recompute_method: {}", opt(cfg.recompute_method.map(|m| m.name().to_string()))),
        format!("recompute_num_layers: {}", opt(cfg.recompute_num_layers.map(|n| n.to_string()))),
        format!("recompute_modules: {}", opt(list(&cfg.recompute_modules))),
        format!(
            "recompute_num_layers_per_stage: {}",
            opt(cfg.recompute_num_layers_per_stage.as_ref().map(|ns| format!("{ns:?}")))
        ),
        format!("fine_grained_activation_offloading: {}", cfg.fine_grained_activation_offloading),
        format!(
            "offload_modules: {}",
            opt(cfg
                .offload_modules
                .as_ref()
                .map(|l| format!("[{}]", l.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "))))
        ),
        format!("cpu_offloading_activations: {}", cfg.cpu_offloading_activations),
        format!(
            "offload_num_layers_per_stage: {}",
            opt(cfg.offload_num_layers_per_stage.as_ref().map(|ns| format!("{ns:?}")))
        ),
    ];
    if base.num_layers_per_stage.is_some() && cfg.num_layers_per_stage.is_none() {
        lines.push("num_layers_per_stage: null".into());
    }
    let rest: Vec<&Outcome> = fitting.take(runners_up).collect();
    let mut text = lines.join("\n") + "\n";
    if !rest.is_empty() {
        text += "# the runners-up that fit:\n";
        text += &table(rest.into_iter(), 2, "# ");
    }
    Some(text)
}

/// Why the plan's optimizer is sharded or whole: the same shape's other choice, where the
/// sweep simulated it, with its time and peak.
fn optimizer_comment(best: &Outcome, outcomes: &[Outcome], limit: Option<u64>) -> String {
    let chosen = if best.cfg.use_distributed_optimizer {
        "distributed over the replicas"
    } else {
        "whole on every replica"
    };
    let twin = ShapeKey { distributed_optimizer: !best.cfg.use_distributed_optimizer, ..best.shape() };
    // The other choice's best on this shape: the fastest that fits, else the fastest, with
    // the memory lever it needs (which the optimizer's bytes change).
    let other = (outcomes.iter().filter(|o| o.shape() == twin))
        .min_by(|a, b| (!a.fits, a.iteration_time).partial_cmp(&(!b.fits, b.iteration_time)).unwrap());
    match other {
        Some(other) => format!(
            "{chosen}; {} it would take iteration {} and peak {}{}{}",
            if other.cfg.use_distributed_optimizer { "distributed," } else { "whole," },
            seconds(other.iteration_time),
            format_bytes(other.max_peak()),
            match other.lever == best.lever {
                true => String::new(),
                false => format!(" with memory lever {}", other.lever.describe()),
            },
            if other.fits { "" } else { ", which does not fit" }
        ),
        None if best.cfg.data_parallel() == 1 => format!("{chosen} (one replica: nothing to shard)"),
        // The sweep simulates both choices of every shape, and the plan the other choice of
        // its own shape, unless what a stage holds all along exceeds the limit.
        None => format!(
            "{chosen}; whole, a stage's parameters, gradients and AdamW moments alone would exceed {}",
            limit.map_or("the memory limit".into(), format_bytes)
        ),
    }
}

/// Why the plan's memory lever: each stage's lever with its peaks, then the fastest
/// candidate of the same shape (layout, schedule, micro batch, optimizer) of each other kind
/// of lever (recompute, offload, neither), with its time and whether it fits.
fn lever_comment(best: &Outcome, outcomes: &[Outcome]) -> String {
    let what = |r: usize| best.lever.describe_stage(r);
    // Consecutive stages with the same lever share an entry, with their largest peaks.
    let mut runs: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    for r in 0..best.peak_memory.len() {
        match runs.last_mut() {
            Some((stages, w)) if *w == what(r) => stages.end = r + 1,
            _ => runs.push((r..r + 1, what(r))),
        }
    }
    let per_stage: Vec<String> = runs
        .into_iter()
        .map(|(stages, what)| {
            let most = |v: &[u64]| v[stages.clone()].iter().copied().max().unwrap_or(0);
            let host = match most(&best.host_memory) {
                0 => String::new(),
                bytes => format!(", host {}", format_bytes(bytes)),
            };
            let noun = if stages.len() == 1 { "stage" } else { "stages" };
            let (peak, label) = (most(&best.peak_memory), ranges(&stages.collect::<Vec<_>>()));
            format!("{noun} {label} {what} (peak {}{host})", format_bytes(peak))
        })
        .collect();
    let kind = |l: &Lever| match l {
        Lever::None => "neither",
        Lever::Offload { .. } | Lever::BlockOrOffload { .. } => "offload",
        _ => "recompute",
    };
    let same_shape = |o: &&Outcome| o.shape() == best.shape();
    let others: Vec<String> = ["neither", "recompute", "offload"]
        .into_iter()
        .filter(|&k| k != kind(&best.lever))
        .filter_map(|k| {
            let other =
                outcomes.iter().filter(same_shape).filter(|o| kind(&o.lever) == k).min_by(|a, b| {
                    (!a.fits, a.iteration_time).partial_cmp(&(!b.fits, b.iteration_time)).unwrap()
                })?;
            Some(format!(
                "{k}: {} would take iteration {}{}",
                other.lever.describe(),
                seconds(other.iteration_time),
                if other.fits { "" } else { " and does not fit" }
            ))
        })
        .collect();
    match others.is_empty() {
        true => per_stage.join("; "),
        false => format!("{}; against {}", per_stage.join("; "), others.join("; ")),
    }
}

/// The stages grouped by their peak as printed, in stage order: `0: 58.63 GiB; 1-4: 55.57 GiB`.
fn stages_by_peak(peaks: &[u64]) -> String {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (stage, &bytes) in peaks.iter().enumerate() {
        let shown = format_bytes(bytes);
        match groups.iter_mut().find(|(s, _)| *s == shown) {
            Some((_, stages)) => stages.push(stage),
            None => groups.push((shown, vec![stage])),
        }
    }
    groups.iter().map(|(shown, stages)| format!("{}: {shown}", ranges(stages))).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::setup::tests::gpt2_small;

    #[test]
    fn shapes_cover_schedules_and_power_of_two_micro_batches() {
        let base = Config { micro_batch_size: 3, ..gpt2_small(4, "1f1b", 1, 12) };
        let s = shapes(&base);
        assert!(s.contains(&(ScheduleKind::Interleaved1F1B, 4, 1)));
        assert!(
            s.contains(&(ScheduleKind::ZeroBubbleV, 2, 1)) && s.contains(&(ScheduleKind::DualPipeV, 2, 4))
        );
        assert!(!s.iter().any(|&(kind, v, _)| kind.is_v() && v != 2));
        let sizes: Vec<usize> =
            s.iter().filter(|(k, _, _)| *k == ScheduleKind::OneFOneB).map(|(_, _, b)| *b).collect();
        assert_eq!(sizes, [1, 2, 3, 4]);
    }

    #[test]
    fn per_stage_n_is_the_smallest_that_fits_each_stage() {
        let hw = Hardware::lookup("h100-sxm", crate::config::Precision::Fp32).unwrap();
        let base = gpt2_small(4, "1f1b", 1, 8);
        // Stage 0 holds 4 microbatches of h.0-h.3 (about 1.6 GiB of activations without
        // recompute), stage 2 holds 2 of h.8-h.11: a 1.5 GiB limit needs recompute early only.
        let limit = 3 << 29;
        let split = Split::new(&base, ScheduleKind::OneFOneB, 1).unwrap();
        let shape = Shape::new(&base, &split.layouts, &hw, ScheduleKind::OneFOneB, 1, 1).unwrap();
        let outcomes = shape_outcomes(&shape, &hw, Some(limit), Search::Everything);
        let per_stage = outcomes.iter().find(|o| matches!(o.lever, Lever::BlockPerStage(_))).unwrap();
        let Lever::BlockPerStage(ns) = &per_stage.lever else { unreachable!() };
        assert!(per_stage.fits);
        assert!(ns[0] > ns[2], "{ns:?}");
        for (r, &n) in ns.iter().enumerate() {
            let fewer = outcomes.iter().find(|o| match o.lever {
                Lever::None => n == 1,
                Lever::Full { method: RecomputeMethod::Block, num_layers } => num_layers + 1 == n,
                _ => false,
            });
            if let Some(o) = fewer {
                assert!(o.peak_memory[r] > limit, "stage {r} fits with fewer than {n}");
            }
        }
    }

    /// Offload per stage is found as recompute per stage is: each stage offloads the fewest
    /// layers with which it fits, the early stages (more microbatches in flight) more. At
    /// GPT-2 small's width the copies of the CPU core's probabilities outlast the compute, so
    /// recompute is faster here (tests/simulate_cli.rs has a model wide enough for the
    /// opposite). A host too small for the offload leaves it out.
    #[test]
    fn offload_per_stage_is_the_fewest_layers_that_fit_each_stage() {
        let hw = Hardware::lookup("h100-sxm", crate::config::Precision::Fp32).unwrap();
        let base = gpt2_small(4, "1f1b", 1, 8);
        let limit = 3 << 29;
        let split = Split::new(&base, ScheduleKind::OneFOneB, 1).unwrap();
        let shape = Shape::new(&base, &split.layouts, &hw, ScheduleKind::OneFOneB, 1, 1).unwrap();
        let outcomes = shape_outcomes(&shape, &hw, Some(limit), Search::Everything);
        let is_mix = |o: &&Outcome| matches!(&o.lever, Lever::Offload { set: OffloadSet::Every, layers: ns } if ns.iter().any(|&n| n != ns[0]));
        let mix = outcomes.iter().find(is_mix).unwrap();
        let Lever::Offload { layers: ns, .. } = &mix.lever else { unreachable!() };
        assert!(mix.fits && ns[0] > ns[3], "{ns:?}");
        for (r, &n) in ns.iter().enumerate().filter(|(_, &n)| n > 0) {
            let fewer = outcomes.iter().find(|o| match &o.lever {
                Lever::None => n == 1,
                Lever::Offload { set: OffloadSet::Every, layers: us } => us.iter().all(|&u| u + 1 == n),
                _ => false,
            });
            assert!(fewer.unwrap().peak_memory[r] > limit, "stage {r} fits with fewer than {n}");
            assert!(mix.host_memory[r] > 0);
        }
        let fastest = |offload: bool| {
            outcomes
                .iter()
                .filter(|o| o.fits && matches!(o.lever, Lever::Offload { .. }) == offload)
                .map(|o| o.iteration_time)
                .fold(f64::INFINITY, f64::min)
        };
        assert!(fastest(true) > fastest(false), "{} vs {}", fastest(true), fastest(false));
        let tiny_host = Hardware { host_memory_bytes: Some(1 << 20), ..hw };
        let outcomes = shape_outcomes(&shape, &tiny_host, Some(limit), Search::Everything);
        assert!(outcomes.iter().all(|o| !o.fits || o.host_memory.iter().all(|&b| b <= 1 << 20)));
        assert!(outcomes.iter().any(|o| matches!(o.lever, Lever::Offload { .. }) && !o.fits));
    }

    /// Recompute per stage applies to a V as to the others, each stage's one policy covering
    /// both its chunks. GPT-2 small at 24 layers on 4 stages under DualPipeV, bf16 on GPUs
    /// (fused attention), in 2.25 GiB: stage 0, holding both ends of the model, needs 3 blocks
    /// recomputed; the others fit with none.
    #[test]
    fn per_stage_n_on_a_v() {
        let hw = Hardware::lookup("h100-sxm", crate::config::Precision::Bf16).unwrap();
        let base = Config {
            num_layers: 24,
            precision: crate::config::Precision::Bf16,
            device: crate::config::DeviceKind::Cuda,
            ..gpt2_small(4, "1f1b", 1, 8)
        };
        let limit = 9 << 28;
        let split = Split::new(&base, ScheduleKind::DualPipeV, 2).unwrap();
        let shape = Shape::new(&base, &split.layouts, &hw, ScheduleKind::DualPipeV, 2, 1).unwrap();
        let outcomes = shape_outcomes(&shape, &hw, Some(limit), Search::Everything);
        let per_stage = outcomes.iter().find(|o| matches!(o.lever, Lever::BlockPerStage(_))).unwrap();
        assert_eq!(per_stage.lever, Lever::BlockPerStage(vec![3, 0, 0, 0]));
        assert!(per_stage.fits, "{:?}", per_stage.peak_memory);
        // Two blocks do not fit stage 0; stages 1-3 fit with none.
        let peaks = |lever: Lever| &outcomes.iter().find(|o| o.lever == lever).unwrap().peak_memory;
        let (none, two) =
            (peaks(Lever::None), peaks(Lever::Full { method: RecomputeMethod::Block, num_layers: 2 }));
        assert!(
            two[0] > limit && none[0] > limit && none[1..].iter().all(|&b| b <= limit),
            "{none:?} {two:?}"
        );
    }

    /// A V places virtual stages 0 and 2p-1 on stage 0: the embedding and the head (each with
    /// its copy of the tied wte) share one GPU. The floor the planner prunes by is the static
    /// memory `simulate` reports for that schedule, not the interleaved placement's.
    #[test]
    fn a_v_split_floors_at_stage_0_holding_both_ends() {
        let base = gpt2_small(2, "1f1b", 1, 8);
        let v_split = Split::new(&base, ScheduleKind::ZeroBubbleV, 2).unwrap();
        let interleaved = Split::new(&base, ScheduleKind::Interleaved1F1B, 2).unwrap();
        let blocks: Vec<usize> = v_split.layouts.iter().map(|l| l.blocks.len()).collect();
        // The head (a [C, V] matmul and the loss) weighs as much as 4 blocks: a chunk alone.
        assert_eq!(blocks, [4, 4, 4, 0]);
        assert_eq!(interleaved.layouts, v_split.layouts);

        // Bytes per parameter: fp32 weight, gradient and two AdamW moments.
        let (c, vocab, positions) = (768u64, 50257u64, 1024u64);
        let block = 12 * c * c + 13 * c;
        let embedding = vocab * c + positions * c;
        let head = vocab * c + 2 * c;
        let v_stages = [16 * (embedding + 4 * block + head), 16 * (8 * block)];
        assert_eq!(v_split.static_floor, v_stages[0]);
        assert_eq!(v_split.static_floor, 1_701_347_328);
        // Interleaved, stage 0 holds virtual stages 0 and 2, stage 1 virtual stages 1 and 3
        // (the head): a lower floor, which a V would have been pruned by.
        let interleaved_stages = [16 * (embedding + 8 * block), 16 * (4 * block + head)];
        assert_eq!(interleaved.static_floor, interleaved_stages[0]);
        assert!(interleaved.static_floor < v_split.static_floor);

        for kind in ["zb-v", "dualpipe-v"] {
            let simulated = Setup::new(&gpt2_small(2, kind, 1, 8)).unwrap();
            let reported: Vec<u64> = (0..2).map(|r| stage_static_bytes(&simulated, r)).collect();
            assert_eq!(reported, v_stages, "{kind}");
        }
    }

    /// GPT-3 175B on Korthikanti et al.'s 64 A100s (t = 8, p = 8, a global batch of 64):
    /// DualPipeV's bubble, under 1%, beats every other schedule, and it fits 80 GiB without
    /// recompute. Its config lines, pasted over the config, simulate to the planner's very
    /// iteration time and per-stage peaks.
    #[test]
    fn the_plan_is_a_v_and_its_lines_simulate_to_its_figures() {
        let dir = std::env::temp_dir().join(format!("pipetrain-plan-v-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/gpt3-175b.yaml");
        let base = crate::config::load(&config, &[]).unwrap();
        let hw = Hardware::lookup("a100-80gb", base.precision).unwrap();
        let limit = hw.memory_bytes;
        let outcomes = sweep(std::slice::from_ref(&base), &hw, limit, Search::Plan { fitting: 6 });
        let best = outcomes.iter().find(|o| o.fits).unwrap();
        assert_eq!(
            (best.kind, best.micro_batch_size, &best.lever),
            (ScheduleKind::DualPipeV, 1, &Lever::None)
        );
        assert!(outcomes.iter().any(|o| o.fits && !o.kind.is_v()), "the V beat others that fit");

        let lines = plan_yaml(&outcomes, &base, limit, 5).unwrap();
        let peaks = "0: 58.63 GiB; 1-4: 55.57 GiB; 5: 55.99 GiB; 6: 56.97 GiB; 7: 57.95 GiB";
        assert!(lines.contains(&format!("\n# peak memory per stage: {peaks}\n")), "{lines}");
        let mut merged: serde_norway::Mapping =
            serde_norway::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
        let planned: serde_norway::Mapping = serde_norway::from_str(&lines).unwrap();
        merged.extend(planned);
        let applied = dir.join("planned.yaml");
        std::fs::write(&applied, serde_norway::to_string(&merged).unwrap()).unwrap();

        // What `simulate --config planned.yaml` runs.
        let cfg = crate::config::load(&applied, &[]).unwrap();
        let setup = Setup::new(&cfg).unwrap();
        let sim = input::run(&setup, &from_hardware(&setup, &hw)).unwrap();
        let peaks: Vec<u64> = sim.stages.iter().map(|s| s.peak_memory).collect();
        assert_eq!(setup.kind, ScheduleKind::DualPipeV);
        assert_eq!(sim.iteration_time, best.iteration_time);
        assert_eq!(peaks, best.peak_memory);
        assert!(peaks.iter().all(|&b| b <= limit.unwrap()), "{peaks:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
