//! The causal self-attention core in fused kernels (fused_attention.cu): forward writes
//! out [B,T,C] and the per-row log-sum-exp lse [B,NH,T]; backward recomputes the
//! probabilities tile by tile from q, k and lse, the dropout mask from its key, and writes
//! dqkv in two launches (the query side, which also leaves delta_i = dout_i . out_i for the
//! key side; then the key and value side). No [T,T] tensor, and no atomics: every sum has
//! a fixed order. The SIMT harness (kernels/tests/simt/fused_attention.rs) replays these
//! launches against the CPU's attention op.
//!
//! Under `precision: bf16` the same three launches run fused_attention_mma.cu instead,
//! whose products are bf16 tensor-core instructions into fp32 (sm_80 and later, head sizes
//! that are multiples of 16; the SIMT harness's fused_attention_mma.rs checks them).

use super::blas::MatmulPrecision;
use super::device::{assert_same_len, cu, cu_mut, int, CudaDevice};
use super::launch::{attention_mma_fits, per_attention_tile, per_attention_tile_bf16};
use super::pointwise::DropoutMask;
use crate::dropout::DropoutSpec;
use crate::tensor::Tensor;
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
    /// The kernels for `t` rows of `heads` heads of `head_size`, and their launch: on the
    /// tensor cores where the device's matmuls are bf16, the GPU has bf16 mma (sm_80 on) and
    /// the head size fits them; in fp32 otherwise.
    fn attention_kernels(
        &self,
        t: usize,
        heads: usize,
        head_size: usize,
    ) -> (&'static Kernels, LaunchConfig) {
        let tensor_cores = self.precision == MatmulPrecision::Bf16
            && self.gpu.compute_capability.0 >= 8
            && attention_mma_fits(head_size);
        if tensor_cores {
            (&BF16, per_attention_tile_bf16(t, heads, head_size))
        } else {
            (&FP32, per_attention_tile(t, heads, head_size))
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
                cu_mut(out)
            }
            None => &mut **scratch.insert(self.scratch::<f32>(b * t * c)),
        };
        let (kernels, cfg) = self.attention_kernels(t, b * nh, c / nh);
        let ((mask, on), (t, nh, hs)) = (mask(dropout), (int(t), int(nh), int(c / n_head)));
        launch!(self, kernels.forward, cfg, out, cu_mut(lse), cu(qkv), &t, &nh, &hs, &mask, &on);
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
        let (kernels, cfg) = self.attention_kernels(t, b * nh, c / nh);
        let ((mask, on), (t, nh, hs)) = (mask(dropout), (int(t), int(nh), int(c / n_head)));
        let (dqkv, qkv, dout, lse) = (cu_mut(dqkv), cu(qkv), cu(dout), cu(lse));
        launch!(
            self,
            kernels.query,
            cfg,
            &mut *dqkv,
            &mut *delta,
            qkv,
            cu(out),
            dout,
            lse,
            &t,
            &nh,
            &hs,
            &mask,
            &on,
        );
        launch!(self, kernels.key_value, cfg, dqkv, qkv, dout, lse, &*delta, &t, &nh, &hs, &mask, &on);
    }
}
