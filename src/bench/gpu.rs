//! `pipetrain bench gpu`: one command for the day a GPU is there. It measures what the GPU
//! path promises and prints one table:
//! - every op of the device on the GPU against the CPU's, at GPT-2 small's sizes (ops.rs);
//! - the bf16 attention core's TFLOP/s forward and backward at head sizes 64 and 128
//!   (attention.rs);
//! - 20 training steps of the config on the GPU (fp32) against the same 20 on the CPU;
//! - bf16 against fp32 on the GPU, the same 20 steps;
//! - each stage's whole peak memory as the GPU's ledger measured it, in fp32 and in bf16,
//!   against `simulate`'s prediction;
//! - MFU of the config's step (`configs/gpt2-124m.yaml`: GPT-2 small at seq 1024) against
//!   the GPU's published peak (the simulator's profile of it), and PyTorch's MFU for the same
//!   shape and step on the same GPU, where `python3 -c 'import torch'` works.
//!
//! On the CUDA stand-in (standin/) the ops run at small sizes and the MFU rows become the
//! step's time, marked as the stand-in's CPU time.
//!
//! Where there is no usable GPU this is one line and exit code 3. The table, the no-GPU
//! line, the op comparison and the loss curves are tested on the CPU; the whole command has
//! run on an H100 (docs/benchmarks.md).

use super::{training_data, Variant};
use crate::cli::BenchArgs;
use crate::config::{Config, DeviceKind, Named, Precision};
use crate::data::TokenData;
use crate::error::NoDevice;
use kernels::cpu::CpuDevice;
use kernels::{AttentionSaves, DType, Device};

/// Training steps of the loss-curve comparisons.
const CURVE_STEPS: usize = 20;
/// The GPU's fp32 loss against the CPU's, relative, at every step: different summation
/// orders, nothing else (as `tests/cuda_train.rs` holds them).
const FP32_TOLERANCE: f64 = 1e-4;
/// bf16 storage against fp32, relative to the fp32 loss, at every step: bf16 keeps 8
/// significant bits, a few parts in a thousand per product and per stored activation. (An
/// H100 measured a worst step of 8.5e-5 with bf16 matmul operands but fp32 activations,
/// before bf16 storage.)
const BF16_TOLERANCE: f64 = 2e-2;
/// The ledger's whole-stage peak against the prediction (the CPU's agree within 2%).
const MEMORY_TOLERANCE: f64 = 2e-2;

/// One line of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub check: String,
    pub measured: String,
    pub against: String,
    pub verdict: Verdict,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Pass,
    Fail,
    /// A figure to read, with nothing to pass.
    Figure,
    /// Not measured, and why.
    Skipped(String),
}

impl Verdict {
    fn within(error: f64, tolerance: f64) -> Verdict {
        if error <= tolerance {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }

    fn text(&self) -> String {
        match self {
            Verdict::Pass => "ok".into(),
            Verdict::Fail => "FAIL".into(),
            Verdict::Figure => "figure".into(),
            Verdict::Skipped(why) => format!("skipped: {why}"),
        }
    }
}

/// The table of `bench what`: a title line naming the device, a header, one line per row,
/// columns padded to their widest cell.
pub fn render(what: &str, device: &str, rows: &[Row]) -> String {
    let header = ["check", "measured", "against", "verdict"].map(String::from);
    let cells: Vec<[String; 4]> = std::iter::once(header)
        .chain(
            rows.iter().map(|r| [r.check.clone(), r.measured.clone(), r.against.clone(), r.verdict.text()]),
        )
        .collect();
    let width = |i: usize| cells.iter().map(|c| c[i].chars().count()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2)];
    let mut out = format!("pipetrain bench {what}: {device}\n");
    for c in &cells {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn run(args: &BenchArgs, cfg: &Config) -> anyhow::Result<()> {
    let gpu = usable_gpu(Precision::Fp32).map_err(|e| NoDevice(format!("bench gpu: no usable GPU: {e}")))?;
    let data = training_data(cfg)?;
    let device = gpu.name();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!("bench gpu: {device}: every op against the CPU's");
    let standin = device.contains(kernels::STANDIN_GPU_NAME);
    let sizes = if standin { ops::Sizes::STANDIN } else { ops::Sizes::GPT2_SMALL };
    let (cuda, cpu) =
        (AttentionSaves::cuda(sizes.c / sizes.heads, DType::F32), AttentionSaves::Probabilities);
    let mut rows = ops::rows((&*gpu, cuda), (&CpuDevice::new(threads), cpu), sizes);
    eprintln!("bench gpu: the attention core in bf16, forward and backward");
    let cases = if standin { &attention::STANDIN } else { &attention::TARGET };
    match usable_gpu(Precision::Bf16) {
        Ok(bf16) => {
            let saves = |head_size| AttentionSaves::cuda(head_size, DType::Bf16);
            rows.extend(attention::rows(&*bf16, saves, cases, standin));
        }
        Err(why) => rows.push(Row {
            check: "attention, bf16".into(),
            measured: "-".into(),
            against: "#21's targets".into(),
            verdict: Verdict::Skipped(why),
        }),
    }
    let on = |device, precision| Config { device, precision, ..cfg.clone() };
    eprintln!("bench gpu: {CURVE_STEPS} steps on the CPU, then on the GPU in fp32 and in bf16");
    let cpu = loss_curve(&on(DeviceKind::Cpu, Precision::Fp32), &data, CURVE_STEPS)?;
    let (fp32, fp32_peaks) =
        loss_curve_and_peaks(&on(DeviceKind::Cuda, Precision::Fp32), &data, CURVE_STEPS)?;
    let (bf16, bf16_peaks) =
        loss_curve_and_peaks(&on(DeviceKind::Cuda, Precision::Bf16), &data, CURVE_STEPS)?;
    rows.push(curve_row("CUDA fp32 vs CPU loss", &fp32, &cpu, FP32_TOLERANCE));
    rows.push(curve_row("CUDA bf16 vs fp32 loss", &bf16, &fp32, BF16_TOLERANCE));
    for (precision, measured) in [(Precision::Fp32, &fp32_peaks), (Precision::Bf16, &bf16_peaks)] {
        let predicted = crate::simulate::predicted_stage_peaks(&on(DeviceKind::Cuda, precision))?;
        rows.extend(memory_rows(precision.name(), measured, &predicted));
    }
    let shape = mfu::Shape::of(cfg);
    let peak = crate::simulate::gpu_peak_flops(&device, cfg.precision);
    eprintln!("bench gpu: MFU over {} steps, ours then PyTorch's", args.steps);
    let ours = mfu::measure(&on(DeviceKind::Cuda, cfg.precision), &data, args.steps)?;
    if standin {
        rows.extend(mfu::standin_rows(ours));
    } else {
        rows.push(mfu::row("MFU, pipetrain", &shape, Some(ours), peak));
        rows.push(mfu::torch_row(&shape, args.steps, peak));
    }
    print!("{}", render("gpu", &device, &rows));
    Ok(())
}

/// `pipetrain bench attention`: the bf16 attention core's TFLOP/s forward and backward at
/// #21's shapes and at the config's own (micro batch, sequence, heads and key/value heads),
/// alone, in seconds, where `bench gpu` takes minutes to reach it: so that two builds can
/// be set against each other on one GPU in one session (scripts/gpu-session's anchor). One
/// line and exit code 3 where no GPU stores activations in bf16.
pub fn run_attention(cfg: &Config) -> anyhow::Result<()> {
    let config_case = attention::Case::of(cfg)?;
    let gpu =
        usable_gpu(Precision::Bf16).map_err(|e| NoDevice(format!("bench attention: no usable GPU: {e}")))?;
    let device = gpu.name();
    let standin = device.contains(kernels::STANDIN_GPU_NAME);
    let mut cases = if standin { attention::STANDIN } else { attention::TARGET }.to_vec();
    cases.push(config_case);
    let saves = |head_size| AttentionSaves::cuda(head_size, DType::Bf16);
    print!("{}", render("attention", &device, &attention::rows(&*gpu, saves, &cases, standin)));
    Ok(())
}

/// GPU 0 storing activations in `precision`, or why it cannot (no GPU, which `run` makes
/// one line and exit 3, or bf16 on a GPU before sm_80).
#[cfg(feature = "cuda")]
fn usable_gpu(precision: Precision) -> Result<Box<dyn Device>, String> {
    Ok(Box::new(kernels::cuda::CudaDevice::new(0)?.with_matmul_precision(precision.matmul())?))
}

#[cfg(not(feature = "cuda"))]
fn usable_gpu(_: Precision) -> Result<Box<dyn Device>, String> {
    Err("this binary was built without the `cuda` feature (cargo build --release --features cuda)".into())
}

/// The mean loss of each of `steps` training steps of `cfg` from its seed.
pub fn loss_curve(cfg: &Config, data: &TokenData, steps: usize) -> anyhow::Result<Vec<f64>> {
    Ok(loss_curve_and_peaks(cfg, data, steps)?.0)
}

/// As [`loss_curve`], with each stage's whole peak as its ledger measured it.
fn loss_curve_and_peaks(
    cfg: &Config,
    data: &TokenData,
    steps: usize,
) -> anyhow::Result<(Vec<f64>, Vec<u64>)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut run = Variant::build(cfg.device.to_string(), cfg.clone(), threads)?;
    let losses = (1..=steps).map(|step| run.step(data, step)).collect::<anyhow::Result<Vec<_>>>()?;
    let peaks = run.ranks.iter().map(|r| r.stage.device.ledger().snapshot().peak_bytes as u64).collect();
    Ok((losses, peaks))
}

/// The worst step of `got` against `want`, relative to `want`.
fn curve_row(check: &str, got: &[f64], want: &[f64], tolerance: f64) -> Row {
    let (step, error) = got
        .iter()
        .zip(want)
        .map(|(g, w)| if g.is_finite() { (g - w).abs() / w.abs() } else { f64::INFINITY })
        .enumerate()
        .fold((0, 0.0f64), |worst, (i, e)| if e > worst.1 { (i, e) } else { worst });
    Row {
        check: format!("{check}, {} steps", want.len()),
        measured: format!("worst {error:.1e} (step {})", step + 1),
        against: format!("<= {tolerance:.0e} of the loss"),
        verdict: Verdict::within(error, tolerance),
    }
}

/// Each stage's measured whole peak against the prediction.
fn memory_rows(precision: &str, measured: &[u64], predicted: &[u64]) -> Vec<Row> {
    measured
        .iter()
        .zip(predicted)
        .enumerate()
        .map(|(stage, (&m, &p))| {
            let error = (m as f64 / p as f64 - 1.0).abs();
            Row {
                check: format!("peak memory, {precision}, stage {stage}"),
                measured: crate::train::summary::human_bytes(m as usize),
                against: format!(
                    "{} predicted (within {:.0}%)",
                    crate::train::summary::human_bytes(p as usize),
                    100.0 * MEMORY_TOLERANCE
                ),
                verdict: Verdict::within(error, MEMORY_TOLERANCE),
            }
        })
        .collect()
}

mod attention;
mod mfu;
mod ops;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_pads_each_column_to_its_widest_cell() {
        let rows = [
            Row {
                check: "CUDA fp32 vs CPU loss, 20 steps".into(),
                measured: "worst 3.2e-6 (step 17)".into(),
                against: "<= 1e-4 of the loss".into(),
                verdict: Verdict::Pass,
            },
            Row {
                check: "peak memory, stage 0".into(),
                measured: "1.07 GiB".into(),
                against: "1.10 GiB predicted (within 2%)".into(),
                verdict: Verdict::Fail,
            },
            Row {
                check: "MFU, PyTorch".into(),
                measured: "-".into(),
                against: "-".into(),
                verdict: Verdict::Skipped("python3 cannot import torch".into()),
            },
        ];
        assert_eq!(
            render("gpu", "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", &rows),
            "pipetrain bench gpu: cuda:0 (NVIDIA H100 80GB HBM3, sm_90)\n\
             check                            measured                against                         verdict\n\
             CUDA fp32 vs CPU loss, 20 steps  worst 3.2e-6 (step 17)  <= 1e-4 of the loss             ok\n\
             peak memory, stage 0             1.07 GiB                1.10 GiB predicted (within 2%)  FAIL\n\
             MFU, PyTorch                     -                       -                               skipped: python3 cannot import torch\n"
        );
    }

    #[test]
    fn a_curve_row_names_its_worst_step() {
        let row = curve_row("x", &[10.0, 9.0, 8.2], &[10.0, 9.0, 8.0], 1e-3);
        assert_eq!((row.measured.as_str(), row.verdict), ("worst 2.5e-2 (step 3)", Verdict::Fail));
        assert_eq!(curve_row("x", &[1.0, f64::NAN], &[1.0, 1.0], 1e-3).verdict, Verdict::Fail);
        assert_eq!(curve_row("x", &[2.0, 1.0005], &[2.0, 1.0], 1e-3).verdict, Verdict::Pass);
    }

    #[test]
    fn memory_rows_hold_each_stage_to_two_percent() {
        let rows = memory_rows("bf16", &[1 << 30, 3 << 20], &[(1 << 30) + (1 << 20), 3 << 20]);
        assert_eq!(rows[0].check, "peak memory, bf16, stage 0");
        assert_eq!(rows[0].against, "1.00 GiB predicted (within 2%)");
        assert_eq!((rows[0].verdict.clone(), rows[1].verdict.clone()), (Verdict::Pass, Verdict::Pass));
        assert_eq!(memory_rows("fp32", &[103], &[100])[0].verdict, Verdict::Fail);
    }

    /// The comparisons' machinery on the CPU: two runs of one config from its seed give the
    /// same losses to the bit, so a GPU's difference is the GPU's.
    #[test]
    fn a_loss_curve_is_the_same_bits_run_twice() {
        let data = TokenData::open_file(std::path::Path::new("data/corpus/train.bin"), 1, 50257).unwrap();
        let cfg = Config {
            num_layers: 2,
            hidden_size: 32,
            num_attention_heads: 2,
            seq_length: 16,
            max_position_embeddings: 16,
            micro_batch_size: 2,
            global_batch_size: 4,
            pipeline_model_parallel_size: 2,
            ..Config::default()
        };
        let (a, b) = (loss_curve(&cfg, &data, 3).unwrap(), loss_curve(&cfg, &data, 3).unwrap());
        assert_eq!(a.len(), 3);
        let uniform = (50257f64).ln();
        assert!(a.iter().all(|l| (l - uniform).abs() < 0.1), "untrained, near ln(50257): {a:?}");
        assert_eq!(
            a.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|l| l.to_bits()).collect::<Vec<_>>()
        );
    }
}
