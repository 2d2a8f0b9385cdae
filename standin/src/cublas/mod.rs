//! cuBLAS: the handle, its stream, and the GEMMs cudarc and pipetrain call (cublasSgemm_v2,
//! cublasSgemmStridedBatched, cublasGemmEx, cublasGemmStridedBatchedEx).
//!
//! As in cuBLAS, a call checks its parameters and returns at once, its scalars read from
//! host memory (pointer mode host, the default); the products run later, in order, on the
//! handle's stream (the null stream until cublasSetStream_v2), so a caller that reads C
//! without synchronizing races here as on a GPU. Each product is computed in f32 with the
//! `gemm` crate, bf16 operands widened exactly and a bf16 C rounded once to nearest even;
//! with beta 0, C is never read (it may hold NaN), and with alpha 0, A and B are not.
//!
//! Modelled: real f32 and bf16 operands (A and B of one type; C f32, or bf16 with bf16
//! operands) under CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_PEDANTIC, any algorithm (a
//! hint); N, T and C (= T on real types) operations. Refused with NOT_SUPPORTED: other
//! types, the reduced-precision compute types (FAST_16F, FAST_16BF, FAST_TF32, emulated),
//! which would round f32 operands in ways not modelled. Rejected with INVALID_VALUE, as
//! cuBLAS documents: negative sizes or batch counts, leading dimensions below
//! max(1, rows stored), null scalars, CUBLAS_OP_CONJG. Operands in device memory are host
//! memory here ([`crate::memory`]), read through the addresses given.

pub(crate) mod products;
#[cfg(test)]
mod tests;

use crate::devices;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cublasStatus_t, cudaDataType_t,
    cudaStream_t,
};
use cudarc::driver::sys::CUstream;
use products::{Element, Operand, Products};
use std::ffi::{c_int, c_longlong, c_void};

/// What a cublasHandle_t points to.
struct Handle {
    /// The stream products run on, a driver stream handle (null: the current context's
    /// null stream, resolved at each call as cuBLAS resolves the null stream).
    stream: CUstream,
}

/// The handle behind `handle`, or NOT_INITIALIZED for a null one.
///
/// # Safety
/// A non-null `handle` came from [`cublasCreate_v2`] and was not destroyed.
unsafe fn handle<'a>(handle: cublasHandle_t) -> Result<&'a mut Handle, cublasStatus_t> {
    // SAFETY: per the contract, a non-null handle is a live `Box<Handle>`.
    unsafe { (handle as *mut Handle).as_mut() }.ok_or(cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED)
}

fn status(result: Result<(), cublasStatus_t>) -> cublasStatus_t {
    result.err().unwrap_or(cublasStatus_t::CUBLAS_STATUS_SUCCESS)
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(out: *mut cublasHandle_t) -> cublasStatus_t {
    if out.is_null() {
        return cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
    }
    let created = Box::into_raw(Box::new(Handle { stream: std::ptr::null_mut() }));
    // SAFETY: `out` is non-null and, per the contract, writable.
    unsafe { *out = created as cublasHandle_t };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Waits for the work the handle enqueued, as cuBLAS does (it synchronizes the whole
/// device; the other streams are the driver's to wait for).
///
/// # Safety
/// `h` came from [`cublasCreate_v2`] and is not used again.
#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(h: cublasHandle_t) -> cublasStatus_t {
    // SAFETY: per the contract, a non-null `h` is a live `Box<Handle>`, not used again.
    status(unsafe { handle(h) }.map(|handle| {
        if let Some(stream) = devices::stream_of(handle.stream) {
            stream.synchronize();
        }
        drop(unsafe { Box::from_raw(handle as *mut Handle) });
    }))
}

/// # Safety
/// `h` came from [`cublasCreate_v2`]; `stream` is null, CUDA's legacy or per-thread handle,
/// or a live stream of the driver's.
#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(h: cublasHandle_t, stream: cudaStream_t) -> cublasStatus_t {
    // SAFETY: per the contract.
    status(unsafe { handle(h) }.map(|h| h.stream = stream as CUstream))
}

/// Enqueues a call's checked products on the handle's stream.
///
/// # Safety
/// A non-null `h` is live; the matrices are as [`Products::run`] requires when the stream
/// runs them.
unsafe fn enqueue(h: cublasHandle_t, products: Result<Products, cublasStatus_t>) -> cublasStatus_t {
    // SAFETY: per the contract.
    let stream = unsafe { handle(h) }.and_then(|handle| {
        devices::stream_of(handle.stream).ok_or(cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED)
    });
    status(stream.and_then(|stream| {
        let products = products?;
        if !products.is_empty() {
            // SAFETY: per the contract.
            stream.enqueue(Box::new(move || unsafe { products.run() }));
        }
        Ok(())
    }))
}

/// The compute types whose result is the plain f32 product the stand-in computes.
fn f32_compute(compute: cublasComputeType_t) -> Result<(), cublasStatus_t> {
    match compute {
        cublasComputeType_t::CUBLAS_COMPUTE_32F | cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC => Ok(()),
        _ => Err(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED),
    }
}

/// The operands of an Ex call (address, type, leading dimension, stride), if cuBLAS offers
/// their types under `compute` and the stand-in models them: f32 compute, A and B of one
/// type, C f32 or of their type.
fn ex_operands(
    compute: cublasComputeType_t,
    operands: [(usize, cudaDataType_t, c_int, c_longlong); 3],
) -> Result<(Operand, Operand, Operand), cublasStatus_t> {
    f32_compute(compute)?;
    let [a, b, c] =
        operands.map(|(addr, ty, ld, stride)| Element::of(ty).map(|ty| Operand { addr, ty, ld, stride }));
    let (a, b, c) = (a?, b?, c?);
    Element::check_types(a.ty, b.ty, c.ty)?;
    Ok((a, b, c))
}

fn f32_operand(addr: usize, ld: c_int, stride: c_longlong) -> Operand {
    Operand { addr, ty: Element::F32, ld, stride }
}

/// # Safety
/// As cuBLAS requires: a live handle, host scalars, and matrices of the sizes given that
/// stay valid until the stream has run the product.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasSgemm_v2(
    h: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
) -> cublasStatus_t {
    let operands =
        (f32_operand(a as usize, lda, 0), f32_operand(b as usize, ldb, 0), f32_operand(c as usize, ldc, 0));
    // SAFETY: per the contract.
    unsafe { enqueue(h, Products::check((transa, transb), (m, n, k), alpha, beta, operands, 1)) }
}

/// # Safety
/// As [`cublasSgemm_v2`], for each of the `batch` matrices `stride_*` elements apart.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasSgemmStridedBatched(
    h: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const f32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
) -> cublasStatus_t {
    let operands = (
        f32_operand(a as usize, lda, stride_a),
        f32_operand(b as usize, ldb, stride_b),
        f32_operand(c as usize, ldc, stride_c),
    );
    // SAFETY: per the contract.
    unsafe { enqueue(h, Products::check((transa, transb), (m, n, k), alpha, beta, operands, batch)) }
}

/// `algo` is a performance hint: every algorithm computes the same product here.
///
/// # Safety
/// As [`cublasSgemm_v2`], with `alpha` and `beta` pointing to f32 (the scale type of the
/// f32 compute types, the only ones accepted).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmEx(
    h: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: cudaDataType_t,
    lda: c_int,
    b: *const c_void,
    b_type: cudaDataType_t,
    ldb: c_int,
    beta: *const c_void,
    c: *mut c_void,
    c_type: cudaDataType_t,
    ldc: c_int,
    compute: cublasComputeType_t,
    _algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    let (alpha, beta) = (alpha as *const f32, beta as *const f32);
    let operands = [(a as usize, a_type, lda, 0), (b as usize, b_type, ldb, 0), (c as usize, c_type, ldc, 0)];
    let products = ex_operands(compute, operands)
        // SAFETY: per the contract.
        .and_then(|operands| unsafe {
            Products::check((transa, transb), (m, n, k), alpha, beta, operands, 1)
        });
    // SAFETY: per the contract.
    unsafe { enqueue(h, products) }
}

/// # Safety
/// As [`cublasGemmEx`], for each of the `batch` matrices `stride_*` elements apart.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    h: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: cudaDataType_t,
    lda: c_int,
    stride_a: c_longlong,
    b: *const c_void,
    b_type: cudaDataType_t,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const c_void,
    c: *mut c_void,
    c_type: cudaDataType_t,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
    compute: cublasComputeType_t,
    _algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    let (alpha, beta) = (alpha as *const f32, beta as *const f32);
    let operands = [
        (a as usize, a_type, lda, stride_a),
        (b as usize, b_type, ldb, stride_b),
        (c as usize, c_type, ldc, stride_c),
    ];
    let products = ex_operands(compute, operands)
        // SAFETY: per the contract.
        .and_then(|operands| unsafe {
            Products::check((transa, transb), (m, n, k), alpha, beta, operands, batch)
        });
    // SAFETY: per the contract.
    unsafe { enqueue(h, products) }
}
