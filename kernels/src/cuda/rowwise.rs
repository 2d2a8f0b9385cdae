//! The ops that reduce along rows or columns: LayerNorm, RMSNorm (alone, or fused with the
//! residual add before them and the residual gradient after them, or as QK-norm on each query
//! and key head of qkv) and bias gradients, on f32 or bf16 activations (parameters and their
//! gradients f32). Every reduction has a fixed shape (warp per row, fixed chunks of rows or
//! elements, then one ordered pass), so results are bitwise repeatable.

use super::device::{rows_cols, CudaDevice};
use super::launch::{
    per_column_chunk, per_column_chunk_of_each, per_column_tile, per_pack, per_row_warp, ROWS_PER_CHUNK,
};
use super::sources::kernel_name;
use super::views::{buf, buf_mut, cu, cu_mut, int, same_dtype};
use crate::backend::{LayerNorm, RmsNorm};
use crate::qk_norm::QkNormRows;
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, CudaView};

impl LayerNorm for CudaDevice {
    fn layernorm_forward_impl(
        &self,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) {
        let (n, c) = rows_cols(inp);
        let (n_i, c_i) = (int(n), int(c));
        let name = kernel_name("layernorm_forward", same_dtype(&[out, inp]));
        launch!(
            self,
            name,
            per_row_warp(n),
            buf_mut(out),
            cu_mut(mean),
            cu_mut(rstd),
            buf(inp),
            cu(weight),
            cu(bias),
            &n_i,
            &c_i,
            &eps,
        );
    }

    fn layernorm_residual_forward_impl(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        mean: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) {
        let (n, c) = rows_cols(residual);
        let (n_i, c_i) = (int(n), int(c));
        let name = kernel_name("layernorm_residual_forward", same_dtype(&[residual, out, a, b]));
        launch!(
            self,
            name,
            per_row_warp(n),
            buf_mut(residual),
            buf_mut(out),
            cu_mut(mean),
            cu_mut(rstd),
            buf(a),
            buf(b),
            cu(weight),
            cu(bias),
            &n_i,
            &c_i,
            &eps,
        );
    }

    fn layernorm_backward_impl(
        &self,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        dweight: &mut Tensor,
        dbias: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = rows_cols(inp);
        let (n_i, c_i) = (int(n), int(c));
        let dtype = same_dtype(&[dinp, dout, inp]);
        let (cfg, wc) = (per_row_warp(n), cu(weight));
        match dresidual {
            None => {
                let name = kernel_name("layernorm_backward_input", dtype);
                launch!(
                    self,
                    name,
                    cfg,
                    buf_mut(dinp),
                    buf(dout),
                    buf(inp),
                    wc,
                    cu(mean),
                    cu(rstd),
                    &n_i,
                    &c_i
                );
            }
            Some(dres) => {
                let name = kernel_name("layernorm_residual_backward_input", same_dtype(&[dinp, dres]));
                let (dinp, dres, dout, inp) = (buf_mut(dinp), buf(dres), buf(dout), buf(inp));
                launch!(self, name, cfg, dinp, dres, dout, inp, wc, cu(mean), cu(rstd), &n_i, &c_i);
            }
        }
        let (cfg, chunks) = per_column_chunk(n, c);
        let mut partial_w = self.scratch::<f32>(chunks * c);
        let mut partial_b = self.scratch::<f32>(chunks * c);
        let rows_per_chunk = ROWS_PER_CHUNK as i32;
        launch!(
            self,
            kernel_name("layernorm_backward_params_partial", dtype),
            cfg,
            &mut *partial_w,
            &mut *partial_b,
            buf(dout),
            buf(inp),
            cu(mean),
            cu(rstd),
            &n_i,
            &c_i,
            &rows_per_chunk,
        );
        self.add_partials(cu_mut(dweight), &partial_w.as_view(), chunks, c);
        self.add_partials(cu_mut(dbias), &partial_b.as_view(), chunks, c);
    }
}

impl RmsNorm for CudaDevice {
    fn rmsnorm_forward_impl(
        &self,
        out: &mut Tensor,
        rstd: &mut Tensor,
        inp: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) {
        let (n, c) = rows_cols(inp);
        let (n_i, c_i) = (int(n), int(c));
        let name = kernel_name("rmsnorm_forward", same_dtype(&[out, inp]));
        launch!(
            self,
            name,
            per_row_warp(n),
            buf_mut(out),
            cu_mut(rstd),
            buf(inp),
            cu(weight),
            &n_i,
            &c_i,
            &eps
        );
    }

    fn rmsnorm_residual_forward_impl(
        &self,
        residual: &mut Tensor,
        out: &mut Tensor,
        rstd: &mut Tensor,
        a: &Tensor,
        b: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) {
        let (n, c) = rows_cols(residual);
        let (n_i, c_i) = (int(n), int(c));
        let name = kernel_name("rmsnorm_residual_forward", same_dtype(&[residual, out, a, b]));
        launch!(
            self,
            name,
            per_row_warp(n),
            buf_mut(residual),
            buf_mut(out),
            cu_mut(rstd),
            buf(a),
            buf(b),
            cu(weight),
            &n_i,
            &c_i,
            &eps
        );
    }

    fn rmsnorm_backward_impl(
        &self,
        dinp: &mut Tensor,
        dresidual: Option<&Tensor>,
        dweight: &mut Tensor,
        dout: &Tensor,
        inp: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
    ) {
        let (n, c) = rows_cols(inp);
        let (n_i, c_i) = (int(n), int(c));
        let dtype = same_dtype(&[dinp, dout, inp]);
        let (cfg, wc) = (per_row_warp(n), cu(weight));
        match dresidual {
            None => {
                let name = kernel_name("rmsnorm_backward_input", dtype);
                launch!(self, name, cfg, buf_mut(dinp), buf(dout), buf(inp), wc, cu(rstd), &n_i, &c_i);
            }
            Some(dres) => {
                let name = kernel_name("rmsnorm_residual_backward_input", same_dtype(&[dinp, dres]));
                let (dinp, dres, dout, inp) = (buf_mut(dinp), buf(dres), buf(dout), buf(inp));
                launch!(self, name, cfg, dinp, dres, dout, inp, wc, cu(rstd), &n_i, &c_i);
            }
        }
        let (cfg, chunks) = per_column_chunk(n, c);
        let mut partial_w = self.scratch::<f32>(chunks * c);
        let rows_per_chunk = ROWS_PER_CHUNK as i32;
        launch!(
            self,
            kernel_name("rmsnorm_backward_weight_partial", dtype),
            cfg,
            &mut *partial_w,
            buf(dout),
            buf(inp),
            cu(rstd),
            &n_i,
            &c_i,
            &rows_per_chunk,
        );
        self.add_partials(cu_mut(dweight), &partial_w.as_view(), chunks, c);
    }

    fn qk_norm_forward_impl(
        &self,
        qkv: &mut Tensor,
        rstd: &mut Tensor,
        [q_weight, k_weight]: [&Tensor; 2],
        r: QkNormRows,
        summed: Option<usize>,
        eps: f32,
    ) {
        let (n, [n_i, nq_i, nk_i, cq_i, ck_i]) = qk_rows_args(qkv, r);
        let parts_i = int(summed.unwrap_or(0));
        launch!(
            self,
            kernel_name("qk_norm_forward", qkv.dtype()),
            per_row_warp(n * r.rows()),
            buf_mut(qkv),
            cu_mut(rstd),
            cu(q_weight),
            cu(k_weight),
            &n_i,
            &nq_i,
            &nk_i,
            &cq_i,
            &ck_i,
            &parts_i,
            &eps
        );
    }

    fn qk_norm_sum_squares_impl(&self, qkv: &Tensor, sums: &mut Tensor, r: QkNormRows) {
        let (n, [n_i, nq_i, nk_i, cq_i, ck_i]) = qk_rows_args(qkv, r);
        let name = kernel_name("qk_norm_sum_squares", qkv.dtype());
        launch!(
            self,
            name,
            per_row_warp(n * r.rows()),
            buf(qkv),
            cu_mut(sums),
            &n_i,
            &nq_i,
            &nk_i,
            &cq_i,
            &ck_i
        );
    }

    fn qk_norm_backward_impl(
        &self,
        dqkv: &mut Tensor,
        [dq_weight, dk_weight]: [&mut Tensor; 2],
        inp: &Tensor,
        [q_weight, k_weight]: [&Tensor; 2],
        rstd: &Tensor,
        r: QkNormRows,
        summed: Option<(&Tensor, usize)>,
    ) {
        let (n, [n_i, nq_i, nk_i, cq_i, ck_i]) = qk_rows_args(inp, r);
        let dtype = same_dtype(&[dqkv, inp]);
        // The weights' partial sums first: they read dqkv, which the input gradient overwrites.
        // Two sums: the query rows' weight's, then the key rows', over the wider's columns.
        let (cfg, chunks) = per_column_chunk_of_each(n, r.q_width.max(r.k_width), 2);
        let mut partial = self.scratch::<f32>(chunks * (r.q_width + r.k_width));
        let tokens_per_chunk = ROWS_PER_CHUNK as i32;
        launch!(
            self,
            kernel_name("qk_norm_backward_weight_partial", dtype),
            cfg,
            &mut *partial,
            buf(dqkv),
            buf(inp),
            cu(rstd),
            &n_i,
            &nq_i,
            &nk_i,
            &cq_i,
            &ck_i,
            &tokens_per_chunk,
        );
        let (q_partial, k_partial) = partial.split_at(chunks * r.q_width);
        self.add_partials(cu_mut(dq_weight), &q_partial, chunks, r.q_width);
        self.add_partials(cu_mut(dk_weight), &k_partial, chunks, r.k_width);
        // Whole rows read no dots: rstd stands in for the pointer.
        let (dots, parts) = summed.unwrap_or((rstd, 0));
        let parts_i = int(parts);
        launch!(
            self,
            kernel_name("qk_norm_backward_input", dtype),
            per_row_warp(n * r.rows()),
            buf_mut(dqkv),
            buf(inp),
            cu(q_weight),
            cu(k_weight),
            cu(rstd),
            cu(dots),
            &n_i,
            &nq_i,
            &nk_i,
            &cq_i,
            &ck_i,
            &parts_i
        );
    }

    fn qk_norm_backward_dots_impl(
        &self,
        dqkv: &Tensor,
        inp: &Tensor,
        [q_weight, k_weight]: [&Tensor; 2],
        rstd: &Tensor,
        dots: &mut Tensor,
        r: QkNormRows,
    ) {
        let (n, [n_i, nq_i, nk_i, cq_i, ck_i]) = qk_rows_args(inp, r);
        launch!(
            self,
            kernel_name("qk_norm_backward_dots", same_dtype(&[dqkv, inp])),
            per_row_warp(n * r.rows()),
            buf(dqkv),
            buf(inp),
            cu(q_weight),
            cu(k_weight),
            cu(rstd),
            cu_mut(dots),
            &n_i,
            &nq_i,
            &nk_i,
            &cq_i,
            &ck_i
        );
    }
}

/// The tokens N of qkv, and the QK-norm kernels' leading arguments N, NQ, NK, CQ, CK (the
/// rows of `QkRows` in rmsnorm.cu).
fn qk_rows_args(qkv: &Tensor, r: QkNormRows) -> (usize, [i32; 5]) {
    let n = qkv.len() / r.token_width();
    (n, [n, r.q_rows, r.k_rows, r.q_width, r.k_width].map(int))
}

impl CudaDevice {
    /// out [C] += column sums of x [N, C].
    pub(super) fn add_column_sums(&self, out: &mut CudaSlice<f32>, x: &Tensor, rows: usize, cols: usize) {
        let (cfg, chunks) = per_column_chunk(rows, cols);
        let mut partial = self.scratch::<f32>(chunks * cols);
        let (n_i, c_i, rows_per_chunk) = (int(rows), int(cols), ROWS_PER_CHUNK as i32);
        let name = kernel_name("column_partial_sums", x.dtype());
        launch!(self, name, cfg, &mut *partial, buf(x), &n_i, &c_i, &rows_per_chunk);
        self.add_partials(out, &partial.as_view(), chunks, cols);
    }

    /// out [cols] += the column sums of partial [chunks, cols].
    fn add_partials(&self, out: &mut CudaSlice<f32>, partial: &CudaView<f32>, chunks: usize, cols: usize) {
        let (chunks_i, c_i) = (int(chunks), int(cols));
        launch!(self, "add_partials", per_column_tile(cols), out, partial, &chunks_i, &c_i);
    }

    /// out [N, C] += bias [C] broadcast over rows.
    pub(super) fn add_bias(&self, out: &mut Tensor, bias: &Tensor, rows: usize, cols: usize) {
        let (n, c_i) = (rows as u64, int(cols));
        let name = kernel_name("bias_add", out.dtype());
        launch!(self, name, per_pack(rows * cols, out.dtype()), buf_mut(out), cu(bias), &n, &c_i);
    }
}
