//! Token + position embedding (or the token embedding alone, with rotary positions). Token ids live on the host; each call uploads them (a few
//! KiB), and backward also uploads the rows grouped by token so the scatter-add into dwte
//! needs no atomics and sums in row order. The activation side (out, dout) is f32 or bf16;
//! the tables and their gradients are f32.

use super::device::{buf, buf_mut, cu, cu_mut, int, rows_cols, CudaDevice};
use super::launch::{per_item, per_token, rows_by_token};
use super::sources::kernel_name;
use crate::tensor::Tensor;

fn btc(t: &Tensor, what: &str) -> (usize, usize, usize) {
    let &[b, t_, c] = t.shape() else { panic!("embedding {what} must be [B,T,C], got {t:?}") };
    (b, t_, c)
}

impl CudaDevice {
    /// out = wte[tokens] (+ wpe[t]); without a position table (rotary positions) the
    /// kernel is passed a null wpe.
    pub(super) fn embedding_forward_op(
        &self,
        out: &mut Tensor,
        tokens: &[u32],
        wte: &Tensor,
        wpe: Option<&Tensor>,
    ) {
        let (b, t, c) = btc(out, "out");
        check(tokens, b, t, c, wte, wpe);
        if tokens.is_empty() {
            return;
        }
        let ids = self.upload(tokens);
        let (rows, t_i, c_i) = ((b * t) as u64, int(t), int(c));
        let name = kernel_name("embedding_forward", out.dtype());
        let cfg = per_item(b * t * c);
        match wpe {
            Some(wpe) => launch!(self, name, cfg, buf_mut(out), &*ids, cu(wte), cu(wpe), &rows, &t_i, &c_i),
            None => launch!(self, name, cfg, buf_mut(out), &*ids, cu(wte), &NULL, &rows, &t_i, &c_i),
        }
    }

    pub(super) fn embedding_backward_op(
        &self,
        dwte: &mut Tensor,
        dwpe: Option<&mut Tensor>,
        dout: &Tensor,
        tokens: &[u32],
    ) {
        let (b, t, c) = btc(dout, "dout");
        check(tokens, b, t, c, dwte, dwpe.as_deref());
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

fn check(tokens: &[u32], b: usize, t: usize, c: usize, wte: &Tensor, wpe: Option<&Tensor>) {
    assert_eq!(tokens.len(), b * t, "embedding: {} tokens for [{b},{t},{c}]", tokens.len());
    let (vocab, wte_c) = rows_cols(wte);
    assert_eq!(wte_c, c, "embedding: wte {wte:?} vs {c} channels");
    if let Some(wpe) = wpe {
        assert!(rows_cols(wpe) >= (t, c), "embedding: wpe {wpe:?} too short for T={t}, C={c}");
    }
    if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= vocab) {
        panic!("embedding: token {bad} outside a vocabulary of {vocab}");
    }
}
