//! SplitMix64 (Steele, Lea and Flood 2014): reproducible inputs for the tests, the emulation
//! harness and `bench gpu`, one stream per seed, the same on every machine.

/// A SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [-scale, scale), 24 random bits each.
    pub fn uniform(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale).collect()
    }

    /// `n` values in [0, bound).
    pub fn below(&mut self, n: usize, bound: u32) -> Vec<u32> {
        (0..n).map(|_| (self.next_u64() % bound as u64) as u32).collect()
    }
}
