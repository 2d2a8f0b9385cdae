//! Prints the CPU matmul peak that MFU is reported against.
//!
//! cargo run --release -p kernels --example matmul_peak -- [threads]

use kernels::cpu::{measure_matmul_peak, CpuDevice};

fn main() {
    let threads = match std::env::args().nth(1) {
        Some(arg) => arg.parse().expect("threads must be a positive integer"),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let device = CpuDevice::new(threads);
    let peak = measure_matmul_peak(&device);
    println!("matmul peak on {}: {:.1} GFLOP/s", kernels::Device::name(&device), peak / 1e9);
}
