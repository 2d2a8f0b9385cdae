//! The MFU denominator of a run and where it came from: `--peak-flops` as given; on the
//! CPU, every rank's cores measured at start; on CUDA, each rank's GPU's published dense
//! peak at the run's precision, from the simulator's profile of that GPU (the peak
//! `bench gpu` measures MFU against).

use crate::config::{Config, DeviceKind, Precision};
use kernels::cpu::CpuDevice;
use kernels::Device;
use stages::dist::{Collective, Group};

/// The profile whose figures stand in for a GPU without one.
const ASSUMED_PROFILE: &str = "h100-sxm";

/// Where the MFU denominator came from, as the summary says it.
#[derive(Clone, Debug, PartialEq)]
pub enum PeakSource {
    Given,
    Measured,
    /// A GPU's profile at a precision; `assumed_for` names a GPU that has none.
    Published {
        profile: String,
        precision: Precision,
        assumed_for: Option<String>,
    },
}

impl PeakSource {
    /// `measured here`, `published, h100-sxm bf16`, ...
    pub fn describe(&self) -> String {
        match self {
            PeakSource::Given => "given by --peak-flops".into(),
            PeakSource::Measured => "measured here".into(),
            PeakSource::Published { profile, precision, assumed_for: None } => {
                format!("published, {profile} {precision}")
            }
            PeakSource::Published { profile, precision, assumed_for: Some(device) } => {
                format!("published, {profile} {precision} assumed for {device}")
            }
        }
    }
}

/// The job's peak FLOP/s, summed over its processors, and (rank 0's) source. Every rank
/// calls it at once: on the CPU each measures its own share of the cores; on CUDA ranks that
/// share a GPU (threads of one process, or processes on one machine with fewer GPUs than
/// ranks) count it once.
pub fn job_peak(
    given: Option<f64>,
    cfg: &Config,
    device: &dyn Device,
    cpu_threads: usize,
    collective: &mut dyn Collective,
) -> anyhow::Result<(f64, PeakSource)> {
    if let Some(peak) = given {
        return Ok((peak, PeakSource::Given));
    }
    // Each rank's peak, and the processor it belongs to: a GPU by machine and name, a CPU
    // share by nothing (every rank's share is its own).
    let (mine, source, processor) = match cfg.device {
        DeviceKind::Cuda => {
            let (peak, source) = published(&device.name(), cfg.precision);
            (peak, source, format!("{} {}", host_name(), device.name()))
        }
        DeviceKind::Cpu => {
            let peak = kernels::cpu::measure_matmul_peak(&CpuDevice::new(cpu_threads.max(1)));
            (peak, PeakSource::Measured, String::new())
        }
    };
    let mut message = mine.to_bits().to_le_bytes().to_vec();
    message.extend(processor.as_bytes());
    let all = collective.all_gather(Group::World, &message)?;
    Ok((sum_per_processor(&all), source))
}

/// The sum of the ranks' peaks (8 bytes each, then the processor's name), each named
/// processor counted once.
fn sum_per_processor(messages: &[Vec<u8>]) -> f64 {
    let mut seen = std::collections::HashSet::new();
    messages
        .iter()
        .filter(|m| m.len() == 8 || seen.insert(&m[8..]))
        .map(|m| f64::from_bits(u64::from_le_bytes(m[..8].try_into().expect("8 bytes"))))
        .sum()
}

/// This machine's name (empty where the system does not say).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// The published peak of the GPU named `device`, or of [`ASSUMED_PROFILE`] for one without
/// a profile.
fn published(device: &str, precision: Precision) -> (f64, PeakSource) {
    let (profile, assumed_for) = match crate::simulate::gpu_profile(device) {
        Some(profile) => (profile, None),
        None => (ASSUMED_PROFILE, Some(device.to_string())),
    };
    let peak = crate::simulate::profile_peak_flops(profile, precision).expect("a GPU profile");
    let source = PeakSource::Published { profile: profile.into(), precision, assumed_for };
    (peak, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(peak: f64, processor: &str) -> Vec<u8> {
        [&peak.to_bits().to_le_bytes()[..], processor.as_bytes()].concat()
    }

    #[test]
    fn ranks_sharing_a_gpu_count_it_once_and_cpu_shares_all_count() {
        let gpu =
            |host: &str, n: u8| message(989e12, &format!("{host} cuda:{n} (NVIDIA H100 80GB HBM3, sm_90)"));
        // Two stages on one GPU, a third rank on the machine's other GPU, a fourth elsewhere.
        let all = [gpu("a", 0), gpu("a", 0), gpu("a", 1), gpu("b", 0)];
        assert_eq!(sum_per_processor(&all), 3.0 * 989e12);
        assert_eq!(sum_per_processor(&[message(2e11, ""), message(2e11, "")]), 4e11);
    }

    #[test]
    fn a_gpu_is_measured_against_its_published_peak_at_the_runs_precision() {
        let (peak, source) = published("cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", Precision::Fp32);
        assert_eq!(peak, 494.5e12);
        assert_eq!(source.describe(), "published, h100-sxm fp32");
        let (peak, source) = published("cuda:0 (NVIDIA GeForce RTX 4090, sm_89)", Precision::Bf16);
        assert_eq!(peak, 989e12);
        assert_eq!(
            source.describe(),
            "published, h100-sxm bf16 assumed for cuda:0 (NVIDIA GeForce RTX 4090, sm_89)"
        );
    }
}
