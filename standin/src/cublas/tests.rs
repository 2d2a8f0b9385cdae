//! Products checked by hand. With A = [1 2 3; 4 5 6] and B = [7 8; 9 10; 11 12],
//! A B = [1*7+2*9+3*11  1*8+2*10+3*12; 4*7+5*9+6*11  4*8+5*10+6*12] = [58 64; 139 154].
//! Every matrix below is written column by column, as cuBLAS stores it.

use super::*;
use crate::stream::{self, Stream};
use cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
const CUBLAS_GEMM_DEFAULT: cublasGemmAlgo_t = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
use cublasOperation_t::{CUBLAS_OP_C as C, CUBLAS_OP_N as N, CUBLAS_OP_T as T};
use cublasStatus_t::{
    CUBLAS_STATUS_INVALID_VALUE as INVALID, CUBLAS_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_NOT_SUPPORTED,
    CUBLAS_STATUS_SUCCESS as OK,
};
use cudaDataType_t::{CUDA_R_16BF, CUDA_R_32F};
use half::bf16;
use std::sync::{Arc, Condvar, Mutex};

/// A, as stored for op N (lda 2) and, transposed, for op T (lda 3).
const A_N: [f32; 6] = [1., 4., 2., 5., 3., 6.];
const A_T: [f32; 6] = [1., 2., 3., 4., 5., 6.];
/// B, as stored for op N (ldb 3) and, transposed, for op T (ldb 2).
const B_N: [f32; 6] = [7., 9., 11., 8., 10., 12.];
const B_T: [f32; 6] = [7., 8., 9., 10., 11., 12.];
const AB: [f32; 4] = [58., 139., 64., 154.];

/// A call's operations, sizes and leading dimensions.
#[derive(Clone, Copy)]
struct Shape {
    ops: (cublasOperation_t, cublasOperation_t),
    mnk: (c_int, c_int, c_int),
    lds: (c_int, c_int, c_int),
}

/// A B from A_N and B_N.
const NN: Shape = Shape { ops: (N, N), mnk: (2, 2, 3), lds: (2, 3, 2) };

/// A handle whose products run on a stream of its own.
struct Blas {
    h: cublasHandle_t,
    stream: Arc<Stream>,
    raw: CUstream,
}

impl Blas {
    fn new() -> Blas {
        let mut h = std::ptr::null_mut();
        let stream = Stream::new(0);
        let raw = stream::into_handle(stream.clone());
        unsafe {
            assert_eq!(cublasCreate_v2(&mut h), OK);
            assert_eq!(cublasSetStream_v2(h, raw as cudaStream_t), OK);
        }
        Blas { h, stream, raw }
    }

    /// cublasSgemm_v2, then a wait for the stream.
    fn sgemm(&self, s: Shape, alpha: f32, beta: f32, a: &[f32], b: &[f32], c: &mut [f32]) -> cublasStatus_t {
        let ((ta, tb), (m, n, k), (lda, ldb, ldc)) = (s.ops, s.mnk, s.lds);
        let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let status =
            unsafe { cublasSgemm_v2(self.h, ta, tb, m, n, k, &alpha, pa, lda, pb, ldb, &beta, pc, ldc) };
        self.stream.synchronize();
        status
    }

    /// cublasGemmEx with f32 scalars and compute, then a wait for the stream.
    #[allow(clippy::too_many_arguments)]
    fn gemm_ex<X, Y>(
        &self,
        s: Shape,
        beta: f32,
        (a, b, ab_type): (&[X], &[X], cudaDataType_t),
        (c, c_type): (&mut [Y], cudaDataType_t),
        compute: cublasComputeType_t,
    ) -> cublasStatus_t {
        let ((ta, tb), (m, n, k), (lda, ldb, ldc)) = (s.ops, s.mnk, s.lds);
        let (alpha, pa, pb, pc) = (1.0f32, a.as_ptr().cast(), b.as_ptr().cast(), c.as_mut_ptr().cast());
        let (one, beta) = ((&raw const alpha).cast(), (&raw const beta).cast());
        let status = unsafe {
            cublasGemmEx(
                self.h,
                ta,
                tb,
                m,
                n,
                k,
                one,
                pa,
                ab_type,
                lda,
                pb,
                ab_type,
                ldb,
                beta,
                pc,
                c_type,
                ldc,
                compute,
                CUBLAS_GEMM_DEFAULT,
            )
        };
        self.stream.synchronize();
        status
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        unsafe {
            assert_eq!(cublasDestroy_v2(self.h), OK);
            stream::release_handle(self.raw);
        }
    }
}

fn bf16s(values: &[f32]) -> Vec<bf16> {
    values.iter().map(|v| bf16::from_f32(*v)).collect()
}

#[test]
fn each_pair_of_operations_gives_the_same_product() {
    let blas = Blas::new();
    for (ta, a, lda) in [(N, A_N, 2), (T, A_T, 3), (C, A_T, 3)] {
        for (tb, b, ldb) in [(N, B_N, 3), (T, B_T, 2), (C, B_T, 2)] {
            let mut c = [0.0; 4];
            let shape = Shape { ops: (ta, tb), lds: (lda, ldb, 2), ..NN };
            assert_eq!(blas.sgemm(shape, 1.0, 0.0, &a, &b, &mut c), OK);
            assert_eq!(c, AB, "{ta:?} {tb:?}");
        }
    }
}

#[test]
fn padding_past_the_rows_is_neither_read_nor_written() {
    let blas = Blas::new();
    let x = f32::NAN;
    // lda 4, ldb 5, ldc 3: NaN padding in A and B would reach C if read; C's must stay -1.
    let a = [1., 4., x, x, 2., 5., x, x, 3., 6., x, x];
    let b = [7., 9., 11., x, x, 8., 10., 12., x, x];
    let mut c = [0., 0., -1., 0., 0., -1.];
    assert_eq!(blas.sgemm(Shape { lds: (4, 5, 3), ..NN }, 1.0, 0.0, &a, &b, &mut c), OK);
    assert_eq!(c, [58., 139., -1., 64., 154., -1.]);
    // Transposed operands: A^T stored with lda 4, B^T with ldb 3.
    let a = [1., 2., 3., x, 4., 5., 6., x];
    let b = [7., 8., x, 9., 10., x, 11., 12., x];
    let mut c = [0., 0., -1., 0., 0., -1.];
    assert_eq!(blas.sgemm(Shape { ops: (T, T), lds: (4, 3, 3), ..NN }, 1.0, 0.0, &a, &b, &mut c), OK);
    assert_eq!(c, [58., 139., -1., 64., 154., -1.]);
}

#[test]
fn alpha_scales_the_product_and_beta_the_old_c_on_the_null_stream() {
    // No stream set: the products run on the current context's null stream.
    devices::set_current(Some(0));
    let mut h = std::ptr::null_mut();
    assert_eq!(unsafe { cublasCreate_v2(&mut h) }, OK);
    let call = |alpha: f32, a: &[f32], beta: f32, c: &mut [f32; 4]| {
        let (pa, pb, pc) = (a.as_ptr(), B_N.as_ptr(), c.as_mut_ptr());
        let status = unsafe { cublasSgemm_v2(h, N, N, 2, 2, 3, &alpha, pa, 2, pb, 3, &beta, pc, 2) };
        devices::primary(0).unwrap().null_stream.synchronize();
        assert_eq!(status, OK);
    };
    let mut c = [1., 2., 3., 4.];
    call(2.0, &A_N, 0.5, &mut c);
    assert_eq!(c, [2. * 58. + 0.5, 2. * 139. + 1., 2. * 64. + 1.5, 2. * 154. + 2.]);
    // beta 0: C is not read, so NaN there does not spread.
    let mut c = [f32::NAN; 4];
    call(1.0, &A_N, 0.0, &mut c);
    assert_eq!(c, AB);
    // alpha 0: A and B are not read.
    let mut c = [1., 2., 3., 4.];
    call(0.0, &[f32::NAN; 6], -2.0, &mut c);
    assert_eq!(c, [-2., -4., -6., -8.]);
    assert_eq!(unsafe { cublasDestroy_v2(h) }, OK);
    devices::set_current(None);
}

#[test]
fn strided_batches_are_found_by_their_strides() {
    let blas = Blas::new();
    let x = f32::NAN;
    // Batch 1: A1 = [1 0 -1; 0 2 0], B1 = [1 0; 0 1; 1 1], A1 B1 = [0 -1; 0 2].
    // A's batches are 8 apart (2 NaN between), B's 6, C's 5 (a -1 between, untouched).
    let a = [1., 4., 2., 5., 3., 6., x, x, 1., 0., 0., 2., -1., 0.];
    let b = [7., 9., 11., 8., 10., 12., 1., 0., 1., 0., 1., 1.];
    let mut c = [0., 0., 0., 0., -1., 0., 0., 0., 0.];
    let (alpha, beta) = (1.0f32, 0.0f32);
    let status = unsafe {
        cublasSgemmStridedBatched(
            blas.h,
            N,
            N,
            2,
            2,
            3,
            &alpha,
            a.as_ptr(),
            2,
            8,
            b.as_ptr(),
            3,
            6,
            &beta,
            c.as_mut_ptr(),
            2,
            5,
            2,
        )
    };
    blas.stream.synchronize();
    assert_eq!(status, OK);
    assert_eq!(c, [58., 139., 64., 154., -1., 0., 0., -1., 2.]);
}

#[test]
fn bf16_operands_accumulate_into_f32() {
    let blas = Blas::new();
    let mut c = [f32::NAN; 4];
    let status = blas.gemm_ex(
        NN,
        0.0,
        (&bf16s(&A_N), &bf16s(&B_N), CUDA_R_16BF),
        (&mut c, CUDA_R_32F),
        CUBLAS_COMPUTE_32F,
    );
    assert_eq!(status, OK);
    assert_eq!(c, AB);
}

#[test]
fn bf16_batches_with_beta_into_bf16() {
    let blas = Blas::new();
    // The batches of the f32 test, dense; beta 1 adds C = 1 everywhere. Every value is a
    // bf16 exactly (integers of at most 8 significant bits).
    let a = bf16s(&[1., 4., 2., 5., 3., 6., 1., 0., 0., 2., -1., 0.]);
    let b = bf16s(&[7., 9., 11., 8., 10., 12., 1., 0., 1., 0., 1., 1.]);
    let mut c = bf16s(&[1.; 8]);
    let (alpha, beta) = (1.0f32, 1.0f32);
    let (one, beta) = ((&raw const alpha).cast(), (&raw const beta).cast());
    let status = unsafe {
        cublasGemmStridedBatchedEx(
            blas.h,
            N,
            N,
            2,
            2,
            3,
            one,
            a.as_ptr().cast(),
            CUDA_R_16BF,
            2,
            6,
            b.as_ptr().cast(),
            CUDA_R_16BF,
            3,
            6,
            beta,
            c.as_mut_ptr().cast(),
            CUDA_R_16BF,
            2,
            4,
            2,
            CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT,
        )
    };
    blas.stream.synchronize();
    assert_eq!(status, OK);
    assert_eq!(c, bf16s(&[59., 140., 65., 155., 1., 1., 0., 3.]));
}

#[test]
fn a_bf16_c_is_rounded_once_to_nearest_even() {
    let blas = Blas::new();
    // C (3x1) = A (3x2) [1 1]^T with A's rows (256, 1), (258, 1), (256, 1.5), all bf16
    // exactly: the f32 sums 257 and 259 lie halfway between bf16 neighbours 2 apart (ties
    // go to the even mantissa: 256 and 260), 257.5 is nearer 258. Truncation would give
    // 256, 258, 256.
    let a = bf16s(&[256., 258., 256., 1., 1., 1.5]);
    let b = bf16s(&[1., 1.]);
    let mut c = [bf16::NAN; 3];
    let shape = Shape { mnk: (3, 1, 2), lds: (3, 2, 3), ..NN };
    assert_eq!(
        blas.gemm_ex(shape, 0.0, (&a, &b, CUDA_R_16BF), (&mut c, CUDA_R_16BF), CUBLAS_COMPUTE_32F),
        OK
    );
    assert_eq!(c, [257f32, 259., 257.5].map(bf16::from_f32));
    assert_eq!(c, [256f32, 260., 258.].map(bf16::from_f32));
}

#[test]
fn bad_parameters_are_refused_before_anything_runs() {
    let blas = Blas::new();
    let mut c = [-1.0; 4];
    let refused = |shape: Shape, c: &mut [f32; 4]| blas.sgemm(shape, 1.0, 0.0, &A_T, &B_T, c);
    // lda below the rows of A as stored: 2 for op N, 3 (k) for op T; ldb and ldc likewise.
    assert_eq!(refused(Shape { lds: (1, 3, 2), ..NN }, &mut c), INVALID);
    assert_eq!(refused(Shape { ops: (T, N), lds: (2, 3, 2), ..NN }, &mut c), INVALID);
    assert_eq!(refused(Shape { ops: (N, T), lds: (2, 1, 2), ..NN }, &mut c), INVALID);
    assert_eq!(refused(Shape { lds: (2, 3, 1), ..NN }, &mut c), INVALID);
    assert_eq!(refused(Shape { mnk: (2, -1, 3), ..NN }, &mut c), INVALID);
    assert_eq!(refused(Shape { ops: (cublasOperation_t::CUBLAS_OP_CONJG, N), ..NN }, &mut c), INVALID);
    assert_eq!(c, [-1.0; 4]);
    // Types and compute types not modelled.
    let mut c16 = bf16s(&[-1.0; 4]);
    let ex = |ab_type, c: &mut [f32; 4], compute| {
        blas.gemm_ex(NN, 0.0, (&A_N, &B_N, ab_type), (c, CUDA_R_32F), compute)
    };
    assert_eq!(ex(CUDA_R_32F, &mut c, CUBLAS_COMPUTE_32F_FAST_TF32), CUBLAS_STATUS_NOT_SUPPORTED);
    assert_eq!(ex(cudaDataType_t::CUDA_R_16F, &mut c, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_NOT_SUPPORTED);
    let f32_into_bf16 =
        blas.gemm_ex(NN, 0.0, (&A_N, &B_N, CUDA_R_32F), (&mut c16, CUDA_R_16BF), CUBLAS_COMPUTE_32F);
    assert_eq!(f32_into_bf16, CUBLAS_STATUS_NOT_SUPPORTED);
    assert_eq!((c, c16), ([-1.0; 4], bf16s(&[-1.0; 4])));
    // A bf16 A with an f32 B.
    let (a, alpha, beta) = (bf16s(&A_N), 1.0f32, 0.0f32);
    let status = unsafe {
        cublasGemmEx(
            blas.h,
            N,
            N,
            2,
            2,
            3,
            (&raw const alpha).cast(),
            a.as_ptr().cast(),
            CUDA_R_16BF,
            2,
            B_N.as_ptr().cast(),
            CUDA_R_32F,
            3,
            (&raw const beta).cast(),
            c.as_mut_ptr().cast(),
            CUDA_R_32F,
            2,
            CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT,
        )
    };
    assert_eq!(status, CUBLAS_STATUS_NOT_SUPPORTED);
    let (pa, pb, pc) = (A_N.as_ptr(), B_N.as_ptr(), c.as_mut_ptr());
    let null =
        unsafe { cublasSgemm_v2(std::ptr::null_mut(), N, N, 2, 2, 3, &alpha, pa, 2, pb, 3, &beta, pc, 2) };
    assert_eq!(null, CUBLAS_STATUS_NOT_INITIALIZED);
}

#[test]
fn the_product_runs_on_the_stream_with_the_scalars_of_the_call() {
    let blas = Blas::new();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    blas.stream.enqueue(Box::new(move || {
        let mut open = g.0.lock().unwrap();
        while !*open {
            open = g.1.wait(open).unwrap();
        }
    }));
    let mut c = [-1.0f32; 4];
    let (mut alpha, beta) = (1.0f32, 0.0f32);
    let (pa, pb, pc) = (A_N.as_ptr(), B_N.as_ptr(), c.as_mut_ptr());
    let status = unsafe { cublasSgemm_v2(blas.h, N, N, 2, 2, 3, &alpha, pa, 2, pb, 3, &beta, pc, 2) };
    assert_eq!(status, OK);
    // The call returned with the stream still blocked: C is as it was. alpha was read
    // when called: changing it now changes nothing.
    alpha = 3.0;
    assert_eq!(unsafe { std::ptr::read_volatile(pc.cast::<[f32; 4]>()) }, [-1.0; 4]);
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    blas.stream.synchronize();
    assert_eq!((c, alpha), (AB, 3.0));
}

#[test]
fn larger_products_agree_with_the_definition_for_every_layout() {
    // Large enough for the gemm crate's blocked kernels (the small products above take its
    // small-matrix path). Small integers keep every sum exact, so the check is equality;
    // leading dimensions are padded with NaN, and C starts as NaN under beta 0.
    let (m, n, k) = (37usize, 29usize, 41usize);
    let value = |i: usize, j: usize, salt: usize| ((i * 7 + j * 3 + salt) % 11) as f32 - 5.0;
    let stored = |rows: usize, cols: usize, ld: usize, at: &dyn Fn(usize, usize) -> f32| {
        let mut x = vec![f32::NAN; ld * cols];
        for j in 0..cols {
            for i in 0..rows {
                x[i + j * ld] = at(i, j);
            }
        }
        x
    };
    let (ld_pad, ldc) = (3usize, m + 2);
    let blas = Blas::new();
    for (ta, tb) in [(N, N), (T, N), (N, T), (T, T)] {
        let (ta_t, tb_t) = (ta == T, tb == T);
        // op(A)(i, p) and op(B)(p, j), whatever the storage.
        let op_a = |i: usize, p: usize| value(i, p, 1);
        let op_b = |p: usize, j: usize| value(p, j, 2);
        let (a, lda) = if ta_t {
            (stored(k, m, k + ld_pad, &|p, i| op_a(i, p)), k + ld_pad)
        } else {
            (stored(m, k, m + ld_pad, &op_a), m + ld_pad)
        };
        let (b, ldb) = if tb_t {
            (stored(n, k, n + ld_pad, &|j, p| op_b(p, j)), n + ld_pad)
        } else {
            (stored(k, n, k + ld_pad, &op_b), k + ld_pad)
        };
        let mut c = vec![f32::NAN; ldc * n];
        let shape = Shape {
            ops: (ta, tb),
            mnk: (m as c_int, n as c_int, k as c_int),
            lds: (lda as c_int, ldb as c_int, ldc as c_int),
        };
        assert_eq!(blas.sgemm(shape, 1.0, 0.0, &a, &b, &mut c), OK);
        for j in 0..n {
            for i in 0..m {
                let want: f32 = (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum();
                assert_eq!(c[i + j * ldc], want, "{ta:?} {tb:?} C({i}, {j})");
            }
            assert!(
                c[m + j * ldc..(j + 1) * ldc].iter().all(|x| x.is_nan()),
                "{ta:?} {tb:?}: padding written"
            );
        }
    }
}
