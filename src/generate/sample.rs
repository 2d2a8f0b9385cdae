//! Choosing the next token from the logits: greedy at temperature 0, otherwise a draw from
//! softmax(logits / temperature) over the top k. The draw for the i-th new token is a
//! Philox word of (seed, i), the project's counter-based RNG, so a seed gives the same
//! tokens on every run and machine with no generator state to carry.

use kernels::philox::{key_words, philox4x32_10};

/// Counter word 3 of a sampling draw: apart from the dropout masks' (layer * 4 + site), so
/// the two never share a random stream.
const SAMPLING_STREAM: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// 0 is greedy.
    pub temperature: f32,
    /// Draw among the k most likely tokens only (None: all).
    pub top_k: Option<usize>,
    pub seed: u64,
}

impl Sampler {
    pub const GREEDY: Sampler = Sampler { temperature: 0.0, top_k: None, seed: 0 };

    /// The next token among `logits[..candidates]` (tokens past it have no text), for the
    /// `draw`-th new token.
    pub fn pick(&self, logits: &[f32], candidates: usize, draw: u32) -> u32 {
        let logits = &logits[..candidates.min(logits.len())];
        // Most likely first; equal logits in token order, so ties go to the lower id as in
        // torch.argmax.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.temperature == 0.0 {
            return order[0] as u32;
        }
        order.truncate(self.top_k.unwrap_or(order.len()));
        let top = logits[order[0]] as f64;
        let t = self.temperature as f64;
        let weights: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - top) / t).exp()).collect();
        let mut target = uniform(self.seed, draw) * weights.iter().sum::<f64>();
        for (&token, w) in order.iter().zip(&weights) {
            if target < *w {
                return token as u32;
            }
            target -= w;
        }
        // Rounding left the target past the last weight: the least likely candidate.
        order[order.len() - 1] as u32
    }
}

/// A uniform number in [0, 1) from 53 bits of Philox(counter (draw, 0, 0, stream), seed).
fn uniform(seed: u64, draw: u32) -> f64 {
    let words = philox4x32_10([draw, 0, 0, SAMPLING_STREAM], key_words(seed));
    let bits = ((words[0] as u64) << 21) ^ (words[1] as u64 >> 11);
    bits as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_largest_logit() {
        assert_eq!(Sampler::GREEDY.pick(&[0.5, 2.0, -1.0, 2.0], 4, 0), 1);
        // Tokens past the candidates are never chosen, however likely.
        assert_eq!(Sampler::GREEDY.pick(&[0.5, 2.0, -1.0, 9.0], 3, 0), 1);
    }

    #[test]
    fn draws_follow_the_softmax_and_repeat_per_seed() {
        let logits = [2.0f32.ln(), 0.0, 1.0f32.ln(), f32::NEG_INFINITY];
        let sampler = Sampler { temperature: 1.0, top_k: None, seed: 7 };
        let draws: Vec<u32> = (0..4000).map(|i| sampler.pick(&logits, 4, i)).collect();
        let share = |t: u32| draws.iter().filter(|&&d| d == t).count() as f64 / 4000.0;
        // Probabilities 1/2, 1/4, 1/4, 0; binomial standard error ~0.008.
        assert!((share(0) - 0.5).abs() < 0.03 && (share(1) - 0.25).abs() < 0.03, "{} {}", share(0), share(1));
        assert_eq!(share(3), 0.0);
        let again: Vec<u32> = (0..4000).map(|i| sampler.pick(&logits, 4, i)).collect();
        assert_eq!(draws, again);
        let other: Vec<u32> = (0..4000).map(|i| Sampler { seed: 8, ..sampler }.pick(&logits, 4, i)).collect();
        assert_ne!(draws, other);
        // Top 1 is greedy whatever the temperature.
        let top1 = Sampler { top_k: Some(1), ..sampler };
        assert!((0..100).all(|i| top1.pick(&logits, 4, i) == 0));
    }
}
