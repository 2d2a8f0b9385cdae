//! Allocation: synchronous and stream-ordered, device and page-locked host memory, and the
//! memory pool cudarc configures.

use super::{current, status};
use crate::devices::stream_of;
use crate::memory;
use cudarc::driver::sys::{CUdevice, CUdeviceptr, CUmemoryPool, CUresult, CUstream};
use std::ffi::{c_int, c_uint, c_void};

fn allocate(out: *mut CUdeviceptr, bytes: usize) -> Result<(), CUresult> {
    let ctx = current()?;
    if out.is_null() || bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let addr = memory::allocate(ctx.device, bytes).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: checked non-null; the caller passes a CUdeviceptr to write.
    unsafe { *out = addr };
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(out: *mut CUdeviceptr, bytes: usize) -> CUresult {
    status(allocate(out, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    status(current().and_then(|ctx| {
        // Freeing waits for the GPU's work, as cuMemFree does.
        crate::stream::synchronize_device(ctx.device);
        if memory::free(ptr) {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
    }))
}

/// Stream-ordered allocation: the memory exists from now (so the capacity counts it at
/// once), which any stream order allows.
#[no_mangle]
pub extern "C" fn cuMemAllocAsync(out: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    if stream_of(stream).is_none() {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    status(allocate(out, bytes))
}

/// Stream-ordered free: poisoned when the stream reaches it, so work enqueued before the
/// free still reads the values, and work after it (on any stream) that was not ordered
/// after it may read NaN.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let Some(s) = stream_of(stream) else { return CUresult::CUDA_ERROR_INVALID_HANDLE };
    if memory::device_of(ptr, 1).is_none() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    s.enqueue(Box::new(move || {
        if !memory::free(ptr) {
            eprintln!("cuda stand-in: cuMemFreeAsync of {ptr:#x}, which was freed twice");
            std::process::abort();
        }
    }));
    CUresult::CUDA_SUCCESS
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    status(current().map(|ctx| {
        let cap = crate::devices::capacity(ctx.device);
        // SAFETY: the caller passes two size_ts to write.
        unsafe {
            *free = cap - memory::used(ctx.device).min(cap);
            *total = cap;
        }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(out: *mut *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    match memory::allocate_pinned(bytes) {
        Some(p) => {
            // SAFETY: the caller passes a pointer to write.
            unsafe { *out = p.cast() };
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
    }
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(out: *mut *mut c_void, bytes: usize) -> CUresult {
    // SAFETY: as cuMemHostAlloc.
    unsafe { cuMemHostAlloc(out, bytes, 0) }
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CUresult {
    if memory::free_pinned(ptr.cast()) {
        CUresult::CUDA_SUCCESS
    } else {
        CUresult::CUDA_ERROR_INVALID_VALUE
    }
}

/// Each GPU has one pool, its default; its handle is the GPU's ordinal + 1.
/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    if dev < 0 || dev as usize >= crate::devices::count() {
        return CUresult::CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: the caller passes a handle to write.
    unsafe { *pool = (dev as usize + 1) as CUmemoryPool };
    CUresult::CUDA_SUCCESS
}

/// Pool attributes: the stand-in keeps nothing back, so a release threshold (the one
/// attribute pipetrain sets) changes nothing it models.
#[no_mangle]
pub extern "C" fn cuMemPoolSetAttribute(pool: CUmemoryPool, _attr: c_int, value: *mut c_void) -> CUresult {
    if pool.is_null() || value.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    CUresult::CUDA_SUCCESS
}
