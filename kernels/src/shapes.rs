//! The shape checks of the [`Device`](crate::Device) ops, made once in the trait before a
//! backend runs an op, and the sizes they derive, which the backends are handed. A shape
//! that does not fit is a bug in the caller: each check panics with the tensors it got.

use crate::op_args::{WeightLayout, OTHER_SHARD};
use crate::qk_norm::{QkNormHeads, QkNormRows};
use crate::rope_frequencies::RopeFrequencies;
use crate::tensor::{rows_cols, DType, Tensor};

/// A matmul's sizes: inp [N,IC], out [N,OC].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulDims {
    pub n: usize,
    pub ic: usize,
    pub oc: usize,
}

/// The sizes of qkv [B,T,(NH+2*KV)*hs]: B, T, NH query heads, KV key/value heads (KV
/// divides NH) and the head size hs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvDims {
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub kv: usize,
    pub hs: usize,
}

impl QkvDims {
    /// The elements of the attention's output [B,T,NH*hs].
    pub fn out_len(&self) -> usize {
        self.b * self.t * self.nh * self.hs
    }
    /// The elements of the key (or the value) heads, [B,T,KV*hs].
    pub fn kv_len(&self) -> usize {
        self.b * self.t * self.kv * self.hs
    }
    /// The query rows, B*NH*T: of the scores, of the log-sum-exp.
    pub fn query_rows(&self) -> usize {
        self.b * self.nh * self.t
    }
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.nh / self.kv
    }
    /// The elements of a row of qkv, (NH+2*KV)*hs.
    pub fn width(&self) -> usize {
        (self.nh + 2 * self.kv) * self.hs
    }
}

pub(crate) fn assert_same_len(a: &Tensor, b: &Tensor) {
    assert_eq!(a.len(), b.len(), "element counts differ: {a:?} vs {b:?}");
}

/// N and C of a norm on the residual stream: `rows` [N,C] (the norm's input, or the
/// residual it is written to), and each of `same` (the residual's summands, the norm's
/// output; or the gradients) as many elements.
pub(crate) fn residual_rows(rows: &Tensor, same: &[&Tensor]) -> (usize, usize) {
    for t in same {
        assert_same_len(rows, t);
    }
    rows_cols(rows)
}

/// The matmul dimensions from `rows` [N,OC] (out or dout), `inp` [N,IC] and the weight.
pub(crate) fn matmul_dims(rows: &Tensor, inp: &Tensor, weight: &Tensor, layout: WeightLayout) -> MatmulDims {
    let &[w0, w1] = weight.shape() else { panic!("matmul weight must be 2-D, got {weight:?}") };
    let (ic, oc) = match layout {
        WeightLayout::InOut => (w0, w1),
        WeightLayout::OutIn => (w1, w0),
    };
    let (n, inp_cols) = rows_cols(inp);
    assert_eq!(inp_cols, ic, "matmul: input {inp:?} vs weight {weight:?} ({layout:?})");
    assert_eq!(rows.len(), n * oc, "matmul: {rows:?} vs {n} rows x {oc} outputs");
    MatmulDims { n, ic, oc }
}

/// The sizes of qkv [B,T,(NH+2*KV)*hs], checked: KV must divide NH.
pub(crate) fn qkv_dims(qkv: &Tensor, n_head: usize, n_kv_head: usize) -> QkvDims {
    let &[b, t, width] = qkv.shape() else { panic!("qkv must be [B,T,(NH+2*KV)*hs], got {qkv:?}") };
    assert!(
        n_kv_head > 0
            && n_head >= n_kv_head
            && n_head.is_multiple_of(n_kv_head)
            && width.is_multiple_of(n_head + 2 * n_kv_head),
        "qkv {qkv:?} with {n_head} query heads on {n_kv_head} key/value heads"
    );
    QkvDims { b, t, nh: n_head, kv: n_kv_head, hs: width / (n_head + 2 * n_kv_head) }
}

/// The rows QK-norm normalises in each token of qkv, checked against its per-row statistics
/// `stats` [B*T, rows a token] (rstd, sums of squares or dots).
pub(crate) fn qk_norm_rows(qkv: &Tensor, stats: &Tensor, h: QkNormHeads) -> QkNormRows {
    let dims = qkv_dims(qkv, h.heads, h.kv_heads);
    let rows = h.span.rows(dims.nh, dims.kv, dims.hs);
    assert_eq!(stats.len(), dims.b * dims.t * rows.rows(), "qk-norm: statistics {stats:?} for {qkv:?}");
    rows
}

/// As [`qk_norm_rows`], and its two weights checked: [q_width] and [k_width].
pub(crate) fn qk_norm_dims(
    qkv: &Tensor,
    stats: &Tensor,
    weights: [&Tensor; 2],
    h: QkNormHeads,
) -> QkNormRows {
    let rows = qk_norm_rows(qkv, stats, h);
    assert!(
        weights.iter().zip(rows.weight_widths()).all(|(w, width)| w.len() == width),
        "qk-norm: weights {weights:?} for {rows:?}"
    );
    rows
}

/// As [`qk_norm_dims`] for a backward: its gradient dqkv as long as the input, and each
/// weight's gradient as its weight.
pub(crate) fn qk_norm_backward_dims(
    dqkv: &Tensor,
    dweights: [&Tensor; 2],
    inp: &Tensor,
    weights: [&Tensor; 2],
    rstd: &Tensor,
    h: QkNormHeads,
) -> QkNormRows {
    let rows = qk_norm_dims(inp, rstd, weights, h);
    assert_same_len(inp, dqkv);
    dweights.iter().zip(weights).for_each(|(dw, w)| assert_same_len(w, dw));
    rows
}

/// The sizes of RoPE's qkv: as [`qkv_dims`], with an even head size (the rotated pairs).
pub(crate) fn rope_dims(qkv: &Tensor, n_head: usize, n_kv_head: usize, freqs: RopeFrequencies) -> QkvDims {
    let dims = qkv_dims(qkv, n_head, n_kv_head);
    let rot = freqs.rotated(dims.hs);
    assert!(
        rot.is_multiple_of(2) && rot > 0 && rot <= dims.hs,
        "rope: {rot} channels of a head of {} must turn (even, at most the head)",
        dims.hs
    );
    dims
}

/// [B,T,C] of the embedding's activation `act` (out or dout), checked against the tokens,
/// the token table (or its gradient) and the position table (or its gradient) if any.
pub(crate) fn embedding_dims(act: &Tensor, tokens: &[u32], wte: &Tensor, wpe: Option<&Tensor>) -> [usize; 3] {
    let &[b, t, c] = act.shape() else { panic!("embedding activations must be [B,T,C], got {act:?}") };
    assert_eq!(tokens.len(), b * t, "embedding: {} tokens for {act:?}", tokens.len());
    let (vocab, wte_c) = rows_cols(wte);
    assert_eq!(wte_c, c, "embedding: wte {wte:?} vs {act:?}");
    if let Some(bad) = tokens.iter().find(|&&tok| tok as usize >= vocab && tok != OTHER_SHARD) {
        panic!("token id {bad} is outside the vocabulary of {vocab}");
    }
    if let Some(wpe) = wpe {
        assert!(wpe.len() >= t * c && rows_cols(wpe).1 == c, "embedding: wpe {wpe:?} vs {act:?}");
    }
    [b, t, c]
}

/// N and V/t of a vocabulary shard's op ([`crate::Device::vocab_shard_stats`] and
/// [`crate::Device::vocab_shard_dlogits`]): `per_row` [N, width] f32 beside logits [N, V/t],
/// `targets` [N] each below V/t or [`OTHER_SHARD`].
pub(crate) fn vocab_shard_rows(
    per_row: &Tensor,
    width: usize,
    logits: &Tensor,
    targets: &[u32],
) -> (usize, usize) {
    let (n, v) = rows_cols(logits);
    assert!(
        per_row.dtype() == DType::F32 && per_row.len() == n * width && targets.len() == n,
        "vocab shard: {per_row:?} and {} targets for logits {logits:?} (want f32 [{n}, {width}])",
        targets.len()
    );
    if let Some(bad) = targets.iter().find(|&&t| t as usize >= v && t != OTHER_SHARD) {
        panic!("vocab shard: target {bad} outside a shard of {v}");
    }
    (n, v)
}

/// N and t of [`crate::Device::vocab_shard_combine`]: losses [N], rows [N,2] and stats
/// [t, N, 3], all f32.
pub(crate) fn vocab_shard_members(losses: &Tensor, rows: &Tensor, stats: &Tensor) -> (usize, usize) {
    let n = losses.len();
    let all_f32 = [losses, rows, stats].iter().all(|t| t.dtype() == DType::F32);
    assert!(
        all_f32 && rows.len() == 2 * n && n > 0 && stats.len().is_multiple_of(3 * n),
        "vocab shard combine: losses {losses:?}, rows {rows:?}, stats {stats:?} (want f32 [N], [N,2], [t,N,3])"
    );
    (n, stats.len() / (3 * n))
}

/// N and V of a classifier call: losses and targets have N entries, and every target is
/// below V.
pub(crate) fn classifier_rows(
    losses: &Tensor,
    inp: &Tensor,
    weight: &Tensor,
    targets: &[u32],
) -> (usize, usize) {
    let (n, v) = (rows_cols(inp).0, rows_cols(weight).0);
    assert!(losses.len() == n && targets.len() == n, "classifier: {n} rows of {inp:?}");
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= v) {
        panic!("classifier: target {bad} outside a vocabulary of {v}");
    }
    (n, v)
}
