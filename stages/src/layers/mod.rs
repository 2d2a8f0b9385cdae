//! The layers, each with an explicit forward that returns what its backward needs and a
//! backward that consumes it (the style of llm.c; no autograd). Which of them a model uses,
//! and how, is its description's (`crate::model`).

pub mod activation;
pub mod block;
pub(crate) mod block_offload;
pub mod dropout_ctx;
pub mod embedding;
pub mod head;
pub mod norm;
pub mod qk_norm;
pub mod vocab_parallel;
pub mod weight_grads;

pub use dropout_ctx::DropoutCtx;
pub use weight_grads::{WeightGrad, WeightGrads};

/// Two distinct elements of `v`, mutably.
pub(crate) fn pair_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j, "two distinct tensors");
    if i < j {
        let (low, high) = v.split_at_mut(j);
        (&mut low[i], &mut high[0])
    } else {
        let (low, high) = v.split_at_mut(i);
        (&mut high[0], &mut low[j])
    }
}
