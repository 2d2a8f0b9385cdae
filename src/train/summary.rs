//! The end-of-run summary: printed, and written as `report.json` in the run dir.

use super::peak::PeakSource;
use crate::config::AliasUse;
use kernels::{Category, MemorySnapshot};
use serde_json::json;
use stages::dist::Topology;
use std::path::{Path, PathBuf};

pub struct Summary {
    pub steps: usize,
    pub final_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
    pub tokens_per_s: f64,
    pub model_flops_per_step: f64,
    /// The MFU denominator: the job's peak FLOP/s.
    pub peak_flops: f64,
    pub peak_source: PeakSource,
    pub elapsed_s: f64,
    /// The run's ranks: every list below has one per rank, in rank order.
    pub topology: Topology,
    pub memory: Vec<MemorySnapshot>,
    /// Peak bytes per stage, everything counted, as `simulate` predicts them.
    pub predicted_peaks: Vec<u64>,
    /// Peak activation bytes per stage as the memory model predicts them.
    pub predicted_activations: Vec<u64>,
    /// The same prediction without recompute or offload, so the report can say what they
    /// saved.
    pub predicted_without_recompute: Vec<u64>,
    /// Peak bytes of offloaded activations in host memory, measured and predicted.
    pub host_peaks: Vec<u64>,
    pub predicted_host_peaks: Vec<u64>,
    /// Seconds each stage spent recomputing dropped activations.
    pub recompute_s: Vec<f64>,
    /// Most microbatches each stage held activations of at once.
    pub max_in_flight: Vec<usize>,
    /// What each stage holds and its recompute policy.
    pub stage_descriptions: Vec<String>,
    /// Measured bubble rate per stage (None before a second step).
    pub bubble: Option<Vec<f64>>,
    pub last_checkpoint_step: usize,
    /// Each training data source: name, normalised weight, tokens it has served in the run
    /// (a resumed run counts from step 1).
    pub data_sources: Vec<(String, f64, u64)>,
    /// `RUN/loss.svg`.
    pub loss_chart: PathBuf,
    /// The config's aliases and the canonical settings they became.
    pub aliases: Vec<AliasUse>,
    /// A greedy continuation of `<|endoftext|>` by the final model (not with `--quiet`).
    pub sample: Option<String>,
}

impl Summary {
    pub fn achieved_flops(&self) -> f64 {
        self.model_flops_per_step * self.steps as f64 / self.elapsed_s.max(1e-9)
    }

    pub fn mfu(&self) -> f64 {
        self.achieved_flops() / self.peak_flops
    }

    pub fn print(&self) {
        let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.4}"));
        println!("== pipetrain run summary ==");
        println!(
            "steps            {} in {:.1} s (last checkpoint: step {})",
            self.steps, self.elapsed_s, self.last_checkpoint_step
        );
        for alias in &self.aliases {
            println!("config           {}", alias.describe());
        }
        println!("final train loss {}", f(self.final_loss));
        println!("final val loss   {}", f(self.final_val_loss));
        println!("tokens/s         {:.0}", self.tokens_per_s);
        for (name, weight, tokens) in &self.data_sources {
            println!("data             {name} (weight {weight:.3}): {tokens} tokens served");
        }
        println!("loss chart       {}", self.loss_chart.display());
        println!("{}", mfu_line(self.mfu(), self.achieved_flops(), self.peak_flops, &self.peak_source));
        let topology = self.topology;
        for (i, m) in self.memory.iter().enumerate() {
            let cat = |c: Category| m.categories.iter().find(|x| x.0 == c).map_or(0, |x| x.2);
            // A rank per stage is named by its stage; others as errors name them.
            let label = match topology.world() == topology.pipeline {
                true => format!("stage {i}"),
                false => topology.describe(&[i]),
            };
            println!("{label:<16} {}", self.stage_descriptions[i]);
            let saved = self.predicted_without_recompute[i].saturating_sub(self.predicted_activations[i]);
            if saved > 0 || self.recompute_s[i] > 0.0 {
                let levers =
                    if self.predicted_host_peaks[i] > 0 { "recompute and offload" } else { "recompute" };
                println!(
                    "{label} {levers} saved {} of activations ({:.0}%), recomputing took {:.2} s",
                    human_bytes(saved as usize),
                    100.0 * saved as f64 / self.predicted_without_recompute[i].max(1) as f64,
                    self.recompute_s[i]
                );
            }
            if self.host_peaks[i] > 0 || self.predicted_host_peaks[i] > 0 {
                println!(
                    "{label} host     {} of offloaded activations (predicted {})",
                    human_bytes(self.host_peaks[i] as usize),
                    human_bytes(self.predicted_host_peaks[i] as usize)
                );
            }
            println!(
                "{label} peak     {} (predicted {}; activations {} (predicted {}, {} microbatches), workspace {}, parameters+grads+optimizer {}){}",
                human_bytes(m.peak_bytes),
                human_bytes(self.predicted_peaks[i] as usize),
                human_bytes(cat(Category::Activations)),
                human_bytes(self.predicted_activations[i] as usize),
                self.max_in_flight[i],
                human_bytes(cat(Category::Workspace)),
                human_bytes(
                    cat(Category::Parameters) + cat(Category::Gradients) + cat(Category::OptimizerState)
                ),
                self.bubble.as_ref().map_or(String::new(), |b| format!(", bubble {:.1}%", 100.0 * b[i])),
            );
        }
        if let Some(text) = &self.sample {
            // Quoted and escaped: the model's newlines stay on the summary's one line.
            println!("sample (greedy)  {text:?}");
        }
    }

    pub fn write(&self, run_dir: &Path) -> anyhow::Result<()> {
        let stages: Vec<_> = self
            .memory
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let cats: serde_json::Map<String, serde_json::Value> = m
                    .categories
                    .iter()
                    .map(|(c, _, peak)| (format!("{c:?}").to_lowercase(), (*peak).into()))
                    .collect();
                let bubble = self.bubble.as_ref().map(|b| b[i]);
                json!({
                    "rank": i,
                    "stage": self.topology.stage_of(i),
                    "replica": self.topology.replica_of(i),
                    "tensor_rank": self.topology.tensor_of(i),
                    "holds": self.stage_descriptions[i],
                    "max_in_flight": self.max_in_flight[i],
                    "predicted_peak_bytes": self.predicted_peaks[i],
                    "predicted_activation_peak_bytes": self.predicted_activations[i],
                    "predicted_activation_peak_bytes_without_recompute": self.predicted_without_recompute[i],
                    "recompute_s": self.recompute_s[i],
                    "host_peak_bytes": self.host_peaks[i],
                    "predicted_host_peak_bytes": self.predicted_host_peaks[i],
                    "peak_bytes": m.peak_bytes, "peak_bytes_by_category": cats, "bubble_rate": bubble })
            })
            .collect();
        let report = json!({
            "steps": self.steps,
            "final_loss": self.final_loss,
            "final_val_loss": self.final_val_loss,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu(),
            "peak_flops": self.peak_flops,
            "peak_flops_from": self.peak_source.describe(),
            "elapsed_s": self.elapsed_s,
            "loss_chart": self.loss_chart,
            "config_aliases": self.aliases,
            "sample": self.sample,
            "data_sources": self
                .data_sources
                .iter()
                .map(|(name, weight, tokens)| json!({"path": name, "weight": weight, "tokens_served": tokens}))
                .collect::<Vec<_>>(),
            "stages": stages,
        });
        std::fs::write(run_dir.join("report.json"), serde_json::to_string_pretty(&report)?)?;
        Ok(())
    }
}

/// The summary's MFU line: the model's FLOP/s over the peak, and where the peak came from.
fn mfu_line(mfu: f64, achieved_flops: f64, peak_flops: f64, source: &PeakSource) -> String {
    format!(
        "MFU              {:.1}% ({:.1} GFLOP/s model, matmul peak {:.1} GFLOP/s {})",
        100.0 * mfu,
        achieved_flops / 1e9,
        peak_flops / 1e9,
        source.describe()
    )
}

pub fn human_bytes(b: usize) -> String {
    let b = b as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mfu_line_says_where_the_peak_came_from() {
        let h100 = PeakSource::Published {
            profile: "h100-sxm".into(),
            precision: crate::config::Precision::Bf16,
            assumed_for: None,
        };
        assert_eq!(
            mfu_line(0.25, 247.25e12, 989e12, &h100),
            "MFU              25.0% (247250.0 GFLOP/s model, matmul peak 989000.0 GFLOP/s published, h100-sxm bf16)"
        );
        assert_eq!(
            mfu_line(0.5, 81e9, 162e9, &PeakSource::Measured),
            "MFU              50.0% (81.0 GFLOP/s model, matmul peak 162.0 GFLOP/s measured here)"
        );
    }
}
