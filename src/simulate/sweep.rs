//! `--sweep` and `--plan`: every schedule x recompute setting x micro batch size of a config,
//! simulated and ranked by iteration time, each marked by whether every stage fits the
//! memory limit; the plan is the fastest that fits, as config lines.
//!
//! Schedules: gpipe, 1f1b, zb-h1, and interleaved-1f1b with v in {2, 4} (and the config's
//! own v) where the shape allows. Micro batch sizes: the powers of two that divide the global
//! batch (and the config's own). Recompute: none; selective core_attn; selective
//! core_attn + mlp; full uniform and full block with N = 1 .. the most blocks of a chunk;
//! and, per stage, the smallest full-block N with which that stage fits (1F1B's early
//! stages hold more microbatches, so they need more recompute than later ones).
//!
//! One schedule is generated and lowered per (schedule, v, micro batch size) and simulated
//! under every recompute setting; the shapes run in parallel.

use super::durations::from_hardware;
use super::hardware::Hardware;
use super::input;
use super::report::seconds;
use super::setup::Setup;
use super::units::format_bytes;
use crate::config::Config;
use rayon::prelude::*;
use schedules::{generate, lower, ScheduleKind};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// A recompute setting, as config keys.
#[derive(Clone, Debug, PartialEq)]
pub enum Recompute {
    None,
    Selective(Vec<&'static str>),
    Full {
        method: &'static str,
        num_layers: usize,
    },
    /// Full block recompute with N per stage (0: none).
    BlockPerStage(Vec<usize>),
}

impl Recompute {
    fn apply(&self, cfg: &mut Config) {
        cfg.recompute_granularity = None;
        cfg.recompute_method = None;
        cfg.recompute_num_layers = None;
        cfg.recompute_modules = None;
        cfg.recompute_num_layers_per_stage = None;
        match self {
            Recompute::None => {}
            Recompute::Selective(modules) => {
                cfg.recompute_granularity = Some("selective".into());
                cfg.recompute_modules = Some(modules.iter().map(|m| m.to_string()).collect());
            }
            Recompute::Full { method, num_layers } => {
                cfg.recompute_granularity = Some("full".into());
                cfg.recompute_method = Some(method.to_string());
                cfg.recompute_num_layers = Some(*num_layers);
            }
            Recompute::BlockPerStage(ns) => {
                cfg.recompute_granularity = Some("full".into());
                cfg.recompute_method = Some("block".into());
                cfg.recompute_num_layers_per_stage = Some(ns.clone());
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Recompute::None => "none".into(),
            Recompute::Selective(m) => format!("selective {}", m.join("+")),
            Recompute::Full { method, num_layers } => format!("full/{method} N={num_layers}"),
            Recompute::BlockPerStage(ns) => {
                format!(
                    "full/block N per stage {}",
                    ns.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
                )
            }
        }
    }
}

/// One simulated candidate.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub kind: ScheduleKind,
    pub v: usize,
    pub micro_batch_size: usize,
    pub recompute: Recompute,
    pub iteration_time: f64,
    pub bubble_rate: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    /// Per stage.
    pub peak_memory: Vec<u64>,
    pub fits: bool,
}

impl Outcome {
    pub fn max_peak(&self) -> u64 {
        self.peak_memory.iter().copied().max().unwrap_or(0)
    }

    /// The config with this candidate's settings.
    fn config(&self, base: &Config) -> Config {
        let mut cfg = base.clone();
        shape_config(&mut cfg, base, self.kind, self.v, self.micro_batch_size);
        self.recompute.apply(&mut cfg);
        cfg
    }
}

/// Sets the schedule, v and micro batch size; an explicit split only applies to the v it
/// was written for.
fn shape_config(cfg: &mut Config, base: &Config, kind: ScheduleKind, v: usize, micro_batch_size: usize) {
    cfg.pipeline_schedule = kind.name().into();
    cfg.virtual_pipeline_model_parallel_size = (v > 1).then_some(v);
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
        let vs = if kind == ScheduleKind::Interleaved1F1B { interleave.clone() } else { vec![1] };
        for v in vs {
            for &b in &sizes {
                out.push((kind, v, b));
            }
        }
    }
    out
}

/// Simulates every candidate of `base` on `hw`; sorted fastest first.
pub fn sweep(base: &Config, path: &Path, hw: &Hardware, limit: Option<u64>) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = shapes(base)
        .into_par_iter()
        .flat_map_iter(|(kind, v, mbs)| shape_outcomes(base, path, hw, limit, kind, v, mbs))
        .collect();
    outcomes
        .sort_by(|a, b| a.iteration_time.total_cmp(&b.iteration_time).then(a.max_peak().cmp(&b.max_peak())));
    outcomes
}

/// Every recompute setting on one shape; nothing when the shape is impossible.
fn shape_outcomes(
    base: &Config,
    path: &Path,
    hw: &Hardware,
    limit: Option<u64>,
    kind: ScheduleKind,
    v: usize,
    mbs: usize,
) -> Vec<Outcome> {
    let mut cfg = base.clone();
    shape_config(&mut cfg, base, kind, v, mbs);
    Recompute::None.apply(&mut cfg);
    if cfg.validate().is_err() {
        return Vec::new();
    }
    let (p, m) = (cfg.pipeline_model_parallel_size, cfg.num_microbatches());
    let Ok(schedule) = generate(kind, p, v, m).and_then(|s| lower(&s)) else {
        return Vec::new();
    };
    let Ok(setup) = Setup::with_schedule(&cfg, path, kind, Arc::new(schedule)) else {
        return Vec::new();
    };
    let most_blocks = setup.layouts.iter().map(|l| l.blocks.len()).max().unwrap_or(0);
    let mut settings = vec![
        Recompute::None,
        Recompute::Selective(vec!["core_attn"]),
        Recompute::Selective(vec!["core_attn", "mlp"]),
    ];
    for method in ["uniform", "block"] {
        settings.extend((1..=most_blocks).map(|num_layers| Recompute::Full { method, num_layers }));
    }
    let simulate = |recompute: Recompute| {
        let mut c = cfg.clone();
        recompute.apply(&mut c);
        c.validate().ok()?;
        let s = setup.with_recompute(&c);
        let sim = input::run(&s, &from_hardware(&s, hw)).ok()?;
        let peak_memory: Vec<u64> = sim.stages.iter().map(|st| st.peak_memory).collect();
        Some(Outcome {
            kind,
            v,
            micro_batch_size: mbs,
            recompute,
            iteration_time: sim.iteration_time,
            bubble_rate: sim.bubble_rate,
            tokens_per_s: sim.tokens_per_second(s.tokens_per_iteration()),
            mfu: super::report::mfu(&s, &sim, hw),
            fits: limit.is_none_or(|l| peak_memory.iter().all(|&b| b <= l)),
            peak_memory,
        })
    };
    let mut outcomes: Vec<Outcome> = settings.into_iter().filter_map(simulate).collect();
    if let Some(per_stage) = limit.and_then(|l| smallest_fitting_block_n(&outcomes, p, l)) {
        outcomes.extend(simulate(Recompute::BlockPerStage(per_stage)));
    }
    outcomes
}

/// Per stage, the smallest full-block N (0: no recompute) whose run fits `limit` on that
/// stage. A stage's peak depends only on its own policy (its memory changes only at its own
/// actions, in list order), so the uniform runs tell each stage's peak under any mix. None
/// if some stage never fits or one N suits every stage (already a candidate).
fn smallest_fitting_block_n(outcomes: &[Outcome], p: usize, limit: u64) -> Option<Vec<usize>> {
    let by_n = |n: usize| {
        outcomes.iter().find(|o| match &o.recompute {
            Recompute::None => n == 0,
            Recompute::Full { method: "block", num_layers } => *num_layers == n,
            _ => false,
        })
    };
    let ns = (0..p)
        .map(|r| (0..).map_while(by_n).position(|o| o.peak_memory[r] <= limit))
        .collect::<Option<Vec<usize>>>()?;
    (ns.iter().any(|&n| n != ns[0])).then_some(ns)
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
    let width = outcomes.iter().map(|o| o.recompute.describe().len()).max().unwrap_or(0).max(9);
    println!(
        "{:>4}  {:16} {:>2} {:>4}  {:width$}  {:>11} {:>7} {:>6}  {:>12}  fits",
        "rank", "schedule", "v", "mbs", "recompute", "iteration", "bubble", "MFU", "peak memory"
    );
    for (i, o) in outcomes.iter().take(top.unwrap_or(usize::MAX)).enumerate() {
        println!(
            "{:>4}  {:16} {:>2} {:>4}  {:width$}  {:>11} {:>6.2}% {:>5.1}%  {:>12}  {}",
            i + 1,
            o.kind.name(),
            o.v,
            o.micro_batch_size,
            o.recompute.describe(),
            seconds(o.iteration_time),
            100.0 * o.bubble_rate,
            100.0 * o.mfu,
            format_bytes(o.max_peak()),
            if o.fits { "yes" } else { "no" }
        );
    }
}

pub fn json(outcomes: &[Outcome], limit: Option<u64>) -> Value {
    let candidates: Vec<Value> = outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            json!({
                "rank": i + 1,
                "pipeline_schedule": o.kind.name(),
                "virtual_pipeline_model_parallel_size": o.v,
                "micro_batch_size": o.micro_batch_size,
                "recompute": o.recompute.describe(),
                "iteration_time_ms": o.iteration_time * 1e3,
                "bubble_rate": o.bubble_rate,
                "tokens_per_s": o.tokens_per_s,
                "mfu": o.mfu,
                "peak_memory_bytes": o.max_peak(),
                "fits": o.fits,
            })
        })
        .collect();
    json!({"memory_limit_bytes": limit, "candidates": candidates})
}

/// The config lines of `best` (the fastest that fits), with comments saying what it is.
/// Every key the plan decides is written, null where it must be unset, so pasting the lines
/// over the config's own gives exactly the plan.
pub fn plan_yaml(best: &Outcome, base: &Config, limit: Option<u64>) -> String {
    let cfg = best.config(base);
    let opt = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    let list = |v: &Option<Vec<String>>| v.as_ref().map(|l| format!("[{}]", l.join(", ")));
    let fits = limit.map_or("no memory limit".into(), |l| format!("fits {} per device", format_bytes(l)));
    let mut lines = vec![
        format!("# pipetrain simulate --plan: the fastest of the sweep that {fits}"),
        format!(
            "# {}, v={}, micro batch {}, recompute {}: iteration {}, bubble {:.2}%, MFU {:.1}%, peak {}",
            best.kind,
            best.v,
            best.micro_batch_size,
            best.recompute.describe(),
            seconds(best.iteration_time),
            100.0 * best.bubble_rate,
            100.0 * best.mfu,
            format_bytes(best.max_peak())
        ),
        format!("pipeline_schedule: {}", cfg.pipeline_schedule),
        format!(
            "virtual_pipeline_model_parallel_size: {}",
            opt(cfg.virtual_pipeline_model_parallel_size.map(|v| v.to_string()))
        ),
        format!("micro_batch_size: {}", cfg.micro_batch_size),
        format!("recompute_granularity: {}", opt(cfg.recompute_granularity.clone())),
        format!("recompute_method: {}", opt(cfg.recompute_method.clone())),
        format!("recompute_num_layers: {}", opt(cfg.recompute_num_layers.map(|n| n.to_string()))),
        format!("recompute_modules: {}", opt(list(&cfg.recompute_modules))),
        format!(
            "recompute_num_layers_per_stage: {}",
            opt(cfg.recompute_num_layers_per_stage.as_ref().map(|ns| format!("{ns:?}")))
        ),
    ];
    if base.num_layers_per_stage.is_some() && cfg.num_layers_per_stage.is_none() {
        lines.push("num_layers_per_stage: null".into());
    }
    lines.join("\n") + "\n"
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
        let sizes: Vec<usize> =
            s.iter().filter(|(k, _, _)| *k == ScheduleKind::OneFOneB).map(|(_, _, b)| *b).collect();
        assert_eq!(sizes, [1, 2, 3, 4]);
    }

    #[test]
    fn per_stage_n_is_the_smallest_that_fits_each_stage() {
        let hw = Hardware::lookup("h100-sxm", "fp32").unwrap();
        let base = gpt2_small(4, "1f1b", 1, 8);
        // Stage 0 holds 4 microbatches of h.0-h.3 (about 1.6 GiB of activations without
        // recompute), stage 2 holds 2 of h.8-h.11: a 1.5 GiB limit needs recompute early only.
        let limit = 3 << 29;
        let outcomes =
            shape_outcomes(&base, Path::new("c.yaml"), &hw, Some(limit), ScheduleKind::OneFOneB, 1, 1);
        let per_stage = outcomes.iter().find(|o| matches!(o.recompute, Recompute::BlockPerStage(_))).unwrap();
        let Recompute::BlockPerStage(ns) = &per_stage.recompute else { unreachable!() };
        assert!(per_stage.fits);
        assert!(ns[0] > ns[2], "{ns:?}");
        for (r, &n) in ns.iter().enumerate() {
            let fewer = outcomes.iter().find(|o| match o.recompute {
                Recompute::None => n == 1,
                Recompute::Full { method: "block", num_layers } => num_layers + 1 == n,
                _ => false,
            });
            if let Some(o) = fewer {
                assert!(o.peak_memory[r] > limit, "stage {r} fits with fewer than {n}");
            }
        }
    }
}
