//! Modules and launches. A module is the PTX NVRTC made of one kernel family: its
//! `.entry` names say which kernels it holds, and each runs as the emulated build of the
//! same source (crate::emulator). The PTX itself is not executed.

use super::{current, refuse, status};
use crate::devices;
use crate::devices::stream_of;
use crate::emulator::{self, Kernel};
use cudarc::driver::sys::{CUfunction, CUmodule, CUresult, CUstream};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::Ordering;

/// The kernels a module's PTX declares.
struct Module {
    entries: Vec<String>,
}

/// The `.entry` names of a PTX text.
fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix(".visible ").unwrap_or(line.trim_start());
            let name = rest.strip_prefix(".entry ")?;
            Some(name.split(|c: char| c == '(' || c.is_whitespace()).next()?.to_string())
        })
        .collect()
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut CUmodule, image: *const c_void) -> CUresult {
    if let Err(e) = current() {
        return e;
    }
    if image.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a PTX image is a NUL-terminated text.
    let Ok(ptx) = unsafe { CStr::from_ptr(image.cast()) }.to_str() else {
        return refuse(
            CUresult::CUDA_ERROR_INVALID_IMAGE,
            "a module image that is not PTX text (cubins are not modelled)",
        );
    };
    let entries = entries(ptx);
    if entries.is_empty() {
        return refuse(CUresult::CUDA_ERROR_INVALID_IMAGE, "a PTX module with no .entry");
    }
    // SAFETY: the caller passes a CUmodule to write.
    unsafe { *out = Box::into_raw(Box::new(Module { entries })) as CUmodule };
    CUresult::CUDA_SUCCESS
}

/// A module from a PTX file, as cuModuleLoadData from its text.
/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(out: *mut CUmodule, path: *const c_char) -> CUresult {
    if path.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
    match std::fs::read(&path).map(std::ffi::CString::new) {
        // SAFETY: a NUL-terminated image, as cuModuleLoadData takes.
        Ok(Ok(text)) => unsafe { cuModuleLoadData(out, text.as_ptr().cast()) },
        _ => refuse(CUresult::CUDA_ERROR_FILE_NOT_FOUND, &format!("cannot read the module {path}")),
    }
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    if module.is_null() {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    // SAFETY: made by cuModuleLoadData, unloaded once; functions are the emulator's
    // statics and outlive it.
    drop(unsafe { Box::from_raw(module as *mut Module) });
    CUresult::CUDA_SUCCESS
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    if module.is_null() || name.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a module handle from cuModuleLoadData and a NUL-terminated name.
    let (module, name) = unsafe { (&*(module as *const Module), CStr::from_ptr(name).to_string_lossy()) };
    if !module.entries.iter().any(|e| *e == name) {
        return CUresult::CUDA_ERROR_NOT_FOUND;
    }
    let kernels = match emulator::kernels() {
        Ok(k) => k,
        Err(why) => return refuse(CUresult::CUDA_ERROR_NOT_SUPPORTED, &why),
    };
    match kernels.get(name.as_ref()) {
        Some(kernel) => {
            // SAFETY: the caller passes a CUfunction to write; the kernel is static.
            unsafe { *out = kernel as *const Kernel as CUfunction };
            CUresult::CUDA_SUCCESS
        }
        None => refuse(
            CUresult::CUDA_ERROR_NOT_FOUND,
            &format!(
                "kernel {name} is in the PTX but not in kernels/cuda, so there is no emulated build of it"
            ),
        ),
    }
}

/// Function attributes: the one cudarc reads is the block size limit.
/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(value: *mut c_int, attrib: c_int, f: CUfunction) -> CUresult {
    if f.is_null() || value.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let v = match attrib {
        0 => 1024, // MAX_THREADS_PER_BLOCK
        _ => {
            return refuse(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                &format!("function attribute {attrib} is not modelled"),
            )
        }
    };
    // SAFETY: checked non-null.
    unsafe { *value = v };
    CUresult::CUDA_SUCCESS
}

/// Function attributes set: the one pipetrain sets is the dynamic shared memory a launch
/// may give (MAX_DYNAMIC_SHARED_SIZE_BYTES), up to the device's opt-in limit.
/// # Safety
/// The CUDA driver API's contract for this call: `f` a function from cuModuleGetFunction.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: CUfunction, attrib: c_int, value: c_int) -> CUresult {
    if f.is_null() {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    // SAFETY: a function handle from cuModuleGetFunction is a static Kernel.
    let kernel: &'static Kernel = unsafe { &*(f as *const Kernel) };
    match attrib {
        8 if (0..=devices::SHARED_PER_BLOCK_OPTIN).contains(&value) => {
            kernel.max_dynamic_shared.store(value, Ordering::Relaxed);
            CUresult::CUDA_SUCCESS
        }
        8 => refuse(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            &format!(
                "{}: MAX_DYNAMIC_SHARED_SIZE_BYTES {value}, past the device's {}",
                kernel.name,
                devices::SHARED_PER_BLOCK_OPTIN
            ),
        ),
        _ => refuse(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            &format!("function attribute {attrib} is not settable here"),
        ),
    }
}

/// A kernel's parameter values, copied at the launch as CUDA copies them, each in its own
/// 16-byte-aligned slot.
struct Params(Vec<Vec<u128>>);

/// A seed for the emulator's block and warp orders, from the launch alone: the same launch
/// runs in the same order every run, whatever the timing of other streams.
fn seed(kernel: &Kernel, grid: [u32; 3], block: [u32; 3]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in kernel.name.bytes().chain(grid.iter().chain(&block).flat_map(|d| d.to_le_bytes())) {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// # Safety
/// The CUDA driver API's contract for this call: each pointer valid for what it reads or writes.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // CUDA's signature
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if f.is_null() {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    // SAFETY: a function handle from cuModuleGetFunction is a static Kernel.
    let kernel: &'static Kernel = unsafe { &*(f as *const Kernel) };
    let (grid, block) = ([gx, gy, gz], [bx, by, bz]);
    let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
    if grid.contains(&0) || threads == 0 || threads > 1024 || gy > 65535 || gz > 65535 {
        return refuse(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            &format!("{}: grid {grid:?} of blocks {block:?} is not a valid launch", kernel.name),
        );
    }
    let most = kernel.max_dynamic_shared.load(Ordering::Relaxed);
    if i64::from(shared_bytes) > i64::from(most) {
        return refuse(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            &format!(
                "{}: {shared_bytes} bytes of dynamic shared memory, above its MAX_DYNAMIC_SHARED_SIZE_BYTES of {most}",
                kernel.name
            ),
        );
    }
    if !extra.is_null() || (params.is_null() && !kernel.param_sizes.is_empty()) {
        return refuse(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            &format!("{}: parameters must come as kernelParams", kernel.name),
        );
    }
    let Some(s) = stream_of(stream) else { return CUresult::CUDA_ERROR_INVALID_HANDLE };
    let copied = Params(
        kernel
            .param_sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let mut slot = vec![0u128; size.div_ceil(16)];
                // SAFETY: kernelParams holds a pointer to each parameter's value, of the
                // size the kernel's declaration gives (CUDA's contract for the caller).
                unsafe {
                    std::ptr::copy_nonoverlapping(*params.add(i) as *const u8, slot.as_mut_ptr().cast(), size)
                };
                slot
            })
            .collect(),
    );
    let order = seed(kernel, grid, block);
    s.enqueue(Box::new(move || {
        let mut copied = copied;
        let mut pointers: Vec<*mut c_void> =
            copied.0.iter_mut().map(|slot| slot.as_mut_ptr().cast()).collect();
        // SAFETY: one pointer per parameter, to a copy of its value; the device pointers
        // among them are the caller's, valid in stream order as CUDA requires.
        unsafe { kernel.launch(grid, block, shared_bytes, order, &mut pointers) };
    }));
    status(Ok(()))
}
