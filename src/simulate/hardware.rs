//! Hardware profiles: what turns FLOPs and bytes into seconds, and the memory a device has.
//!
//! Assumptions (figures are nominal and from the vendors' data sheets unless said):
//! * `efficiency` is the fraction of the dense peak that a transformer layer's forward and
//!   backward sustain at large sizes, their memory-bound parts (LayerNorm, GELU, softmax,
//!   dropout) included. Megatron-LM reaches about 52% of the A100's peak end to end on
//!   large GPTs (Narayanan et al. 2021, bubbles and communication included), so about 60%
//!   per layer; H100s reach a smaller fraction of their higher peak (about 50%), H200s a
//!   little more (55%) with their faster memory.
//! * Memory-bound recompute (GELU, LayerNorm) streams at [`MEMORY_EFFICIENCY`] of the HBM
//!   bandwidth.
//! * Within a node of 8 GPUs (DGX/HGX), GPUs talk over NVLink (per direction: A100 NVLink 3
//!   300 GB/s, H100/H200 NVLink 4 450 GB/s); between nodes each GPU has its own InfiniBand
//!   NIC (DGX A100: HDR 200 Gb/s = 25 GB/s; DGX H100: NDR 400 Gb/s = 50 GB/s). Messages
//!   cost 10 µs of latency (NCCL). Point-to-point transfers between stages run at the link
//!   rate; ring collectives (tensor-parallel and data-parallel) reach [`COLLECTIVE_EFFICIENCY`]
//!   of it, NCCL's usual bus bandwidth. A group of ranks of stride `stride` (Megatron's order:
//!   tensor fastest, then data, then pipeline) lies in one node iff stride x size <= 8.
//! * Activation offload copies over each GPU's PCIe link to host memory (A100: Gen4 x16,
//!   32 GB/s per direction; H100 and H200: Gen5 x16, 64 GB/s) at [`HOST_COPY_EFFICIENCY`]
//!   of it, and the host has 2 TiB per 8 GPUs (DGX A100, H100 and H200): 256 GiB each.
//! * Device memory is what nvidia-smi reports in total (A100 80GB: 81920 MiB, H100 SXM:
//!   81559 MiB, H200: 143771 MiB); allocator slack and the CUDA context come out of it.
//! * Peaks are dense bf16; with `precision: fp32` the GPU profiles use the TF32 tensor-core
//!   rate, half of it.
//! * The attention kernel follows the config's device, as the trainer's does: with
//!   `device: cuda` (head size <= 64) the fused kernel keeps each row's log-sum-exp
//!   [B,NH,T] instead of the probabilities [B,NH,T,T] (stages::saved), and its backward
//!   computes q k^T once more (durations.rs). Under `precision: bf16` activations are
//!   stored, recomputed and sent at 2 bytes per element, as the trainer stores them;
//!   weights, gradients and Adam moments stay fp32 (with a bf16 copy of the parameters beside
//!   them, memory.rs), and so do the gradient reductions.
//!
//! Every figure can be overridden after the name: `--hardware a100-80gb,efficiency=0.65,
//! network-gb-s=12.5` (see [`OVERRIDES`]).

use super::units::format_rate;
use crate::config::Precision;
use crate::error::user_error;

/// Streaming kernels reach about 80% of the nominal HBM bandwidth (STREAM-like copies).
pub const MEMORY_EFFICIENCY: f64 = 0.8;
/// NCCL's ring collectives reach about 80% of the link's nominal rate as bus bandwidth
/// (nccl-tests on DGX A100/H100, NVLink and InfiniBand alike).
pub const COLLECTIVE_EFFICIENCY: f64 = 0.8;
/// Copies between device and pinned host memory reach about 80% of PCIe's nominal rate
/// (bandwidthTest on Gen4 and Gen5 x16).
pub const HOST_COPY_EFFICIENCY: f64 = 0.8;

#[derive(Clone, Debug, PartialEq)]
pub struct Hardware {
    pub name: String,
    /// Dense FLOP/s at the run's precision.
    pub peak_flops: f64,
    pub efficiency: f64,
    /// Bytes per second of device memory.
    pub memory_bandwidth: f64,
    /// Bytes per second, one direction of one link between GPUs of a node.
    pub link_bandwidth: f64,
    /// Bytes per second, one direction of one GPU's link to other nodes.
    pub network_bandwidth: f64,
    /// GPUs that share the fast links (None: one machine holds the whole run).
    pub gpus_per_node: Option<usize>,
    /// Seconds per message.
    pub link_latency: f64,
    /// Device memory, the default memory limit (None: unknown).
    pub memory_bytes: Option<u64>,
    /// Bytes per second, one direction of one GPU's link to host memory (activation
    /// offload).
    pub host_link_bandwidth: f64,
    /// Host memory per GPU, the limit of offloaded activations (None: unknown, or the
    /// device's own, as on the CPU).
    pub host_memory_bytes: Option<u64>,
}

pub const NAMES: [&str; 4] = ["a100-80gb", "h100-sxm", "h200", "cpu-measured"];

/// The figures `--hardware NAME,FIGURE=VALUE,..` may override.
pub const OVERRIDES: [&str; 9] = [
    "peak-tflops",
    "efficiency",
    "hbm-tb-s",
    "nvlink-gb-s",
    "network-gb-s",
    "gpus-per-node",
    "memory-gib",
    "pcie-gb-s",
    "host-memory-gib",
];

impl Hardware {
    /// The profile `spec` names for `precision` (fp32 | bf16), with the figures it overrides
    /// (`NAME,FIGURE=VALUE,..`; a peak given is at the run's precision).
    pub fn lookup(spec: &str, precision: Precision) -> anyhow::Result<Hardware> {
        let mut items = spec.split(',');
        let mut hw = Self::named(items.next().unwrap_or("").trim(), precision)?;
        for item in items {
            let err = |msg: String| user_error(format!("command line: --hardware {spec}: {msg}"));
            let (key, value) =
                item.split_once('=').ok_or_else(|| err(format!("`{item}` is not FIGURE=VALUE")))?;
            let x: f64 = value.trim().parse().map_err(|_| err(format!("{item}: not a number")))?;
            if !(x.is_finite() && x > 0.0) {
                return Err(err(format!("{item}: must be > 0")));
            }
            match key.trim() {
                "peak-tflops" => hw.peak_flops = x * 1e12,
                "efficiency" if x <= 1.0 => hw.efficiency = x,
                "efficiency" => return Err(err(format!("{item}: a fraction of the peak, at most 1"))),
                "hbm-tb-s" => hw.memory_bandwidth = x * 1e12,
                "nvlink-gb-s" => hw.link_bandwidth = x * 1e9,
                "network-gb-s" => hw.network_bandwidth = x * 1e9,
                "gpus-per-node" if x.fract() == 0.0 => hw.gpus_per_node = Some(x as usize),
                "gpus-per-node" => return Err(err(format!("{item}: a whole number"))),
                "memory-gib" => hw.memory_bytes = Some((x * (1u64 << 30) as f64) as u64),
                "pcie-gb-s" => hw.host_link_bandwidth = x * 1e9,
                "host-memory-gib" => hw.host_memory_bytes = Some((x * (1u64 << 30) as f64) as u64),
                other => {
                    return Err(err(format!(
                        "unknown figure `{other}` (expected one of: {})",
                        OVERRIDES.join(", ")
                    )))
                }
            }
        }
        Ok(hw)
    }

    /// The profile `name` for `precision` as it ships. `cpu-measured` times a matmul on this
    /// machine's cores now (about a second).
    fn named(name: &str, precision: Precision) -> anyhow::Result<Hardware> {
        let gpu = |peak_bf16_tflops: f64,
                   efficiency: f64,
                   hbm_tb_s: f64,
                   link_gb_s: f64,
                   net_gb_s: f64,
                   pcie_gb_s: f64,
                   mib: u64| {
            let peak = peak_bf16_tflops * 1e12;
            Hardware {
                name: name.to_string(),
                peak_flops: if precision == Precision::Bf16 { peak } else { peak / 2.0 },
                efficiency,
                memory_bandwidth: hbm_tb_s * 1e12,
                link_bandwidth: link_gb_s * 1e9,
                network_bandwidth: net_gb_s * 1e9,
                gpus_per_node: Some(8),
                link_latency: 10e-6,
                memory_bytes: Some(mib << 20),
                host_link_bandwidth: pcie_gb_s * 1e9,
                host_memory_bytes: Some(256 << 30),
            }
        };
        Ok(match name {
            "a100-80gb" => gpu(312.0, 0.60, 2.0, 300.0, 25.0, 32.0, 81920),
            "h100-sxm" => gpu(989.0, 0.50, 3.35, 450.0, 50.0, 64.0, 81559),
            "h200" => gpu(989.0, 0.55, 4.8, 450.0, 50.0, 64.0, 143771),
            "cpu-measured" => cpu_measured(),
            other => {
                return Err(user_error(format!(
                    "command line: --hardware {other}: unknown hardware (expected one of: {})",
                    NAMES.join(", ")
                )))
            }
        })
    }

    /// FLOP/s that the model's layers achieve.
    pub fn achieved_flops(&self) -> f64 {
        self.peak_flops * self.efficiency
    }

    /// Bytes per second that streaming (memory-bound) kernels achieve.
    pub fn achieved_bandwidth(&self) -> f64 {
        self.memory_bandwidth * MEMORY_EFFICIENCY
    }

    /// Whether `size` ranks `stride` apart in the rank order share one node.
    pub fn within_node(&self, stride: usize, size: usize) -> bool {
        self.gpus_per_node.is_none_or(|n| stride * size <= n)
    }

    /// Bytes per second one rank's ring collective moves among `size` ranks `stride` apart:
    /// NVLink's within a node, the network's across nodes.
    pub fn collective_bandwidth(&self, stride: usize, size: usize) -> f64 {
        let link = if self.within_node(stride, size) { self.link_bandwidth } else { self.network_bandwidth };
        link * COLLECTIVE_EFFICIENCY
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let node = self.gpus_per_node.map_or("one node".into(), |n| format!("{n} GPUs per node"));
        format!(
            "{}: {} peak x {:.2} efficiency, memory {}, NVLink {}, network {} per GPU, PCIe {}, {node}, {:.0} us per message",
            self.name,
            format_rate(self.peak_flops, "FLOP"),
            self.efficiency,
            format_rate(self.memory_bandwidth, "B"),
            format_rate(self.link_bandwidth, "B"),
            format_rate(self.network_bandwidth, "B"),
            format_rate(self.host_link_bandwidth, "B"),
            self.link_latency * 1e6
        )
    }
}

/// The dense peak FLOP/s at `precision` of the GPU a device is named after, from its
/// profile ([`gpu_profile`]); None for a GPU without one.
pub fn gpu_peak_flops(device_name: &str, precision: Precision) -> Option<f64> {
    gpu_profile(device_name).and_then(|profile| profile_peak_flops(profile, precision))
}

/// The profile of the GPU a device is named after (its name as the driver gives it, e.g.
/// "NVIDIA H100 80GB HBM3"); None for a GPU without one (an H100 PCIe, whose clocks are
/// lower, included).
pub fn gpu_profile(device_name: &str) -> Option<&'static str> {
    if device_name.contains("H200") {
        Some("h200")
    } else if device_name.contains("H100") && !device_name.contains("PCIe") {
        Some("h100-sxm")
    } else if device_name.contains("A100") {
        Some("a100-80gb")
    } else {
        None
    }
}

/// The dense peak FLOP/s at `precision` of the GPU profile named `profile`.
pub fn profile_peak_flops(profile: &str, precision: Precision) -> Option<f64> {
    Hardware::named(profile, precision).ok().map(|hw| hw.peak_flops)
}

/// This machine's CPU as the trainer's CPU backend uses it: the fp32 matmul peak of all its
/// cores, measured; the trainer's kernels reach about half of it per layer. Memory bandwidth
/// (20 GB/s) and the in-process "link" (a copy at that bandwidth) are typical server
/// figures, not measured; the memory limit is the machine's RAM. The machine holds the
/// whole run (as the trainer's threads do); a network to others would be 10 Gb/s Ethernet.
fn cpu_measured() -> Hardware {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peak = kernels::cpu::measure_matmul_peak(&kernels::cpu::CpuDevice::new(threads));
    Hardware {
        name: format!("cpu-measured ({threads} threads)"),
        peak_flops: peak,
        efficiency: 0.5,
        memory_bandwidth: 20e9,
        link_bandwidth: 20e9,
        network_bandwidth: 1.25e9,
        gpus_per_node: None,
        link_latency: 5e-6,
        memory_bytes: total_ram(),
        // Offload copies within the same memory, whose limit is the device's.
        host_link_bandwidth: 20e9,
        host_memory_bytes: None,
    }
}

/// MemTotal from /proc/meminfo (Linux); None elsewhere.
fn total_ram() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_profiles_carry_the_published_peaks() {
        let h100 = Hardware::lookup("h100-sxm", crate::config::Precision::Bf16).unwrap();
        assert_eq!((h100.peak_flops, h100.memory_bandwidth, h100.link_bandwidth), (989e12, 3.35e12, 450e9));
        assert_eq!(Hardware::lookup("a100-80gb", crate::config::Precision::Bf16).unwrap().peak_flops, 312e12);
        assert_eq!(Hardware::lookup("a100-80gb", crate::config::Precision::Fp32).unwrap().peak_flops, 156e12);
        let h200 = Hardware::lookup("h200", crate::config::Precision::Bf16).unwrap();
        assert_eq!((h200.memory_bandwidth, h200.memory_bytes), (4.8e12, Some(143771 << 20)));
        assert_eq!(h100.achieved_flops(), 494.5e12);
    }

    #[test]
    fn a_gpu_is_known_by_its_driver_name() {
        assert_eq!(
            gpu_peak_flops("cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", crate::config::Precision::Bf16),
            Some(989e12)
        );
        assert_eq!(
            gpu_peak_flops("cuda:0 (NVIDIA H200, sm_90)", crate::config::Precision::Fp32),
            Some(494.5e12)
        );
        assert_eq!(
            gpu_peak_flops("cuda:1 (NVIDIA A100-SXM4-80GB, sm_80)", crate::config::Precision::Bf16),
            Some(312e12)
        );
        assert_eq!(gpu_peak_flops("cuda:0 (NVIDIA H100 PCIe, sm_90)", crate::config::Precision::Bf16), None);
        assert_eq!(
            gpu_peak_flops("cuda:0 (NVIDIA GeForce RTX 4090, sm_89)", crate::config::Precision::Bf16),
            None
        );
    }

    #[test]
    fn figures_are_overridden_after_the_name() {
        let hw = Hardware::lookup(
            "a100-80gb,efficiency=0.65,network-gb-s=12.5,gpus-per-node=4,pcie-gb-s=16,host-memory-gib=64",
            crate::config::Precision::Bf16,
        )
        .unwrap();
        assert_eq!((hw.efficiency, hw.network_bandwidth, hw.gpus_per_node), (0.65, 12.5e9, Some(4)));
        assert_eq!((hw.peak_flops, hw.link_bandwidth), (312e12, 300e9));
        assert_eq!((hw.host_link_bandwidth, hw.host_memory_bytes), (16e9, Some(64 << 30)));
        let h100 = Hardware::lookup("h100-sxm", Precision::Bf16).unwrap();
        assert_eq!((h100.host_link_bandwidth, h100.host_memory_bytes), (64e9, Some(256 << 30)));
        let err = |spec: &str| Hardware::lookup(spec, Precision::Bf16).unwrap_err().to_string();
        assert_eq!(
            err("h200,efficiency=1.5"),
            "command line: --hardware h200,efficiency=1.5: efficiency=1.5: a fraction of the peak, at most 1"
        );
        assert!(err("h200,speed=3").ends_with("unknown figure `speed` (expected one of: peak-tflops, efficiency, hbm-tb-s, nvlink-gb-s, network-gb-s, gpus-per-node, memory-gib, pcie-gb-s, host-memory-gib)"));
        assert_eq!(
            err("h200,hbm-tb-s=fast"),
            "command line: --hardware h200,hbm-tb-s=fast: hbm-tb-s=fast: not a number"
        );
    }

    #[test]
    fn unknown_hardware_lists_the_known_ones() {
        assert_eq!(
            Hardware::lookup("tpu", crate::config::Precision::Bf16).unwrap_err().to_string(),
            "command line: --hardware tpu: unknown hardware (expected one of: a100-80gb, h100-sxm, h200, cpu-measured)"
        );
    }
}
