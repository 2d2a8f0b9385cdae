//! The CUDA backend (feature `cuda`): [`CudaDevice`] implements [`crate::Device`] with
//! kernels from `kernels/cuda/*.cu`, compiled at run time by NVRTC for the GPU at hand,
//! and cuBLAS for the matmuls. cudarc loads the CUDA libraries dynamically, so this builds
//! with no CUDA toolkit, and [`CudaDevice::new`] returns an error, never a panic, where
//! there is no driver or no GPU.

/// Launches kernel `$name` of device `$dev` on its stream with `$cfg`, passing each
/// argument by reference (so scalars must be named locals that outlive the launch). An
/// empty grid is skipped: CUDA rejects it, and it would have no work to do.
macro_rules! launch {
    ($dev:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let cfg: cudarc::driver::LaunchConfig = $cfg;
        if cfg.grid_dim.0 > 0 && cfg.grid_dim.1 > 0 && cfg.grid_dim.2 > 0 {
            use cudarc::driver::PushKernelArg as _;
            $dev.launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let function = $dev.gpu.kernel($name);
            let mut builder = $dev.stream.launch_builder(function);
            $(builder.arg($arg);)+
            // SAFETY: the arguments match the kernel's parameter list in kernels/cuda/, and
            // every buffer was sized for the launch by the caller.
            let launched = unsafe { builder.launch(cfg) };
            if let Err(e) = launched {
                panic!("cuda: launching {} failed: {e:?}", $name);
            }
        }
    }};
}

mod adamw;
mod arena;
mod attention;
mod blas;
mod blaslt;
mod classifier;
mod clock;
pub mod compile;
mod device;
mod embedding;
mod fused_attention;
mod gemm_shape;
mod gpu;
pub mod launch;
mod offload;
mod pointwise;
mod readout;
mod rope;
mod rowwise;
mod scratch;
pub mod sources;
mod tensor_table;
mod views;

pub use device::{CudaDevice, MatmulPrecision};
pub use gpu::gpu_count;
