//! Token + position embedding, then dropout (GPT-2's embd_pdrop).

use super::dropout_ctx::DropoutCtx;
use crate::shape::GptShape;
use kernels::{Category, Device, DropoutSite, Tensor};

/// out [B,T,C] (Workspace) = dropout(wte[tokens] + wpe[0..T]); tokens [B*T].
pub fn forward(
    dev: &dyn Device,
    s: &GptShape,
    wte: &Tensor,
    wpe: &Tensor,
    tokens: &[u32],
    dropout: &DropoutCtx,
) -> Tensor {
    let mut out =
        dev.zeros_of(dev.activation_dtype(), &[s.micro_batch, s.seq_len, s.hidden], Category::Workspace);
    dev.embedding_forward(&mut out, tokens, wte, Some(wpe));
    match dropout.spec(0, DropoutSite::Embedding) {
        Some(spec) => {
            let mut dropped = dev.zeros_of(out.dtype(), out.shape(), Category::Workspace);
            dev.dropout_forward(&mut dropped, &out, spec);
            dropped
        }
        None => out,
    }
}

/// dwte [V,C] += and dwpe [maxT,C] += from dout [B,T,C].
pub fn backward(
    dev: &dyn Device,
    dwte: &mut Tensor,
    dwpe: &mut Tensor,
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
    dev.embedding_backward(dwte, Some(dwpe), &dout, tokens);
}
