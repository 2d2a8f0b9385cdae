//! The causal self-attention core in fused kernels (fused_attention.cu): forward writes
//! out [B,T,NH*hs] and the per-row log-sum-exp lse [B,NH,T]; backward recomputes the
//! probabilities tile by tile from q, k and lse, the dropout mask from its key, and writes
//! dqkv in two launches (the query side, a block per query tile of each query head, which
//! also leaves delta_i = dout_i . out_i for the key side; then the key and value side, a
//! block per key tile of each key/value head, summing over its group of query heads).
//! Grouped-query attention's shared key and value heads are read in place from qkv. No
//! [T,T] tensor, and no atomics: every sum has a fixed order. The SIMT harness
//! (kernels/tests/simt/fused_attention.rs) replays these launches against the CPU's
//! attention op.
//!
//! On bf16 activations (`precision: bf16`) the same three launches run
//! fused_attention_mma.cu instead, which reads and writes bf16 and multiplies on tensor
//! cores into fp32 (sm_80 and later, head sizes that are multiples of 16, compiled for
//! heads up to 64 and up to 128; the SIMT harness's fused_attention_mma.rs checks them).

use super::device::{assert_same_len, buf, buf_mut, cu, cu_mut, int, same_dtype, CudaDevice};
use super::launch::{per_attention_tile, per_attention_tile_bf16};
use super::pointwise::DropoutMask;
use super::sources::kernel_name;
use crate::device::Device;
use crate::dropout::DropoutSpec;
use crate::memory::Category;
use crate::shapes::QkvDims as Dims;
use crate::tensor::{DType, Tensor};
use cudarc::driver::LaunchConfig;

/// The mask argument and whether the kernels apply it (without dropout it is not read).
fn mask(dropout: Option<DropoutSpec>) -> (DropoutMask, i32) {
    match dropout {
        Some(spec) => (DropoutMask::new(&spec), 1),
        None => (DropoutMask::UNUSED, 0),
    }
}

/// The names of the three fused attention kernels of one family.
struct Kernels {
    forward: &'static str,
    query: &'static str,
    key_value: &'static str,
}

impl Kernels {
    /// fused_attention.cu's kernels for f32 activations, their tensor-core twins in
    /// fused_attention_mma.cu for bf16.
    fn of(dtype: DType) -> Kernels {
        Kernels {
            forward: kernel_name("fused_attention_forward", dtype),
            query: kernel_name("fused_attention_backward_query", dtype),
            key_value: kernel_name("fused_attention_backward_key_value", dtype),
        }
    }
}

/// The tensor-core kernels compiled for head sizes above 64, up to 128.
const BF16_HS128: Kernels = Kernels {
    forward: "fused_attention_forward_bf16_hs128",
    query: "fused_attention_backward_query_bf16_hs128",
    key_value: "fused_attention_backward_key_value_bf16_hs128",
};

impl CudaDevice {
    /// The kernels for qkv of `dtype`, and the launch of those over `heads` heads of `d`
    /// (B*NH query heads, or B*KV key/value heads for the key side): bf16 activations go to
    /// the tensor cores (the device requires sm_80 for bf16, and the trainer a head size
    /// that fits them), f32 ones to CUDA cores.
    fn attention_kernels(dtype: DType, d: Dims, heads: usize) -> (Kernels, LaunchConfig) {
        match dtype {
            DType::Bf16 if d.hs > 64 => (BF16_HS128, per_attention_tile_bf16(d.t, heads, d.hs)),
            DType::Bf16 => (Kernels::of(dtype), per_attention_tile_bf16(d.t, heads, d.hs)),
            DType::F32 => (Kernels::of(dtype), per_attention_tile(d.t, heads, d.hs)),
        }
    }

    /// The kernels' shape arguments: T, NH, KV, hs.
    fn shape_args(d: Dims) -> [i32; 4] {
        [int(d.t), int(d.nh), int(d.kv), int(d.hs)]
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
    ) {
        let rows = d.query_rows(); // of lse and delta
        assert_eq!(lse.len(), rows, "attention: lse {lse:?} for qkv {qkv:?}, {d:?}");
        let mut scratch = None;
        let out = match out {
            Some(out) => out,
            None => scratch.insert(self.empty_of(qkv.dtype(), &[d.b, d.t, d.nh * d.hs], Category::Workspace)),
        };
        let (kernels, cfg) = Self::attention_kernels(same_dtype(&[out, qkv]), d, d.b * d.nh);
        let ((mask, on), [t, nh, kv, hs]) = (mask(dropout), Self::shape_args(d));
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
    ) {
        let rows = d.query_rows(); // of lse and delta
        assert_same_len(out, dout);
        assert_eq!(lse.len(), rows, "attention: lse {lse:?} for qkv {qkv:?}, {d:?}");
        let mut delta = self.scratch::<f32>(rows); // [B,NH,T]
        let dtype = same_dtype(&[dqkv, dout, out, qkv]);
        let (kernels, query_cfg) = Self::attention_kernels(dtype, d, d.b * d.nh);
        let (_, key_value_cfg) = Self::attention_kernels(dtype, d, d.b * d.kv);
        let ((mask, on), [t, nh, kv, hs]) = (mask(dropout), Self::shape_args(d));
        let lse = cu(lse);
        launch!(
            self,
            kernels.query,
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
            &mask,
            &on,
        );
        launch!(
            self,
            kernels.key_value,
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
            &mask,
            &on
        );
    }
}
