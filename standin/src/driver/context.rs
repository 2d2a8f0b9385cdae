//! Initialisation, devices and their primary contexts.

use super::{current, refuse, status, INITIALISED};
use crate::devices::{self, Context};
use cudarc::driver::sys::{CUcontext, CUdevice, CUresult, CUuuid};
use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::Ordering;

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    devices::count(); // reads (and checks) the environment now, not at a later call
    INITIALISED.store(true, Ordering::Release);
    CUresult::CUDA_SUCCESS
}

fn initialised() -> Result<(), CUresult> {
    if INITIALISED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_NOT_INITIALIZED)
    }
}

fn device(ordinal: CUdevice) -> Result<usize, CUresult> {
    initialised()?;
    usize::try_from(ordinal).ok().filter(|&d| d < devices::count()).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    if version.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes an int to write.
    unsafe { *version = devices::DRIVER_VERSION };
    CUresult::CUDA_SUCCESS
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    status(initialised().map(|()| {
        // SAFETY: the caller passes an int to write.
        unsafe { *count = devices::count() as c_int }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(out: *mut CUdevice, ordinal: c_int) -> CUresult {
    status(device(ordinal).map(|d| {
        // SAFETY: the caller passes a CUdevice to write.
        unsafe { *out = d as CUdevice }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    status(device(dev).map(|_| {
        let bytes = devices::NAME.as_bytes();
        let n = bytes.len().min(len.max(1) as usize - 1);
        // SAFETY: the caller's buffer holds `len` bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast(), n);
            *name.add(n) = 0;
        }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    status(device(dev).map(|d| {
        // SAFETY: the caller passes a size_t to write.
        unsafe { *bytes = devices::capacity(d) }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    status(device(dev).map(|d| {
        let mut bytes = [0 as c_char; 16];
        bytes[0] = d as c_char;
        // SAFETY: the caller passes a CUuuid to write.
        unsafe { (*uuid).bytes = bytes }
    }))
}

/// The attributes cudarc and pipetrain read, with an H100's values where they matter to
/// launch shapes; any other is refused, saying which.
fn attribute(attrib: c_int) -> Option<c_int> {
    Some(match attrib {
        1 => 1024,                             // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                         // MAX_BLOCK_DIM_X, _Y
        4 => 64,                               // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                         // MAX_GRID_DIM_X
        6 | 7 => 65535,                        // MAX_GRID_DIM_Y, _Z
        8 => devices::SHARED_PER_BLOCK,        // MAX_SHARED_MEMORY_PER_BLOCK
        10 => 32,                              // WARP_SIZE
        16 => devices::MULTIPROCESSORS,        // MULTIPROCESSOR_COUNT
        39 => 2048,                            // MAX_THREADS_PER_MULTIPROCESSOR
        75 => devices::COMPUTE_CAPABILITY.0,   // COMPUTE_CAPABILITY_MAJOR
        76 => devices::COMPUTE_CAPABILITY.1,   // COMPUTE_CAPABILITY_MINOR
        97 => devices::SHARED_PER_BLOCK_OPTIN, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        115 => 1,                              // MEMORY_POOLS_SUPPORTED
        _ => return None,
    })
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    if let Err(e) = device(dev) {
        return e;
    }
    match attribute(attrib) {
        Some(v) => {
            // SAFETY: the caller passes an int to write.
            unsafe { *value = v };
            CUresult::CUDA_SUCCESS
        }
        None => {
            refuse(CUresult::CUDA_ERROR_INVALID_VALUE, &format!("device attribute {attrib} is not modelled"))
        }
    }
}

fn handle(ctx: &'static Context) -> CUcontext {
    ctx as *const Context as CUcontext
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    status(device(dev).map(|d| {
        // SAFETY: the caller passes a CUcontext to write.
        unsafe { *ctx = handle(devices::primary(d).expect("a GPU below the count has a context")) }
    }))
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    status(device(dev).map(drop))
}

/// The context a handle names, if it is one of ours.
fn context(ctx: CUcontext) -> Option<&'static Context> {
    (0..devices::count()).filter_map(devices::primary).find(|c| handle(c) == ctx)
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    if let Err(e) = initialised() {
        return e;
    }
    if ctx.is_null() {
        devices::set_current(None);
        return CUresult::CUDA_SUCCESS;
    }
    match context(ctx) {
        Some(c) => {
            devices::set_current(Some(c.device));
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_CONTEXT,
    }
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult {
    status(initialised().map(|()| {
        let c = devices::current().map_or(std::ptr::null_mut(), handle);
        // SAFETY: the caller passes a CUcontext to write.
        unsafe { *ctx = c }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    status(current().map(|c| {
        // SAFETY: the caller passes a CUdevice to write.
        unsafe { *dev = c.device as CUdevice }
    }))
}

/// Waits for every stream of the current context's GPU.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    status(current().map(|c| crate::stream::synchronize_device(c.device)))
}

/// Only primary contexts exist here, and those are released, not destroyed.
#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let why = if context(ctx).is_some() {
        "cuCtxDestroy of a primary context"
    } else {
        "cuCtxDestroy of an unknown context"
    };
    refuse(CUresult::CUDA_ERROR_INVALID_CONTEXT, why)
}
