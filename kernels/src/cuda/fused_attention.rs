//! The causal self-attention core in fused kernels (fused_attention.cu): forward writes
//! out [B,T,NH*hs] and the per-row log-sum-exp lse [B,NH,T]; backward recomputes the
//! probabilities tile by tile from q, k and lse, the dropout mask from its key, and writes
//! dqkv in two launches (the query side, a block per query tile of each query head, which
//! also leaves delta_i = dout_i . out_i for the key side; then the key and value side, a
//! block per key tile of each key/value head, summing over its group of query heads).
//! Grouped-query attention's shared key and value heads are read in place from qkv. No
//! [T,T] tensor, and no atomics on any value: every sum has a fixed order. The SIMT harness
//! (kernels/tests/simt/fused_attention.rs) replays these launches against the CPU's
//! attention op.
//!
//! On bf16 activations (`precision: bf16`) fused_attention_mma.cu runs instead, which reads
//! and writes bf16 and multiplies on tensor cores into fp32 (sm_80 and later, head sizes
//! that are multiples of 16, compiled for heads up to 64 and up to 128; the SIMT harness's
//! fused_attention_mma.rs checks them). Their backward is chained: a launch for delta
//! (which also zeroes the counters), then one kernel from the key side that sums dq too,
//! each query tile's over the key tiles' blocks in a fixed order, through fp32 partial
//! sums they hand on by turns ([`ChainedDq`] is that scratch). Five products a tile where
//! the two sides make seven.

use super::device::{assert_same_len, CudaDevice};
use super::launch::{
    per_attention_forward_bf16, per_attention_forward_bf16_hs128, per_attention_tile, per_attention_tile_bf16,
};
use super::pointwise::DropoutMask;
use super::views::{buf, buf_mut, cu, cu_mut, int, same_dtype};
use crate::attention::{attention_mma_compiled_head_size, CausalMask, ChainedDq};
use crate::device::Device;
use crate::dropout::DropoutSpec;
use crate::memory::Category;
use crate::shapes::QkvDims as Dims;
use crate::tensor::{DType, Tensor};
use cudarc::driver::LaunchConfig;

/// The mask argument of `nh` query heads a batch row and whether the kernels apply it
/// (without dropout it is not read).
fn mask(dropout: Option<DropoutSpec>, nh: usize) -> (DropoutMask, i32) {
    match dropout {
        Some(spec) => (DropoutMask::of_heads(&spec, nh), 1),
        None => (DropoutMask::UNUSED, 0),
    }
}

/// The fused attention kernels of one family: the forward and the backward's, and their
/// launches over `heads` heads (T, heads, hs): B*NH query heads, or B*KV key/value heads
/// for the key side.
struct Kernels {
    forward: &'static str,
    forward_launch: fn(usize, usize, usize) -> LaunchConfig,
    backward: Backward,
    backward_launch: fn(usize, usize, usize) -> LaunchConfig,
}

enum Backward {
    /// The query side (dq, and delta for the key side), then the key side (dk and dv).
    TwoSided { query: &'static str, key_value: &'static str },
    /// delta, with the turns' counters zeroed, then every gradient from the key side, each
    /// query tile's dq summed over the key tiles' blocks in turn ([`ChainedDq`]).
    Chained { delta: &'static str, backward: &'static str },
}

/// fused_attention.cu's kernels, for f32 activations at head sizes up to 64.
const F32: Kernels = Kernels {
    forward: "fused_attention_forward",
    forward_launch: per_attention_tile,
    backward: Backward::TwoSided {
        query: "fused_attention_backward_query",
        key_value: "fused_attention_backward_key_value",
    },
    backward_launch: per_attention_tile,
};

/// The tensor-core kernels (fused_attention_mma.cu) compiled for head sizes up to 64.
const BF16: Kernels = Kernels {
    forward: "fused_attention_forward_bf16",
    forward_launch: per_attention_forward_bf16,
    backward: Backward::Chained {
        delta: "fused_attention_backward_delta_bf16",
        backward: "fused_attention_backward_bf16",
    },
    backward_launch: per_attention_tile_bf16,
};

/// The tensor-core kernels compiled for head sizes above 64, up to 128.
const BF16_HS128: Kernels = Kernels {
    forward: "fused_attention_forward_bf16_hs128",
    forward_launch: per_attention_forward_bf16_hs128,
    backward: Backward::Chained {
        delta: "fused_attention_backward_delta_bf16_hs128",
        backward: "fused_attention_backward_bf16_hs128",
    },
    backward_launch: per_attention_tile_bf16,
};

impl CudaDevice {
    /// The kernels for qkv of `dtype` at head size `hs`: bf16 activations go to the tensor
    /// cores (the device requires sm_80 for bf16, and the trainer a head size that fits
    /// them), f32 ones to CUDA cores.
    fn attention_kernels(dtype: DType, hs: usize) -> Kernels {
        match dtype {
            DType::Bf16 if attention_mma_compiled_head_size(hs) == 64 => BF16,
            DType::Bf16 => BF16_HS128,
            DType::F32 => F32,
        }
    }

    /// The kernels' shape arguments: T, NH, KV, hs, and the keys a query sees at most.
    fn shape_args(d: Dims, mask: CausalMask) -> [i32; 5] {
        [int(d.t), int(d.nh), int(d.kv), int(d.hs), int(mask.keys(d.t))]
    }

    /// out [B,T,NH*hs] (a scratch buffer when None) and lse [B,NH,T] from qkv
    /// [B,T,(NH+2*KV)*hs].
    pub(super) fn fused_attention_forward_op(
        &self,
        out: Option<&mut Tensor>,
        lse: &mut Tensor,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        d: Dims,
        causal: CausalMask,
    ) {
        let rows = d.query_rows(); // of lse and delta
        assert_eq!(lse.len(), rows, "attention: lse {lse:?} for qkv {qkv:?}, {d:?}");
        let mut scratch = None;
        let out = match out {
            Some(out) => out,
            None => scratch.insert(self.empty_of(qkv.dtype(), &[d.b, d.t, d.nh * d.hs], Category::Workspace)),
        };
        let kernels = Self::attention_kernels(same_dtype(&[out, qkv]), d.hs);
        let cfg = (kernels.forward_launch)(d.t, d.b * d.nh, d.hs);
        let ((mask, on), [t, nh, kv, hs, window]) = (mask(dropout, d.nh), Self::shape_args(d, causal));
        launch!(
            self,
            kernels.forward,
            cfg,
            buf_mut(out),
            cu_mut(lse),
            buf(qkv),
            &t,
            &nh,
            &kv,
            &hs,
            &window,
            &mask,
            &on
        );
    }

    /// dqkv [B,T,(NH+2*KV)*hs] (overwrite) from dout [B,T,NH*hs], and qkv, out and lse as
    /// forward left them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_attention_backward_op(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        out: &Tensor,
        qkv: &Tensor,
        lse: &Tensor,
        dropout: Option<DropoutSpec>,
        d: Dims,
        causal: CausalMask,
    ) {
        let rows = d.query_rows(); // of lse and delta
        assert_same_len(out, dout);
        assert_eq!(lse.len(), rows, "attention: lse {lse:?} for qkv {qkv:?}, {d:?}");
        let mut delta = self.scratch::<f32>(rows); // [B,NH,T]
        let dtype = same_dtype(&[dqkv, dout, out, qkv]);
        let kernels = Self::attention_kernels(dtype, d.hs);
        let query_cfg = (kernels.backward_launch)(d.t, d.b * d.nh, d.hs);
        let key_value_cfg = (kernels.backward_launch)(d.t, d.b * d.kv, d.hs);
        let ((mask, on), [t, nh, kv, hs, window]) = (mask(dropout, d.nh), Self::shape_args(d, causal));
        let lse = cu(lse);
        match kernels.backward {
            Backward::TwoSided { query, key_value } => {
                launch!(
                    self,
                    query,
                    query_cfg,
                    buf_mut(dqkv),
                    &mut *delta,
                    buf(qkv),
                    buf(out),
                    buf(dout),
                    lse,
                    &t,
                    &nh,
                    &kv,
                    &hs,
                    &window,
                    &mask,
                    &on,
                );
                launch!(
                    self,
                    key_value,
                    key_value_cfg,
                    buf_mut(dqkv),
                    buf(qkv),
                    buf(dout),
                    lse,
                    &*delta,
                    &t,
                    &nh,
                    &kv,
                    &hs,
                    &window,
                    &mask,
                    &on
                );
            }
            Backward::Chained { delta: delta_kernel, backward } => {
                let chain = ChainedDq::of(dtype, d.hs, d.t, d.b * d.nh, d.b * d.kv).expect("a chained dtype");
                let (mut partials, mut turns) =
                    (self.scratch::<f32>(chain.partials), self.scratch::<u32>(chain.turns));
                launch!(
                    self,
                    delta_kernel,
                    query_cfg,
                    &mut *delta,
                    &mut *turns,
                    buf(out),
                    buf(dout),
                    &t,
                    &nh,
                    &kv,
                    &hs
                );
                launch!(
                    self,
                    backward,
                    key_value_cfg,
                    buf_mut(dqkv),
                    &mut *partials,
                    &mut *turns,
                    buf(qkv),
                    buf(dout),
                    lse,
                    &*delta,
                    &t,
                    &nh,
                    &kv,
                    &hs,
                    &window,
                    &mask,
                    &on
                );
            }
        }
    }
}
