//! Streams, events and host functions.

use super::{current, status};
use crate::devices::stream_of;
use crate::stream::{into_handle, release_handle, Event, NotReady, Stream};
use cudarc::driver::sys::{CUevent, CUhostFn, CUresult, CUstream};
use std::ffi::{c_float, c_int, c_uint, c_void};

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(out: *mut CUstream, _flags: c_uint) -> CUresult {
    status(current().map(|ctx| {
        // SAFETY: the caller passes a CUstream to write.
        unsafe { *out = into_handle(Stream::new(ctx.device)) }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut CUstream,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    // SAFETY: as cuStreamCreate; every stand-in stream has the same priority.
    unsafe { cuStreamCreate(out, flags) }
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    if (stream as usize) <= 2 {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    // SAFETY: a handle this library made, destroyed once, as the caller must.
    unsafe { release_handle(stream) };
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    match stream_of(stream) {
        Some(s) => {
            s.synchronize();
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}

/// A host function pointer and its argument, moved to the stream's thread.
struct HostCall(unsafe extern "C" fn(*mut c_void), usize);

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, data: *mut c_void) -> CUresult {
    let (Some(s), Some(f)) = (stream_of(stream), f) else { return CUresult::CUDA_ERROR_INVALID_VALUE };
    let call = HostCall(f, data as usize);
    s.enqueue(Box::new(move || {
        let HostCall(f, data) = call;
        // SAFETY: the caller's function and argument, called once in stream order.
        unsafe { f(data as *mut c_void) }
    }));
    CUresult::CUDA_SUCCESS
}

fn event<'a>(e: CUevent) -> Option<&'a Event> {
    // SAFETY: a non-null event handle is a Box<Event> from cuEventCreate, live until
    // cuEventDestroy (using it after is the caller's bug, as in CUDA).
    (!e.is_null()).then(|| unsafe { &*(e as *const Event) })
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(out: *mut CUevent, _flags: c_uint) -> CUresult {
    status(current().map(|_| {
        // SAFETY: the caller passes a CUevent to write.
        unsafe { *out = Box::into_raw(Box::<Event>::default()) as CUevent }
    }))
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    if e.is_null() {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    // SAFETY: made by cuEventCreate, destroyed once. Waits already enqueued hold their own
    // reference to the mark.
    drop(unsafe { Box::from_raw(e as *mut Event) });
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: CUevent, stream: CUstream) -> CUresult {
    let (Some(e), Some(s)) = (event(e), stream_of(stream)) else {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    };
    e.record(&s);
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, e: CUevent, _flags: c_uint) -> CUresult {
    let (Some(s), Some(e)) = (stream_of(stream), event(e)) else {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    };
    e.make_wait(&s);
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    let Some(e) = event(e) else { return CUresult::CUDA_ERROR_INVALID_HANDLE };
    e.synchronize();
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    match event(e) {
        Some(e) if e.is_done() => CUresult::CUDA_SUCCESS,
        Some(_) => CUresult::CUDA_ERROR_NOT_READY,
        None => CUresult::CUDA_ERROR_INVALID_HANDLE,
    }
}

/// Milliseconds between two events' marks, on the host's clock.
/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    let (Some(start), Some(end)) = (event(start), event(end)) else {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    };
    match (start.reached(), end.reached()) {
        (Ok(a), Ok(b)) => {
            let signed = if b >= a { (b - a).as_secs_f64() } else { -(a - b).as_secs_f64() };
            // SAFETY: the caller passes a float to write.
            unsafe { *ms = (signed * 1e3) as c_float };
            CUresult::CUDA_SUCCESS
        }
        (Err(NotReady::Unrecorded), _) | (_, Err(NotReady::Unrecorded)) => {
            CUresult::CUDA_ERROR_INVALID_HANDLE
        }
        _ => CUresult::CUDA_ERROR_NOT_READY,
    }
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut c_float, start: CUevent, end: CUevent) -> CUresult {
    // SAFETY: as the _v2 entry point, which has the same contract.
    unsafe { cuEventElapsedTime_v2(ms, start, end) }
}
