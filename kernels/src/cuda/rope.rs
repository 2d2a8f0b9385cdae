//! Rotary position embedding in place on the query and key heads of qkv
//! [B,T,(NH+2*KV)*hs], f32 or bf16, one thread per (row, rotated pair): kernels/cuda/rope.cu.

use super::device::{buf_mut, int, CudaDevice};
use super::launch::per_item;
use super::sources::kernel_name;
use crate::tensor::Tensor;

/// The rows B*T, tokens T and head size of qkv [B,T,(NH+2*KV)*hs], checked as the CPU
/// backend checks them.
fn rope_dims(qkv: &Tensor, n_head: usize, n_kv_head: usize) -> (usize, usize, usize) {
    let &[b, t, width] = qkv.shape() else { panic!("rope: qkv must be [B,T,(NH+2*KV)*hs], got {qkv:?}") };
    let heads = n_head + 2 * n_kv_head;
    assert!(
        n_kv_head > 0 && n_head.is_multiple_of(n_kv_head) && width.is_multiple_of(heads),
        "rope: qkv {qkv:?} with {n_head} query heads on {n_kv_head} key/value heads"
    );
    let hs = width / heads;
    assert!(hs.is_multiple_of(2), "rope: the head size {hs} must be even");
    (b * t, t, hs)
}

impl CudaDevice {
    /// Turns the query and key heads of qkv, token t of each sequence at position
    /// `first + t`.
    pub(super) fn rope_forward_op(
        &self,
        qkv: &mut Tensor,
        n_head: usize,
        n_kv_head: usize,
        base: f32,
        first: usize,
    ) {
        let (rows, t, hs) = rope_dims(qkv, n_head, n_kv_head);
        let name = kernel_name("rope_forward", qkv.dtype());
        let (rows_u, t_i, nh_i, kv_i, hs_i, first_u) =
            (rows as u64, int(t), int(n_head), int(n_kv_head), int(hs), first as u64);
        launch!(
            self,
            name,
            per_item(rows * hs / 2),
            buf_mut(qkv),
            &rows_u,
            &t_i,
            &nh_i,
            &kv_i,
            &hs_i,
            &first_u,
            &base
        );
    }

    /// The inverse rotation in place on dqkv, token t at position t.
    pub(super) fn rope_backward_op(&self, dqkv: &mut Tensor, n_head: usize, n_kv_head: usize, base: f32) {
        let (rows, t, hs) = rope_dims(dqkv, n_head, n_kv_head);
        let name = kernel_name("rope_backward", dqkv.dtype());
        let (rows_u, t_i, nh_i, kv_i, hs_i) = (rows as u64, int(t), int(n_head), int(n_kv_head), int(hs));
        launch!(
            self,
            name,
            per_item(rows * hs / 2),
            buf_mut(dqkv),
            &rows_u,
            &t_i,
            &nh_i,
            &kv_i,
            &hs_i,
            &base
        );
    }
}
