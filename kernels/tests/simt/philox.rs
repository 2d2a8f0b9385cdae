//! philox.cuh against kernels/src/philox.rs, word for word, through a probe kernel; and
//! the mask argument every dropout kernel takes.

use crate::harness::{Arg, Elem, Family, Run};
use kernels::cuda::launch::per_item;
use kernels::philox::{block_words, counter_base, drop_threshold, key_words};
use kernels::{DropoutKey, DropoutSite, DropoutSpec};

/// `DropoutMask` of philox.cuh, field for field with its C layout (padding after the key,
/// after the scale and at the end), for an elementwise dropout from `spec.first` or a
/// layer's own attention heads.
fn dropout_mask_bytes(spec: &DropoutSpec) -> Vec<u8> {
    assert_eq!(spec.heads, None, "the harness keys the fused attentions' masks by their own heads");
    let mut bytes = Vec::new();
    let words = counter_base(&spec.key).into_iter().chain(key_words(spec.key.seed));
    words.chain([0]).for_each(|w| w.put(&mut bytes));
    drop_threshold(spec.p).put(&mut bytes);
    (1.0 / (1.0 - spec.p)).put(&mut bytes);
    0u32.put(&mut bytes);
    (spec.first as u64).put(&mut bytes);
    [1u32, 1, 0, 0].into_iter().for_each(|w| w.put(&mut bytes));
    bytes
}

/// The mask argument of the dropout kernels.
pub fn dropout_mask(spec: &DropoutSpec) -> Arg {
    Arg::Value(dropout_mask_bytes(spec))
}

/// The mask argument the device passes a kernel told not to apply dropout
/// (`DropoutMask::UNUSED`): zero words, threshold 0, scale 1, from element 0 of its own heads.
pub fn unused_dropout_mask() -> Arg {
    let mut bytes = Vec::new();
    [0u32; 6].into_iter().for_each(|w| w.put(&mut bytes));
    0u64.put(&mut bytes);
    1.0f32.put(&mut bytes);
    0u32.put(&mut bytes);
    0u64.put(&mut bytes);
    [1u32, 1, 0, 0].into_iter().for_each(|w| w.put(&mut bytes));
    Arg::Value(bytes)
}

/// One thread per case: the random word of element `indices[i]` under `masks[i]`, and
/// whether the mask keeps it, as the dropout kernels draw them (from the block's words, and
/// element by element: both must keep it).
const PROBE: &str = r#"
#include "philox.cuh"
extern "C" __global__ void probe(unsigned int* out, const DropoutMask* masks, const unsigned long long* indices,
                                 int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint4 words = mask_block_words(masks[i], (unsigned int)(indices[i] / 4));
    const unsigned int word = uint4_word(words, (unsigned int)(indices[i] % 4));
    out[2 * i] = word;
    out[2 * i + 1] = mask_keeps(masks[i], word) && mask_keeps_element(masks[i], indices[i]) ? 1 : 0;
}
"#;

#[test]
fn philox_cuh_draws_the_rust_masks() {
    let Some(family) = Family::custom("philox_cuh_draws_the_rust_masks", PROBE, &["probe"]) else { return };
    let keys = [
        DropoutKey { seed: 0, step: 0, microbatch: 0, layer: 0, site: DropoutSite::Embedding },
        DropoutKey { seed: 1337, step: 3, microbatch: 1, layer: 2, site: DropoutSite::MlpResidual },
        DropoutKey {
            seed: u64::MAX - 5,
            step: 100_000,
            microbatch: 63,
            layer: 95,
            site: DropoutSite::AttentionProbs,
        },
    ];
    let mut cases = Vec::new();
    for key in keys {
        for p in [0.0f32, 0.1, 0.5, 0.9] {
            for index in (0..64).chain([1_000_003, (1 << 33) + 7]) {
                cases.push((DropoutSpec { p, key, first: 0, heads: None }, index));
            }
        }
    }
    let masks: Vec<u8> = cases.iter().flat_map(|(spec, _)| dropout_mask_bytes(spec)).collect();
    let indices: Vec<u64> = cases.iter().map(|&(_, i)| i).collect();
    let n = cases.len();
    let mut run = Run::new(17);
    let (out, m, i) = (run.buffer(&vec![u32::MAX; 2 * n]), run.buffer(&masks), run.buffer(&indices));
    run.launch("probe", per_item(n), &[out.into(), m.into(), i.into(), (n as i32).into()]);
    run.read(out);
    let got = family.run(run).unwrap().get::<u32>(out);
    for ((spec, index), got) in cases.iter().zip(got.chunks_exact(2)) {
        let word = block_words(&spec.key, (index / 4) as u32)[*index as usize % 4];
        let keep = word as u64 >= drop_threshold(spec.p);
        assert_eq!(got, [word, keep as u32], "{spec:?}, element {index}");
    }
}
