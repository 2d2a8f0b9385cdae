//! The embedding: token embedding plus, for learned positions, the position table, times
//! the model's embedding multiplier where it has one (Gemma's sqrt(hidden_size)), then
//! dropout (GPT-2's embd_pdrop). Rotary models add no positions here: their blocks rotate
//! q and k.
//!
//! Under tensor parallelism the token embedding is vocabulary-parallel (Megatron's
//! `VocabParallelEmbedding`): each rank looks up the tokens of its rows, a zero row for the
//! others', tensor rank 0 adds the positions, and the group sums the parts. Adding zeros
//! is exact, so the sum is the whole lookup bit for bit. With sequence parallelism the sum
//! is reduce-scattered into each rank's rows, and dropout runs on them.

use super::dropout_ctx::{dropout_backward_or_keep, dropout_or_keep, DropoutCtx};
use crate::dist::TensorGroup;
use crate::model::ModelShape;
use crate::tensor_parallel::Shard;
use kernels::{Category, Device, DropoutSite, Tensor};
use std::sync::Arc;

/// The token embedding as one rank holds it: its shard of the table's rows.
pub struct TokenEmbedding<'a> {
    /// [V/t, C]
    pub table: &'a Tensor,
    pub shard: Shard,
}

/// out [B,T,C] (Workspace; this rank's rows [R,C] with sequence parallelism) =
/// dropout(wte[tokens] + wpe[0..T]); tokens [B*T]; wpe [maxT,C] where the model learns
/// positions.
pub fn forward(
    dev: &dyn Device,
    s: &ModelShape,
    wte: &TokenEmbedding,
    wpe: Option<&Tensor>,
    tokens: &[u32],
    dropout: &DropoutCtx,
    tp: &mut TensorGroup,
) -> Tensor {
    let mut out =
        dev.empty_of(dev.activation_dtype(), &[s.micro_batch, s.seq_len, s.hidden], Category::Workspace);
    let wpe = wpe.filter(|_| wte.shard.rank == 0);
    dev.embedding_forward(&mut out, &wte.shard.vocab_ids(s, tokens), wte.table, wpe);
    let rows = wte.shard.rows(s);
    let mut out = match wte.shard.sequence {
        true => tp.reduce_scatter_rows(out, dev, rows.clone(), Category::Workspace),
        false => {
            tp.all_reduce(&mut out, dev);
            out
        }
    };
    if let Some(m) = s.arch.embedding_multiplier {
        dev.scale(&mut out, m);
    }
    dropout_or_keep(dev, out, stream_dropout(s, dropout, rows.start))
}

/// dwte [V/t,C] += (this shard's rows) and, where the model learns positions, dwpe
/// [maxT,C] += from dout [B,T,C], which every tensor rank holds whole (with sequence
/// parallelism its rows [R,C], gathered whole after the dropout).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dev: &dyn Device,
    s: &ModelShape,
    wte: &TokenEmbedding,
    dwte: &mut Tensor,
    dwpe: Option<&mut Tensor>,
    dout: Tensor,
    tokens: &[u32],
    dropout: &DropoutCtx,
    tp: &mut TensorGroup,
) {
    let mut dout = dout;
    // The multiplier and the dropout mask are both diagonal: their gradients commute.
    if let Some(m) = s.arch.embedding_multiplier {
        dev.scale(&mut dout, m);
    }
    let dout =
        dropout_backward_or_keep(dev, Arc::new(dout), stream_dropout(s, dropout, wte.shard.rows(s).start));
    let dout = match wte.shard.sequence {
        true => Arc::new(tp.all_gather_parts(&dout, dev, &[s.micro_batch, s.seq_len, s.hidden])),
        false => dout,
    };
    dev.embedding_backward(dwte, dwpe, &dout, &wte.shard.vocab_ids(s, tokens));
}

/// The embedding's dropout on rows from `first_row` on: the whole mask's.
fn stream_dropout(s: &ModelShape, dropout: &DropoutCtx, first_row: usize) -> Option<kernels::DropoutSpec> {
    dropout.spec(0, DropoutSite::Embedding).map(|d| kernels::DropoutSpec { first: first_row * s.hidden, ..d })
}
