//! The embedding: token embedding plus, for learned positions, the position table, then
//! dropout (GPT-2's embd_pdrop). Rotary models add no positions here: their blocks rotate
//! q and k.
//!
//! Under tensor parallelism the token embedding is vocabulary-parallel (Megatron's
//! `VocabParallelEmbedding`): each rank looks up the tokens of its rows, a zero row for the
//! others', tensor rank 0 adds the positions, and the group sums the parts. Adding zeros
//! is exact, so the sum is the whole lookup bit for bit.

use super::dropout_ctx::DropoutCtx;
use crate::dist::TensorGroup;
use crate::model::ModelShape;
use crate::tensor_parallel::Shard;
use kernels::{Category, Device, DropoutSite, Tensor};

/// The token embedding as one rank holds it: its shard of the table's rows.
pub struct TokenEmbedding<'a> {
    /// [V/t, C]
    pub table: &'a Tensor,
    pub shard: Shard,
}

/// out [B,T,C] (Workspace) = dropout(wte[tokens] + wpe[0..T]); tokens [B*T]; wpe [maxT,C]
/// where the model learns positions.
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
        dev.zeros_of(dev.activation_dtype(), &[s.micro_batch, s.seq_len, s.hidden], Category::Workspace);
    let wpe = wpe.filter(|_| wte.shard.rank == 0);
    dev.embedding_forward(&mut out, &wte.shard.vocab_ids(s, tokens), wte.table, wpe);
    tp.all_reduce(&mut out, dev);
    match dropout.spec(0, DropoutSite::Embedding) {
        Some(spec) => {
            let mut dropped = dev.zeros_of(out.dtype(), out.shape(), Category::Workspace);
            dev.dropout_forward(&mut dropped, &out, spec);
            dropped
        }
        None => out,
    }
}

/// dwte [V/t,C] += (this shard's rows) and, where the model learns positions, dwpe
/// [maxT,C] += from dout [B,T,C], which every tensor rank holds whole.
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
) {
    let dout = match dropout.spec(0, DropoutSite::Embedding) {
        Some(spec) => {
            let mut d = dev.zeros_of(dout.dtype(), dout.shape(), Category::Workspace);
            dev.dropout_backward(&mut d, &dout, spec);
            d
        }
        None => dout,
    };
    dev.embedding_backward(dwte, dwpe, &dout, &wte.shard.vocab_ids(s, tokens));
}
