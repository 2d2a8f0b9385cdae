//! Dropout with the Philox mask of `crate::philox`: element `index` of a mask is word
//! `index % 4` of block `index / 4`, the mapping the CUDA backend reproduces bit for bit.

use super::CHUNK;
use crate::dropout::DropoutSpec;
use crate::philox;
use rayon::prelude::*;

/// xs [n] *= mask / (1 - p), where xs[k] is element `first + k` of the mask. One Philox
/// call serves four consecutive elements; whole runs of `philox::LANES` calls are drawn
/// together.
pub fn scale_by_mask(spec: &DropoutSpec, first: usize, xs: &mut [f32]) {
    if spec.p == 0.0 {
        return; // every element kept, scale 1: the mask would change nothing
    }
    let threshold = philox::drop_threshold(spec.p);
    let scale = 1.0 / (1.0 - spec.p);
    let apply = |xs: &mut [f32], words: &[u32]| {
        for (x, &word) in xs.iter_mut().zip(words) {
            *x *= if word as u64 >= threshold { scale } else { 0.0 };
        }
    };
    let block = |b: usize| u32::try_from(b).expect("dropout mask index beyond Philox's 2^34 elements");
    // Up to the first block boundary, from word `first % 4` of its block.
    let head = ((4 - first % 4) % 4).min(xs.len());
    let (head_xs, rest) = xs.split_at_mut(head);
    if head > 0 {
        apply(head_xs, &philox::block_words(&spec.key, block(first / 4))[first % 4..]);
    }
    // Then whole runs of LANES blocks, then single blocks (the last maybe partial).
    let first_block = (first + head) / 4;
    let done = rest.len() / (4 * philox::LANES) * philox::LANES;
    let mut runs = rest.chunks_exact_mut(4 * philox::LANES);
    for (r, run) in (&mut runs).enumerate() {
        let words = philox::lanes_words(&spec.key, block(first_block + r * philox::LANES));
        for (xs, words) in run.chunks_exact_mut(4).zip(&words) {
            apply(xs, words);
        }
    }
    for (b, xs) in runs.into_remainder().chunks_mut(4).enumerate() {
        apply(xs, &philox::block_words(&spec.key, block(first_block + done + b)));
    }
}

/// out [n] = inp [n] * mask / (1 - p), element index = `spec.first` + position in the
/// tensor. The same call is the backward (dinp = dout * mask / (1 - p)).
pub fn apply(out: &mut [f32], inp: &[f32], spec: &DropoutSpec) {
    out.par_chunks_mut(CHUNK).zip(inp.par_chunks(CHUNK)).enumerate().for_each(|(chunk, (out, inp))| {
        out.copy_from_slice(inp);
        scale_by_mask(spec, spec.first + chunk * CHUNK, out);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::random;
    use crate::dropout::{DropoutKey, DropoutSite};

    const KEY: DropoutKey =
        DropoutKey { seed: 42, step: 7, microbatch: 3, layer: 5, site: DropoutSite::MlpResidual };

    #[test]
    fn mask_is_philox_keep_and_kept_values_are_scaled() {
        let spec = DropoutSpec { p: 0.25, key: KEY, first: 0, heads: None };
        let inp = random(1, 2 * CHUNK + 6, 1.0);
        let mut out = vec![f32::NAN; inp.len()];
        apply(&mut out, &inp, &spec);
        let mut kept = 0;
        for (i, (&o, &x)) in out.iter().zip(&inp).enumerate() {
            if philox::keep(&KEY, i, spec.p) {
                assert_eq!(o, x * (1.0 / 0.75), "element {i}");
                kept += 1;
            } else {
                assert_eq!(o, 0.0, "element {i}");
            }
        }
        let fraction = kept as f64 / inp.len() as f64;
        assert!((fraction - 0.75).abs() < 0.01, "kept {fraction}");
    }

    #[test]
    fn unaligned_windows_see_the_same_mask_elements() {
        let spec = DropoutSpec { p: 0.5, key: KEY, first: 0, heads: None };
        for (first, n) in [(5, 11), (6, 1), (7, 2), (8, 4), (9, 0), (0, 3), (3, 200), (64, 129)] {
            let mut xs = vec![1.0; n];
            scale_by_mask(&spec, first, &mut xs);
            let want: Vec<f32> =
                (0..n).map(|k| if philox::keep(&KEY, first + k, 0.5) { 2.0 } else { 0.0 }).collect();
            assert_eq!(xs, want, "window {first}+{n}");
        }
    }

    #[test]
    fn zero_probability_is_the_identity() {
        let inp = random(2, 1000, 1.0);
        let mut out = vec![0.0; inp.len()];
        apply(&mut out, &inp, &DropoutSpec { p: 0.0, key: KEY, first: 0, heads: None });
        assert_eq!(out, inp);
    }

    /// A shard of rows dropped from its first element's index gets the whole tensor's mask:
    /// shards that start mid-block and span several chunks included.
    #[test]
    fn a_shard_from_its_first_element_gets_the_whole_mask() {
        let spec = DropoutSpec { p: 0.5, key: KEY, first: 0, heads: None };
        let inp = random(3, 3 * CHUNK + 10, 1.0);
        let mut whole = vec![0.0; inp.len()];
        apply(&mut whole, &inp, &spec);
        for first in [1, 6, CHUNK - 3, CHUNK + 2] {
            let mut part = vec![0.0; inp.len() - first];
            apply(&mut part, &inp[first..], &DropoutSpec { first, ..spec });
            assert_eq!(part, whole[first..], "first {first}");
        }
    }
}
