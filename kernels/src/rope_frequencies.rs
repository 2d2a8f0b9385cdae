//! The rotary embedding's frequencies, each the f32 that Hugging Face's
//! `LlamaRotaryEmbedding` computes: inv_freq_i = 1 / base^(2i/hs), and for Llama 3.1 and
//! later (config.json's rope_type "llama3", Megatron's `use_rope_scaling`) those of long
//! wavelength slowed by a factor. Every backend's rope turns its pairs by these;
//! kernels/cuda/rope.cu repeats [`RopeFrequencies::inv_freq`] step for step.

/// Llama 3.1's scaling as Megatron-LM fixes it and every Llama 3.x config.json sets it: the
/// model was first trained on 8192 positions; wavelengths longer than 8192 / 1 positions are
/// slowed by the factor, those shorter than 8192 / 4 kept, and those between blended.
pub const LLAMA3_ORIGINAL_POSITIONS: f32 = 8192.0;
pub const LLAMA3_LOW_FREQ_FACTOR: f32 = 1.0;
pub const LLAMA3_HIGH_FREQ_FACTOR: f32 = 4.0;

/// Whether `factor` can scale Llama 3.1's frequencies: transformers refuses one below 1,
/// which would speed the long wavelengths up.
pub fn is_llama3_factor(factor: f64) -> bool {
    factor.is_finite() && factor >= 1.0
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeFrequencies {
    /// Llama 2: 10000, Llama 3: 500000.
    pub base: f32,
    /// Llama 3.1's scaling factor (8 for 3.1, 32 for 3.2's 1B and 3B); None for plain RoPE.
    pub llama3_factor: Option<f32>,
}

impl RopeFrequencies {
    pub const fn plain(base: f32) -> RopeFrequencies {
        RopeFrequencies { base, llama3_factor: None }
    }

    /// The frequency of pair i of a head of `hs`: `1.0 / (base ** (arange(0, hs, 2).float() / hs))`
    /// in f32, then Llama 3.1's scaling where it is set.
    pub fn inv_freq(&self, i: usize, hs: usize) -> f32 {
        let exponent = (2 * i) as f32 / hs as f32;
        let inv_freq = 1.0 / self.base.powf(exponent);
        match self.llama3_factor {
            Some(factor) => llama3_scaled(inv_freq, factor),
            None => inv_freq,
        }
    }
}

/// transformers' `_compute_llama3_parameters` on f32 tensors, one f32 operation per step in
/// its order; torch computes `scalar / tensor` as `tensor.reciprocal() * scalar`.
fn llama3_scaled(inv_freq: f32, factor: f32) -> f32 {
    let low_freq_wavelen = LLAMA3_ORIGINAL_POSITIONS / LLAMA3_LOW_FREQ_FACTOR;
    let high_freq_wavelen = LLAMA3_ORIGINAL_POSITIONS / LLAMA3_HIGH_FREQ_FACTOR;
    let wavelen = (1.0 / inv_freq) * std::f32::consts::TAU;
    if wavelen > low_freq_wavelen {
        return inv_freq / factor;
    }
    if wavelen < high_freq_wavelen {
        return inv_freq;
    }
    let smooth = ((1.0 / wavelen) * LLAMA3_ORIGINAL_POSITIONS - LLAMA3_LOW_FREQ_FACTOR)
        / (LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR);
    (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' inv_freq for Llama 3.1 8B (head size 128, base 500000, factor 8) and
    /// Llama 3.2 1B (64, 500000, 32), as f32 bits: `rotary_emb.inv_freq` of a
    /// `LlamaForCausalLM` built from each config.json, written by
    /// tests/hf/make_llama_fixture.py into tests/fixtures/llama3_inv_freq.json.
    #[test]
    fn match_transformers_bit_for_bit() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/llama3_inv_freq.json");
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = fixture["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 3);
        for case in cases {
            let hs = case["head_dim"].as_u64().unwrap() as usize;
            let freqs = RopeFrequencies {
                base: case["rope_theta"].as_f64().unwrap() as f32,
                llama3_factor: case["factor"].as_f64().map(|f| f as f32),
            };
            let bits: Vec<u32> = case["inv_freq_bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(bits.len(), hs / 2);
            let ours: Vec<u32> = (0..hs / 2).map(|i| freqs.inv_freq(i, hs).to_bits()).collect();
            assert_eq!(ours, bits, "{freqs:?}, head size {hs}");
        }
    }

    /// The three bands at Llama 3.1 8B's sizes: pair 0 (wavelength 2 pi) kept, pair 63
    /// (about 4.4 million positions) slowed by the factor, and a pair between 2048 and 8192
    /// positions blended, strictly between the two.
    #[test]
    fn keeps_the_short_wavelengths_and_slows_the_long() {
        let (plain, scaled) = (
            RopeFrequencies::plain(500_000.0),
            RopeFrequencies { llama3_factor: Some(8.0), ..RopeFrequencies::plain(500_000.0) },
        );
        assert_eq!(scaled.inv_freq(0, 128), 1.0);
        assert_eq!(scaled.inv_freq(63, 128), plain.inv_freq(63, 128) / 8.0);
        let wavelen = |i| std::f32::consts::TAU / plain.inv_freq(i, 128);
        let medium = (0..64).find(|&i| (2048.0..=8192.0).contains(&wavelen(i))).unwrap();
        let (p, s) = (plain.inv_freq(medium, 128), scaled.inv_freq(medium, 128));
        assert!(p / 8.0 < s && s < p, "pair {medium}: {s} is not between {} and {p}", p / 8.0);
    }
}
