//! The MFU denominator of a run and where it came from: `--peak-flops` as given; on the
//! CPU, every rank's cores measured at start; on CUDA, each rank's GPU's published dense
//! peak at the run's precision, from the simulator's profile of that GPU (the peak
//! `bench gpu` measures MFU against).

use crate::config::Config;
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
        precision: String,
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

/// The job's peak FLOP/s, every rank's summed, and (rank 0's) source. Every rank calls it
/// at once: on the CPU each measures its own cores.
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
    let (mine, source) = match cfg.device.as_str() {
        "cuda" => published(&device.name(), &cfg.precision),
        _ => (kernels::cpu::measure_matmul_peak(&CpuDevice::new(cpu_threads.max(1))), PeakSource::Measured),
    };
    let all = collective.all_gather(Group::World, &mine.to_bits().to_le_bytes())?;
    let sum =
        all.iter().map(|b| f64::from_bits(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))).sum();
    Ok((sum, source))
}

/// The published peak of the GPU named `device`, or of [`ASSUMED_PROFILE`] for one without
/// a profile.
fn published(device: &str, precision: &str) -> (f64, PeakSource) {
    let (profile, assumed_for) = match crate::simulate::gpu_profile(device) {
        Some(profile) => (profile, None),
        None => (ASSUMED_PROFILE, Some(device.to_string())),
    };
    let peak = crate::simulate::profile_peak_flops(profile, precision).expect("a GPU profile");
    let source = PeakSource::Published { profile: profile.into(), precision: precision.into(), assumed_for };
    (peak, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_is_measured_against_its_published_peak_at_the_runs_precision() {
        let (peak, source) = published("cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", "fp32");
        assert_eq!(peak, 494.5e12);
        assert_eq!(source.describe(), "published, h100-sxm fp32");
        let (peak, source) = published("cuda:0 (NVIDIA GeForce RTX 4090, sm_89)", "bf16");
        assert_eq!(peak, 989e12);
        assert_eq!(
            source.describe(),
            "published, h100-sxm bf16 assumed for cuda:0 (NVIDIA GeForce RTX 4090, sm_89)"
        );
    }
}
