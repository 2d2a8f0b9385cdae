//! What a run shows and keeps: the progress bar, `metrics.jsonl` (one JSON object per step),
//! and the end-of-run summary.

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;

pub struct Metrics {
    file: std::fs::File,
    bar: Option<ProgressBar>,
    log_interval: usize,
}

impl Metrics {
    /// Opens `run_dir/metrics.jsonl`, keeping only lines up to `keep_through_step` (a resumed
    /// run drops what it will redo).
    pub fn open(
        run_dir: &Path,
        keep_through_step: usize,
        total_steps: usize,
        quiet: bool,
        log_interval: usize,
    ) -> anyhow::Result<Self> {
        let path = run_dir.join("metrics.jsonl");
        let kept: String = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| s as usize <= keep_through_step)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let tmp = run_dir.join("metrics.jsonl.tmp");
        std::fs::write(&tmp, kept)?;
        std::fs::rename(&tmp, &path)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path)?;
        let bar = (!quiet).then(|| {
            let bar = ProgressBar::new(total_steps as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]")
                    .expect("valid template"),
            );
            bar.set_position(keep_through_step as u64);
            bar
        });
        Ok(Metrics { file, bar, log_interval: log_interval.max(1) })
    }

    /// Records one step: appends its JSON line and updates the bar (or logs a line).
    pub fn step(&mut self, record: Value) -> anyhow::Result<()> {
        writeln!(self.file, "{record}")?;
        let step = record["step"].as_u64().unwrap_or(0);
        let mut msg = format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            record["loss"].as_f64().unwrap_or(f64::NAN),
            record["lr"].as_f64().unwrap_or(0.0),
            record["tokens_per_s"].as_f64().unwrap_or(0.0)
        );
        if let Some(v) = record["val_loss"].as_f64() {
            msg.push_str(&format!(" val {v:.4}"));
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(step);
                bar.set_message(msg);
            }
            None if (step as usize).is_multiple_of(self.log_interval) => eprintln!("step {step} {msg}"),
            None => {}
        }
        Ok(())
    }

    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// Tokens served so far by each data source, by name.
pub fn tokens_served(sources: &[(String, f64)], tokens: &[u64]) -> Value {
    Value::Object(sources.iter().zip(tokens).map(|((name, _), &n)| (name.clone(), n.into())).collect())
}

/// A step's metrics line.
pub fn step_record(
    step: usize,
    loss: f64,
    lr: f32,
    grad_norm: f64,
    tokens_per_s: f64,
    step_ms: f64,
) -> Value {
    json!({
        "step": step,
        "loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens_per_s": tokens_per_s,
        "step_ms": step_ms,
    })
}
