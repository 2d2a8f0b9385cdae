//! `--gpus N`: the ways to lay a run over N GPUs, t x p x dp = N, for the sweep and the
//! planner to try.
//!
//! * t divides the attention heads and the MLP width (and the sequence: sequence
//!   parallelism is on whenever t > 1, as Megatron recommends; it moves the same bytes as
//!   the all-reduces it replaces and divides the rest of the activations by t) and stays
//!   within a node, where NVLink carries its collectives;
//! * p is at most the number of layers;
//! * dp divides the global batch (the micro batch size is the sweep's to choose).

use crate::config::Config;

/// Every (t, p, dp) layout of `base` over `gpus` GPUs, as configs; `gpus_per_node` bounds t
/// (None: any t the model allows).
pub fn layouts(base: &Config, gpus: usize, gpus_per_node: Option<usize>) -> Vec<Config> {
    let divisors = |n: usize| (1..=n).filter(move |d| n.is_multiple_of(*d));
    let mut out = Vec::new();
    for t in divisors(gpus).take_while(|&t| gpus_per_node.is_none_or(|node| t <= node)) {
        for p in divisors(gpus / t).take_while(|&p| p <= base.num_layers) {
            let dp = gpus / (t * p);
            let mut cfg = base.clone();
            cfg.tensor_model_parallel_size = t;
            cfg.sequence_parallel = t > 1;
            cfg.pipeline_model_parallel_size = p;
            cfg.data_parallel_size = Some(dp);
            if p != base.pipeline_model_parallel_size {
                cfg.num_layers_per_stage = None;
                cfg.recompute_num_layers_per_stage = None;
            }
            if cfg.validate().is_ok() {
                out.push(cfg);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_multiply_to_the_gpus_and_respect_the_model() {
        // 12 heads, 12 layers, a global batch of 8 over 16 GPUs: t is 1, 2 or 4 (8 does not
        // divide 12 heads, 16 is more than a node), p at most 12, dp at most 8.
        let base = Config { global_batch_size: 8, ..Config::default() };
        let found: Vec<(usize, usize, usize)> = layouts(&base, 16, Some(8))
            .iter()
            .map(|c| (c.tensor_model_parallel_size, c.pipeline_model_parallel_size, c.data_parallel()))
            .collect();
        assert_eq!(
            found,
            [
                (1, 2, 8),
                (1, 4, 4),
                (1, 8, 2),
                (2, 1, 8),
                (2, 2, 4),
                (2, 4, 2),
                (2, 8, 1),
                (4, 1, 4),
                (4, 2, 2),
                (4, 4, 1)
            ]
        );
        assert!(layouts(&base, 16, Some(8))
            .iter()
            .all(|c| c.sequence_parallel == (c.tensor_model_parallel_size > 1)));
    }
}
