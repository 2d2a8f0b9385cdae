//! The layer matmuls whose epilogue folds in the step after them, through cuBLASLt: the
//! bias in forward (`matmul_forward` with a bias), and GELU's derivative in the
//! backward-input product that feeds it (`matmul_backward_input_gelu`). Each saves a pass
//! over an [N, OC] activation, the bias add or the GELU backward, as llm.c's matmuls do.
//!
//! The epilogue runs on the fp32 accumulator, so a bf16 result is rounded once where the
//! unfused path rounds the product and then the sum; under bf16 the epilogue adds the
//! bias's bf16 copy where the unfused path adds its fp32 master. cuBLASLt's GELU
//! derivative is its own code: it agrees with `gelu.cu`'s to rounding, not bit for bit, so
//! a run keeps one path for a given problem. Where cuBLASLt has no algorithm for a problem
//! (an aux leading dimension that is not a multiple of 8, say), the caller takes the
//! unfused path; the choice is made once per problem and kept.
//!
//! GELU's forward stays our kernel: the `mlp` recompute module rebuilds the activation
//! with it, and a forward through cuBLASLt's GELU would give the kept activation and the
//! recomputed one different bits.

use super::gemm_shape::GemmShape;
use super::views::{Buf, BufMut};
use crate::device::cuda_fuses_gelu_backward;
use crate::tensor::DType;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t as Attr, cublasLtMatmulDesc_t, cublasLtMatmulPreferenceAttributes_t,
    cublasLtMatrixLayout_t, cublasStatus_t, cudaDataType_t,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// cuBLASLt's workspace per device. Hopper's fastest kernels want 32 MiB (llm.c's size);
/// like cuBLAS's own workspace, it is outside the ledger, in the memory the simulator's
/// GPU profile leaves to the CUDA context and the allocator. A GPU without 32 MiB free when
/// the device opens gets none, and cuBLASLt chooses among the algorithms that need none:
/// running out of memory stays the ledger's error, at the allocation that does.
const WORKSPACE_BYTES: usize = 32 << 20;

/// What a fused product does after the accumulation.
pub(super) enum Epilogue<'a> {
    /// out += bias [m], broadcast over the columns (the rows of a row-major out), the bias
    /// of out's type: under bf16 the parameter's bf16 copy, as cuBLASLt takes no other
    /// (an fp32 bias beside a bf16 product is INVALID_VALUE in 13.1, seen on an H200).
    Bias(Buf<'a>),
    /// out *= gelu'(aux), aux of out's shape and type (GELU's input from the forward).
    GeluBackward(Buf<'a>),
}

impl Epilogue<'_> {
    fn kind(&self) -> cublasLtEpilogue_t {
        match self {
            Epilogue::Bias(_) => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::GeluBackward(_) => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DGELU,
        }
    }
}

/// One problem as cuBLASLt's heuristic sees it: the shape, the element type and the epilogue.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Problem {
    shape: GemmShape,
    bf16: bool,
    epilogue: cublasLtEpilogue_t,
}

/// A device's cuBLASLt handle, its workspace, and the algorithm chosen for each problem
/// (None: none fits, so that problem runs unfused).
pub(super) struct Lt {
    handle: cublasLtHandle_t,
    workspace: Option<CudaSlice<u8>>,
    algos: HashMap<Problem, Option<cublasLtMatmulAlgo_t>>,
}

// SAFETY: the handle is used only under the device's mutex, one call at a time.
unsafe impl Send for Lt {}

impl Lt {
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<Lt, String> {
        let handle = lt::create_handle().map_err(|e| format!("cannot start cuBLASLt: {e:?}"))?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES).ok();
        Ok(Lt { handle, workspace, algos: HashMap::new() })
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle came from create_handle and is not used again.
        unsafe { lt::destroy_handle(self.handle) }.unwrap_or_else(|e| panic!("cuda: cuBLASLt: {e:?}"));
    }
}

/// Descriptors that are destroyed when the call is over, whichever way it ends: the
/// matmul's, and the layouts of A, B and C (= D).
struct Descriptors {
    desc: cublasLtMatmulDesc_t,
    layouts: [cublasLtMatrixLayout_t; 3],
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each was created by this call and is not used after it.
        unsafe {
            for layout in self.layouts {
                let _ = lt::destroy_matrix_layout(layout);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn check(status: Result<(), lt::CublasError>, what: &str) {
    status.unwrap_or_else(|e| panic!("cuda: cuBLASLt {what}: {e:?}"));
}

/// Sets one attribute of `desc` from `value`.
fn set<T>(desc: cublasLtMatmulDesc_t, attr: Attr, value: &T) {
    // SAFETY: `value` is the attribute's type, read for its size during the call.
    let status = unsafe {
        lt::set_matmul_desc_attribute(desc, attr, value as *const T as *const c_void, size_of::<T>())
    };
    check(status, "set_matmul_desc_attribute");
}

fn element(bf16: bool) -> cudaDataType_t {
    if bf16 {
        cudaDataType_t::CUDA_R_16BF
    } else {
        cudaDataType_t::CUDA_R_32F
    }
}

/// A column-major layout of `rows` x `cols` with leading dimension `ld`.
fn layout(bf16: bool, rows: usize, cols: usize, ld: usize) -> cublasLtMatrixLayout_t {
    lt::create_matrix_layout(element(bf16), rows as u64, cols as u64, ld as i64)
        .unwrap_or_else(|e| panic!("cuda: cuBLASLt layout {rows}x{cols} ld {ld}: {e:?}"))
}

/// The address of a buffer on `stream`, with the guard that orders its other streams.
fn address<'a>(buf: &Buf<'a>, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
    match buf {
        Buf::F32(s) => s.device_ptr(stream),
        Buf::Bf16(s) => s.device_ptr(stream),
    }
}

impl Lt {
    /// C = op(A) op(B) (column-major, beta 0) then `epilogue`, all on `stream`, A and B and
    /// C of `dtype`, with the device's context current. Returns false, having done nothing,
    /// where an operand is not aligned as cuBLASLt wants or it has no algorithm for the
    /// problem: the caller runs it unfused.
    pub(super) fn gemm(
        &mut self,
        stream: &CudaStream,
        shape: GemmShape,
        dtype: DType,
        (a, b, c): (Buf, Buf, BufMut),
        epilogue: Epilogue,
    ) -> bool {
        let bf16 = dtype == DType::Bf16;
        // The addresses, held for the call (their guards order other streams after it).
        let (a_ptr, _a) = address(&a, stream);
        let (b_ptr, _b) = address(&b, stream);
        let (c_ptr, _c) = match c {
            BufMut::F32(s) => s.device_ptr_mut(stream),
            BufMut::Bf16(s) => s.device_ptr_mut(stream),
        };
        let (vector_ptr, _vector) = match &epilogue {
            Epilogue::Bias(vector) | Epilogue::GeluBackward(vector) => address(vector, stream),
        };
        // cuBLASLt's algorithms assume 256-byte aligned matrices unless told otherwise and
        // read the bias and aux in 16-byte accesses. The arena's buffers are whole
        // allocations, so this turns away only a view into one.
        let aligned =
            [a_ptr, b_ptr, c_ptr].iter().all(|p| p.is_multiple_of(256)) && vector_ptr.is_multiple_of(16);
        let aux_fits = !matches!(epilogue, Epilogue::GeluBackward(_)) || cuda_fuses_gelu_backward(shape.ldc);
        let problem = Problem { shape, bf16, epilogue: epilogue.kind() };
        // A problem cuBLASLt has refused is not asked again.
        if !aligned || !aux_fits || self.algos.get(&problem) == Some(&None) {
            return false;
        }

        let GemmShape { ta, tb, m, n, k, lda, ldb, ldc } = shape;
        let (a_rows, a_cols) = if ta { (k, m) } else { (m, k) };
        let (b_rows, b_cols) = if tb { (n, k) } else { (k, n) };
        let layouts =
            [layout(bf16, a_rows, a_cols, lda), layout(bf16, b_rows, b_cols, ldb), layout(bf16, m, n, ldc)];
        let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let desc = lt::create_matmul_desc(compute, cudaDataType_t::CUDA_R_32F)
            .unwrap_or_else(|e| panic!("cuda: cuBLASLt matmul desc: {e:?}"));
        let d = Descriptors { desc, layouts };
        let op = |t: bool| if t { 1i32 } else { 0i32 }; // CUBLAS_OP_T, CUBLAS_OP_N
        set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &op(ta));
        set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &op(tb));
        set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue.kind());
        let vector = vector_ptr as *const c_void;
        match epilogue {
            Epilogue::Bias(_) => {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector);
                set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &element(bf16));
            }
            Epilogue::GeluBackward(_) => {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &vector);
                set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(ldc as i64));
            }
        }

        let handle = self.handle;
        let workspace_len = self.workspace.as_ref().map_or(0, CudaSlice::len);
        let algo = *self.algos.entry(problem).or_insert_with(|| heuristic(handle, &d, workspace_len));
        let Some(algo) = algo else { return false };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (workspace, _w) = match &mut self.workspace {
            Some(w) => {
                let (ptr, guard) = w.device_ptr_mut(stream);
                (ptr, Some(guard))
            }
            None => (0, None),
        };
        let [a_layout, b_layout, c_layout] = d.layouts;
        // SAFETY: the layouts describe the buffers the callers sized for this shape; the
        // scalars are f32 as the scale type says; every buffer is on this device's stream.
        let status = unsafe {
            lt::matmul(
                handle,
                desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a_ptr as *const c_void,
                a_layout,
                b_ptr as *const c_void,
                b_layout,
                c_ptr as *const c_void,
                c_layout,
                c_ptr as *mut c_void,
                c_layout,
                &algo,
                workspace as *mut c_void,
                workspace_len,
                stream.cu_stream() as _,
            )
        };
        check(status, &format!("matmul {shape:?}"));
        true
    }
}

/// cuBLASLt's best algorithm for the problem `d` describes within a workspace of `bytes`,
/// or None where it has none; any other failure is a bug.
fn heuristic(handle: cublasLtHandle_t, d: &Descriptors, bytes: usize) -> Option<cublasLtMatmulAlgo_t> {
    let pref = lt::create_matmul_pref().unwrap_or_else(|e| panic!("cuda: cuBLASLt preference: {e:?}"));
    let bytes = bytes as u64;
    // SAFETY: the attribute is a u64, read for its size; `pref` is destroyed below.
    let result = unsafe {
        check(
            lt::set_matmul_pref_attribute(
                pref,
                cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &bytes as *const u64 as *const c_void,
                size_of::<u64>(),
            ),
            "set_matmul_pref_attribute",
        );
        let [a, b, c] = d.layouts;
        let result = lt::get_matmul_algo_heuristic(handle, d.desc, a, b, c, c, pref);
        let _ = lt::destroy_matmul_pref(pref);
        result
    };
    match result {
        Ok(found) => Some(found.algo),
        // No algorithm, or a combination this cuBLASLt does not take (a bias or aux of
        // another type than the product's, say): the unfused path, which the launch count
        // in `cuda_ops` shows.
        Err(lt::CublasError(
            cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED | cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
        )) => None,
        Err(e) => panic!("cuda: cuBLASLt heuristic: {e:?}"),
    }
}
