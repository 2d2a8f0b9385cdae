// Philox4x32-10 and the dropout mask: a line-by-line transcription of
// kernels/src/philox.rs, so both backends draw bit-identical masks; keep the two in step.
// kernels/tests/simt/philox.rs runs this header on the host against the Rust masks.
//
// A mask element is drawn as:
//   counter = [index / 4, microbatch, step, layer * 4 + site], key = [seed lo, seed hi],
//   word    = philox(counter, key)[index % 4],
//   keep    = word >= p * 2^32.
#pragma once

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

// Ten rounds of Philox4x32 on `c` under key `k`.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k.x += PHILOX_W0;
            k.y += PHILOX_W1;
        }
        const unsigned int hi0 = __umulhi(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
        const unsigned int hi1 = __umulhi(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// One dropout mask, as the Rust side packs it (kernels/src/cuda/pointwise.rs): the counter
// words that do not depend on the element index, the key words, the drop threshold and
// the 1 / (1 - p) scale of the kept elements; and where a tensor-parallel rank's part lies
// in the whole tensor's mask. The layout matches the #[repr(C)] struct.
struct DropoutMask {
    unsigned int counter[3];  // microbatch, step, layer * 4 + site
    unsigned int key[2];      // seed lo, seed hi
    unsigned long long threshold;
    float scale;
    // The mask element of an elementwise dropout's first element: where a sequence-parallel
    // rank's rows begin in the whole tensor (0 otherwise).
    unsigned long long first;
    // An attention's heads: the rank's own query heads a batch row (heads[0]) among the
    // layer's heads[1], from heads[2]; {1, 1, 0} for a layer's own heads (attention_head.cuh's
    // mask_head).
    unsigned int heads[3];
};

// The four random words covering elements 4*block .. 4*block+3 of the mask.
__device__ __forceinline__ uint4 mask_block_words(const DropoutMask& m, unsigned int block) {
    return philox4x32_10(make_uint4(block, m.counter[0], m.counter[1], m.counter[2]),
                         make_uint2(m.key[0], m.key[1]));
}

__device__ __forceinline__ unsigned int uint4_word(uint4 w, unsigned int i) {
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

// Whether the random word of an element keeps it.
__device__ __forceinline__ bool mask_keeps(const DropoutMask& m, unsigned int word) {
    return (unsigned long long)word >= m.threshold;
}

// Whether the mask keeps element `index`: one Philox call for one element, where a caller
// cannot take the four words of a block together.
__device__ __forceinline__ bool mask_keeps_element(const DropoutMask& m, unsigned long long index) {
    return mask_keeps(m, uint4_word(mask_block_words(m, (unsigned int)(index / 4)), (unsigned int)(index % 4)));
}
