//! The rotary embedding's frequencies, each the f32 that Hugging Face's
//! `LlamaRotaryEmbedding` computes: inv_freq_i = 1 / base^(2i/d) over the d channels of a
//! head that turn (all hs of them, or the first `rotary_dims`), and for Llama 3.1 and later
//! (config.json's rope_type "llama3", Megatron's `use_rope_scaling`) those of long
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

/// The channels that `percent` of a head of `hs` turns, as Megatron-LM's RotaryEmbedding
/// and transformers' `partial_rotary_factor` count them: `int(hs * percent)`.
pub fn rotary_dims_of(percent: f64, hs: usize) -> usize {
    (hs as f64 * percent) as usize
}

/// The `percent` whose [`rotary_dims_of`] a head of `hs` is `rot`, for writing down:
/// rot / hs, or the next f64 up where the product rounds below rot (2 of 98 is
/// 0.02040816326530612, and 98 of it 1.9999999999999998).
pub fn rotary_percent_of(rot: usize, hs: usize) -> f64 {
    let percent = rot as f64 / hs as f64;
    if rotary_dims_of(percent, hs) == rot {
        percent
    } else {
        percent.next_up()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeFrequencies {
    /// Llama 2: 10000, Llama 3: 500000.
    pub base: f32,
    /// Llama 3.1's scaling factor (8 for 3.1, 32 for 3.2's 1B and 3B); None for plain RoPE.
    pub llama3_factor: Option<f32>,
    /// The leading channels of each head that turn, the rest passing through (Megatron's
    /// `rotary_percent` of the head size, Hugging Face's `partial_rotary_factor`: Nemotron's
    /// half, GPT-NeoX's quarter); None turns the whole head. Even, and at most the head size.
    pub rotary_dims: Option<usize>,
}

impl RopeFrequencies {
    pub const fn plain(base: f32) -> RopeFrequencies {
        RopeFrequencies { base, llama3_factor: None, rotary_dims: None }
    }

    /// The channels of a head of `hs` that turn: d = 2 * (the pairs).
    pub fn rotated(&self, hs: usize) -> usize {
        self.rotary_dims.unwrap_or(hs)
    }

    /// The frequency of pair i of a head of `hs`, d = [`RopeFrequencies::rotated`] channels
    /// of it turning: `1.0 / (base ** (arange(0, d, 2).float() / d))` in f32, then Llama
    /// 3.1's scaling where it is set.
    pub fn inv_freq(&self, i: usize, hs: usize) -> f32 {
        let exponent = (2 * i) as f32 / self.rotated(hs) as f32;
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
                rotary_dims: None,
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

    /// Every even count of channels of every head up to 2048 reads back from the percent
    /// written for it.
    #[test]
    fn a_written_percent_reads_back_as_its_channels() {
        for hs in 2..=2048 {
            for rot in (2..=hs).step_by(2) {
                assert_eq!(rotary_dims_of(rotary_percent_of(rot, hs), hs), rot, "{rot} of {hs}");
            }
        }
        assert_eq!(rotary_percent_of(64, 128), 0.5);
        assert_eq!(rotary_dims_of(0.25, 80), 20);
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
