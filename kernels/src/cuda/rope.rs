//! Rotary position embedding in place on the query and key heads of qkv
//! [B,T,(NH+2*KV)*hs] (the leading `freqs.rotated(hs)` channels of each head), f32 or
//! bf16, one thread per row and pack of rotated pairs:
//! kernels/cuda/rope.cu.

use super::device::CudaDevice;
use super::launch::per_rope_thread;
use super::sources::kernel_name;
use super::views::{buf_mut, int};
use crate::backend::Rope;
use crate::rope_frequencies::RopeFrequencies;
use crate::shapes::QkvDims;
use crate::tensor::Tensor;

impl Rope for CudaDevice {
    /// Turns the query and key heads of qkv, token t of each sequence at position
    /// `first + t`.
    fn rope_forward_impl(&self, qkv: &mut Tensor, d: QkvDims, freqs: RopeFrequencies, first: usize) {
        let (rows, rot) = (d.b * d.t, freqs.rotated(d.hs));
        let name = kernel_name("rope_forward", qkv.dtype());
        let (rows_u, t_i, nh_i, kv_i, hs_i, rot_i, first_u) =
            (rows as u64, int(d.t), int(d.nh), int(d.kv), int(d.hs), int(rot), first as u64);
        let factor = llama3_factor(freqs);
        launch!(
            self,
            name,
            per_rope_thread(rows, rot / 2, qkv.dtype()),
            buf_mut(qkv),
            &rows_u,
            &t_i,
            &nh_i,
            &kv_i,
            &hs_i,
            &rot_i,
            &first_u,
            &freqs.base,
            &factor
        );
    }

    /// The inverse rotation in place on dqkv, token t at position t.
    fn rope_backward_impl(&self, dqkv: &mut Tensor, d: QkvDims, freqs: RopeFrequencies) {
        let (rows, rot) = (d.b * d.t, freqs.rotated(d.hs));
        let name = kernel_name("rope_backward", dqkv.dtype());
        let (rows_u, t_i, nh_i, kv_i, hs_i, rot_i) =
            (rows as u64, int(d.t), int(d.nh), int(d.kv), int(d.hs), int(rot));
        let factor = llama3_factor(freqs);
        launch!(
            self,
            name,
            per_rope_thread(rows, rot / 2, dqkv.dtype()),
            buf_mut(dqkv),
            &rows_u,
            &t_i,
            &nh_i,
            &kv_i,
            &hs_i,
            &rot_i,
            &freqs.base,
            &factor
        );
    }
}

/// The kernels' `llama3_factor`: 0 for plain RoPE.
fn llama3_factor(freqs: RopeFrequencies) -> f32 {
    freqs.llama3_factor.unwrap_or(0.0)
}
