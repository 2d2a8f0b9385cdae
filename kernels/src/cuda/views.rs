//! A tensor's CUDA storage as the kernels and cuBLAS take it: its f32 or bf16 slice, or
//! either as one kernel argument whose kernel is chosen by the dtype.

use crate::tensor::{DType, Storage, Tensor};
use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};

/// Whether `t` is a parameter whose fp32 master holds only part of it.
pub(super) fn master_is_sharded(t: &Tensor) -> bool {
    matches!(t.storage(), Storage::CudaMaster { part, .. } if part.len() != t.len())
}

/// The f32 buffer of a tensor (a parameter's master copy). A tensor of another device or
/// another dtype here is a bug in the caller.
pub(super) fn cu(t: &Tensor) -> &CudaSlice<f32> {
    assert!(!master_is_sharded(t), "cuda: {t:?} holds only its replica's part of its fp32 master");
    match t.storage() {
        Storage::Cuda(s) | Storage::CudaMaster { master: s, .. } => s,
        _ => panic!("cuda: {t:?} is not an f32 GPU tensor"),
    }
}

pub(super) fn cu_mut(t: &mut Tensor) -> &mut CudaSlice<f32> {
    if !matches!(t.storage(), Storage::Cuda(_) | Storage::CudaMaster { .. }) {
        panic!("cuda: {t:?} is not an f32 GPU tensor");
    }
    assert!(!master_is_sharded(t), "cuda: {t:?} holds only its replica's part of its fp32 master");
    match t.storage_mut() {
        Storage::Cuda(s) | Storage::CudaMaster { master: s, .. } => s,
        _ => unreachable!("checked above"),
    }
}

/// A tensor's bf16 elements for a cuBLAS operand: a bf16 tensor's own, or a parameter's
/// bf16 copy (rows padded, see [`Storage::CudaMaster`]).
pub(super) fn cu16(t: &Tensor) -> &CudaSlice<u16> {
    match t.storage() {
        Storage::CudaBf16(s) | Storage::CudaMaster { bf16: s, .. } => s,
        _ => panic!("cuda: {t:?} has no bf16 elements (a parameter without its bf16 copy?)"),
    }
}

pub(super) fn cu16_mut(t: &mut Tensor) -> &mut CudaSlice<u16> {
    if !matches!(t.storage(), Storage::CudaBf16(_)) {
        panic!("cuda: {t:?} is not a bf16 GPU tensor");
    }
    match t.storage_mut() {
        Storage::CudaBf16(s) => s,
        _ => unreachable!("checked above"),
    }
}

/// A tensor's elements as a kernel argument, whichever their type: the kernel (an f32 one
/// or its `_bf16` twin, see [`kernel_name`](super::sources::kernel_name)) is chosen to match.
pub(super) enum Buf<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>),
}

pub(super) enum BufMut<'a> {
    F32(&'a mut CudaSlice<f32>),
    Bf16(&'a mut CudaSlice<u16>),
}

pub(super) fn buf(t: &Tensor) -> Buf<'_> {
    match t.dtype() {
        DType::F32 => Buf::F32(cu(t)),
        DType::Bf16 => Buf::Bf16(cu16(t)),
    }
}

pub(super) fn buf_mut(t: &mut Tensor) -> BufMut<'_> {
    match t.dtype() {
        DType::F32 => BufMut::F32(cu_mut(t)),
        DType::Bf16 => BufMut::Bf16(cu16_mut(t)),
    }
}

// SAFETY (both): each pushes its slice exactly as cudarc pushes a slice of that type,
// with the same stream-ordering events.
unsafe impl<'a, 'b: 'a> PushKernelArg<Buf<'b>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: Buf<'b>) -> &mut Self {
        match arg {
            Buf::F32(s) => self.arg(s),
            Buf::Bf16(s) => self.arg(s),
        }
    }
}

unsafe impl<'a, 'b: 'a> PushKernelArg<BufMut<'b>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: BufMut<'b>) -> &mut Self {
        match arg {
            BufMut::F32(s) => self.arg(s),
            BufMut::Bf16(s) => self.arg(s),
        }
    }
}

/// The one dtype of an op's activation tensors (a mixture is a bug in the caller).
pub(super) fn same_dtype(tensors: &[&Tensor]) -> DType {
    let dtype = tensors[0].dtype();
    assert!(tensors.iter().all(|t| t.dtype() == dtype), "cuda: an op's activations mix dtypes: {tensors:?}");
    dtype
}

/// A size as the kernels' `int` parameters take it.
pub(super) fn int(x: usize) -> i32 {
    i32::try_from(x).unwrap_or_else(|_| panic!("cuda: size {x} does not fit a kernel's int"))
}
