//! The attention core's speed, in the terms #21's targets use: TFLOP/s of the causal core
//! forward and backward at B = 16, T = 1024, for GPT-2's heads of 64 (12 heads) and a
//! Llama's of 128 (Llama 3 8B's 32 query heads over 8 key/value heads), on the device the
//! bench opens for bf16 (the tensor-core kernels). FLOPs count the causal half of the T x T
//! scores, as FlashAttention's benchmarks do: the forward's two products are
//! 4 * B * NH * (T^2 / 2) * hs, the backward 2.5 times that; under a sliding window (the
//! config's case of `bench attention`, its first layer's mask) the share of them its pairs
//! are of the causal ones. Each figure is the median of `REPS` calls, each timed between
//! two marks of the device's clock, after a warm-up call.
//!
//! On the CUDA stand-in the cases shrink and the times are its CPU's under the emulator.

use super::{Row, Verdict};
use crate::config::Config;
use kernels::{AttentionSaved, AttentionSaves, Category, CausalMask, Device, Tensor};
use stages::flops::scored_area;

/// Calls timed per figure.
const REPS: usize = 10;

/// One attention call's shape.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    pub mask: CausalMask,
}

/// #21's shapes: GPT-2's layer, and Llama 3 8B's.
pub const TARGET: [Case; 2] = [
    Case { batch: 16, seq: 1024, heads: 12, kv_heads: 12, head_size: 64, mask: CausalMask::Full },
    Case { batch: 16, seq: 1024, heads: 32, kv_heads: 8, head_size: 128, mask: CausalMask::Full },
];

/// The same head sizes at sizes the stand-in's emulator runs in seconds.
pub const STANDIN: [Case; 2] = [
    Case { batch: 1, seq: 64, heads: 2, kv_heads: 2, head_size: 64, mask: CausalMask::Full },
    Case { batch: 1, seq: 64, heads: 4, kv_heads: 2, head_size: 128, mask: CausalMask::Full },
];

/// #21's targets, TFLOP/s forward and backward.
const TARGET_TFLOPS: (f64, f64) = (200.0, 150.0);

impl Case {
    /// The attention core of `cfg`'s layers at its micro batch; refused in one line, as
    /// `train` refuses it under bf16, where the tensor-core kernels do not take its head
    /// size.
    pub fn of(cfg: &Config) -> anyhow::Result<Case> {
        let head_size = cfg.tensor_core_head_size().map_err(|need| {
            cfg.key_error("hidden_size", format!("bench attention runs the bf16 kernels, which need {need}"))
        })?;
        Ok(Case {
            batch: cfg.micro_batch_size,
            seq: cfg.seq_length,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_size,
            mask: cfg.architecture().attention_mask(0).over(cfg.seq_length),
        })
    }

    /// FLOPs of one forward call over the causal half (of the T x T area `stages::flops`
    /// counts, a window's share of it).
    pub fn forward_flops(&self) -> f64 {
        let (b, nh, hs) = (self.batch as f64, self.heads as f64, self.head_size as f64);
        4.0 * b * nh * (scored_area(self.mask, self.seq) / 2.0) * hs
    }

    /// FLOPs of one backward call: 2.5 forwards.
    pub fn backward_flops(&self) -> f64 {
        2.5 * self.forward_flops()
    }

    fn describe(&self) -> String {
        let window = match self.mask {
            CausalMask::Full => String::new(),
            CausalMask::Window(w) => format!(", a window of {w} keys"),
        };
        format!(
            "B = {}, T = {}, {} heads over {} key/value heads of {}{window}",
            self.batch, self.seq, self.heads, self.kv_heads, self.head_size
        )
    }

    /// [B, T, width] for `heads` heads.
    fn shape(&self, heads: usize) -> [usize; 3] {
        [self.batch, self.seq, heads * self.head_size]
    }
}

/// Median seconds of one forward and one backward call of `case` on `dev`, which keeps
/// `saves` for backward; inputs of the device's activation dtype.
pub fn seconds(dev: &dyn Device, saves: AttentionSaves, case: &Case) -> (f64, f64) {
    let dtype = dev.activation_dtype();
    let mut rng = kernels::SplitMix64::new(21);
    let mut tensor = |shape: [usize; 3]| {
        let data = rng.uniform(shape.iter().product(), 1.0);
        dev.from_host_of(dtype, &data, &shape, Category::Workspace)
    };
    let qkv = tensor(case.shape(case.heads + 2 * case.kv_heads));
    let dout = tensor(case.shape(case.heads));
    let mut out = dev.empty_of(dtype, &case.shape(case.heads), Category::Workspace);
    let mut dqkv = dev.empty_of(dtype, qkv.shape(), Category::Workspace);
    let mut saved =
        dev.empty_attention_saved(saves, [case.batch, case.heads, case.seq], false, Category::Workspace);
    let forward = |out: &mut Tensor, saved: &mut AttentionSaved| {
        dev.attention_forward(Some(out), saved, None, &qkv, case.heads, case.kv_heads, case.mask)
    };
    let backward = |dqkv: &mut Tensor, out: &Tensor, saved: &AttentionSaved| {
        dev.attention_backward(dqkv, &dout, out, &qkv, saved, None, case.heads, case.kv_heads, case.mask)
    };
    forward(&mut out, &mut saved);
    backward(&mut dqkv, &out, &saved);
    dev.clock_start();
    let mut marks = vec![dev.clock_mark()];
    for _ in 0..REPS {
        forward(&mut out, &mut saved);
        marks.push(dev.clock_mark());
        backward(&mut dqkv, &out, &saved);
        marks.push(dev.clock_mark());
    }
    let readings = dev.clock_read();
    let spans: Vec<f64> = marks.windows(2).map(|w| readings.at(w[1]) - readings.at(w[0])).collect();
    let every_other = |first: usize| spans.iter().skip(first).step_by(2).copied().collect::<Vec<_>>();
    (super::super::median(&every_other(0)), super::super::median(&every_other(1)))
}

/// A forward and a backward row for each case: TFLOP/s against #21's targets, or on the
/// stand-in the times alone.
pub fn rows(dev: &dyn Device, saves: fn(usize) -> AttentionSaves, cases: &[Case], standin: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for case in cases {
        let (forward, backward) = seconds(dev, saves(case.head_size), case);
        let runs = [
            ("forward", forward, case.forward_flops(), TARGET_TFLOPS.0),
            ("backward", backward, case.backward_flops(), TARGET_TFLOPS.1),
        ];
        for (pass, s, flops, target) in runs {
            let check = format!("attention {pass}, head size {}", case.head_size);
            let (measured, against) = if standin {
                (
                    format!("{:.3} ms", s * 1e3),
                    format!("the stand-in's CPU time under the emulator, {}", case.describe()),
                )
            } else {
                (
                    format!("{:.0} TFLOP/s ({:.3} ms)", flops / s / 1e12, s * 1e3),
                    format!("{target:.0} TFLOP/s (#21), {}", case.describe()),
                )
            };
            rows.push(Row { check, measured, against, verdict: Verdict::Figure });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::cpu::CpuDevice;

    /// GPT-2's layer at #21's shape: 4 * 16 * 12 * 1024^2 / 2 * 64 FLOPs forward.
    #[test]
    fn flops_count_the_causal_half() {
        assert_eq!(TARGET[0].forward_flops(), 25_769_803_776.0);
        assert_eq!(TARGET[0].backward_flops(), 64_424_509_440.0);
        assert_eq!(TARGET[1].forward_flops(), 137_438_953_472.0);
        // A window of 256 keys over 1024: (256 * 257 / 2 + 768 * 256) of 1024 * 1025 / 2 pairs.
        let windowed = Case { mask: CausalMask::Window(256), ..TARGET[0] };
        let share = (256.0 * 257.0 / 2.0 + 768.0 * 256.0) / (1024.0 * 1025.0 / 2.0);
        assert!((windowed.forward_flops() / (TARGET[0].forward_flops() * share) - 1.0).abs() < 1e-12);
    }

    /// The rows time real calls on any device: on the CPU, the stand-in's shapes give a
    /// forward and a backward row per head size, each a positive time.
    #[test]
    fn each_case_gives_a_forward_and_a_backward_row() {
        let rows = rows(&CpuDevice::new(2), |_| AttentionSaves::Probabilities, &STANDIN, true);
        let checks: Vec<&str> = rows.iter().map(|r| r.check.as_str()).collect();
        assert_eq!(
            checks,
            [
                "attention forward, head size 64",
                "attention backward, head size 64",
                "attention forward, head size 128",
                "attention backward, head size 128"
            ]
        );
        for r in &rows {
            let ms: f64 = r.measured.trim_end_matches(" ms").parse().unwrap();
            assert!(ms > 0.0, "{r:?}");
        }
    }
}
