//! cuBLASLt: the handle, matmul descriptors, matrix layouts, preferences, the algorithm
//! heuristic and cublasLtMatmul, as pipetrain calls them.
//!
//! A matmul is checked when called, its scalars read from host memory (f32, the only scale
//! type accepted), and enqueued on the stream it names (null: the current context's null
//! stream, as in [`crate::cublas`]); it runs later, in stream order, through the cuBLAS
//! stand-in's products: D = alpha op(A) op(B) + beta C in f32, then the epilogue on the f32
//! result, then one rounding to D's type. With beta 0, C is not read. The heuristic checks
//! the same problem and offers one algorithm that needs no workspace; any algorithm (or
//! none) and any workspace are accepted by the matmul, since every one computes the same.
//!
//! Modelled: CUBLAS_COMPUTE_32F and _32F_PEDANTIC with scale type CUDA_R_32F; A and B both
//! CUDA_R_32F or both CUDA_R_16BF, C and D of one type, f32 or (bf16 operands only) bf16;
//! one matrix per layout, column-major; the epilogues DEFAULT, BIAS and DGELU
//! (`plan::Epilogue`). Refused with NOT_SUPPORTED: other compute, scale and data types,
//! other epilogues, descriptor, layout or preference attributes not listed at their setter,
//! sizes or leading dimensions above i32::MAX (the products take C ints), a DGELU aux matrix
//! whose leading dimension is not a multiple of 8 at least m or whose address is not
//! 16-byte aligned (cuBLASLt's own requirements). Rejected with INVALID_VALUE: a bias or
//! DGELU aux of another type than D (as cuBLASLt 13.1's heuristic answered on an H200,
//! 2026-11-27, for f32 and bf16 D at GPT-2's shapes and a small one), null
//! pointers where one is required (the heuristic does not look at the bias and aux
//! pointers' presence, which may be set after it), an attribute buffer of the wrong size,
//! a layout's leading dimension below max(1, rows), layouts inconsistent with the
//! operations, CUBLAS_OP_CONJG, and C == D with different leading dimensions (cuBLASLt
//! computes in place only with C's layout equal to D's).

mod plan;
#[cfg(test)]
mod tests;

use crate::cublas::products::Element;
use crate::devices;
use cudarc::cublas::sys as blas;
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t, cublasLtMatmulDesc_t, cublasLtMatmulHeuristicResult_t,
    cublasLtMatmulPreferenceAttributes_t, cublasLtMatmulPreference_t, cublasLtMatrixLayout_t, cublasStatus_t,
    cudaDataType, cudaStream_t,
};
use cudarc::driver::sys::CUstream;
use plan::Problem;
use std::ffi::{c_int, c_void};

const INVALID: cublasStatus_t = cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
const NOT_SUPPORTED: cublasStatus_t = cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED;

/// What a cublasLtHandle_t points to. cuBLASLt's handle holds no stream (each matmul names
/// its own), and the stand-in nothing else: the byte gives each handle its own address.
struct Handle {
    _address: u8,
}

/// What a cublasLtMatmulDesc_t points to: the attributes as set, raw, checked when the
/// heuristic or a matmul reads them (as cuBLASLt checks them).
#[derive(Clone, Copy)]
struct Desc {
    /// cublasOperation_t values.
    transa: i32,
    transb: i32,
    /// A cublasLtEpilogue_t value.
    epilogue: u32,
    bias: usize,
    /// cudaDataType_t values; -1: D's type.
    bias_type: i32,
    aux: usize,
    aux_ld: i64,
    aux_type: i32,
}

/// What a cublasLtMatrixLayout_t points to: one column-major matrix, `ld` >= max(1, rows),
/// every size at most i32::MAX.
#[derive(Clone, Copy)]
struct Layout {
    ty: Element,
    rows: usize,
    cols: usize,
    ld: usize,
}

/// What a cublasLtMatmulPreference_t points to: nothing, as its one attribute, the
/// workspace allowed, rules nothing out here, where every algorithm needs none.
struct Preference;

/// cuBLASLt's status for the cuBLAS stand-in's (the same codes, one enum per cudarc module).
fn lt_status(status: blas::cublasStatus_t) -> cublasStatus_t {
    use blas::cublasStatus_t as B;
    use cublasStatus_t as L;
    match status {
        B::CUBLAS_STATUS_SUCCESS => L::CUBLAS_STATUS_SUCCESS,
        B::CUBLAS_STATUS_NOT_INITIALIZED => L::CUBLAS_STATUS_NOT_INITIALIZED,
        B::CUBLAS_STATUS_ALLOC_FAILED => L::CUBLAS_STATUS_ALLOC_FAILED,
        B::CUBLAS_STATUS_INVALID_VALUE => L::CUBLAS_STATUS_INVALID_VALUE,
        B::CUBLAS_STATUS_ARCH_MISMATCH => L::CUBLAS_STATUS_ARCH_MISMATCH,
        B::CUBLAS_STATUS_MAPPING_ERROR => L::CUBLAS_STATUS_MAPPING_ERROR,
        B::CUBLAS_STATUS_EXECUTION_FAILED => L::CUBLAS_STATUS_EXECUTION_FAILED,
        B::CUBLAS_STATUS_INTERNAL_ERROR => L::CUBLAS_STATUS_INTERNAL_ERROR,
        B::CUBLAS_STATUS_NOT_SUPPORTED => L::CUBLAS_STATUS_NOT_SUPPORTED,
        B::CUBLAS_STATUS_LICENSE_ERROR => L::CUBLAS_STATUS_LICENSE_ERROR,
    }
}

fn status(result: Result<(), cublasStatus_t>) -> cublasStatus_t {
    result.err().unwrap_or(cublasStatus_t::CUBLAS_STATUS_SUCCESS)
}

/// Boxes `value` into `*out`, cuBLASLt's opaque pointer to it.
///
/// # Safety
/// `out` is null or writable.
unsafe fn create<T, Opaque>(out: *mut *mut Opaque, value: T) -> cublasStatus_t {
    if out.is_null() {
        return INVALID;
    }
    // SAFETY: `out` is non-null and, per the contract, writable.
    unsafe { *out = Box::into_raw(Box::new(value)).cast() };
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// Frees what [`create`] boxed; null is nothing to free.
///
/// # Safety
/// `object` is null or came from [`create`] with a `T`, and is not used again.
unsafe fn destroy<T, Opaque>(object: *mut Opaque) -> cublasStatus_t {
    if !object.is_null() {
        // SAFETY: per the contract.
        drop(unsafe { Box::from_raw(object.cast::<T>()) });
    }
    cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// The `T` behind an opaque pointer, or INVALID_VALUE for a null one.
///
/// # Safety
/// `object` is null or came from [`create`] with a `T` and was not destroyed.
unsafe fn object<'a, T, Opaque>(object: *mut Opaque) -> Result<&'a mut T, cublasStatus_t> {
    // SAFETY: per the contract.
    unsafe { object.cast::<T>().as_mut() }.ok_or(INVALID)
}

/// An attribute's value from its buffer, INVALID_VALUE unless the size is the value's.
///
/// # Safety
/// `buf` is null or readable for `size` bytes.
unsafe fn value<T: Copy>(buf: *const c_void, size: usize) -> Result<T, cublasStatus_t> {
    if buf.is_null() || size != size_of::<T>() {
        return Err(INVALID);
    }
    // SAFETY: `buf` holds `size_of::<T>()` readable bytes; attribute buffers need no alignment.
    Ok(unsafe { buf.cast::<T>().read_unaligned() })
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasLtCreate(out: *mut cublasLtHandle_t) -> cublasStatus_t {
    // SAFETY: per the contract.
    unsafe { create(out, Handle { _address: 0 }) }
}

/// Waits for nothing: cuBLASLt has no stream of its own (the matmuls' streams are the
/// caller's to wait for).
///
/// # Safety
/// `h` came from [`cublasLtCreate`] and is not used again.
#[no_mangle]
pub unsafe extern "C" fn cublasLtDestroy(h: cublasLtHandle_t) -> cublasStatus_t {
    if h.is_null() {
        return cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED;
    }
    // SAFETY: per the contract.
    unsafe { destroy::<Handle, _>(h) }
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescCreate(
    out: *mut cublasLtMatmulDesc_t,
    compute: cublasComputeType_t,
    scale: cudaDataType,
) -> cublasStatus_t {
    use cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC};
    // The f32 compute types are the ones whose result is the plain f32 product computed here.
    if !matches!(compute, CUBLAS_COMPUTE_32F | CUBLAS_COMPUTE_32F_PEDANTIC)
        || scale != cudaDataType::CUDA_R_32F
    {
        return NOT_SUPPORTED;
    }
    let desc = Desc {
        transa: blas::cublasOperation_t::CUBLAS_OP_N as i32,
        transb: blas::cublasOperation_t::CUBLAS_OP_N as i32,
        epilogue: cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT as u32,
        bias: 0,
        bias_type: -1,
        aux: 0,
        aux_ld: 0,
        aux_type: -1,
    };
    // SAFETY: per the contract.
    unsafe { create(out, desc) }
}

/// # Safety
/// `desc` is null or came from [`cublasLtMatmulDescCreate`], and is not used again.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescDestroy(desc: cublasLtMatmulDesc_t) -> cublasStatus_t {
    // SAFETY: per the contract.
    unsafe { destroy::<Desc, _>(desc) }
}

/// # Safety
/// `desc` is null or live; `buf` is null or readable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescSetAttribute(
    desc: cublasLtMatmulDesc_t,
    attr: cublasLtMatmulDescAttributes_t,
    buf: *const c_void,
    size: usize,
) -> cublasStatus_t {
    use cublasLtMatmulDescAttributes_t as A;
    // SAFETY (every call below): per the contract.
    let set = |desc: &mut Desc| unsafe {
        match attr {
            A::CUBLASLT_MATMUL_DESC_TRANSA => desc.transa = value(buf, size)?,
            A::CUBLASLT_MATMUL_DESC_TRANSB => desc.transb = value(buf, size)?,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE => desc.epilogue = value(buf, size)?,
            A::CUBLASLT_MATMUL_DESC_BIAS_POINTER => desc.bias = value::<*const c_void>(buf, size)? as usize,
            A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE => desc.bias_type = value(buf, size)?,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER => {
                desc.aux = value::<*const c_void>(buf, size)? as usize
            }
            A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD => desc.aux_ld = value(buf, size)?,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE => desc.aux_type = value(buf, size)?,
            _ => return Err(NOT_SUPPORTED),
        }
        Ok(())
    };
    // SAFETY: per the contract.
    status(unsafe { object::<Desc, _>(desc) }.and_then(set))
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutCreate(
    out: *mut cublasLtMatrixLayout_t,
    ty: cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
) -> cublasStatus_t {
    if u64::try_from(ld).map_or(true, |ld| ld < rows.max(1)) {
        return INVALID;
    }
    let size = |v: u64| usize::try_from(v).ok().filter(|v| *v <= c_int::MAX as usize).ok_or(NOT_SUPPORTED);
    let layout = Element::of_raw(ty as i32)
        .map_err(lt_status)
        .and_then(|ty| Ok(Layout { ty, rows: size(rows)?, cols: size(cols)?, ld: size(ld as u64)? }));
    match layout {
        // SAFETY: per the contract.
        Ok(layout) => unsafe { create(out, layout) },
        Err(status) => status,
    }
}

/// # Safety
/// `layout` is null or came from [`cublasLtMatrixLayoutCreate`], and is not used again.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutDestroy(layout: cublasLtMatrixLayout_t) -> cublasStatus_t {
    // SAFETY: per the contract.
    unsafe { destroy::<Layout, _>(layout) }
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceCreate(
    out: *mut cublasLtMatmulPreference_t,
) -> cublasStatus_t {
    // SAFETY: per the contract.
    unsafe { create(out, Preference) }
}

/// # Safety
/// `pref` is null or came from [`cublasLtMatmulPreferenceCreate`], and is not used again.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceDestroy(pref: cublasLtMatmulPreference_t) -> cublasStatus_t {
    // SAFETY: per the contract.
    unsafe { destroy::<Preference, _>(pref) }
}

/// # Safety
/// `pref` is null or live; `buf` is null or readable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceSetAttribute(
    pref: cublasLtMatmulPreference_t,
    attr: cublasLtMatmulPreferenceAttributes_t,
    buf: *const c_void,
    size: usize,
) -> cublasStatus_t {
    // SAFETY (both): per the contract.
    status(unsafe { object::<Preference, _>(pref) }.and_then(|_| match attr {
        // Checked as cuBLASLt checks it (a u64), then not needed.
        cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES => {
            unsafe { value::<u64>(buf, size) }.map(drop)
        }
        _ => Err(NOT_SUPPORTED),
    }))
}

/// The problem a descriptor and four layouts pose, checked.
///
/// # Safety
/// Each pointer is null or live.
unsafe fn problem(
    h: cublasLtHandle_t,
    desc: cublasLtMatmulDesc_t,
    [a, b, c, d]: [cublasLtMatrixLayout_t; 4],
) -> Result<Problem, cublasStatus_t> {
    if h.is_null() {
        return Err(cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED);
    }
    // SAFETY: per the contract.
    let layout = |l| unsafe { object::<Layout, _>(l) }.map(|l| *l);
    // SAFETY: per the contract.
    Problem::check(unsafe { object(desc) }?, [layout(a)?, layout(b)?, layout(c)?, layout(d)?])
}

/// Offers one algorithm (zeroed: there is only one), needing no workspace, for a problem
/// [`cublasLtMatmul`] would accept; NOT_SUPPORTED with no algorithm for one it refuses.
///
/// # Safety
/// The descriptors are null or live; `results` is null or writable for `requested`
/// results, `count` null or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasLtMatmulAlgoGetHeuristic(
    h: cublasLtHandle_t,
    desc: cublasLtMatmulDesc_t,
    a: cublasLtMatrixLayout_t,
    b: cublasLtMatrixLayout_t,
    c: cublasLtMatrixLayout_t,
    d: cublasLtMatrixLayout_t,
    pref: cublasLtMatmulPreference_t,
    requested: c_int,
    results: *mut cublasLtMatmulHeuristicResult_t,
    count: *mut c_int,
) -> cublasStatus_t {
    // SAFETY: per the contract.
    let checked = unsafe { problem(h, desc, [a, b, c, d]) }.and_then(|_| {
        // SAFETY: per the contract.
        unsafe { object::<Preference, _>(pref) }?;
        if requested < 1 || results.is_null() || count.is_null() {
            return Err(INVALID);
        }
        Ok(())
    });
    let found = checked.is_ok();
    if found {
        let result = cublasLtMatmulHeuristicResult_t {
            algo: cublasLtMatmulAlgo_t { data: [0; 8] },
            workspaceSize: 0,
            state: cublasStatus_t::CUBLAS_STATUS_SUCCESS,
            wavesCount: 1.0,
            reserved: [0; 4],
        };
        // SAFETY: `results` is non-null and, per the contract, writable.
        unsafe { results.write(result) };
    }
    if !count.is_null() {
        // SAFETY: per the contract.
        unsafe { count.write(c_int::from(found)) };
    }
    status(checked)
}

/// Enqueues D = epilogue(alpha op(A) op(B) + beta C) on `stream`. `algo` (may be null) and
/// the workspace are hints: every algorithm computes the same here and needs none.
///
/// # Safety
/// As cuBLASLt requires: live descriptors, host f32 scalars, and matrices (the bias and aux
/// the descriptor names too) of the layouts given that stay valid until the stream has run
/// the product; `stream` is null, CUDA's legacy or per-thread handle, or a live stream.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasLtMatmul(
    h: cublasLtHandle_t,
    desc: cublasLtMatmulDesc_t,
    alpha: *const c_void,
    a: *const c_void,
    a_layout: cublasLtMatrixLayout_t,
    b: *const c_void,
    b_layout: cublasLtMatrixLayout_t,
    beta: *const c_void,
    c: *const c_void,
    c_layout: cublasLtMatrixLayout_t,
    d: *mut c_void,
    d_layout: cublasLtMatrixLayout_t,
    _algo: *const cublasLtMatmulAlgo_t,
    _workspace: *mut c_void,
    _workspace_size: usize,
    stream: cudaStream_t,
) -> cublasStatus_t {
    let addrs = [a as usize, b as usize, c as usize, d as usize];
    // SAFETY: per the contract.
    let plan = unsafe { problem(h, desc, [a_layout, b_layout, c_layout, d_layout]) }
        // SAFETY: per the contract, the scalars are null or f32.
        .and_then(|problem| unsafe { problem.plan(addrs, alpha.cast(), beta.cast()) });
    let stream = devices::stream_of(stream as CUstream).ok_or(cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED);
    status(plan.and_then(|plan| {
        let stream = stream?;
        if !plan.is_empty() {
            // SAFETY: per the contract, the matrices are valid when the stream runs this.
            stream.enqueue(Box::new(move || unsafe { plan.run() }));
        }
        Ok(())
    }))
}
