//! One CUDA context and one set of loaded kernels per GPU, opened on first use and shared
//! by every [`super::CudaDevice`] on that GPU (several pipeline stages may share one), so
//! NVRTC compiles the kernels once per GPU per process.

use super::compile::{compile, nvrtc_version};
use super::sources::SOURCES;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

pub(super) struct Gpu {
    pub ctx: Arc<CudaContext>,
    /// e.g. "NVIDIA H100 80GB HBM3"
    pub name: String,
    pub compute_capability: (i32, i32),
    kernels: HashMap<&'static str, CudaFunction>,
}

impl Gpu {
    /// A kernel by its `extern "C"` name. Every name is listed in [`SOURCES`] and loaded
    /// when the GPU opens, so a missing one is a bug here, not a user error.
    pub fn kernel(&self, name: &str) -> &CudaFunction {
        self.kernels.get(name).unwrap_or_else(|| panic!("cuda: no kernel named {name} in kernels/cuda"))
    }
}

static GPUS: Mutex<BTreeMap<usize, Arc<Gpu>>> = Mutex::new(BTreeMap::new());

/// The GPU `ordinal`, opened (context, compiled and loaded kernels) on first call.
pub(super) fn gpu(ordinal: usize) -> Result<Arc<Gpu>, String> {
    let mut gpus = GPUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gpu) = gpus.get(&ordinal) {
        return Ok(gpu.clone());
    }
    let gpu = Arc::new(open(ordinal)?);
    gpus.insert(ordinal, gpu.clone());
    Ok(gpu)
}

/// GPUs this process can see (0 where there is no CUDA driver).
pub fn gpu_count() -> usize {
    // SAFETY: only tries to open the library by its candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n as usize)
}

fn open(ordinal: usize) -> Result<Gpu, String> {
    // SAFETY: only tries to open the library by its candidate names. Without this check
    // cudarc panics on the first driver call.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver: the library libcuda.so was not found".into());
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| match CudaContext::device_count() {
        Ok(count) => format!("cannot open GPU {ordinal} ({count} GPUs present): {e:?}"),
        Err(_) => format!("cannot open GPU {ordinal}: {e:?}"),
    })?;
    let name = ctx.name().map_err(|e| format!("GPU {ordinal}: cannot read its name: {e:?}"))?;
    let cc = ctx.compute_capability().map_err(|e| format!("GPU {ordinal}: {e:?}"))?;
    check_nvrtc_not_newer_than_driver()?;
    keep_freed_memory(&ctx).map_err(|e| format!("GPU {ordinal}: cannot configure its memory pool: {e:?}"))?;

    let arch = format!("compute_{}{}", cc.0, cc.1);
    let ptx = SOURCES.par_iter().map(|s| compile(s, &arch)).collect::<Result<Vec<_>, _>>()?;
    let mut kernels = HashMap::new();
    for (source, ptx) in SOURCES.iter().zip(ptx) {
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| format!("GPU {ordinal}: cannot load {} for {arch}: {e:?}", source.name))?;
        for &kernel in source.kernels {
            let function = module
                .load_function(kernel)
                .map_err(|e| format!("GPU {ordinal}: {} has no kernel {kernel}: {e:?}", source.name))?;
            kernels.insert(kernel, function);
        }
    }
    Ok(Gpu { ctx, name, compute_capability: cc, kernels })
}

/// Ops allocate and free scratch buffers all the time (stream-ordered, from the device's
/// pool). By default the pool hands freed memory back to the driver at every
/// synchronisation, so the next allocation pays for it again; keep it instead. The ledger
/// still counts what is live, which is what the memory reports use.
fn keep_freed_memory(ctx: &CudaContext) -> Result<(), cudarc::driver::DriverError> {
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut threshold = u64::MAX;
    // SAFETY: a device of a live context; the attribute takes a u64 by pointer.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device())?;
        cudarc::driver::sys::cuMemPoolSetAttribute(
            pool,
            cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
    }
}

/// The driver JIT-compiles our PTX, and it cannot read the PTX of a newer NVRTC. Caught
/// here, that is one clear line rather than an opaque module-load error.
fn check_nvrtc_not_newer_than_driver() -> Result<(), String> {
    let mut version = 0;
    // SAFETY: the driver library is present; the call writes one int.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    status.result().map_err(|e| format!("cuDriverGetVersion failed: {e:?}"))?;
    let driver = (version / 1000, (version % 1000) / 10);
    let nvrtc = nvrtc_version()?;
    if nvrtc > driver {
        return Err(format!(
            "NVRTC {}.{} is newer than the CUDA driver ({}.{}), which could not load its PTX; \
             install NVRTC {}.{} or older (PyPI: nvidia-cuda-nvrtc-cu12 for CUDA 12, nvidia-cuda-nvrtc \
             for CUDA 13) and put it first on LD_LIBRARY_PATH",
            nvrtc.0, nvrtc.1, driver.0, driver.1, driver.0, driver.1
        ));
    }
    Ok(())
}
