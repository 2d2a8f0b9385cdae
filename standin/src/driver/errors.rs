//! Error names and descriptions, as cudarc prints them.

use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, CStr};

fn describe(e: CUresult) -> (&'static CStr, &'static CStr) {
    use CUresult::*;
    match e {
        CUDA_SUCCESS => (c"CUDA_SUCCESS", c"no error"),
        CUDA_ERROR_INVALID_VALUE => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        CUDA_ERROR_OUT_OF_MEMORY => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        CUDA_ERROR_NOT_INITIALIZED => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        CUDA_ERROR_INVALID_DEVICE => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        CUDA_ERROR_INVALID_IMAGE => (c"CUDA_ERROR_INVALID_IMAGE", c"device kernel image is invalid"),
        CUDA_ERROR_INVALID_CONTEXT => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        CUDA_ERROR_INVALID_HANDLE => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        CUDA_ERROR_NOT_FOUND => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        CUDA_ERROR_NOT_READY => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        CUDA_ERROR_NOT_SUPPORTED => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        _ => (c"CUDA_ERROR_UNKNOWN", c"an error the stand-in does not name"),
    }
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: the caller passes a pointer to write; the string is static.
    unsafe { *out = describe(error).0.as_ptr() };
    CUresult::CUDA_SUCCESS
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: the caller passes a pointer to write; the string is static.
    unsafe { *out = describe(error).1.as_ptr() };
    CUresult::CUDA_SUCCESS
}
