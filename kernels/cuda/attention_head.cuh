// What the fused attention kernels (fused_attention.cu on CUDA cores, fused_attention_mma.cu
// on tensor cores) share: where a block's head lies in qkv and out, and the dropout mask of
// its probabilities, drawn from Philox at the CPU's element index.
#pragma once
#include "common.cuh"
#include "philox.cuh"

// The block's head (blockIdx.y = b * NH + h): offsets of its columns, and bh.
struct Head {
    unsigned long long qkv;  // offset of the head's q in qkv (row stride 3C)
    unsigned long long io;   // offset of the head's columns in out / dout (row stride C)
    unsigned long long bh;   // b * NH + h
};

__device__ __forceinline__ Head head_of(int T, int NH, int hs) {
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const unsigned long long C = (unsigned long long)NH * hs;
    return Head{(unsigned long long)b * T * 3 * C + (unsigned long long)h * hs, (unsigned long long)b * T * C + h * hs,
                (unsigned long long)bh};
}

// The multiplier of element (i, j) of head bh's probabilities under dropout: 1 / (1 - p)
// or 0 as the mask keeps or drops it. Called only when dropout is on.
__device__ __forceinline__ float dropout_factor(const DropoutMask& mask, unsigned long long bh, int T, int i, int j) {
    const unsigned long long index = (bh * T + i) * T + j;
    const uint4 words = mask_block_words(mask, (unsigned int)(index / 4));
    return mask_keeps(mask, uint4_word(words, (unsigned int)(index % 4))) ? mask.scale : 0.0f;
}
