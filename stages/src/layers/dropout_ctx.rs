//! Which dropout masks a microbatch draws: the counter-keyed RNG needs (seed, step,
//! microbatch, layer, site), so a recompute regenerates exactly the forward's masks. And
//! the dropout of a layer's output, or its gradient, where a mask is drawn.

use crate::model::DropoutProbs;
use kernels::{Category, Device, DropoutKey, DropoutSite, DropoutSpec, Tensor};
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
pub struct DropoutCtx {
    pub seed: u64,
    pub step: u32,
    pub microbatch: u32,
    pub probs: DropoutProbs,
    /// Dropout is off outside training (evaluation).
    pub training: bool,
}

impl DropoutCtx {
    /// The dropout to apply at `site` of block `layer` (0 for the embedding), if any.
    pub fn spec(&self, layer: usize, site: DropoutSite) -> Option<DropoutSpec> {
        let p = match site {
            DropoutSite::AttentionProbs => self.probs.attention,
            _ => self.probs.hidden,
        };
        (self.training && p > 0.0).then_some(DropoutSpec {
            p,
            key: DropoutKey {
                seed: self.seed,
                step: self.step,
                microbatch: self.microbatch,
                layer: layer as u32,
                site,
            },
            first: 0,
            heads: None,
        })
    }
}

/// dropout(t) where `spec` draws a mask; t itself where it does not.
pub(crate) fn dropout_or_keep(dev: &dyn Device, t: Tensor, spec: Option<DropoutSpec>) -> Tensor {
    match spec {
        Some(spec) => {
            let mut out = dev.empty_of(t.dtype(), t.shape(), Category::Workspace);
            dev.dropout_forward(&mut out, &t, spec);
            out
        }
        None => t,
    }
}

/// The gradient through [`dropout_or_keep`]: d, or the same mask applied to it.
pub(crate) fn dropout_backward_or_keep(
    dev: &dyn Device,
    d: Arc<Tensor>,
    spec: Option<DropoutSpec>,
) -> Arc<Tensor> {
    match spec {
        Some(spec) => {
            let mut out = dev.empty_of(d.dtype(), d.shape(), Category::Workspace);
            dev.dropout_backward(&mut out, &d, spec);
            Arc::new(out)
        }
        None => d,
    }
}
