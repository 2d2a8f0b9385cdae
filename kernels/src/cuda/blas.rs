//! The matmuls on cuBLAS. Our tensors are row-major and cuBLAS is column-major: a row-major
//! [R, C] matrix is a column-major [C, R] one, so each product is computed transposed,
//! C^T = B^T A^T, which needs no copies, only the operands swapped and transpose flags.

use super::blaslt::{Epilogue, Lt};
use super::device::{rows_cols, CudaDevice};
use super::gemm_shape::GemmShape;
use super::views::{buf, buf_mut, cu, cu16, cu_mut, same_dtype, Buf, BufMut};
use crate::backend::{matmul_backward_input_then_gelu, Matmul};
use crate::op_args::WeightLayout;
use crate::shapes::MatmulDims;
use crate::tensor::{DType, Tensor};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use std::os::raw::{c_int, c_longlong};

fn op(transpose: bool) -> cublasOperation_t {
    if transpose {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

fn int(x: usize) -> c_int {
    c_int::try_from(x).unwrap_or_else(|_| panic!("cuda: matmul dimension {x} exceeds cuBLAS's int"))
}

impl GemmShape {
    fn config(&self, alpha: f32, beta: f32) -> GemmConfig<f32> {
        GemmConfig {
            transa: op(self.ta),
            transb: op(self.tb),
            m: int(self.m),
            n: int(self.n),
            k: int(self.k),
            alpha,
            lda: int(self.lda),
            ldb: int(self.ldb),
            beta,
            ldc: int(self.ldc),
        }
    }
}

/// Matmul sizes: `n` rows, `ic` inputs, `oc` outputs, and `ldo` elements from one row of
/// out (or dout) to the next: `oc`, or more for the classifier's padded logits.
#[derive(Clone, Copy, Debug)]
struct Dims {
    n: usize,
    ic: usize,
    oc: usize,
    ldo: usize,
}

impl From<MatmulDims> for Dims {
    /// A layer matmul's: rows of out (dout) are `oc` apart.
    fn from(MatmulDims { n, ic, oc }: MatmulDims) -> Dims {
        Dims { n, ic, oc, ldo: oc }
    }
}

/// out [N,OC] = inp [N,IC] W, as out^T = W^T inp^T: A = W, B = inp. Row-major W [IC,OC]
/// (InOut) is column-major [OC,IC], already W^T; [OC,IC] (OutIn) needs the transpose.
fn forward_shape(d: Dims, layout: WeightLayout) -> GemmShape {
    let (ta, lda) = match layout {
        WeightLayout::InOut => (false, d.oc),
        WeightLayout::OutIn => (true, d.ic),
    };
    GemmShape { ta, tb: false, m: d.oc, n: d.n, k: d.ic, lda, ldb: d.ic, ldc: d.ldo }
}

/// dinp [N,IC] = dout [N,OC] W^T, as dinp^T = W dout^T: A = W, B = dout.
fn backward_input_shape(d: Dims, layout: WeightLayout) -> GemmShape {
    let (ta, lda) = match layout {
        WeightLayout::InOut => (true, d.oc),
        WeightLayout::OutIn => (false, d.ic),
    };
    GemmShape { ta, tb: false, m: d.ic, n: d.n, k: d.oc, lda, ldb: d.ldo, ldc: d.ic }
}

/// dW += inp^T dout. InOut dW [IC,OC] is column-major [OC,IC] = dout^T inp: A = dout,
/// B = inp. OutIn dW [OC,IC] is column-major [IC,OC] = inp^T dout: A = inp, B = dout.
/// Returns the shape and whether dout is operand A.
fn backward_weight_shape(d: Dims, layout: WeightLayout) -> (GemmShape, bool) {
    match layout {
        WeightLayout::InOut => (
            GemmShape { ta: false, tb: true, m: d.oc, n: d.ic, k: d.n, lda: d.ldo, ldb: d.ic, ldc: d.oc },
            true,
        ),
        WeightLayout::OutIn => (
            GemmShape { ta: false, tb: true, m: d.ic, n: d.oc, k: d.n, lda: d.ic, ldb: d.ldo, ldc: d.ic },
            false,
        ),
    }
}

/// A product's operand as activations of `dtype` read it: a tensor's f32 elements, or its
/// bf16 ones (a weight's bf16 copy).
fn operand(dtype: DType, t: &Tensor) -> Buf<'_> {
    match dtype {
        DType::F32 => Buf::F32(cu(t)),
        DType::Bf16 => Buf::Bf16(cu16(t)),
    }
}

impl CudaDevice {
    /// One fp32 gemm on this device's stream.
    pub(super) fn gemm(
        &self,
        shape: GemmShape,
        alpha: f32,
        beta: f32,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) {
        let blas = self.blas();
        // SAFETY: the shapes were checked against the tensors' sizes by the callers.
        unsafe { blas.gemm(shape.config(alpha, beta), a, b, c) }
            .unwrap_or_else(|e| panic!("cuda: cuBLAS gemm {shape:?} failed: {e:?}"));
    }

    /// `batch` fp32 gemms over consecutive matrices `stride_*` elements apart.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_batched(
        &self,
        shape: GemmShape,
        batch: usize,
        strides: (usize, usize, usize),
        alpha: f32,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) {
        let stride = |s: usize| c_longlong::try_from(s).expect("cuda: stride fits in i64");
        let config = StridedBatchedConfig {
            gemm: shape.config(alpha, 0.0),
            batch_size: int(batch),
            stride_a: stride(strides.0),
            stride_b: stride(strides.1),
            stride_c: stride(strides.2),
        };
        let blas = self.blas();
        // SAFETY: the shapes and strides were checked against the buffers by the callers.
        unsafe { blas.gemm_strided_batched(config, a, b, c) }
            .unwrap_or_else(|e| panic!("cuda: cuBLAS batched gemm {shape:?} x {batch} failed: {e:?}"));
    }

    /// One product of bf16 operands (as bits) with fp32 accumulation, into C of either
    /// type (bf16 C is rounded once, from the fp32 sum; beta scales C read in its type).
    fn gemm_bf16(&self, shape: GemmShape, beta: f32, a16: &CudaSlice<u16>, b16: &CudaSlice<u16>, c: BufMut) {
        let alpha = 1.0f32;
        let blas = self.blas();
        let (a_ptr, _a_sync) = a16.device_ptr(&self.stream);
        let (b_ptr, _b_sync) = b16.device_ptr(&self.stream);
        let ((c_ptr, _c_sync), c_type) = match c {
            BufMut::F32(c) => (c.device_ptr_mut(&self.stream), cudaDataType_t::CUDA_R_32F),
            BufMut::Bf16(c) => (c.device_ptr_mut(&self.stream), cudaDataType_t::CUDA_R_16BF),
        };
        let cfg = shape.config(alpha, beta);
        // SAFETY: bf16 operands and a C of the checked sizes and the type given; alpha and
        // beta are f32 as CUBLAS_COMPUTE_32F requires; all three buffers are on this
        // device's stream.
        let status = unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cfg.transa,
                cfg.transb,
                cfg.m,
                cfg.n,
                cfg.k,
                (&alpha) as *const f32 as *const _,
                a_ptr as *const _,
                cudaDataType_t::CUDA_R_16BF,
                cfg.lda,
                b_ptr as *const _,
                cudaDataType_t::CUDA_R_16BF,
                cfg.ldb,
                (&beta) as *const f32 as *const _,
                c_ptr as *mut _,
                c_type,
                cfg.ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        status.unwrap_or_else(|e| panic!("cuda: cuBLAS bf16 gemm {shape:?} failed: {e:?}"));
    }

    /// A product whose operands are the activations `a` and `b` or a weight (its bf16 copy
    /// for bf16 activations): fp32 throughout for f32 activations, bf16 operands for bf16
    /// ones. Nothing is cast: bf16 activations come from the kernels that wrote them, a
    /// weight's copy from AdamW.
    fn layer_gemm(&self, dtype: DType, shape: GemmShape, beta: f32, a: &Tensor, b: &Tensor, c: BufMut) {
        match (dtype, c) {
            (DType::F32, BufMut::F32(c)) => self.gemm(shape, 1.0, beta, cu(a), cu(b), c),
            (DType::Bf16, c) => self.gemm_bf16(shape, beta, cu16(a), cu16(b), c),
            (DType::F32, BufMut::Bf16(_)) => panic!("cuda: an f32 product into a bf16 tensor"),
        }
    }

    /// C = op(A) op(B) then `epilogue` through cuBLASLt on this device's stream, where
    /// epilogue fusion is on ([`CudaDevice::with_epilogue_fusion`]); false, having done
    /// nothing, where it is off or cuBLASLt declines the problem ([`Lt::gemm`]).
    fn fused(&self, shape: GemmShape, dtype: DType, abc: (Buf, Buf, BufMut), epilogue: Epilogue) -> bool {
        self.epilogue_fusion && self.lt().gemm(&self.stream, shape, dtype, abc, epilogue)
    }

    /// The cuBLASLt state, with this device's context current on the calling thread.
    fn lt(&self) -> std::sync::MutexGuard<'_, Lt> {
        self.gpu.ctx.bind_to_thread().unwrap_or_else(|e| panic!("cuda: cannot bind the context: {e:?}"));
        self.lt.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cuBLAS handle, with this device's context current on the calling thread
    /// (cuBLAS, unlike cudarc's own calls, uses whatever context is current).
    fn blas(&self) -> std::sync::MutexGuard<'_, cudarc::cublas::CudaBlas> {
        self.gpu.ctx.bind_to_thread().unwrap_or_else(|e| panic!("cuda: cannot bind the context: {e:?}"));
        self.blas.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Matmul for CudaDevice {
    fn matmul_forward_impl(
        &self,
        out: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        bias: Option<&Tensor>,
        dims: MatmulDims,
    ) {
        let d = Dims::from(dims);
        let dtype = same_dtype(&[out, inp]);
        let shape = forward_shape(d, layout);
        if let Some(bias) = bias {
            let (a, b) = (operand(dtype, weight), operand(dtype, inp));
            if self.fused(shape, dtype, (a, b, buf_mut(out)), Epilogue::Bias(operand(dtype, bias))) {
                return;
            }
        }
        self.layer_gemm(dtype, shape, 0.0, weight, inp, buf_mut(out));
        if let Some(bias) = bias {
            // In bf16, a second rounding after the product's.
            self.add_bias(out, bias, d.n, d.oc);
        }
    }

    fn matmul_backward_input_impl(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        dims: MatmulDims,
    ) {
        let d = Dims::from(dims);
        let dtype = same_dtype(&[dinp, dout]);
        self.layer_gemm(dtype, backward_input_shape(d, layout), 0.0, weight, dout, buf_mut(dinp));
    }

    fn matmul_backward_input_gelu_impl(
        &self,
        dinp: &mut Tensor,
        dout: &Tensor,
        weight: &Tensor,
        layout: WeightLayout,
        gelu_input: &Tensor,
        dims: MatmulDims,
    ) {
        let d = Dims::from(dims);
        let dtype = same_dtype(&[dinp, dout, gelu_input]);
        let shape = backward_input_shape(d, layout);
        let (a, b) = (operand(dtype, weight), operand(dtype, dout));
        let epilogue = Epilogue::GeluBackward(buf(gelu_input));
        if !self.fused(shape, dtype, (a, b, buf_mut(dinp)), epilogue) {
            matmul_backward_input_then_gelu(self, dinp, dout, weight, layout, gelu_input, dims);
        }
    }

    fn matmul_backward_weight_impl(
        &self,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
        dout: &Tensor,
        inp: &Tensor,
        layout: WeightLayout,
        dims: MatmulDims,
    ) {
        let d = Dims::from(dims);
        let dtype = same_dtype(&[dout, inp]);
        let (shape, dout_is_a) = backward_weight_shape(d, layout);
        let (a, b) = if dout_is_a { (dout, inp) } else { (inp, dout) };
        // beta = 1: parameter gradients (f32) accumulate over microbatches.
        self.layer_gemm(dtype, shape, 1.0, a, b, BufMut::F32(cu_mut(dweight)));
        if let Some(dbias) = dbias {
            self.add_column_sums(cu_mut(dbias), dout, d.n, d.oc);
        }
    }
}

impl CudaDevice {
    /// The tied LM head's forward into padded rows: logits [N, ldo] = inp [N,C] @ wte [V,C]^T
    /// over the first V columns of each row (fp32; the rest of a row is left as it was), or
    /// over all ldo columns from wte's bf16 copy, whose padding rows make those zero.
    pub(super) fn head_forward(&self, logits: &mut Tensor, inp: &Tensor, weight: &HeadWeight) {
        let (d, _) = head_dims(inp, weight);
        assert!(logits.len() >= d.n * d.ldo, "classifier: {logits:?} for {d:?}");
        let shape = forward_shape(d, WeightLayout::OutIn);
        match weight {
            HeadWeight::Fp32 { wte, .. } => self.gemm(shape, 1.0, 0.0, cu(wte), cu(inp), cu_mut(logits)),
            HeadWeight::Bf16Padded { wte16, .. } => {
                self.gemm_bf16(shape, 0.0, wte16, cu16(inp), buf_mut(logits))
            }
        }
    }

    /// The LM head's backward from padded rows of dlogits [N, ldo] (the padding columns zero):
    /// dinp [N,C] = dlogits @ wte (overwrite), dwte [V,C] += dlogits^T @ inp over the first V
    /// columns.
    pub(super) fn head_backward(
        &self,
        dinp: &mut Tensor,
        dwte: &mut Tensor,
        dlogits: &Tensor,
        inp: &Tensor,
        weight: &HeadWeight,
    ) {
        let (d, v) = head_dims(inp, weight);
        assert!(dlogits.len() >= d.n * d.ldo, "classifier: {dlogits:?} for {d:?}");
        assert!(dinp.len() == inp.len() && dwte.len() == v * d.ic, "classifier: {dinp:?}, {dwte:?}");
        let backward_input = backward_input_shape(d, WeightLayout::OutIn);
        // dwte has V rows: its product runs over the vocabulary proper.
        let (shape, dout_is_a) = backward_weight_shape(Dims { oc: v, ..d }, WeightLayout::OutIn);
        let (a, b) = if dout_is_a { (dlogits, inp) } else { (inp, dlogits) };
        match weight {
            HeadWeight::Fp32 { wte, .. } => {
                self.gemm(backward_input, 1.0, 0.0, cu(wte), cu(dlogits), cu_mut(dinp));
                // beta = 1: parameter gradients accumulate over microbatches.
                self.gemm(shape, 1.0, 1.0, cu(a), cu(b), cu_mut(dwte));
            }
            HeadWeight::Bf16Padded { wte16, .. } => {
                self.gemm_bf16(backward_input, 0.0, wte16, cu16(dlogits), buf_mut(dinp));
                self.gemm_bf16(shape, 1.0, cu16(a), cu16(b), BufMut::F32(cu_mut(dwte)));
            }
        }
    }

    /// The head's weight for rows of `ldo` logits, as the activations' dtype reads it.
    pub(super) fn head_weight<'a>(&self, wte: &'a Tensor, inp: &Tensor, ldo: usize) -> HeadWeight<'a> {
        let &[v, c] = wte.shape() else { panic!("classifier: wte must be 2-D, got {wte:?}") };
        assert!(ldo >= v, "classifier: rows of {ldo} columns for a vocabulary of {v}");
        match inp.dtype() {
            DType::F32 => HeadWeight::Fp32 { wte, ldo },
            DType::Bf16 => {
                let wte16 = cu16(wte);
                assert_eq!(wte16.len(), ldo * c, "classifier: wte's bf16 copy is not padded to {ldo} rows");
                HeadWeight::Bf16Padded { wte16, v, c }
            }
        }
    }
}

/// The tied LM head's weight as its GEMMs read it. Under bf16 it is wte's bf16 copy, whose
/// rows are padded with zeros to [ldo, C], so the forward and backward-input products run
/// over the padded vocabulary (a multiple of 128): with V itself (50257, odd) as a
/// dimension cuBLAS falls back to unaligned kernels many times slower.
pub(super) enum HeadWeight<'a> {
    Fp32 { wte: &'a Tensor, ldo: usize },
    Bf16Padded { wte16: &'a CudaSlice<u16>, v: usize, c: usize },
}

/// The head's sizes from inp [N,C] and its weight: `oc` the columns its products run
/// over (V for fp32, the padded ldo under bf16), `v` the vocabulary proper.
fn head_dims(inp: &Tensor, weight: &HeadWeight) -> (Dims, usize) {
    let (n, inp_cols) = rows_cols(inp);
    let (v, c, ldo, oc) = match weight {
        HeadWeight::Fp32 { wte, ldo } => (wte.shape()[0], wte.shape()[1], *ldo, wte.shape()[0]),
        HeadWeight::Bf16Padded { wte16, v, c } => (*v, *c, wte16.len() / c, wte16.len() / c),
    };
    assert_eq!(inp_cols, c, "classifier: input {inp:?} vs a head of {c} columns");
    (Dims { n, ic: c, oc, ldo }, v)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// cuBLAS's sgemm on the host, straight from its definition (column-major, leading
    /// dimensions, transposes), to check our row-major mappings without a GPU.
    pub fn host_gemm(s: GemmShape, alpha: f32, beta: f32, a: &[f32], b: &[f32], c: &mut [f32]) {
        let at = |i: usize, p: usize| if s.ta { a[p + i * s.lda] } else { a[i + p * s.lda] };
        let bt = |p: usize, j: usize| if s.tb { b[j + p * s.ldb] } else { b[p + j * s.ldb] };
        for j in 0..s.n {
            for i in 0..s.m {
                let dot: f32 = (0..s.k).map(|p| at(i, p) * bt(p, j)).sum();
                c[i + j * s.ldc] = alpha * dot + beta * c[i + j * s.ldc];
            }
        }
    }

    /// Row-major [r, k] x [k, c], with an accessor for the right operand.
    pub fn row_major(r: usize, k: usize, c: usize, x: &[f32], y: impl Fn(usize, usize) -> f32) -> Vec<f32> {
        (0..r * c).map(|i| (0..k).map(|p| x[i / c * k + p] * y(p, i % c)).sum()).collect()
    }

    pub fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7 + seed * 13) % 23) as f32 - 11.0).collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-3 * y.abs().max(1.0), "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn layer_matmul_mappings_compute_the_row_major_products() {
        let d = Dims { n: 5, ic: 3, oc: 4, ldo: 4 };
        let (inp, dout) = (values(d.n * d.ic, 1), values(d.n * d.oc, 2));
        let w = values(d.ic * d.oc, 3);
        for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
            // W as a math matrix [IC, OC], whatever its storage.
            let wm = |i: usize, o: usize| match layout {
                WeightLayout::InOut => w[i * d.oc + o],
                WeightLayout::OutIn => w[o * d.ic + i],
            };
            let mut out = vec![0.0; d.n * d.oc];
            host_gemm(forward_shape(d, layout), 1.0, 0.0, &w, &inp, &mut out);
            close(&out, &row_major(d.n, d.ic, d.oc, &inp, wm));

            let mut dinp = vec![0.0; d.n * d.ic];
            host_gemm(backward_input_shape(d, layout), 1.0, 0.0, &w, &dout, &mut dinp);
            close(&dinp, &row_major(d.n, d.oc, d.ic, &dout, |o, i| wm(i, o)));

            // dW accumulates onto what is there.
            let mut dw = vec![1.0; d.ic * d.oc];
            let (shape, dout_is_a) = backward_weight_shape(d, layout);
            let (a, b) = if dout_is_a { (&dout, &inp) } else { (&inp, &dout) };
            host_gemm(shape, 1.0, 1.0, a, b, &mut dw);
            let inp_t: Vec<f32> = (0..d.ic * d.n).map(|x| inp[x % d.n * d.ic + x / d.n]).collect();
            let dwm = row_major(d.ic, d.n, d.oc, &inp_t, |n, o| dout[n * d.oc + o]);
            let want: Vec<f32> = (0..d.ic * d.oc)
                .map(|x| match layout {
                    WeightLayout::InOut => dwm[x] + 1.0,
                    WeightLayout::OutIn => dwm[x % d.ic * d.oc + x / d.ic] + 1.0,
                })
                .collect();
            close(&dw, &want);
        }
    }

    #[test]
    fn head_matmuls_write_and_read_only_the_vocabulary_of_padded_rows() {
        let (n, c, v, ldo) = (3, 4, 5, 8);
        let (padded, unpadded) = (Dims { n, ic: c, oc: v, ldo }, Dims { n, ic: c, oc: v, ldo: v });
        let (inp, wte, dout) = (values(n * c, 1), values(v * c, 3), values(n * v, 2));
        let layout = WeightLayout::OutIn;
        let pad_rows = |rows: &[f32], fill: f32| -> Vec<f32> {
            (0..n * ldo).map(|x| if x % ldo < v { rows[x / ldo * v + x % ldo] } else { fill }).collect()
        };

        // Forward: the same values as unpadded rows, the padding as it was.
        let mut want = vec![0.0; n * v];
        host_gemm(forward_shape(unpadded, layout), 1.0, 0.0, &wte, &inp, &mut want);
        let mut logits = vec![7.5; n * ldo];
        host_gemm(forward_shape(padded, layout), 1.0, 0.0, &wte, &inp, &mut logits);
        assert_eq!(logits, pad_rows(&want, 7.5));

        // Backward: NaN in the padding would reach every output that read it.
        let dlogits = pad_rows(&dout, f32::NAN);
        let (mut want, mut dinp) = (vec![0.0; n * c], vec![0.0; n * c]);
        host_gemm(backward_input_shape(unpadded, layout), 1.0, 0.0, &wte, &dout, &mut want);
        host_gemm(backward_input_shape(padded, layout), 1.0, 0.0, &wte, &dlogits, &mut dinp);
        assert_eq!(dinp, want);
        let (mut want, mut dwte) = (vec![1.0; v * c], vec![1.0; v * c]);
        host_gemm(backward_weight_shape(unpadded, layout).0, 1.0, 1.0, &inp, &dout, &mut want);
        host_gemm(backward_weight_shape(padded, layout).0, 1.0, 1.0, &inp, &dlogits, &mut dwte);
        assert_eq!(dwte, want);
    }
}
