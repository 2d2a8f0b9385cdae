//! Token + position embedding (or the token embedding alone, with rotary positions). Token ids live on the host; each call uploads them (a few
//! KiB), and backward also uploads the rows grouped by token so the scatter-add into dwte
//! needs no atomics and sums in row order. The activation side (out, dout) is f32 or bf16;
//! the tables and their gradients are f32.

use super::device::CudaDevice;
use super::launch::{per_item, per_pack, per_token, rows_by_token};
use super::sources::kernel_name;
use super::views::{buf, buf_mut, cu, cu_mut, int};
use crate::backend::Embedding;
use crate::tensor::Tensor;

impl Embedding for CudaDevice {
    /// out = wte[tokens] (+ wpe[t]); without a position table (rotary positions) the
    /// kernel is passed a null wpe.
    fn embedding_forward_impl(
        &self,
        out: &mut Tensor,
        tokens: &[u32],
        wte: &Tensor,
        wpe: Option<&Tensor>,
        [b, t, c]: [usize; 3],
    ) {
        if tokens.is_empty() {
            return;
        }
        let ids = self.upload(tokens);
        let (rows, t_i, c_i) = ((b * t) as u64, int(t), int(c));
        let name = kernel_name("embedding_forward", out.dtype());
        let cfg = per_pack(b * t * c, out.dtype());
        match wpe {
            Some(wpe) => launch!(self, name, cfg, buf_mut(out), &*ids, cu(wte), cu(wpe), &rows, &t_i, &c_i),
            None => launch!(self, name, cfg, buf_mut(out), &*ids, cu(wte), &NULL, &rows, &t_i, &c_i),
        }
    }

    fn embedding_backward_impl(
        &self,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
        dout: &Tensor,
        tokens: &[u32],
        [b, t, c]: [usize; 3],
    ) {
        if tokens.is_empty() {
            return;
        }
        let (layout, groups) = rows_by_token(tokens);
        let layout = self.upload(&layout);
        let (g_i, c_i) = (int(groups), int(c));
        let name = kernel_name("embedding_backward_wte", dout.dtype());
        launch!(self, name, per_token(groups), cu_mut(dwte), buf(dout), &*layout, &g_i, &c_i);
        if let Some(dwpe) = dwpe {
            let (b_i, t_i) = (int(b), int(t));
            let name = kernel_name("embedding_backward_wpe", dout.dtype());
            launch!(self, name, per_item(t * c), cu_mut(dwpe), buf(dout), &b_i, &t_i, &c_i);
        }
    }
}

/// A null device pointer: the position table a model with rotary positions lacks.
const NULL: u64 = 0;
