//! FLOP counts from the layer shapes, for MFU and the simulator's durations. A matmul of
//! [N,K] by [K,M] costs 2*N*K*M; the attention core counts its full T x T products (the
//! usual convention for MFU, e.g. PaLM's and Megatron's), and under a sliding window the
//! same share of them as the window's pairs are of the causal ones (about 2 T W of them
//! for a window of W keys well inside T), so that the count stays proportional to the
//! work either way.

use crate::model::ModelShape;
use crate::tensor_parallel::TensorParallel;
use kernels::CausalMask;

/// FLOPs of one microbatch through one part of the model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Flops {
    pub forward: f64,
    /// Gradients of the inputs (and of the attention core, which has no weights).
    pub backward_input: f64,
    /// Gradients of the weights.
    pub backward_weight: f64,
}

impl Flops {
    pub fn total(&self) -> f64 {
        self.forward + self.backward_input + self.backward_weight
    }

    /// Each part times `k`.
    pub fn scaled(self, k: f64) -> Flops {
        Flops {
            forward: k * self.forward,
            backward_input: k * self.backward_input,
            backward_weight: k * self.backward_weight,
        }
    }

    /// One tensor-parallel rank's share: Megatron splits every matmul (the LM head's by
    /// vocabulary) and the attention core (by heads) t ways.
    pub fn per_rank(self, tp: TensorParallel) -> Flops {
        let t = tp.size as f64;
        Flops {
            forward: self.forward / t,
            backward_input: self.backward_input / t,
            backward_weight: self.backward_weight / t,
        }
    }
}

/// A block attending under `mask`, for one microbatch: its four matmuls (q, k and v with
/// grouped-query attention's narrower k and v; SwiGLU's fused gate and up) and the
/// attention core, whose products span every query head whatever the groups. Norms,
/// rotary embeddings and activations are elementwise and not counted.
fn block_flops(s: &ModelShape, mask: CausalMask) -> Flops {
    let (n, c, f) = (s.tokens() as f64, s.hidden as f64, s.ffn as f64);
    let (qkv, fc1, a) = (s.qkv_width() as f64, s.fc1_width() as f64, s.attention_width() as f64);
    let matmul = 2.0 * n * (c * qkv + a * c + c * fc1 + f * c);
    let attention = 2.0 * 2.0 * s.micro_batch as f64 * scored_area(mask, s.seq_len) * a;
    Flops { forward: matmul + attention, backward_input: matmul + 2.0 * attention, backward_weight: matmul }
}

/// A block attending to every key before the query.
pub fn full_block_flops(s: &ModelShape) -> Flops {
    block_flops(s, CausalMask::Full)
}

/// A block under the model's window (every block's, where it has none).
fn windowed_block_flops(s: &ModelShape) -> Flops {
    block_flops(s, window_mask(s))
}

/// The mask of the model's windowed layers (Full where it has none).
pub fn window_mask(s: &ModelShape) -> CausalMask {
    s.arch.sliding_window.map_or(CausalMask::Full, |w| CausalMask::Window(w.keys))
}

/// How many of `layers` attend to every key, and how many under the model's window.
pub fn mask_counts(s: &ModelShape, layers: std::ops::Range<usize>) -> (usize, usize) {
    let count = layers.len();
    let windowed = s.arch.sliding_window.map_or(0, |w| layers.filter(|&l| w.windows(l)).count());
    (count - windowed, windowed)
}

/// The T x T products' area a mask counts over `t` positions: t^2, and under a window the
/// share of it that the window's pairs are of the causal ones.
pub fn scored_area(mask: CausalMask, t: usize) -> f64 {
    match mask.over(t) {
        CausalMask::Full => (t * t) as f64,
        windowed => (t * t) as f64 * windowed.pairs(t) as f64 / CausalMask::Full.pairs(t) as f64,
    }
}

/// The blocks `layers` for one microbatch, in all: so many of the windowed kind and so many
/// of the full, where a window covers some.
pub fn blocks_flops(s: &ModelShape, layers: std::ops::Range<usize>) -> Flops {
    let (full, windowed) = mask_counts(s, layers);
    full_block_flops(s).scaled(full as f64) + windowed_block_flops(s).scaled(windowed as f64)
}

/// A block's FLOPs, the same for every layer but where a window covers some and not
/// others: then their mean, what the balanced split weighs each block by.
pub fn typical_block_flops(s: &ModelShape) -> Flops {
    match s.arch.sliding_window {
        None => full_block_flops(s),
        Some(_) => blocks_flops(s, 0..s.num_layers).scaled(1.0 / s.num_layers.max(1) as f64),
    }
}

/// The head (the output layer's matmul) for one microbatch: all of it in
/// forward, which runs the head's backward too (see layers/head.rs).
pub fn head_flops(s: &ModelShape) -> Flops {
    let m = 2.0 * s.tokens() as f64 * s.hidden as f64 * s.vocab as f64;
    Flops { forward: 3.0 * m, backward_input: 0.0, backward_weight: 0.0 }
}

/// Model FLOPs of one training step over `microbatches` microbatches (no recompute counted:
/// MFU measures useful work).
pub fn train_step_flops(s: &ModelShape, microbatches: usize) -> f64 {
    (blocks_flops(s, 0..s.num_layers).total() + head_flops(s).total()) * microbatches as f64
}

impl std::ops::Add for Flops {
    type Output = Flops;
    fn add(self, o: Flops) -> Flops {
        Flops {
            forward: self.forward + o.forward,
            backward_input: self.backward_input + o.backward_input,
            backward_weight: self.backward_weight + o.backward_weight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_six_n_plus_attention_for_gpt2_small() {
        let s = ModelShape::GPT2_SMALL;
        // 6 * (non-embedding matmul params + LM head) per token + 12 * L * T * C attention.
        let matmul_params = 12.0 * (768.0 * 2304.0 + 768.0 * 768.0 + 2.0 * 768.0 * 3072.0) + 768.0 * 50257.0;
        let expected = 1024.0 * (6.0 * matmul_params + 12.0 * 12.0 * 1024.0 * 768.0);
        assert_eq!(train_step_flops(&s, 1), expected);
    }

    /// A window of W keys over T positions counts T^2 times its pairs over the causal ones;
    /// OLMo 3's pattern counts a full layer in four.
    #[test]
    fn a_window_counts_its_share_of_the_products() {
        let full = ModelShape::GPT2_SMALL;
        let window = |full_every| crate::SlidingWindow { keys: 256, full_every };
        let with =
            |w| ModelShape { arch: crate::Architecture { sliding_window: Some(w), ..full.arch }, ..full };
        let (t, w) = (1024.0, 256.0);
        let pairs = (w * (w + 1.0) / 2.0 + (t - w) * w) / (t * (t + 1.0) / 2.0);
        let core = |s: &ModelShape| full_block_flops(s).forward - full_block_flops(s).backward_weight;
        let windowed = blocks_flops(&with(window(None)), 0..1);
        let ratio = (windowed.forward - windowed.backward_weight) / core(&full);
        assert!((ratio / pairs - 1.0).abs() < 1e-12, "{ratio} against {pairs}");
        let every_fourth = blocks_flops(&with(window(Some(4))), 0..12);
        assert_eq!(every_fourth, windowed.scaled(9.0) + full_block_flops(&full).scaled(3.0));
        assert_eq!(typical_block_flops(&full), full_block_flops(&full));
    }
}
