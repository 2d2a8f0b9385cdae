//! Parameter initialisation from the seed through Philox, keyed by the parameter's global
//! index, so every stage draws the same values for the same tensor whatever the partition.

use kernels::philox::{key_words, philox4x32_10};

/// Salt in the counter's last word, separating init draws from dropout draws.
const INIT_STREAM: u32 = 0x1A17_0000;

/// `n` samples of N(0, std^2) for parameter `param_index` (Box-Muller on Philox words).
pub fn normal_init(seed: u64, param_index: u32, n: usize, std: f32) -> Vec<f32> {
    let key = key_words(seed);
    let mut out = Vec::with_capacity(n);
    let mut block = 0u32;
    while out.len() < n {
        let w = philox4x32_10([block, param_index, 0, INIT_STREAM], key);
        for pair in [[w[0], w[1]], [w[2], w[3]]] {
            // u1 in (0, 1] so the log is finite; u2 in [0, 1).
            let u1 = (pair[0] as f64 + 1.0) / 4_294_967_296.0;
            let u2 = pair[1] as f64 / 4_294_967_296.0;
            let r = (-2.0 * u1.ln()).sqrt();
            let theta = 2.0 * std::f64::consts::PI * u2;
            for z in [r * theta.cos(), r * theta.sin()] {
                if out.len() < n {
                    out.push((z * std as f64) as f32);
                }
            }
        }
        block += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_init_has_the_requested_moments_and_is_keyed() {
        let x = normal_init(7, 3, 200_000, 0.02);
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64;
        assert!(mean.abs() < 2e-4, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 2e-4, "std {}", var.sqrt());
        assert_eq!(normal_init(7, 3, 5, 0.02), x[..5].to_vec());
        assert_ne!(normal_init(7, 4, 5, 0.02), x[..5].to_vec());
        assert_ne!(normal_init(8, 3, 5, 0.02), x[..5].to_vec());
    }
}
