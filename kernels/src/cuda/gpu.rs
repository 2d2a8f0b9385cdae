//! One CUDA context and one set of loaded kernels per GPU, opened on first use and shared
//! by every [`super::CudaDevice`] on that GPU (several pipeline stages may share one); NVRTC
//! compiles the kernels once per architecture per process. A GPU opened for a sole device
//! runs without cudarc's per-buffer event tracking (`GpuUse`).

use super::compile::{compile, nvrtc_version};
use super::launch::DYNAMIC_SHARED;
use super::sources::SOURCES;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

/// How the devices of this process use a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum GpuUse {
    /// Several devices (pipeline stages in threads) share it and hand tensors between their
    /// streams: cudarc's per-buffer events order each buffer's uses across streams, and the
    /// arena's reuse of a buffer on another stream.
    Shared,
    /// One device uses it; what crosses to another stream (an NCCL communicator's) is
    /// ordered by the device's explicit fences. cudarc's per-buffer event tracking is off,
    /// saving an event record and a stream wait per buffer argument of every launch.
    Sole,
}

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

/// The GPUs open now, by ordinal and use. Held weakly: a GPU closes with its last device
/// (its compiled kernels stay in [`PTX`]).
static GPUS: Mutex<BTreeMap<(usize, GpuUse), Weak<Gpu>>> = Mutex::new(BTreeMap::new());

/// Every source compiled for an architecture, once per process.
static PTX: Mutex<BTreeMap<String, Arc<Vec<String>>>> = Mutex::new(BTreeMap::new());

/// The PTX of every source for `arch`, compiled on first call (in parallel).
fn ptx_for(arch: &str) -> Result<Arc<Vec<String>>, String> {
    let mut cache = PTX.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ptx) = cache.get(arch) {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(SOURCES.par_iter().map(|s| compile(s, arch)).collect::<Result<Vec<_>, _>>()?);
    cache.insert(arch.to_string(), ptx.clone());
    Ok(ptx)
}

/// The GPU `ordinal`, opened (context, compiled and loaded kernels) for a device that uses
/// it as `used` says: once for all shared devices; for a sole one, a context wrapper of its
/// own over the GPU's primary context (cudarc keeps its tracking flag per wrapper), opened
/// afresh once the previous sole device has gone. Two live sole devices on one GPU are a
/// bug in the caller, said as an error.
pub(super) fn gpu(ordinal: usize, used: GpuUse) -> Result<Arc<Gpu>, String> {
    let mut gpus = GPUS.lock().unwrap_or_else(|e| e.into_inner());
    match (used, gpus.get(&(ordinal, used)).and_then(Weak::upgrade)) {
        (GpuUse::Shared, Some(gpu)) => return Ok(gpu),
        (GpuUse::Sole, Some(_)) => {
            return Err(format!("GPU {ordinal} already has its sole device in this process"))
        }
        (_, None) => {}
    }
    let gpu = Arc::new(open(ordinal, used)?);
    gpus.insert((ordinal, used), Arc::downgrade(&gpu));
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

fn open(ordinal: usize, used: GpuUse) -> Result<Gpu, String> {
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
    if used == GpuUse::Sole {
        // SAFETY: no buffer exists on the context yet, and its one device orders every
        // crossing to another stream with its own fences (see GpuUse::Sole).
        unsafe { ctx.disable_event_tracking() };
    }

    let arch = format!("compute_{}{}", cc.0, cc.1);
    let ptx = ptx_for(&arch)?;
    let mut kernels = HashMap::new();
    for (source, ptx) in SOURCES.iter().zip(ptx.iter()) {
        let module = ctx
            .load_module(Ptx::from_src(ptx.as_str()))
            .map_err(|e| format!("GPU {ordinal}: cannot load {} for {arch}: {e:?}", source.name))?;
        for &kernel in source.kernels {
            let function = module
                .load_function(kernel)
                .map_err(|e| format!("GPU {ordinal}: {} has no kernel {kernel}: {e:?}", source.name))?;
            if let Some(&(_, bytes)) = DYNAMIC_SHARED.iter().find(|(name, _)| *name == kernel) {
                let limit = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                function.set_attribute(limit, bytes as i32).map_err(|e| {
                    format!(
                        "GPU {ordinal}: {kernel} cannot take {bytes} bytes of dynamic shared memory: {e:?}"
                    )
                })?;
            }
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
