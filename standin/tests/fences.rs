//! The stand-in orders streams only by their events, as a GPU does: work on one stream
//! that reads what another writes sees the write only when it waits for that stream's
//! event. Dropping the wait must read the buffer before it is written, or a missing fence
//! in the host path would pass here and fail on a GPU.

use cuda_standin::driver::*;
use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUevent, CUfunction, CUmodule, CUresult, CUstream};
use std::ffi::c_void;

fn ok(r: CUresult) {
    assert_eq!(r, CUresult::CUDA_SUCCESS);
}

/// Stream A: a 200 ms host function, then `add` writing 1 + 1 into `out`; an event after
/// it; stream B: (the wait, if `wait`) then a copy of `out` to pinned host memory. What B
/// copied.
fn what_the_second_stream_reads(wait: bool) -> Vec<f32> {
    const N: usize = 256;
    // SAFETY: the driver's C API on this thread's context, with buffers of N floats.
    unsafe {
        ok(cuInit(0));
        let mut ctx: CUcontext = std::ptr::null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let ptx = c".visible .entry add(\n";
        let (mut module, mut add): (CUmodule, CUfunction) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuModuleLoadData(&mut module, ptx.as_ptr().cast()));
        ok(cuModuleGetFunction(&mut add, module, c"add".as_ptr()));
        let (mut ones, mut out): (CUdeviceptr, CUdeviceptr) = (0, 0);
        ok(cuMemAlloc_v2(&mut ones, N * 4));
        ok(cuMemAlloc_v2(&mut out, N * 4));
        ok(cuMemcpyHtoD_v2(ones, [1.0f32; N].as_ptr().cast(), N * 4));
        ok(cuMemsetD8_v2(out, 0, N * 4));
        let (mut a, mut b): (CUstream, CUstream) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuStreamCreate(&mut a, 1));
        ok(cuStreamCreate(&mut b, 1));
        unsafe extern "C" fn slow(_: *mut c_void) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        ok(cuLaunchHostFunc(a, Some(slow), std::ptr::null_mut()));
        let (mut o, mut x, mut y, mut n) = (out, ones, ones, N as u64);
        let mut params: [*mut c_void; 4] = [
            (&mut o as *mut u64).cast(),
            (&mut x as *mut u64).cast(),
            (&mut y as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        ok(cuLaunchKernel(add, 1, 1, 1, N as u32, 1, 1, 0, a, params.as_mut_ptr(), std::ptr::null_mut()));
        let mut written: CUevent = std::ptr::null_mut();
        ok(cuEventCreate(&mut written, 0));
        ok(cuEventRecord(written, a));
        if wait {
            ok(cuStreamWaitEvent(b, written, 0));
        }
        let mut host: *mut c_void = std::ptr::null_mut();
        ok(cuMemHostAlloc(&mut host, N * 4, 0));
        ok(cuMemcpyDtoHAsync_v2(host, out, N * 4, b));
        ok(cuStreamSynchronize(b));
        let read = std::slice::from_raw_parts(host.cast::<f32>(), N).to_vec();
        ok(cuStreamSynchronize(a));
        ok(cuMemFreeHost(host));
        ok(cuEventDestroy_v2(written));
        ok(cuStreamDestroy_v2(a));
        ok(cuStreamDestroy_v2(b));
        ok(cuMemFree_v2(ones));
        ok(cuMemFree_v2(out));
        ok(cuModuleUnload(module));
        read
    }
}

#[test]
fn with_the_wait_the_second_stream_reads_the_write() {
    if let Some(why) = cuda_standin::emulator::UNAVAILABLE {
        eprintln!("SKIP with_the_wait_the_second_stream_reads_the_write: no emulated kernels: {why}");
        return;
    }
    assert!(what_the_second_stream_reads(true).iter().all(|&x| x == 2.0));
}

#[test]
fn dropping_the_wait_reads_the_buffer_before_it_is_written() {
    if let Some(why) = cuda_standin::emulator::UNAVAILABLE {
        eprintln!("SKIP dropping_the_wait_reads_the_buffer_before_it_is_written: no emulated kernels: {why}");
        return;
    }
    assert!(what_the_second_stream_reads(false).iter().all(|&x| x == 0.0));
}
