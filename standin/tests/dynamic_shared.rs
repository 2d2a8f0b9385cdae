//! Dynamic shared memory as a GPU limits it: a launch may give a kernel up to 48 KB unless
//! the kernel's MAX_DYNAMIC_SHARED_SIZE_BYTES is raised, which may go up to the device's
//! opt-in limit. The tensor-core forward at head size 128 takes 69,632 bytes, so a device
//! that forgot to raise its limit would fail on a GPU; it must fail here too.

use cuda_standin::driver::*;
use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUfunction, CUmodule, CUresult, CUstream};
use kernels::attention::ATTENTION_MMA_FORWARD_HS128_SHARED;
use std::ffi::c_void;

const FORWARD: &str = "fused_attention_forward_bf16_hs128";

fn ok(r: CUresult) {
    assert_eq!(r, CUresult::CUDA_SUCCESS);
}

/// Launches the forward over one head of T = 16 at head size 16 with `shared` bytes of
/// dynamic shared memory, q, k and v zero; what it returned, then out and lse once it ran.
/// With q = 0 every score is 0: out (the mean of zero values) is 0 and lse_i = ln(i + 1).
///
/// # Safety
/// `forward` is the kernel's handle on the current context.
unsafe fn launch(forward: CUfunction, shared: u32) -> (CUresult, Vec<u16>, Vec<f32>) {
    const T: usize = 16;
    let (mut out, mut lse, mut qkv): (CUdeviceptr, CUdeviceptr, CUdeviceptr) = (0, 0, 0);
    // SAFETY: buffers of the sizes the kernel reads and writes at this shape; each
    // parameter a pointer to a value of the size the kernel declares (the mask's zeros
    // are never read without dropout).
    unsafe {
        ok(cuMemAlloc_v2(&mut out, T * 16 * 2));
        ok(cuMemAlloc_v2(&mut lse, T * 4));
        ok(cuMemAlloc_v2(&mut qkv, T * 48 * 2));
        ok(cuMemsetD8_v2(qkv, 0, T * 48 * 2));
        let mut stream: CUstream = std::ptr::null_mut();
        ok(cuStreamCreate(&mut stream, 1));
        let (mut o, mut l, mut x) = (out, lse, qkv);
        // The causal mask: a window of T keys.
        let (mut t, mut nh, mut kv, mut hs, mut window, mut dropout) =
            (T as i32, 1i32, 1i32, 16i32, T as i32, 0i32);
        let mask_bytes =
            cuda_standin::emulator::kernels().expect("the families load")[FORWARD].param_sizes[8];
        let mut mask = vec![0u8; mask_bytes];
        let mut params: [*mut c_void; 10] = [
            (&mut o as *mut u64).cast(),
            (&mut l as *mut u64).cast(),
            (&mut x as *mut u64).cast(),
            (&mut t as *mut i32).cast(),
            (&mut nh as *mut i32).cast(),
            (&mut kv as *mut i32).cast(),
            (&mut hs as *mut i32).cast(),
            (&mut window as *mut i32).cast(),
            mask.as_mut_ptr().cast(),
            (&mut dropout as *mut i32).cast(),
        ];
        let launched = cuLaunchKernel(
            forward,
            1,
            1,
            1,
            128,
            1,
            1,
            shared,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        ok(cuStreamSynchronize(stream));
        let (mut out_host, mut lse_host) = (vec![0u16; T * 16], vec![0f32; T]);
        if launched == CUresult::CUDA_SUCCESS {
            ok(cuMemcpyDtoH_v2(out_host.as_mut_ptr().cast(), out, T * 16 * 2));
            ok(cuMemcpyDtoH_v2(lse_host.as_mut_ptr().cast(), lse, T * 4));
        }
        ok(cuStreamDestroy_v2(stream));
        for b in [out, lse, qkv] {
            ok(cuMemFree_v2(b));
        }
        (launched, out_host, lse_host)
    }
}

#[test]
fn a_launch_past_48_kb_needs_the_kernels_limit_raised() {
    if let Some(why) = cuda_standin::emulator::UNAVAILABLE {
        eprintln!("SKIP a_launch_past_48_kb_needs_the_kernels_limit_raised: no emulated kernels: {why}");
        return;
    }
    let bytes = ATTENTION_MMA_FORWARD_HS128_SHARED;
    assert!(bytes > 48 * 1024, "the forward at 128 is the case this checks");
    // SAFETY: the driver's C API on this thread's context.
    unsafe {
        ok(cuInit(0));
        let mut ctx: CUcontext = std::ptr::null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let ptx = format!(".visible .entry {FORWARD}(\n\0");
        let (mut module, mut forward): (CUmodule, CUfunction) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuModuleLoadData(&mut module, ptx.as_ptr().cast()));
        ok(cuModuleGetFunction(&mut forward, module, format!("{FORWARD}\0").as_ptr().cast()));

        assert_eq!(
            launch(forward, bytes).0,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "a launch past 48 KB, not raised"
        );
        let limit = 8; // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        assert_eq!(cuFuncSetAttribute(forward, limit, 227 * 1024 + 1), CUresult::CUDA_ERROR_INVALID_VALUE);
        ok(cuFuncSetAttribute(forward, limit, bytes as i32));
        assert_eq!(launch(forward, bytes + 1).0, CUresult::CUDA_ERROR_INVALID_VALUE, "past the raised limit");

        let (launched, out, lse) = launch(forward, bytes);
        ok(launched);
        assert!(out.iter().all(|&x| x == 0), "out {out:?}");
        let expected: Vec<f32> = (0..16).map(|i| ((i + 1) as f32).ln()).collect();
        for (i, (&got, &want)) in lse.iter().zip(&expected).enumerate() {
            assert!((got - want).abs() <= 1e-6, "lse[{i}] = {got}, ln({}) = {want}", i + 1);
        }
        ok(cuModuleUnload(module));
    }
}
