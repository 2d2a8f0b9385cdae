//! The causal self-attention core in fused kernels (fused_attention.cu): forward writes
//! out [B,T,C] and the per-row log-sum-exp lse [B,NH,T]; backward recomputes the
//! probabilities tile by tile from q, k and lse, the dropout mask from its key, and writes
//! dqkv in two launches (the query side, which also leaves delta_i = dout_i . out_i for the
//! key side; then the key and value side). No [T,T] tensor, and no atomics: every sum has
//! a fixed order. The SIMT harness (kernels/tests/simt/fused_attention.rs) replays these
//! launches against the CPU's attention op.
//!
//! On bf16 activations (`precision: bf16`) the same three launches run
//! fused_attention_mma.cu instead, which reads and writes bf16 and multiplies on tensor
//! cores into fp32 (sm_80 and later, head sizes that are multiples of 16; the SIMT
//! harness's fused_attention_mma.rs checks them).

use super::device::{assert_same_len, buf, buf_mut, cu, cu_mut, int, same_dtype, CudaDevice};
use super::launch::{per_attention_tile, per_attention_tile_bf16};
use super::pointwise::DropoutMask;
use crate::device::Device;
use crate::dropout::DropoutSpec;
use crate::memory::Category;
use crate::tensor::{DType, Tensor};
use cudarc::driver::LaunchConfig;

/// B, T, C, NH of qkv [B,T,3C] with `n_head` heads.
fn dims(qkv: &Tensor, n_head: usize) -> [usize; 4] {
    let &[b, t, c3] = qkv.shape() else { panic!("attention qkv must be [B,T,3C], got {qkv:?}") };
    assert!(
        c3.is_multiple_of(3) && n_head > 0 && (c3 / 3).is_multiple_of(n_head),
        "attention: qkv {qkv:?}, {n_head} heads"
    );
    [b, t, c3 / 3, n_head]
}

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

const FP32: Kernels = Kernels {
    forward: "fused_attention_forward",
    query: "fused_attention_backward_query",
    key_value: "fused_attention_backward_key_value",
};
const BF16: Kernels = Kernels {
    forward: "fused_attention_forward_bf16",
    query: "fused_attention_backward_query_bf16",
    key_value: "fused_attention_backward_key_value_bf16",
};

impl CudaDevice {
    /// The kernels for `t` rows of `heads` heads of `head_size` over qkv of `dtype`, and
    /// their launch: bf16 activations go to the tensor cores (the device requires sm_80 for
    /// bf16, and the trainer a head size that fits them), f32 ones to CUDA cores.
    fn attention_kernels(
        &self,
        dtype: DType,
        t: usize,
        heads: usize,
        head_size: usize,
    ) -> (&'static Kernels, LaunchConfig) {
        match dtype {
            DType::Bf16 => (&BF16, per_attention_tile_bf16(t, heads, head_size)),
            DType::F32 => (&FP32, per_attention_tile(t, heads, head_size)),
        }
    }

    /// out [B,T,C] (a scratch buffer when None) and lse [B,NH,T] from qkv [B,T,3C].
    pub(super) fn fused_attention_forward_op(
        &self,
        out: Option<&mut Tensor>,
        lse: &mut Tensor,
        dropout: Option<DropoutSpec>,
        qkv: &Tensor,
        n_head: usize,
    ) {
        let [b, t, c, nh] = dims(qkv, n_head);
        assert_eq!(lse.len(), b * nh * t, "attention: lse {lse:?} for qkv {qkv:?}, {nh} heads");
        let mut scratch = None;
        let out = match out {
            Some(out) => {
                assert_eq!(out.len(), b * t * c, "attention: out {out:?} for qkv {qkv:?}");
                out
            }
            None => scratch.insert(self.empty_of(qkv.dtype(), &[b, t, c], Category::Workspace)),
        };
        let dtype = same_dtype(&[out, qkv]);
        let (kernels, cfg) = self.attention_kernels(dtype, t, b * nh, c / nh);
        let ((mask, on), (t, nh, hs)) = (mask(dropout), (int(t), int(nh), int(c / n_head)));
        launch!(self, kernels.forward, cfg, buf_mut(out), cu_mut(lse), buf(qkv), &t, &nh, &hs, &mask, &on);
    }

    /// dqkv [B,T,3C] (overwrite) from dout [B,T,C], and qkv, out and lse as forward left them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_attention_backward_op(
        &self,
        dqkv: &mut Tensor,
        dout: &Tensor,
        out: &Tensor,
        qkv: &Tensor,
        lse: &Tensor,
        dropout: Option<DropoutSpec>,
        n_head: usize,
    ) {
        let [b, t, c, nh] = dims(qkv, n_head);
        assert_same_len(dqkv, qkv);
        assert_eq!(dout.len(), b * t * c, "attention: dout {dout:?} for qkv {qkv:?}");
        assert_same_len(out, dout);
        assert_eq!(lse.len(), b * nh * t, "attention: lse {lse:?} for qkv {qkv:?}, {nh} heads");
        let mut delta = self.scratch::<f32>(b * nh * t); // [B,NH,T]
        let dtype = same_dtype(&[dqkv, dout, out, qkv]);
        let (kernels, cfg) = self.attention_kernels(dtype, t, b * nh, c / nh);
        let ((mask, on), (t, nh, hs)) = (mask(dropout), (int(t), int(nh), int(c / n_head)));
        let lse = cu(lse);
        launch!(
            self,
            kernels.query,
            cfg,
            buf_mut(dqkv),
            &mut *delta,
            buf(qkv),
            buf(out),
            buf(dout),
            lse,
            &t,
            &nh,
            &hs,
            &mask,
            &on,
        );
        launch!(
            self,
            kernels.key_value,
            cfg,
            buf_mut(dqkv),
            buf(qkv),
            buf(dout),
            lse,
            &*delta,
            &t,
            &nh,
            &hs,
            &mask,
            &on
        );
    }
}
