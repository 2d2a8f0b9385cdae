//! Copies and fills. Device memory is host memory, so a copy is a `memcpy` run where CUDA
//! would run it:
//! - asynchronous copies on their stream's thread, in stream order;
//! - from pageable host memory, the source is staged at the call, so the caller may reuse
//!   it at once (as CUDA stages it);
//! - to pageable host memory, the call returns when the copy is done (as CUDA's does);
//!   to page-locked memory it returns at once, and the caller must synchronise;
//! - the synchronous copies wait for all the GPU's work first, then copy.

use super::{current, status};
use crate::devices::stream_of;
use crate::memory;
use crate::stream::{synchronize_device, Stream};
use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};
use std::ffi::{c_uchar, c_void};
use std::sync::Arc;

/// A raw address moved into a stream's job.
#[derive(Clone, Copy)]
struct Addr(usize);

fn device_range(ptr: CUdeviceptr, bytes: usize) -> Result<(), CUresult> {
    match memory::device_of(ptr, bytes) {
        Some(_) => Ok(()),
        None => Err(super::refuse(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            &format!("{bytes} bytes at {ptr:#x} are not inside one device allocation"),
        )),
    }
}

fn stream(handle: CUstream) -> Result<Arc<Stream>, CUresult> {
    stream_of(handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

fn copy_job(dst: Addr, src: Addr, bytes: usize) -> Box<dyn FnOnce() + Send> {
    // SAFETY: both ranges were checked (device) or are the caller's (host) for the copy's
    // duration, as CUDA requires of them.
    Box::new(move || unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) })
}

fn htod(dst: CUdeviceptr, src: *const c_void, bytes: usize, s: &Stream) -> Result<(), CUresult> {
    device_range(dst, bytes)?;
    if memory::is_pinned(src.cast(), bytes) {
        s.enqueue(copy_job(Addr(dst as usize), Addr(src as usize), bytes));
    } else {
        // SAFETY: the caller's source holds `bytes` bytes during the call.
        let staged = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes) }.to_vec();
        s.enqueue(Box::new(move || {
            // SAFETY: the destination was checked to lie in one allocation.
            unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst as *mut u8, bytes) }
        }));
    }
    Ok(())
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, bytes: usize, s: &Stream) -> Result<(), CUresult> {
    device_range(src, bytes)?;
    let position = s.enqueue(copy_job(Addr(dst as usize), Addr(src as usize), bytes));
    if !memory::is_pinned(dst.cast(), bytes) {
        s.wait_for(position);
    }
    Ok(())
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: &Stream) -> Result<(), CUresult> {
    device_range(dst, bytes)?;
    device_range(src, bytes)?;
    s.enqueue(copy_job(Addr(dst as usize), Addr(src as usize), bytes));
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    h: CUstream,
) -> CUresult {
    status(stream(h).and_then(|s| htod(dst, src, bytes, &s)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    h: CUstream,
) -> CUresult {
    status(stream(h).and_then(|s| dtoh(dst, src, bytes, &s)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    h: CUstream,
) -> CUresult {
    status(stream(h).and_then(|s| dtod(dst, src, bytes, &s)))
}

/// Runs a synchronous operation on the context's null stream after all the GPU's work,
/// and waits for it.
fn synchronous(op: impl FnOnce(&Stream) -> Result<(), CUresult>) -> CUresult {
    status(current().and_then(|ctx| {
        synchronize_device(ctx.device);
        op(&ctx.null_stream)?;
        ctx.null_stream.synchronize();
        Ok(())
    }))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult {
    synchronous(|s| htod(dst, src, bytes, s))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult {
    synchronous(|s| dtoh(dst, src, bytes, s))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    synchronous(|s| dtod(dst, src, bytes, s))
}

fn memset(dst: CUdeviceptr, value: c_uchar, bytes: usize, s: &Stream) -> Result<(), CUresult> {
    device_range(dst, bytes)?;
    // SAFETY: the range was checked to lie in one allocation.
    s.enqueue(Box::new(move || unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) }));
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, value: c_uchar, n: usize, h: CUstream) -> CUresult {
    status(stream(h).and_then(|s| memset(dst, value, n, &s)))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) -> CUresult {
    synchronous(|s| memset(dst, value, n, s))
}

/// A copy between two GPUs' memory: one address space here, so a device copy on the
/// stream; the contexts must name GPUs that exist.
#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: cudarc::driver::sys::CUcontext,
    src: CUdeviceptr,
    src_ctx: cudarc::driver::sys::CUcontext,
    bytes: usize,
    h: CUstream,
) -> CUresult {
    if dst_ctx.is_null() || src_ctx.is_null() {
        return CUresult::CUDA_ERROR_INVALID_CONTEXT;
    }
    status(stream(h).and_then(|s| dtod(dst, src, bytes, &s)))
}
