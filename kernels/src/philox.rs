//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
//! a counter-based RNG. The CUDA kernel `cuda/philox.cuh` is the same function, so both
//! backends draw identical dropout masks.
//!
//! A dropout mask element is drawn as:
//!   counter = [index / 4, microbatch, step, layer * 4 + site], key = [seed lo, seed hi],
//!   word    = philox(counter, key)[index % 4],
//!   keep    = word >= p * 2^32.

use crate::dropout::DropoutKey;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Ten rounds of Philox4x32 on `counter` under `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [c0, c1, c2, c3] = rounds(counter.map(|w| [w]), key);
    [c0[0], c1[0], c2[0], c3[0]]
}

/// Ten rounds of Philox4x32 on N counters side by side, word j of counter i at `c[j][i]`
/// (structure of arrays): the compiler turns the N independent multiplies into SIMD ones.
#[inline(always)]
fn rounds<const N: usize>(mut c: [[u32; N]; 4], key: [u32; 2]) -> [[u32; N]; 4] {
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let [c0, c1, c2, c3] = &mut c;
        for i in 0..N {
            let (hi0, lo0) = mulhilo(M0, c0[i]);
            let (hi1, lo1) = mulhilo(M1, c2[i]);
            (c0[i], c1[i], c2[i], c3[i]) = (hi1 ^ c1[i] ^ k[0], lo1, hi0 ^ c3[i] ^ k[1], lo0);
        }
    }
    c
}

/// The Philox counter words that do not depend on the element index.
#[inline]
pub fn counter_base(key: &DropoutKey) -> [u32; 3] {
    [key.microbatch, key.step, key.layer * 4 + key.site as u32]
}

/// The Philox key for a run's seed.
#[inline]
pub fn key_words(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// Elements whose random word is below this are dropped.
#[inline]
pub fn drop_threshold(p: f32) -> u64 {
    (p as f64 * 4_294_967_296.0) as u64
}

/// The four random words covering elements `4*block .. 4*block+3` of a mask.
#[inline]
pub fn block_words(key: &DropoutKey, block: u32) -> [u32; 4] {
    let [mb, step, site] = counter_base(key);
    philox4x32_10([block, mb, step, site], key_words(key.seed))
}

/// Blocks [`block_words`] draws at once in [`lanes_words`].
pub const LANES: usize = 16;

/// The words of blocks `first .. first + LANES`, as `block_words` gives each, drawn side by
/// side (one block at a time is a serial chain of multiplies).
#[inline]
pub fn lanes_words(key: &DropoutKey, first: u32) -> [[u32; 4]; LANES] {
    let [mb, step, site] = counter_base(key);
    let blocks = std::array::from_fn(|i| first.wrapping_add(i as u32));
    let [c0, c1, c2, c3] = rounds([blocks, [mb; LANES], [step; LANES], [site; LANES]], key_words(key.seed));
    std::array::from_fn(|i| [c0[i], c1[i], c2[i], c3[i]])
}

/// Whether element `index` of the mask `key` is kept at drop probability `p`.
pub fn keep(key: &DropoutKey, index: usize, p: f32) -> bool {
    let words = block_words(key, (index / 4) as u32);
    words[index % 4] as u64 >= drop_threshold(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dropout::DropoutSite;

    // Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32 10 rounds).
    #[test]
    fn matches_random123_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn lanes_draw_the_blocks_one_by_one_draws() {
        let key = DropoutKey {
            seed: u64::MAX - 5,
            step: 9,
            microbatch: 4,
            layer: 11,
            site: DropoutSite::AttentionProbs,
        };
        for first in [0, 1, 1000, u32::MAX - 3] {
            let lanes = lanes_words(&key, first);
            for (i, words) in lanes.iter().enumerate() {
                assert_eq!(*words, block_words(&key, first.wrapping_add(i as u32)), "block {first}+{i}");
            }
        }
    }

    #[test]
    fn keep_rate_matches_probability_and_keys_differ() {
        let key = DropoutKey { seed: 1337, step: 3, microbatch: 1, layer: 2, site: DropoutSite::MlpResidual };
        let n = 100_000;
        let kept = (0..n).filter(|&i| keep(&key, i, 0.1)).count();
        assert!((kept as f64 / n as f64 - 0.9).abs() < 0.005, "kept {kept} of {n}");
        let other = DropoutKey { microbatch: 2, ..key };
        let same = (0..1000).filter(|&i| keep(&key, i, 0.5) == keep(&other, i, 0.5)).count();
        assert!(same < 600, "masks of different microbatches agree on {same} of 1000");
        assert!((0..1000).all(|i| keep(&key, i, 0.0)));
    }
}
