//! Which dropout masks a microbatch draws: the counter-keyed RNG needs (seed, step,
//! microbatch, layer, site), so a recompute regenerates exactly the forward's masks.

use crate::model::DropoutProbs;
use kernels::{DropoutKey, DropoutSite, DropoutSpec};

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
