//! One matmul as cuBLASLt checks it ([`Problem`]: all the heuristic sees) and runs it
//! ([`Plan`]): C copied into D where they differ, the cuBLAS stand-in's product into D, and
//! the epilogue applied to the product's f32 result before the one rounding to D's type.

use super::{lt_status, Desc, Layout, INVALID, NOT_SUPPORTED};
use crate::cublas::products::{self, Element, Operand, Products, Stored, View};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::sys::{cublasLtEpilogue_t, cublasStatus_t};
use std::ffi::c_int;

/// What is done to the f32 result before it is stored.
#[derive(Clone, Copy)]
pub(super) enum Epilogue {
    Default,
    /// Adds an m-element vector to every column.
    Bias {
        addr: usize,
        ty: Element,
    },
    /// Multiplies by gelu'(aux), aux an m x n matrix `ld` apart: the GELU input that
    /// GELU_AUX saved in the forward.
    DGelu {
        addr: usize,
        ty: Element,
        ld: usize,
    },
}

impl Epilogue {
    /// The descriptor's epilogue for a D of type `d` with `m` rows.
    fn check(desc: &Desc, d: Element, m: usize) -> Result<Epilogue, cublasStatus_t> {
        use cublasLtEpilogue_t::{
            CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_DGELU,
        };
        let is = |epilogue: cublasLtEpilogue_t| desc.epilogue == epilogue as u32;
        // A type attribute left unset (or set to -1) means D's type, the only one taken.
        let ty = |raw: i32| match raw {
            -1 => Ok(d),
            raw if Element::of_raw(raw).map_err(lt_status)? == d => Ok(d),
            _ => Err(INVALID),
        };
        if is(CUBLASLT_EPILOGUE_DEFAULT) {
            Ok(Epilogue::Default)
        } else if is(CUBLASLT_EPILOGUE_BIAS) {
            Ok(Epilogue::Bias { addr: desc.bias, ty: ty(desc.bias_type)? })
        } else if is(CUBLASLT_EPILOGUE_DGELU) {
            let ty = ty(desc.aux_type)?;
            // cuBLASLt's requirements of the aux matrix, which has no layout of its own.
            let ld = usize::try_from(desc.aux_ld).ok().filter(|ld| ld.is_multiple_of(8) && *ld >= m);
            match ld {
                Some(ld) if desc.aux.is_multiple_of(16) => Ok(Epilogue::DGelu { addr: desc.aux, ty, ld }),
                _ => Err(NOT_SUPPORTED),
            }
        } else {
            Err(NOT_SUPPORTED)
        }
    }

    /// The address of the matrix the epilogue reads, if it reads one.
    fn operand(&self) -> Option<usize> {
        match *self {
            Epilogue::Default => None,
            Epilogue::Bias { addr, .. } | Epilogue::DGelu { addr, .. } => Some(addr),
        }
    }

    /// Applies the epilogue to the m x n f32 result at `result`, `ld` apart.
    ///
    /// # Safety
    /// The result is writable and the bias or aux matrix readable for their shapes.
    unsafe fn apply(&self, (m, n): (usize, usize), result: *mut f32, ld: usize) {
        // The operand as an m x n matrix (a bias is its one column repeated: leading
        // dimension 0), and how an element of it combines with the result's.
        let (addr, ty, operand_ld, combine): (_, _, _, fn(f32, f32) -> f32) = match *self {
            Epilogue::Default => return,
            Epilogue::Bias { addr, ty } => (addr, ty, 0, |r, bias| r + bias),
            Epilogue::DGelu { addr, ty, ld } => (addr, ty, ld, |r, x| r * gelu_grad(x)),
        };
        // SAFETY: per the contract.
        let operand = unsafe { View::of(Stored { addr, ty, rows: m, cols: n, ld: operand_ld }) };
        for j in 0..n {
            for i in 0..m {
                // SAFETY: (i, j) lies inside both matrices.
                unsafe {
                    let r = &mut *result.add(i + j * ld);
                    *r = combine(*r, *operand.ptr.add(i + j * operand.ld));
                }
            }
        }
    }
}

/// The derivative of GPT-2's tanh GELU, in f32 and in the order kernels/src/cpu/gelu.rs's
/// backward computes it, with f32::exp. A real cuBLASLt's GELU is its own and agrees with
/// this only to rounding: the stand-in stands for the API, not the bits.
fn gelu_grad(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const CUBIC: f32 = 0.044_715;
    let u = SQRT_2_OVER_PI * (x + CUBIC * x * x * x);
    let s = 1.0 / (1.0 + (-2.0 * u).exp());
    let du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * x * x);
    s + x * s * (1.0 - s) * 2.0 * du_dx
}

/// A matmul's problem, checked: what the heuristic needs, everything but the addresses and
/// scalars.
pub(super) struct Problem {
    ops: (cublasOperation_t, cublasOperation_t),
    /// op(A) is m x k, op(B) k x n.
    mnk: (usize, usize, usize),
    layouts: [Layout; 4],
    epilogue: Epilogue,
}

impl Problem {
    /// The problem of `desc` on A, B, C and D of these layouts, or why cuBLASLt refuses it.
    pub(super) fn check(desc: &Desc, [a, b, c, d]: [Layout; 4]) -> Result<Problem, cublasStatus_t> {
        use cublasOperation_t::{CUBLAS_OP_C, CUBLAS_OP_CONJG, CUBLAS_OP_N, CUBLAS_OP_T};
        let op = |raw: i32| {
            let ops = [CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C, CUBLAS_OP_CONJG];
            ops.into_iter().find(|op| *op as i32 == raw).ok_or(INVALID)
        };
        let ops = (op(desc.transa)?, op(desc.transb)?);
        let transposes = |op| products::transposes(op).map_err(lt_status);
        let (m, k) = if transposes(ops.0)? { (a.cols, a.rows) } else { (a.rows, a.cols) };
        let (b_k, n) = if transposes(ops.1)? { (b.cols, b.rows) } else { (b.rows, b.cols) };
        if b_k != k || [c, d].iter().any(|x| (x.rows, x.cols) != (m, n)) {
            return Err(INVALID);
        }
        if c.ty != d.ty {
            return Err(NOT_SUPPORTED);
        }
        Element::check_types(a.ty, b.ty, d.ty).map_err(lt_status)?;
        let epilogue = Epilogue::check(desc, d.ty, m)?;
        Ok(Problem { ops, mnk: (m, n, k), layouts: [a, b, c, d], epilogue })
    }

    /// The matmul on A, B, C and D at `addrs` with these scalars, read now; INVALID_VALUE
    /// for a null pointer the matmul reads or writes, or C == D with different layouts.
    ///
    /// # Safety
    /// `alpha` and `beta` are null or point to an f32.
    pub(super) unsafe fn plan(
        &self,
        [a, b, c, d]: [usize; 4],
        alpha: *const f32,
        beta: *const f32,
    ) -> Result<Plan, cublasStatus_t> {
        let [a_layout, b_layout, c_layout, d_layout] = self.layouts;
        // Layouts keep every size within a C int.
        let operand = |addr, l: Layout| Operand { addr, ty: l.ty, ld: l.ld as c_int, stride: 0 };
        let (m, n, k) = self.mnk;
        let mnk = (m as c_int, n as c_int, k as c_int);
        // D is the products' C: where C is another matrix, it is copied into D first.
        let operands = (operand(a, a_layout), operand(b, b_layout), operand(d, d_layout));
        // SAFETY: per the contract.
        let products =
            unsafe { Products::check(self.ops, mnk, alpha, beta, operands, 1) }.map_err(lt_status)?;
        // SAFETY: `Products::check` found beta non-null; per the contract it is an f32.
        let reads_c = unsafe { *beta } != 0.0;
        if a == 0 || b == 0 || d == 0 || (reads_c && c == 0) || self.epilogue.operand() == Some(0) {
            return Err(INVALID);
        }
        if c == d && c_layout.ld != d_layout.ld {
            return Err(INVALID);
        }
        let stored = |addr, l: Layout| Stored { addr, ty: l.ty, rows: l.rows, cols: l.cols, ld: l.ld };
        let copy = (reads_c && c != d).then(|| (stored(c, c_layout), stored(d, d_layout)));
        Ok(Plan { products, copy, epilogue: self.epilogue, mn: (m, n) })
    }
}

/// A checked matmul, its scalars read, to run on a stream.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    products: Products,
    /// C and D, where C is read and is not D.
    copy: Option<(Stored, Stored)>,
    epilogue: Epilogue,
    mn: (usize, usize),
}

impl Plan {
    pub(super) fn is_empty(&self) -> bool {
        self.products.is_empty()
    }

    /// # Safety
    /// Every matrix the matmul names is readable (D writable) for its layout, and D overlaps
    /// none of the others unless it is C.
    pub(super) unsafe fn run(&self) {
        if let Some((c, d)) = self.copy {
            // SAFETY: per the contract.
            unsafe { copy(c, d) };
        }
        let (mn, epilogue) = (self.mn, self.epilogue);
        // SAFETY: per the contract; the epilogue keeps to the m x n result it is given.
        unsafe { self.products.run_then(&|result, ld| epilogue.apply(mn, result, ld)) }
    }
}

/// Copies C's elements into D, of C's type and shape, bits unchanged and padding untouched.
///
/// # Safety
/// Both matrices are valid for their shapes, C readable and D writable.
unsafe fn copy(c: Stored, d: Stored) {
    let bytes = c.ty.bytes() as usize;
    for j in 0..c.cols {
        let (from, to) = (c.addr + j * c.ld * bytes, d.addr + j * d.ld * bytes);
        // SAFETY: column j lies inside both, per the contract.
        unsafe { std::ptr::copy(from as *const u8, to as *mut u8, c.rows * bytes) };
    }
}
