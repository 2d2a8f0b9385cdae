//! The GPT-2 layers, each with an explicit forward that returns what its backward needs and
//! a backward that consumes it (the style of llm.c; no autograd).

pub mod block;
pub mod dropout_ctx;
pub mod embedding;
pub mod head;
pub mod weight_grads;

pub use dropout_ctx::DropoutCtx;
pub use weight_grads::{WeightGrad, WeightGrads};
