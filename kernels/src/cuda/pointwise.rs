//! The elementwise ops: residual add and accumulation, GELU, squared ReLU, the gated linear
//! units (SwiGLU, GeGLU) and dropout, each on
//! f32 tensors or, through the kernels' `_bf16` twins, on bf16 ones; and zeroing many f32
//! tensors at once (zero.cu).

use super::device::CudaDevice;
use super::launch::{per_pack, per_table_chunk, ZERO_CHUNK};
use super::sources::kernel_name;
use super::views::{buf, buf_mut, same_dtype};
use crate::backend::{Dropout, Elementwise, Gelu, Glu, SquaredRelu};
use crate::dropout::DropoutSpec;
use crate::philox::{counter_base, drop_threshold, key_words};
use crate::tensor::{Storage, Tensor};
use crate::{DType, Gate};
use cudarc::driver::{CudaSlice, DevicePtrMut, DeviceRepr};
use std::ops::Range;

/// One dropout mask as the kernels take it: `DropoutMask` in kernels/cuda/philox.cuh, field
/// for field (repr(C) pads both the same way).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct DropoutMask {
    counter: [u32; 3],
    key: [u32; 2],
    threshold: u64,
    scale: f32,
    /// The mask element of the tensor's first ([`DropoutSpec::first`]).
    first: u64,
    /// An attention's query heads: [own a batch row, the layer's, the first own one's index
    /// among them] ([`DropoutSpec::heads`]); [1, 1, 0] for a layer's own.
    heads: [u32; 3],
}

// SAFETY: plain old data with the C layout of the kernel parameter.
unsafe impl DeviceRepr for DropoutMask {}

impl DropoutMask {
    /// The argument of a kernel told not to apply dropout, which never reads it.
    pub const UNUSED: DropoutMask =
        DropoutMask { counter: [0; 3], key: [0; 2], threshold: 0, scale: 1.0, first: 0, heads: [1, 1, 0] };

    /// An elementwise dropout's mask from element `spec.first`: the counter, key and
    /// threshold of kernels/src/philox.rs, so the GPU draws the CPU's mask; kept elements
    /// are scaled by 1 / (1 - p).
    pub fn new(spec: &DropoutSpec) -> Self {
        assert_eq!(spec.heads, None, "cuda: an elementwise dropout keyed by attention heads");
        DropoutMask {
            counter: counter_base(&spec.key),
            key: key_words(spec.key.seed),
            threshold: drop_threshold(spec.p),
            scale: 1.0 / (1.0 - spec.p),
            first: spec.first as u64,
            heads: [1, 1, 0],
        }
    }

    /// The mask of an attention's probabilities over `nh` query heads a batch row, which
    /// the fused kernels index by (batch, head, query, key): a tensor-parallel rank's heads
    /// draw the whole layer's ([`DropoutSpec::heads`]).
    pub fn of_heads(spec: &DropoutSpec, nh: usize) -> Self {
        assert_eq!(spec.first, 0, "cuda: attention dropout keyed from mask element {}", spec.first);
        let heads = match spec.heads {
            Some(r) => [nh, r.total, r.first].map(|x| u32::try_from(x).expect("attention heads fit 32 bits")),
            None => [1, 1, 0],
        };
        DropoutMask { heads, ..DropoutMask::new(&DropoutSpec { heads: None, ..*spec }) }
    }
}

impl Elementwise for CudaDevice {
    fn accumulate_impl(&self, acc: &mut Tensor, x: &Tensor) {
        let (n, dtype) = (acc.len() as u64, same_dtype(&[acc, x]));
        let name = kernel_name("accumulate", dtype);
        launch!(self, name, per_pack(acc.len(), dtype), buf_mut(acc), buf(x), &n);
        self.refresh_bf16_copy(acc);
    }

    fn add_impl(&self, out: &mut Tensor, a: &Tensor, b: &Tensor) {
        let (n, dtype) = (out.len() as u64, same_dtype(&[out, a, b]));
        let name = kernel_name("add", dtype);
        launch!(self, name, per_pack(out.len(), dtype), buf_mut(out), buf(a), buf(b), &n);
    }

    fn add_scalar_impl(&self, out: &mut Tensor, a: &Tensor, s: f32) {
        let (n, dtype) = (out.len() as u64, same_dtype(&[out, a]));
        let name = kernel_name("add_scalar", dtype);
        launch!(self, name, per_pack(out.len(), dtype), buf_mut(out), buf(a), &s, &n);
    }

    fn scale_impl(&self, t: &mut Tensor, s: f32) {
        let (n, dtype) = (t.len() as u64, t.dtype());
        let name = kernel_name("scale", dtype);
        launch!(self, name, per_pack(t.len(), dtype), buf_mut(t), &s, &n);
    }
}

impl Gelu for CudaDevice {
    fn gelu_forward_impl(&self, out: &mut Tensor, inp: &Tensor) {
        let (n, dtype) = (out.len() as u64, same_dtype(&[out, inp]));
        let name = kernel_name("gelu_forward", dtype);
        launch!(self, name, per_pack(out.len(), dtype), buf_mut(out), buf(inp), &n);
    }

    fn gelu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        let (n, dtype) = (dinp.len() as u64, same_dtype(&[dinp, inp, dout]));
        let name = kernel_name("gelu_backward", dtype);
        launch!(self, name, per_pack(dinp.len(), dtype), buf_mut(dinp), buf(inp), buf(dout), &n);
    }
}

impl SquaredRelu for CudaDevice {
    fn squared_relu_forward_impl(&self, out: &mut Tensor, inp: &Tensor) {
        let (n, dtype) = (out.len() as u64, same_dtype(&[out, inp]));
        let name = kernel_name("squared_relu_forward", dtype);
        launch!(self, name, per_pack(out.len(), dtype), buf_mut(out), buf(inp), &n);
    }

    fn squared_relu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor) {
        let (n, dtype) = (dinp.len() as u64, same_dtype(&[dinp, inp, dout]));
        let name = kernel_name("squared_relu_backward", dtype);
        launch!(self, name, per_pack(dinp.len(), dtype), buf_mut(dinp), buf(inp), buf(dout), &n);
    }
}

impl Glu for CudaDevice {
    /// out [N,F] = act(inp[:, :F]) * inp[:, F:], one thread per output.
    fn glu_forward_impl(&self, out: &mut Tensor, inp: &Tensor, f: usize, gate: Gate) {
        let (n, cols, dtype) = (out.len() as u64, f as u64, same_dtype(&[out, inp]));
        let name = kernel_name(gate.kernels().0, dtype);
        launch!(self, name, per_pack(out.len(), dtype), buf_mut(out), buf(inp), &n, &cols);
    }

    /// dinp [N,2F] (overwrite) from inp [N,2F] and dout [N,F], one thread per element of dout.
    fn glu_backward_impl(&self, dinp: &mut Tensor, inp: &Tensor, dout: &Tensor, f: usize, gate: Gate) {
        let (n, cols, dtype) = (dout.len() as u64, f as u64, same_dtype(&[dinp, inp, dout]));
        let name = kernel_name(gate.kernels().1, dtype);
        launch!(self, name, per_pack(dout.len(), dtype), buf_mut(dinp), buf(inp), buf(dout), &n, &cols);
    }
}

impl Dropout for CudaDevice {
    /// out = inp * mask (forward on activations, backward on gradients alike), one thread
    /// per 128-bit pack.
    fn dropout_impl(&self, out: &mut Tensor, inp: &Tensor, spec: &DropoutSpec) {
        let (len, dtype) = (out.len(), same_dtype(&[out, inp]));
        let (n, mask) = (len as u64, DropoutMask::new(spec));
        let name = kernel_name("dropout_apply", dtype);
        launch!(self, name, per_pack(len, dtype), buf_mut(out), buf(inp), &n, &mask);
    }
}

impl CudaDevice {
    /// out = inp * mask over each run of elements with its mask: the unfused attention's
    /// probabilities (f32, as that path is).
    pub(super) fn dropout_runs(
        &self,
        out: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        runs: &[(Range<usize>, DropoutMask)],
    ) {
        for (run, mask) in runs {
            let n = run.len() as u64;
            let (mut out, inp) = (out.slice_mut(run.clone()), inp.slice(run.clone()));
            launch!(self, "dropout_apply", per_pack(run.len(), DType::F32), &mut out, &inp, &n, mask);
        }
    }

    /// x *= mask over each run of elements with its mask, in place.
    pub(super) fn dropout_runs_inplace(&self, x: &mut CudaSlice<f32>, runs: &[(Range<usize>, DropoutMask)]) {
        for (run, mask) in runs {
            let n = run.len() as u64;
            let mut x = x.slice_mut(run.clone());
            launch!(self, "dropout_apply_inplace", per_pack(run.len(), DType::F32), &mut x, &n, mask);
        }
    }
}

impl CudaDevice {
    /// Zeroes `tensors` (f32, without a bf16 copy) in one launch of `zero_tensors`, from a
    /// kept table of their addresses and lengths (tensor_table.rs).
    pub(super) fn zero_tensors(&self, tensors: &mut [&mut Tensor]) {
        if tensors.is_empty() {
            return;
        }
        // The addresses are written on this stream; the guards record that use for cudarc's
        // event tracking when they drop, after the launch. A record is zero.cu's
        // `ZeroedTensor`: the address and the length.
        let lens: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        let (records, _writes): (Vec<[u64; 2]>, Vec<_>) = tensors
            .iter_mut()
            .map(|t| {
                let n = t.len() as u64;
                assert!(
                    matches!(t.storage(), Storage::Cuda(_)),
                    "cuda: zeroing {t:?} with others: only f32 tensors without a bf16 copy"
                );
                let Storage::Cuda(x) = t.storage_mut() else { unreachable!("checked above") };
                let (address, write) = x.device_ptr_mut(&self.stream);
                ([address, n], write)
            })
            .unzip();
        self.zero_table.with((&self.arena, &self.stream), records.concat(), &lens, ZERO_CHUNK, |table| {
            launch!(
                self,
                "zero_tensors",
                per_table_chunk(table.blocks),
                &table.records,
                &table.first,
                &table.count
            )
        });
    }
}
