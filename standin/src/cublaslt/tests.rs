//! Matmuls through the C entry points, checked bit for bit against host references: the
//! cuBLAS stand-in's product, or f32 arithmetic on products small enough to be exact.
//! Every matrix is written column by column, as cuBLASLt stores it.

use super::*;
use crate::cublas::{cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, cublasSgemm_v2};
use crate::stream::{self, Stream};
use cublasLtEpilogue_t::{
    CUBLASLT_EPILOGUE_BIAS as BIAS, CUBLASLT_EPILOGUE_DEFAULT as DEFAULT, CUBLASLT_EPILOGUE_DGELU as DGELU,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
};
use cublasLtMatmulDescAttributes_t as Attr;
use cublasStatus_t::{CUBLAS_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_SUCCESS as OK};
use cudaDataType::{CUDA_R_16BF as BF16, CUDA_R_32F as F32};
use half::bf16;
use std::ptr::null_mut;
use std::sync::{Arc, Condvar, Mutex};

const N: i32 = blas::cublasOperation_t::CUBLAS_OP_N as i32;
const T: i32 = blas::cublasOperation_t::CUBLAS_OP_T as i32;

/// A matrix as the device holds it: f32 or bf16 elements, 16-byte aligned (as cuBLASLt
/// requires of an aux matrix).
struct Buf {
    ty: cudaDataType,
    words: Vec<u128>,
    len: usize,
}

impl Buf {
    /// `values`, rounded to nearest even for bf16.
    fn new(ty: cudaDataType, values: &[f32]) -> Buf {
        let mut buf = Buf { ty, words: vec![0; values.len().div_ceil(4)], len: values.len() };
        values.iter().enumerate().for_each(|(i, v)| buf.set(i, *v));
        buf
    }

    fn set(&mut self, i: usize, v: f32) {
        assert!(i < self.len);
        let p = self.words.as_mut_ptr();
        unsafe {
            match self.ty {
                BF16 => *p.cast::<bf16>().add(i) = bf16::from_f32(v),
                _ => *p.cast::<f32>().add(i) = v,
            }
        }
    }

    /// The elements, widened exactly.
    fn values(&self) -> Vec<f32> {
        let p = self.words.as_ptr();
        (0..self.len)
            .map(|i| unsafe {
                match self.ty {
                    BF16 => (*p.cast::<bf16>().add(i)).to_f32(),
                    _ => *p.cast::<f32>().add(i),
                }
            })
            .collect()
    }

    fn ptr(&self) -> *const c_void {
        self.words.as_ptr().cast()
    }

    fn mut_ptr(&mut self) -> *mut c_void {
        self.words.as_mut_ptr().cast()
    }
}

/// `x` rounded once to `ty`.
fn round(ty: cudaDataType, x: f32) -> f32 {
    if ty == BF16 {
        bf16::from_f32(x).to_f32()
    } else {
        x
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// gelu'(x) as the module documents it: kernels/src/cpu/gelu.rs's backward, with f32::exp.
fn gelu_grad_reference(x: f32) -> f32 {
    let (k, c) = (0.797_884_6f32, 0.044_715f32);
    let s = 1.0 / (1.0 + (-2.0 * (k * (x + c * x * x * x))).exp());
    s + x * s * (1.0 - s) * 2.0 * (k * (1.0 + 3.0 * c * x * x))
}

/// A matmul's attributes, layouts (type, rows, cols, ld of A, B, C, D) and scalars.
#[derive(Clone, Copy)]
struct Call {
    ops: (i32, i32),
    epilogue: cublasLtEpilogue_t,
    /// The bias pointer and type (-1: D's).
    bias: (*const c_void, i32),
    /// The aux pointer, leading dimension and type (-1: D's).
    aux: (*const c_void, i64, i32),
    layouts: [(cudaDataType, u64, u64, i64); 4],
    alpha: f32,
    beta: f32,
}

impl Call {
    /// op(A) op(B) with dense layouts, no epilogue.
    fn new(ab: cudaDataType, cd: cudaDataType, (m, n, k): (u64, u64, u64)) -> Call {
        let dense = |ty, rows, cols| (ty, rows, cols, rows as i64);
        Call {
            ops: (N, N),
            epilogue: DEFAULT,
            bias: (std::ptr::null(), -1),
            aux: (std::ptr::null(), 0, -1),
            layouts: [dense(ab, m, k), dense(ab, k, n), dense(cd, m, n), dense(cd, m, n)],
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

fn check(status: cublasStatus_t) -> Result<(), cublasStatus_t> {
    if status == OK {
        Ok(())
    } else {
        Err(status)
    }
}

fn set<V>(desc: cublasLtMatmulDesc_t, attr: Attr, value: V) -> Result<(), cublasStatus_t> {
    check(unsafe { cublasLtMatmulDescSetAttribute(desc, attr, (&raw const value).cast(), size_of::<V>()) })
}

/// A call's descriptor, layouts and preference, destroyed when dropped.
struct Objects {
    desc: cublasLtMatmulDesc_t,
    layouts: [cublasLtMatrixLayout_t; 4],
    pref: cublasLtMatmulPreference_t,
}

impl Objects {
    fn new(call: &Call) -> Result<Objects, cublasStatus_t> {
        let mut o = Objects { desc: null_mut(), layouts: [null_mut(); 4], pref: null_mut() };
        unsafe {
            check(cublasLtMatmulDescCreate(&mut o.desc, cublasComputeType_t::CUBLAS_COMPUTE_32F, F32))?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, call.ops.0)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, call.ops.1)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, call.epilogue as u32)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias.0)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, call.bias.1)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux.0)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, call.aux.1)?;
            set(o.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, call.aux.2)?;
            for (layout, (ty, rows, cols, ld)) in o.layouts.iter_mut().zip(call.layouts) {
                check(cublasLtMatrixLayoutCreate(layout, ty, rows, cols, ld))?;
            }
            check(cublasLtMatmulPreferenceCreate(&mut o.pref))?;
            let workspace = 1u64 << 20;
            let max_workspace =
                cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES;
            check(cublasLtMatmulPreferenceSetAttribute(
                o.pref,
                max_workspace,
                (&raw const workspace).cast(),
                8,
            ))?;
        }
        Ok(o)
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        unsafe {
            assert_eq!(cublasLtMatmulDescDestroy(self.desc), OK);
            self.layouts.iter().for_each(|l| assert_eq!(cublasLtMatrixLayoutDestroy(*l), OK));
            assert_eq!(cublasLtMatmulPreferenceDestroy(self.pref), OK);
        }
    }
}

/// A handle, and a stream of its own for the matmuls.
struct Lt {
    h: cublasLtHandle_t,
    stream: Arc<Stream>,
    raw: CUstream,
}

impl Lt {
    fn new() -> Lt {
        let mut h = null_mut();
        assert_eq!(unsafe { cublasLtCreate(&mut h) }, OK);
        let stream = Stream::new(0);
        Lt { h, raw: stream::into_handle(stream.clone()), stream }
    }

    /// The heuristic's status and algorithm count; a result, when found, is checked here.
    fn heuristic(&self, call: &Call) -> (cublasStatus_t, c_int) {
        let o = Objects::new(call).expect("the call's objects");
        let (mut result, mut count) = (std::mem::MaybeUninit::uninit(), -1);
        let [a, b, c, d] = o.layouts;
        let status = unsafe {
            cublasLtMatmulAlgoGetHeuristic(
                self.h,
                o.desc,
                a,
                b,
                c,
                d,
                o.pref,
                1,
                result.as_mut_ptr(),
                &mut count,
            )
        };
        if status == OK {
            let result = unsafe { result.assume_init() };
            assert_eq!((result.workspaceSize, result.state, result.wavesCount), (0, OK, 1.0));
        }
        (status, count)
    }

    /// cublasLtMatmul on A, B, C and D on this handle's stream, returning at once.
    fn matmul(&self, call: &Call, abc: [*const c_void; 3], d: *mut c_void) -> cublasStatus_t {
        self.matmul_on(self.raw as cudaStream_t, call, abc, d)
    }

    fn matmul_on(
        &self,
        stream: cudaStream_t,
        call: &Call,
        [a, b, c]: [*const c_void; 3],
        d: *mut c_void,
    ) -> cublasStatus_t {
        let o = Objects::new(call).expect("the call's objects");
        let [la, lb, lc, ld] = o.layouts;
        let (alpha, beta) = ((&raw const call.alpha).cast(), (&raw const call.beta).cast());
        let (algo, workspace) = (std::ptr::null(), null_mut());
        unsafe {
            cublasLtMatmul(
                self.h, o.desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, workspace, 0, stream,
            )
        }
    }

    /// The heuristic's and the matmul's status, once the stream has run the matmul.
    fn statuses(
        &self,
        call: &Call,
        abc: [*const c_void; 3],
        d: *mut c_void,
    ) -> (cublasStatus_t, cublasStatus_t) {
        let heuristic = self.heuristic(call).0;
        let matmul = self.matmul(call, abc, d);
        self.stream.synchronize();
        (heuristic, matmul)
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        unsafe {
            assert_eq!(cublasLtDestroy(self.h), OK);
            stream::release_handle(self.raw);
        }
    }
}

/// Values with no short binary expansion, so products and sums round.
fn inexact(len: usize, salt: f32) -> Vec<f32> {
    (0..len).map(|i| (i as f32 * 0.37 + salt).sin()).collect()
}

#[test]
fn an_f32_bias_is_added_to_the_cublas_product() {
    let lt = Lt::new();
    let (m, n, k) = (3, 4, 5);
    let (a, b, c, bias) = (inexact(m * k, 0.1), inexact(k * n, 0.2), inexact(m * n, 0.3), [0.3, -1.7, 2.9]);
    // cuBLAS, on the same stream: C = 1.5 A B + 0.5 C.
    let (mut blas, mut h) = (c.clone(), null_mut());
    let (alpha, beta) = (1.5f32, 0.5f32);
    let (mi, ni, ki) = (m as c_int, n as c_int, k as c_int);
    unsafe {
        assert_eq!(cublasCreate_v2(&mut h), blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        cublasSetStream_v2(h, lt.raw as blas::cudaStream_t);
        let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), blas.as_mut_ptr());
        let (op_n, ok) = (blas::cublasOperation_t::CUBLAS_OP_N, blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        assert_eq!(cublasSgemm_v2(h, op_n, op_n, mi, ni, ki, &alpha, pa, mi, pb, ki, &beta, pc, mi), ok);
        cublasDestroy_v2(h);
    }
    // cuBLASLt, with D apart from C (C is copied, not written).
    let (a, b, c, bias) = (Buf::new(F32, &a), Buf::new(F32, &b), Buf::new(F32, &c), Buf::new(F32, &bias));
    let mut d = Buf::new(F32, &[f32::NAN; 12]);
    let call = Call {
        epilogue: BIAS,
        bias: (bias.ptr(), F32 as i32),
        alpha,
        beta,
        ..Call::new(F32, F32, (3, 4, 5))
    };
    assert_eq!(lt.heuristic(&call), (OK, 1));
    assert_eq!(lt.statuses(&call, [a.ptr(), b.ptr(), c.ptr()], d.mut_ptr()), (OK, OK));
    let bias = bias.values();
    let want: Vec<f32> = blas.iter().enumerate().map(|(e, x)| x + bias[e % m]).collect();
    assert_eq!(bits(&d.values()), bits(&want));
}

#[test]
fn a_bias_into_bf16_is_added_before_the_one_rounding() {
    let lt = Lt::new();
    // D (3x1) = A (3x2) [1 1]^T + bias, A's rows (256, 1), (258, 1), (256, 1.5): products
    // 257, 259, 257.5, which bf16 would round to 256, 260, 258 (ties to even).
    let (a, b) = (Buf::new(BF16, &[256., 258., 256., 1., 1., 1.5]), Buf::new(BF16, &[1., 1.]));
    let (product, bias_values) = ([257f32, 259., 257.5], [1f32, -1., 0.25]);
    let bias = Buf::new(BF16, &bias_values);
    let mut d = Buf::new(BF16, &[f32::NAN; 3]);
    let call = Call { epilogue: BIAS, bias: (bias.ptr(), BF16 as i32), ..Call::new(BF16, BF16, (3, 1, 2)) };
    let d_ptr = d.mut_ptr();
    assert_eq!(lt.statuses(&call, [a.ptr(), b.ptr(), d_ptr], d_ptr), (OK, OK));
    let once: Vec<f32> = product.iter().zip(bias_values).map(|(p, b)| round(BF16, p + b)).collect();
    let twice: Vec<f32> =
        product.iter().zip(bias_values).map(|(p, b)| round(BF16, round(BF16, *p) + b)).collect();
    assert_eq!(bits(&d.values()), bits(&once));
    assert_eq!((once, twice), (vec![258.; 3], vec![256., 260., 258.]), "the case shows one rounding");
}

#[test]
fn dgelu_scales_the_product_by_the_gelu_gradient_of_aux() {
    let lt = Lt::new();
    // D (5x6) = (2 A B + C) * gelu'(aux), A 5x2, B 2x6 and C small integers, so the product
    // is exact and only the epilogue and the final rounding round. aux has ld 8 (its padding
    // NaN, never read) and values across both tails with long binary expansions.
    let (m, n) = (5, 6);
    let small = |e: usize, salt: usize| ((e * 5 + salt) % 7) as f32 - 3.0;
    let (a, b, c): (Vec<f32>, Vec<f32>, Vec<f32>) = (
        (0..2 * m).map(|e| small(e, 1)).collect(),
        (0..2 * n).map(|e| small(e, 2)).collect(),
        (0..m * n).map(|e| small(e, 3)).collect(),
    );
    let product = |i: usize, j: usize| 2. * (a[i] * b[2 * j] + a[i + m] * b[2 * j + 1]) + c[i + j * m];
    let mut aux_values = vec![f32::NAN; 8 * n];
    (0..m * n).for_each(|e| aux_values[e % m + 8 * (e / m)] = e as f32 * 0.29 - 4.1);
    for (d_type, aux_type) in [(F32, -1), (F32, F32 as i32), (BF16, -1), (BF16, BF16 as i32)] {
        let aux = Buf::new(d_type, &aux_values);
        let (a, b, c) = (Buf::new(BF16, &a), Buf::new(BF16, &b), Buf::new(d_type, &c));
        let mut d = Buf::new(d_type, &vec![f32::NAN; m * n]);
        let call = Call {
            epilogue: DGELU,
            aux: (aux.ptr(), 8, aux_type),
            alpha: 2.0,
            beta: 1.0,
            ..Call::new(BF16, d_type, (m as u64, n as u64, 2))
        };
        assert_eq!(lt.statuses(&call, [a.ptr(), b.ptr(), c.ptr()], d.mut_ptr()), (OK, OK));
        let x = aux.values();
        let want: Vec<f32> = (0..m * n)
            .map(|e| {
                let (i, j) = (e % m, e / m);
                round(d_type, product(i, j) * gelu_grad_reference(x[i + 8 * j]))
            })
            .collect();
        assert_eq!(bits(&d.values()), bits(&want), "D {d_type:?}, aux {aux_type}");
    }
}

#[test]
fn transposed_operands_with_padded_leading_dimensions() {
    // op(A) 3x4, op(B) 4x2; every stored matrix has 2 rows of NaN padding below it, and D's
    // padding (-1) must stay as it is. C, apart from D, has a leading dimension of its own.
    let lt = Lt::new();
    let (m, n, k) = (3usize, 2usize, 4usize);
    let value = |i: usize, j: usize, salt: usize| ((i * 7 + j * 3 + salt) % 11) as f32 - 5.0;
    let stored = |rows: usize, cols: usize, pad: f32, at: &dyn Fn(usize, usize) -> f32| {
        let mut x = vec![pad; (rows + 2) * cols];
        (0..cols).for_each(|j| (0..rows).for_each(|i| x[i + j * (rows + 2)] = at(i, j)));
        (x, (rows + 2) as i64)
    };
    for ty in [F32, BF16] {
        for (ta, tb) in [(N, N), (N, T), (T, N), (T, T)] {
            let (op_a, op_b, c_at) = (|i, p| value(i, p, 1), |p, j| value(p, j, 2), |i, j| value(i, j, 3));
            let (a, lda) = if ta == T {
                stored(k, m, f32::NAN, &|p, i| op_a(i, p))
            } else {
                stored(m, k, f32::NAN, &op_a)
            };
            let (b, ldb) = if tb == T {
                stored(n, k, f32::NAN, &|j, p| op_b(p, j))
            } else {
                stored(k, n, f32::NAN, &op_b)
            };
            let (c, ldc) = stored(m, n, f32::NAN, &c_at);
            let (d, ldd) = stored(m, n, -1.0, &|_, _| f32::NAN);
            let (a, b, c, mut d) = (Buf::new(ty, &a), Buf::new(ty, &b), Buf::new(ty, &c), Buf::new(ty, &d));
            let shape = |ty, rows: usize, cols: usize, ld| (ty, rows as u64, cols as u64, ld);
            let (a_rows, b_rows) = (if ta == T { k } else { m }, if tb == T { n } else { k });
            let layouts = [
                shape(ty, a_rows, if ta == T { m } else { k }, lda),
                shape(ty, b_rows, if tb == T { k } else { n }, ldb),
                shape(ty, m, n, ldc),
                shape(ty, m, n, ldd),
            ];
            let call = Call { ops: (ta, tb), layouts, beta: -1.0, ..Call::new(ty, ty, (0, 0, 0)) };
            assert_eq!(lt.statuses(&call, [a.ptr(), b.ptr(), c.ptr()], d.mut_ptr()), (OK, OK));
            let (got, ld) = (d.values(), ldd as usize);
            for j in 0..n {
                for i in 0..m {
                    let want = (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum::<f32>() - c_at(i, j);
                    assert_eq!(got[i + j * ld], want, "{ty:?} {ta} {tb} D({i}, {j})");
                }
                assert_eq!(got[m + j * ld..(j + 1) * ld], [-1.0; 2], "{ty:?} {ta} {tb}: padding written");
            }
        }
    }
}

#[test]
fn what_is_not_modelled_or_not_valid_is_refused() {
    use cublasStatus_t::{
        CUBLAS_STATUS_INVALID_VALUE as INVALID, CUBLAS_STATUS_NOT_SUPPORTED as UNSUPPORTED,
    };
    let lt = Lt::new();
    let f32_call = Call::new(F32, F32, (3, 2, 2));
    let (a, b, mut d) = (Buf::new(F32, &[1.; 6]), Buf::new(F32, &[1.; 4]), Buf::new(F32, &[-1.; 6]));
    let bias = Buf::new(F32, &[1.; 3]);
    let aux = Buf::new(F32, &[1.; 32]);
    let (pa, pb, pd) = (a.ptr(), b.ptr(), d.mut_ptr());
    let refused = |call: &Call| lt.statuses(call, [pa, pb, pd], pd);
    // Epilogues not modelled, and aux matrices cuBLASLt does not take.
    let gelu_aux_bias =
        Call { epilogue: CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias: (bias.ptr(), -1), ..f32_call };
    assert_eq!(lt.heuristic(&gelu_aux_bias), (UNSUPPORTED, 0));
    assert_eq!(refused(&gelu_aux_bias), (UNSUPPORTED, UNSUPPORTED));
    let dgelu = |ptr: *const c_void, ld| Call { epilogue: DGELU, aux: (ptr, ld, -1), ..f32_call };
    assert_eq!(lt.heuristic(&dgelu(aux.ptr(), 8)), (OK, 1));
    assert_eq!(refused(&dgelu(aux.ptr(), 12)), (UNSUPPORTED, UNSUPPORTED), "aux ld not a multiple of 8");
    assert_eq!(refused(&dgelu(aux.ptr(), 0)), (UNSUPPORTED, UNSUPPORTED), "aux ld below m");
    let misaligned = aux.ptr().wrapping_byte_add(4);
    assert_eq!(refused(&dgelu(misaligned, 8)), (UNSUPPORTED, UNSUPPORTED), "aux not 16-byte aligned");
    // Types: a bias or aux only of D's type; f32 operands not into bf16; C and D of one type.
    let bf16_call = Call::new(BF16, BF16, (3, 2, 2));
    let bias_call =
        |call: Call, ty: cudaDataType| Call { epilogue: BIAS, bias: (bias.ptr(), ty as i32), ..call };
    assert_eq!(lt.heuristic(&bias_call(bf16_call, BF16)), (OK, 1));
    assert_eq!(lt.heuristic(&bias_call(bf16_call, F32)), (INVALID, 0));
    assert_eq!(lt.heuristic(&bias_call(f32_call, BF16)), (INVALID, 0));
    let aux_call =
        |call: Call, ty: cudaDataType| Call { epilogue: DGELU, aux: (aux.ptr(), 8, ty as i32), ..call };
    assert_eq!(lt.heuristic(&aux_call(bf16_call, F32)), (INVALID, 0));
    assert_eq!(lt.heuristic(&aux_call(f32_call, BF16)), (INVALID, 0));
    assert_eq!(lt.heuristic(&Call::new(F32, BF16, (3, 2, 2))).0, UNSUPPORTED);
    let mut mixed = f32_call;
    mixed.layouts[2].0 = BF16;
    assert_eq!(lt.heuristic(&mixed).0, UNSUPPORTED);
    // Shapes inconsistent with the operations (A^T is 2x3, B 2x2), CUBLAS_OP_CONJG.
    assert_eq!(lt.heuristic(&Call { ops: (T, N), ..f32_call }).0, INVALID);
    let conjg = blas::cublasOperation_t::CUBLAS_OP_CONJG as i32;
    assert_eq!(lt.heuristic(&Call { ops: (conjg, N), ..f32_call }).0, INVALID);
    // Pointers the matmul needs, unseen by the heuristic: a bias, D.
    assert_eq!(refused(&Call { bias: (std::ptr::null(), -1), ..bias_call(f32_call, F32) }), (OK, INVALID));
    assert_eq!(lt.matmul(&f32_call, [pa, pb, pd], null_mut()), INVALID);
    // C == D with another leading dimension; beta 0 still looks at the layouts.
    let mut in_place = f32_call;
    in_place.layouts[2] = (F32, 3, 2, 4);
    let c_is_d = lt.matmul(&Call { beta: 1.0, ..in_place }, [pa, pb, pd], pd);
    assert_eq!((c_is_d, lt.matmul(&in_place, [pa, pb, pd], pd)), (INVALID, INVALID));
    lt.stream.synchronize();
    assert_eq!(d.values(), [-1.; 6], "nothing refused ran");
    assert_eq!(refused(&bias_call(f32_call, F32)), (OK, OK));
    assert_eq!(d.values(), [3.; 6]);
    // Layouts, descriptors and attributes.
    let mut layout = null_mut();
    let layout_of = |l: &mut cublasLtMatrixLayout_t, ty, rows, ld| unsafe {
        cublasLtMatrixLayoutCreate(l, ty, rows, 2, ld)
    };
    assert_eq!(layout_of(&mut layout, F32, 3, 2), INVALID, "ld below the rows");
    assert_eq!(layout_of(&mut layout, F32, 0, 0), INVALID, "ld below 1");
    assert_eq!(layout_of(&mut layout, cudaDataType::CUDA_R_16F, 3, 3), UNSUPPORTED);
    let mut desc = null_mut();
    let tf32 = cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32;
    assert_eq!(unsafe { cublasLtMatmulDescCreate(&mut desc, tf32, F32) }, UNSUPPORTED);
    let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC;
    assert_eq!(unsafe { cublasLtMatmulDescCreate(&mut desc, compute, BF16) }, UNSUPPORTED);
    assert_eq!(unsafe { cublasLtMatmulDescCreate(&mut desc, compute, F32) }, OK);
    assert_eq!(set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, 1i64), Err(INVALID), "an 8-byte TRANSA");
    assert_eq!(set(desc, Attr::CUBLASLT_MATMUL_DESC_POINTER_MODE, 0i32), Err(UNSUPPORTED));
    assert_eq!(unsafe { cublasLtMatmulDescDestroy(desc) }, OK);
    // A null handle.
    let o = Objects::new(&f32_call).unwrap();
    let [la, lb, lc, ld] = o.layouts;
    let (mut result, mut count) = (std::mem::MaybeUninit::uninit(), -1);
    let null_handle = unsafe {
        cublasLtMatmulAlgoGetHeuristic(
            null_mut(),
            o.desc,
            la,
            lb,
            lc,
            ld,
            o.pref,
            1,
            result.as_mut_ptr(),
            &mut count,
        )
    };
    assert_eq!((null_handle, count), (CUBLAS_STATUS_NOT_INITIALIZED, 0));
    let one = (&raw const f32_call.alpha).cast();
    let (algo, stream) = (std::ptr::null(), lt.raw as cudaStream_t);
    let null_handle = unsafe {
        cublasLtMatmul(
            null_mut(),
            o.desc,
            one,
            pa,
            la,
            pb,
            lb,
            one,
            pd,
            lc,
            pd,
            ld,
            algo,
            null_mut(),
            0,
            stream,
        )
    };
    assert_eq!(null_handle, CUBLAS_STATUS_NOT_INITIALIZED);
}

#[test]
fn the_matmul_runs_on_the_stream_reading_device_memory_then() {
    let lt = Lt::new();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    lt.stream.enqueue(Box::new(move || {
        let mut open = g.0.lock().unwrap();
        while !*open {
            open = g.1.wait(open).unwrap();
        }
    }));
    // D (2x1) = alpha [1 2; 3 4] [1 1]^T + bias, on the blocked stream.
    let (a, b, mut bias) =
        (Buf::new(F32, &[1., 3., 2., 4.]), Buf::new(F32, &[1., 1.]), Buf::new(F32, &[0., 0.]));
    let mut d = Buf::new(F32, &[-1., -1.]);
    let mut call = Call { epilogue: BIAS, bias: (bias.ptr(), -1), ..Call::new(F32, F32, (2, 1, 2)) };
    let d_ptr = d.mut_ptr();
    assert_eq!(lt.matmul(&call, [a.ptr(), b.ptr(), d_ptr], d_ptr), OK);
    // Returned with the stream blocked: D is as it was. alpha was read when called; the
    // bias, in device memory, is read when the stream runs the matmul.
    assert_eq!(unsafe { std::ptr::read_volatile(d_ptr.cast::<[f32; 2]>()) }, [-1., -1.]);
    call.alpha = 5.0;
    bias.set(0, 10.);
    bias.set(1, 20.);
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    lt.stream.synchronize();
    assert_eq!((d.values(), call.alpha), (vec![3. + 10., 7. + 20.], 5.0));
}

#[test]
fn the_null_stream_is_the_current_contexts() {
    let lt = Lt::new();
    let (a, b, mut d) =
        (Buf::new(F32, &[1., 3., 2., 4.]), Buf::new(F32, &[1., 1.]), Buf::new(F32, &[f32::NAN; 2]));
    let (call, d_ptr) = (Call::new(F32, F32, (2, 1, 2)), d.mut_ptr());
    // No context current: there is no null stream to run on, as in the cuBLAS stand-in.
    let no_context = lt.matmul_on(null_mut(), &call, [a.ptr(), b.ptr(), d_ptr], d_ptr);
    assert_eq!(no_context, CUBLAS_STATUS_NOT_INITIALIZED);
    crate::devices::set_current(Some(0));
    assert_eq!(lt.matmul_on(null_mut(), &call, [a.ptr(), b.ptr(), d_ptr], d_ptr), OK);
    crate::devices::primary(0).unwrap().null_stream.synchronize();
    crate::devices::set_current(None);
    assert_eq!(d.values(), [3., 7.]);
}
