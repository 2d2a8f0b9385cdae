//! The elementwise ops: residual add and accumulation, GELU, dropout, AdamW, and the
//! f32 <-> bf16 casts.

use super::device::{cu, cu_mut, CudaDevice};
use super::launch::per_item;
use super::scratch::Scratch;
use crate::device::AdamWStep;
use crate::dropout::DropoutSpec;
use crate::philox::{counter_base, drop_threshold, key_words};
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, DeviceRepr};

/// One dropout mask as the kernels take it: `DropoutMask` in kernels/cuda/philox.cuh, field
/// for field (repr(C) pads both the same way).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct DropoutMask {
    counter: [u32; 3],
    key: [u32; 2],
    threshold: u64,
    scale: f32,
}

// SAFETY: plain old data with the C layout of the kernel parameter.
unsafe impl DeviceRepr for DropoutMask {}

impl DropoutMask {
    /// The argument of a kernel told not to apply dropout, which never reads it.
    pub const UNUSED: DropoutMask = DropoutMask { counter: [0; 3], key: [0; 2], threshold: 0, scale: 1.0 };

    /// The counter, key and threshold of kernels/src/philox.rs, so the GPU draws the CPU's
    /// mask; kept elements are scaled by 1 / (1 - p).
    pub fn new(spec: &DropoutSpec) -> Self {
        DropoutMask {
            counter: counter_base(&spec.key),
            key: key_words(spec.key.seed),
            threshold: drop_threshold(spec.p),
            scale: 1.0 / (1.0 - spec.p),
        }
    }
}

impl CudaDevice {
    pub(super) fn accumulate_op(&self, acc: &mut Tensor, x: &Tensor) {
        let n = acc.len() as u64;
        launch!(self, "accumulate", per_item(acc.len()), cu_mut(acc), cu(x), &n);
    }

    pub(super) fn add_op(&self, out: &mut Tensor, a: &Tensor, b: &Tensor) {
        let n = out.len() as u64;
        launch!(self, "add", per_item(out.len()), cu_mut(out), cu(a), cu(b), &n);
    }

    pub(super) fn gelu_forward_op(&self, out: &mut Tensor, inp: &Tensor) {
        let n = out.len() as u64;
        launch!(self, "gelu_forward", per_item(out.len()), cu_mut(out), cu(inp), &n);
    }

    pub(super) fn gelu_backward_op(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        let n = dinp.len() as u64;
        launch!(self, "gelu_backward", per_item(dinp.len()), cu_mut(dinp), cu(inp), cu(dout), &n);
    }

    /// out = inp * mask (forward on activations, backward on gradients alike).
    pub(super) fn dropout_op(&self, out: &mut Tensor, inp: &Tensor, spec: &DropoutSpec) {
        let len = out.len();
        self.dropout_slices(cu_mut(out), cu(inp), len, spec);
    }

    /// The first `len` elements of out = inp * mask, one thread per four elements.
    pub(super) fn dropout_slices(
        &self,
        out: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        len: usize,
        spec: &DropoutSpec,
    ) {
        let (n, mask) = (len as u64, DropoutMask::new(spec));
        launch!(self, "dropout_apply", per_item(len.div_ceil(4)), out, inp, &n, &mask);
    }

    pub(super) fn dropout_inplace(&self, x: &mut CudaSlice<f32>, len: usize, spec: &DropoutSpec) {
        let (n, mask) = (len as u64, DropoutMask::new(spec));
        launch!(self, "dropout_apply_inplace", per_item(len.div_ceil(4)), x, &n, &mask);
    }

    pub(super) fn adamw_op(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamWStep,
    ) {
        let n = param.len() as u64;
        // The per-step constants, computed as the CPU backend computes them.
        let t = i32::try_from(hp.step).expect("adamw step fits in i32");
        let step_size = (hp.lr as f64 / (1.0 - (hp.beta1 as f64).powi(t))) as f32;
        let bias2_sqrt = (1.0 - (hp.beta2 as f64).powi(t)).sqrt() as f32;
        let decay = 1.0 - hp.lr * hp.weight_decay;
        launch!(
            self,
            "adamw",
            per_item(param.len()),
            cu_mut(param),
            cu(grad),
            cu_mut(m),
            cu_mut(v),
            &n,
            &hp.beta1,
            &hp.beta2,
            &hp.eps,
            &hp.grad_scale,
            &decay,
            &step_size,
            &bias2_sqrt,
        );
    }

    /// A bf16 copy (as bits) of an f32 buffer, rounded to nearest even.
    pub(super) fn to_bf16(&self, x: &CudaSlice<f32>) -> Scratch<u16> {
        self.to_bf16_padded(x, x.len())
    }

    /// As [`Self::to_bf16`], into `len` >= x.len() elements, the rest zero.
    pub(super) fn to_bf16_padded(&self, x: &CudaSlice<f32>, len: usize) -> Scratch<u16> {
        assert!(len >= x.len(), "cuda: padding {} elements to {len}", x.len());
        let mut out = self.scratch::<u16>(len);
        let n = x.len() as u64;
        launch!(self, "f32_to_bf16", per_item(x.len()), &mut *out, x, &n);
        if len > x.len() {
            let mut padding = out.slice_mut(x.len()..);
            self.stream
                .memset_zeros(&mut padding)
                .unwrap_or_else(|e| panic!("cuda: cannot zero padding: {e:?}"));
        }
        out
    }
}

impl CudaDevice {
    /// Rounds every element of `t` to the nearest bf16 and back: the rounding the bf16
    /// matmul mode applies to its operands, for checking it against the CPU's.
    pub fn round_to_bf16(&self, t: &mut Tensor) {
        let bits = self.to_bf16(cu(t));
        let n = t.len() as u64;
        launch!(self, "bf16_to_f32", per_item(t.len()), cu_mut(t), &*bits, &n);
    }
}
