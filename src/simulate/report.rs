//! The simulation report: printed for people, or one JSON object for scripts.

use super::durations::{Durations, P2p};
use super::hardware::Hardware;
use super::input::message_bytes;
use super::korthikanti::{self, Kept};
use super::setup::Setup;
use super::units::{format_bytes, format_rate};
use kernels::DType;
use schedules::SimReport;
use serde_json::{json, Value};
use stages::flops::train_step_flops;
use stages::memory_model::{block_offload_groups, tally_groups};
use stages::saved::block_kept_bytes;
use stages::ModelShape;

pub struct Report<'a> {
    pub setup: &'a Setup,
    pub hw: &'a Hardware,
    pub durations: &'a Durations,
    pub sim: &'a SimReport,
    /// Where the op times came from: `hardware`, `op-times` or `measured`.
    pub times_from: &'a str,
    pub memory_limit: Option<u64>,
}

impl Report<'_> {
    pub fn tokens_per_second(&self) -> f64 {
        self.sim.tokens_per_second(self.setup.tokens_per_iteration())
    }

    /// Model FLOPs (no recompute) over the peak of the GPUs: one replica's FLOPs over its t
    /// x p GPUs (every replica does the same).
    pub fn mfu(&self) -> f64 {
        mfu(self.setup, self.sim, self.hw)
    }

    /// One layer's activation bytes on one GPU of stage `stage` (its blocks' average), and
    /// the paper's figure for the same case with what tells them apart at 16 bits (see
    /// korthikanti.rs).
    fn layer_bytes(&self, stage: usize) -> (f64, Option<Korthikanti>) {
        let setup = self.setup;
        let (s, tp) = (&setup.shape, setup.tp);
        let policy = &setup.policies[stage];
        let blocks: usize = (0..setup.v).map(|c| setup.layout(stage, c).blocks.len()).sum();
        let per_layer = |s: &ModelShape| {
            let kept: usize = (0..setup.v)
                .map(|c| {
                    let n = setup.layout(stage, c).blocks.len();
                    (0..n).map(|o| block_kept_bytes(s, tp, policy.block_keep(n, o))).sum::<usize>()
                })
                .sum();
            kept as f64 / blocks.max(1) as f64
        };
        let paper = Kept::of(policy).filter(|_| blocks > 0).map(|k| Korthikanti {
            ours_16bit: per_layer(&ModelShape { activations: DType::Bf16, ..*s }),
            bytes: korthikanti::layer_bytes(s, tp, k),
            masks: korthikanti::mask_bytes(s, tp, k) as f64,
            statistics: korthikanti::statistics_bytes(s, tp, k) as f64,
            fused: korthikanti::fused_core_bytes(s, tp, k),
        });
        (per_layer(s), paper)
    }

    fn fits(&self, stage: usize) -> bool {
        self.memory_limit.is_none_or(|limit| self.sim.stages[stage].peak_memory <= limit)
    }

    /// Seconds of one microbatch's passes on a stage, its chunks summed: F, B, W, R.
    fn stage_times(&self, stage: usize) -> [f64; 4] {
        let v = self.setup.v;
        self.durations.chunks[stage * v..(stage + 1) * v].iter().fold([0.0; 4], |t, c| {
            [t[0] + c.forward, t[1] + c.backward_input, t[2] + c.backward_weight, t[3] + c.recompute]
        })
    }

    /// Seconds one message takes on an idle link.
    fn p2p_seconds(&self) -> f64 {
        match self.durations.p2p {
            P2p::Link { latency, bandwidth } => latency + message_bytes(self.setup) as f64 / bandwidth,
            P2p::PerMessage(t) => t,
        }
    }

    pub fn print(&self) {
        let (s, c) = (&self.setup.shape, &self.setup.cfg);
        let setup = self.setup;
        println!(
            "model     {} layers, hidden {}, {} heads, ffn {}, seq {}, vocab {}: {:.2}B parameters; {} activations",
            s.num_layers,
            s.hidden,
            s.heads,
            s.ffn,
            s.seq_len,
            s.vocab,
            stages::params::total_params(s) as f64 / 1e9,
            c.precision
        );
        if s.naming() != stages::Naming::Gpt2 {
            println!("          {}", s.describe_architecture());
        }
        println!(
            "pipeline  {}: {} stages x {} chunk(s), {} microbatches of {} per replica (global batch {})",
            setup.kind, setup.p, setup.v, setup.m, c.micro_batch_size, c.global_batch_size
        );
        for alias in &c.aliases {
            println!("config    {}", alias.describe());
        }
        println!(
            "parallel  tensor {}{} x pipeline {} x data {} = {} GPUs; time and memory below are one GPU's",
            setup.tp.size,
            if setup.tp.sequence && setup.tp.size > 1 { " (sequence parallel)" } else { "" },
            setup.p,
            setup.dp,
            setup.world_size()
        );
        println!("hardware  {}", self.hw.describe());
        println!(
            "times     from {}; p2p {:.3} ms per {} message; per microbatch below, chunks summed (ms); optimizer per step",
            self.times_from,
            self.p2p_seconds() * 1e3,
            format_bytes(message_bytes(setup))
        );
        println!();
        let width = (0..setup.p).map(|r| setup.stage_layers(r).len()).max().unwrap_or(0).max(6);
        let rwidth = setup.policies.iter().map(|p| p.describe().len()).max().unwrap_or(0).max(9);
        println!(
            "stage  {:width$}  {:rwidth$}  {:>9} {:>9} {:>9} {:>8} {:>9}  {:>12}  {:>6}  {:>10}",
            "layers",
            "recompute",
            "forward",
            "bwd-in",
            "bwd-w",
            "recomp",
            "optimizer",
            "peak memory",
            "busy",
            "idle"
        );
        for (r, st) in self.sim.stages.iter().enumerate() {
            let t = self.stage_times(r).map(|x| x * 1e3);
            let over = if self.fits(r) { "" } else { "  over the limit" };
            println!(
                "{r:>5}  {:width$}  {:rwidth$}  {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>9.2}  {:>12}  {:>5.1}%  {:>10}{over}",
                setup.stage_layers(r),
                setup.policies[r].describe(),
                t[0],
                t[1],
                t[2],
                t[3],
                st.optimizer * 1e3,
                format_bytes(st.peak_memory),
                100.0 * st.busy / self.sim.iteration_time,
                seconds(st.idle),
            );
        }
        println!();
        self.print_layer_bytes();
        println!();
        println!(
            "iteration {}   bubble {:.2}%   tokens/s {:.0}   MFU {:.1}% of {} x {}",
            seconds(self.sim.iteration_time),
            100.0 * self.sim.bubble_rate,
            self.tokens_per_second(),
            100.0 * self.mfu(),
            setup.world_size(),
            format_rate(self.hw.peak_flops, "FLOP")
        );
        if self.sim.stages.iter().any(|st| st.peak_host > 0) {
            let per_stage: Vec<String> =
                self.sim.stages.iter().map(|st| format_bytes(st.peak_host)).collect();
            println!(
                "host      offloaded activations per stage: {} (of {} per GPU)",
                per_stage.join(", "),
                self.hw.host_memory_bytes.map_or("the device's memory".into(), format_bytes)
            );
            self.print_offload_groups();
        }
        if let Some(limit) = self.memory_limit {
            let over: Vec<usize> = (0..setup.p).filter(|&r| !self.fits(r)).collect();
            if over.is_empty() {
                println!("memory    every stage fits {}", format_bytes(limit));
            } else {
                println!("memory    stage(s) {} exceed {}", ranges(&over), format_bytes(limit));
            }
        }
    }

    /// The bytes a microbatch moves from stage `r` to host memory and back, by tensor group,
    /// summed over the stage's chunks and layers.
    fn offload_groups(&self, r: usize) -> Vec<(&'static str, usize)> {
        let setup = self.setup;
        let lever = (&setup.policies[r], &setup.offloads[r]);
        let blocks = (0..setup.v).flat_map(|c| {
            let blocks = setup.layout(r, c).blocks.len();
            (0..blocks).map(move |o| (blocks, o))
        });
        tally_groups(
            blocks.flat_map(|(blocks, o)| block_offload_groups(&setup.shape, setup.tp, lever, blocks, o)),
        )
    }

    /// [`Report::offload_groups`] of every stage; stages with the same figures share a line.
    fn print_offload_groups(&self) {
        let mut lines: Vec<(Vec<usize>, String)> = Vec::new();
        for r in 0..self.setup.p {
            let groups = self.offload_groups(r);
            let line = match groups.is_empty() {
                true => "nothing".to_string(),
                false => groups
                    .iter()
                    .map(|(g, b)| format!("{g} {}", format_bytes(*b as u64)))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            match lines.last_mut() {
                Some((stages, last)) if *last == line => stages.push(r),
                _ => lines.push((vec![r], line)),
            }
        }
        println!("          moved out and back per microbatch, by tensor group:");
        for (stages, line) in lines {
            println!("  stage {}: {line}", ranges(&stages));
        }
    }

    /// Per stage, one layer's activations on one GPU beside Korthikanti et al.'s figure.
    fn print_layer_bytes(&self) {
        println!(
            "activations per layer and microbatch on one GPU ({} bytes per activation element, f32 statistics), against Korthikanti et al. 2022, Table 2",
            self.setup.activation_bytes_per_element()
        );
        println!("  (at 16 bits; the paper stores 1-byte dropout masks, which we regenerate, and no norm statistics, which we keep in fp32)");
        let differences = korthikanti::differences(&self.setup.shape);
        if !differences.is_empty() {
            println!("  (the paper's GPT formula at this model's widths: {})", differences.join("; "));
        }
        // Stages with the same figures share a line.
        let mut lines: Vec<(Vec<usize>, String)> = Vec::new();
        for r in 0..self.setup.p {
            let (ours, paper) = self.layer_bytes(r);
            let holds_blocks = (0..self.setup.v).any(|c| !self.setup.layout(r, c).blocks.is_empty());
            let line = match paper {
                _ if !holds_blocks => "no transformer layer".to_string(),
                Some(k) => format!(
                    "{}{} + masks {} - statistics {}{} = {}; paper {}",
                    format_bytes(ours as u64),
                    if ours == k.ours_16bit {
                        String::new()
                    } else {
                        format!(", {} at 16 bits", format_bytes(k.ours_16bit as u64))
                    },
                    format_bytes(k.masks as u64),
                    format_bytes(k.statistics as u64),
                    match k.fused {
                        (0, _) => String::new(),
                        (lse, core) => format!(
                            " - log-sum-exp {} + attention core {} (fused: never stored)",
                            format_bytes(lse as u64),
                            format_bytes(core as u64)
                        ),
                    },
                    format_bytes(
                        (k.ours_16bit + k.masks - k.statistics - k.fused.0 as f64 + k.fused.1 as f64) as u64
                    ),
                    format_bytes(k.bytes as u64)
                ),
                None => {
                    format!("{} (the paper gives no figure for this recompute)", format_bytes(ours as u64))
                }
            };
            match lines.last_mut() {
                Some((stages, last)) if *last == line => stages.push(r),
                _ => lines.push((vec![r], line)),
            }
        }
        for (stages, line) in lines {
            println!("  stage {}: {line}", ranges(&stages));
        }
    }

    pub fn json(&self) -> Value {
        let setup = self.setup;
        let c = &setup.cfg;
        let stages: Vec<Value> = self
            .sim
            .stages
            .iter()
            .enumerate()
            .map(|(r, st)| {
                let t = self.stage_times(r).map(|x| x * 1e3);
                let (layer, paper) = self.layer_bytes(r);
                json!({
                    "layer_activation_bytes": layer,
                    "korthikanti_layer_bytes": paper.map(|k| k.bytes),
                    "stage": r,
                    "layers": setup.stage_layers(r),
                    "recompute": setup.policies[r].describe(),
                    "offload": setup.offloads[r].describe(),
                    "peak_memory_bytes": st.peak_memory,
                    "host_peak_bytes": st.peak_host,
                    "offloaded_bytes_by_group": self.offload_groups(r).into_iter()
                        .map(|(group, bytes)| json!({"group": group, "bytes": bytes}))
                        .collect::<Vec<_>>(),
                    "static_bytes": super::memory::stage_static_bytes(setup, r),
                    "busy_ms": st.busy * 1e3,
                    "idle_ms": st.idle * 1e3,
                    "forward_ms": t[0],
                    "backward_input_ms": t[1],
                    "backward_weight_ms": t[2],
                    "recompute_ms": t[3],
                    "optimizer_ms": st.optimizer * 1e3,
                    "fits": self.fits(r),
                })
            })
            .collect();
        json!({
            "iteration_time_ms": self.sim.iteration_time * 1e3,
            "bubble_rate": self.sim.bubble_rate,
            "tokens_per_s": self.tokens_per_second(),
            "mfu": self.mfu(),
            "pipeline_schedule": setup.kind.name(),
            "pipeline_model_parallel_size": setup.p,
            "tensor_model_parallel_size": setup.tp.size,
            "sequence_parallel": setup.tp.sequence,
            "data_parallel_size": setup.dp,
            "world_size": setup.world_size(),
            "virtual_pipeline_model_parallel_size": setup.v,
            "microbatches": setup.m,
            "micro_batch_size": c.micro_batch_size,
            "global_batch_size": c.global_batch_size,
            "precision": c.precision.to_string(),
            "parameters": stages::params::total_params(&setup.shape),
            "hardware": self.hw.name,
            "peak_flops": self.hw.peak_flops,
            "times_from": self.times_from,
            "config_aliases": c.aliases,
            "p2p_ms": self.p2p_seconds() * 1e3,
            "memory_limit_bytes": self.memory_limit,
            "fits": (0..setup.p).all(|r| self.fits(r)),
            "stages": stages,
        })
    }
}

/// Korthikanti et al.'s bytes per layer, ours at their 16 bits, and the two terms that tell
/// them apart.
struct Korthikanti {
    ours_16bit: f64,
    bytes: f64,
    masks: f64,
    statistics: f64,
    /// (log-sum-exp kept, attention core not stored) by a fused core; zeros otherwise.
    fused: (usize, usize),
}

/// Model FLOPs (no recompute) of one replica over the peak of its t x p GPUs.
pub fn mfu(setup: &Setup, sim: &SimReport, hw: &Hardware) -> f64 {
    sim.mfu(train_step_flops(&setup.shape, setup.m), hw.peak_flops * setup.tp.size as f64)
}

/// Sorted numbers as runs: `0-3, 5, 7-8`.
pub fn ranges(xs: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &x in xs {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == x => *end = x,
            _ => runs.push((x, x)),
        }
    }
    let run = |(a, b): &(usize, usize)| if a == b { a.to_string() } else { format!("{a}-{b}") };
    runs.iter().map(run).collect::<Vec<_>>().join(", ")
}

/// `1.234 s` or `12.3 ms`.
pub fn seconds(t: f64) -> String {
    if t >= 1.0 {
        format!("{t:.3} s")
    } else {
        format!("{:.2} ms", t * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_lists_read_as_runs() {
        assert_eq!(ranges(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(ranges(&[4]), "4");
        assert_eq!(seconds(1.5), "1.500 s");
        assert_eq!(seconds(0.0123), "12.30 ms");
    }
}
