//! MFU of one training step of the config's shape against the GPU's published peak: ours,
//! measured by the trainer, and PyTorch's for the same shape on the same GPU (torch_mfu.py,
//! carried in the binary and run by `python3` where it imports torch). Both count the same
//! model FLOPs (`stages::flops`), so the two figures compare the same work.

use super::super::Variant;
use super::{Row, Verdict};
use crate::config::Config;
use crate::data::TokenData;
use std::process::Command;
use std::time::Instant;

const TORCH_SCRIPT: &str = include_str!("torch_mfu.py");

/// What one step computes.
pub struct Shape {
    pub cfg: Config,
    pub flops_per_step: f64,
}

impl Shape {
    pub fn of(cfg: &Config) -> Shape {
        let flops = stages::flops::train_step_flops(&crate::plan::shape(cfg), cfg.num_microbatches());
        Shape { cfg: cfg.clone(), flops_per_step: flops }
    }

    fn describe(&self) -> String {
        let c = &self.cfg;
        format!(
            "{} layers x {}, seq {}, micro batch {} x {} microbatches, {}",
            c.num_layers,
            c.hidden_size,
            c.seq_length,
            c.micro_batch_size,
            c.num_microbatches(),
            c.precision
        )
    }
}

/// The median of `steps` timed training steps of `cfg`, after one warm-up step.
pub fn measure(cfg: &Config, data: &TokenData, steps: usize) -> anyhow::Result<f64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut run = Variant::build(cfg.device.to_string(), cfg.clone(), threads)?;
    run.step(data, 1)?;
    for step in 0..steps {
        let start = Instant::now();
        run.step(data, step + 2)?;
        run.step_s.push(start.elapsed().as_secs_f64());
    }
    Ok(super::super::median(&run.step_s))
}

/// MFU of a step of `step_s` seconds against `peak` FLOP/s.
pub fn row(check: &str, shape: &Shape, step_s: Option<f64>, peak: Option<f64>) -> Row {
    let against = |peak: f64| format!("{:.0} TFLOP/s peak; {}", peak / 1e12, shape.describe());
    match (step_s, peak) {
        (Some(s), Some(peak)) => Row {
            check: check.into(),
            measured: format!("{:.1}% ({s:.3} s per step)", 100.0 * shape.flops_per_step / s / peak),
            against: against(peak),
            verdict: Verdict::Figure,
        },
        (Some(s), None) => Row {
            check: check.into(),
            measured: format!("{:.1} TFLOP/s ({s:.3} s per step)", shape.flops_per_step / s / 1e12),
            against: shape.describe(),
            verdict: Verdict::Skipped("no published peak for this GPU".into()),
        },
        (None, _) => Row {
            check: check.into(),
            measured: "-".into(),
            against: peak.map_or_else(|| shape.describe(), against),
            verdict: Verdict::Skipped("not measured".into()),
        },
    }
}

/// On the CUDA stand-in: the step's time, which is the CPU's under the emulator and says
/// nothing of a GPU's, and no PyTorch to compare.
pub fn standin_rows(step_s: f64) -> [Row; 2] {
    let standin = "the stand-in: CPU time under the SIMT emulator, not a GPU's";
    [
        Row {
            check: "step time, pipetrain".into(),
            measured: format!("{step_s:.3} s per step"),
            against: standin.into(),
            verdict: Verdict::Figure,
        },
        Row {
            check: "MFU, PyTorch".into(),
            measured: "-".into(),
            against: standin.into(),
            verdict: Verdict::Skipped("no GPU to run PyTorch on".into()),
        },
    ]
}

/// PyTorch's MFU for the same step, or why it was not measured.
pub fn torch_row(shape: &Shape, steps: usize, peak: Option<f64>) -> Row {
    match torch_step_seconds(shape, steps) {
        Ok(s) => row("MFU, PyTorch", shape, Some(s), peak),
        Err(why) => Row { verdict: Verdict::Skipped(why), ..row("MFU, PyTorch", shape, None, peak) },
    }
}

fn torch_step_seconds(shape: &Shape, steps: usize) -> Result<f64, String> {
    let imports = Command::new("python3").args(["-c", "import torch"]).output();
    if !imports.is_ok_and(|o| o.status.success()) {
        return Err("`python3 -c 'import torch'` fails here".into());
    }
    let script = std::env::temp_dir().join(format!("pipetrain-torch-mfu-{}.py", std::process::id()));
    std::fs::write(&script, TORCH_SCRIPT).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let c = &shape.cfg;
    let args = serde_json::json!({
        "layers": c.num_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
        "seq": c.seq_length, "vocab": c.vocab_size, "micro_batch": c.micro_batch_size,
        "microbatches": c.num_microbatches(), "precision": c.precision.to_string(), "steps": steps.max(1),
    });
    let out = Command::new("python3").arg(&script).arg(args.to_string()).output();
    let _ = std::fs::remove_file(&script);
    let out = out.map_err(|e| format!("cannot run python3: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    match serde_json::from_str::<serde_json::Value>(last) {
        Ok(v) if v["step_s"].is_f64() => Ok(v["step_s"].as_f64().unwrap_or_default()),
        Ok(v) if v["error"].is_string() => Err(format!("torch: {}", v["error"].as_str().unwrap_or_default())),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            Err(format!("torch failed: {}", stderr.lines().last().unwrap_or("no output")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mfu_is_the_steps_model_flops_over_the_peak() {
        let cfg = Config { global_batch_size: 8, micro_batch_size: 4, ..Config::default() };
        let shape = Shape::of(&cfg);
        // GPT-2 small at T = 1024: 6 N + 12 L T C FLOPs per token, 8192 tokens.
        assert_eq!(
            shape.flops_per_step,
            2.0 * 4.0 * stages::flops::train_step_flops(&stages::ModelShape::GPT2_SMALL, 1)
        );
        let peak = 4.0 * shape.flops_per_step / 0.5;
        let r = row("MFU, pipetrain", &shape, Some(0.5), Some(peak));
        assert_eq!(r.measured, "25.0% (0.500 s per step)");
        assert_eq!(r.verdict, Verdict::Figure);
        assert!(
            r.against.ends_with("; 12 layers x 768, seq 1024, micro batch 4 x 2 microbatches, fp32"),
            "{}",
            r.against
        );
        let unknown = row("MFU, pipetrain", &shape, Some(0.5), None);
        assert_eq!(unknown.verdict, Verdict::Skipped("no published peak for this GPU".into()));
    }
}
