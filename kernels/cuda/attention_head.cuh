// What the fused attention kernels (fused_attention.cu on CUDA cores, fused_attention_mma.cu
// on tensor cores) share: where a block's head lies in qkv and out, and the dropout mask of
// its probabilities, drawn from Philox at the CPU's element index.
#pragma once
#include "common.cuh"
#include "philox.cuh"

// Query head h of sequence b, and the key/value head g = h / (NH / KV) it shares (Hugging
// Face's repeat_kv, read in place: KV == NH is multi-head attention). qkv [B, T, (NH + 2 KV)
// hs] holds each token's NH query heads, then its KV key heads, then its KV value heads.
struct Head {
    unsigned long long q;       // offset of the head's q in qkv
    unsigned long long k, v;    // offsets of its group's k and v in qkv
    unsigned long long stride;  // qkv's row stride, (NH + 2 KV) hs
    unsigned long long io;      // offset of the head's columns in out / dout (row stride NH hs)
    unsigned long long bh;      // b * NH + h: the head's rows of lse and delta, its dropout key
};

__device__ __forceinline__ Head query_head(int b, int h, int T, int NH, int KV, int hs) {
    const unsigned long long stride = (unsigned long long)(NH + 2 * KV) * hs, row0 = (unsigned long long)b * T;
    const unsigned long long g = h / (NH / KV), kv = row0 * stride + (unsigned long long)NH * hs + g * hs;
    return Head{row0 * stride + (unsigned long long)h * hs, kv, kv + (unsigned long long)KV * hs, stride,
                row0 * NH * hs + (unsigned long long)h * hs, (unsigned long long)b * NH + h};
}

// The head of a block of a query-side kernel: blockIdx.y = b * NH + h.
__device__ __forceinline__ Head head_of(int T, int NH, int KV, int hs) {
    return query_head(blockIdx.y / NH, blockIdx.y % NH, T, NH, KV, hs);
}

// The query heads of a block of a key-side kernel, blockIdx.y = b * KV + g: head r of its
// group, r < NH / KV, in ascending order as the key and value gradients sum them.
__device__ __forceinline__ Head group_head(int r, int T, int NH, int KV, int hs) {
    const int b = blockIdx.y / KV, g = blockIdx.y % KV;
    return query_head(b, g * (NH / KV) + r, T, NH, KV, hs);
}

// The (batch, head) pair of the whole layer's [B, NH, T, T] mask that head bh = b * NH + h
// draws: b * total + first + h for a tensor-parallel rank's heads first.. of the layer's
// total, bh itself for a layer's own ({1, 1, 0}). Invariant in every loop over a head's
// elements, so computed once a head.
__device__ __forceinline__ unsigned long long mask_head(const DropoutMask& mask, unsigned long long bh) {
    return bh / mask.heads[0] * mask.heads[1] + mask.heads[2] + bh % mask.heads[0];
}

// The multiplier of element (i, j) of head bh's probabilities under dropout: 1 / (1 - p)
// or 0 as the mask keeps or drops it. Called only when dropout is on.
__device__ __forceinline__ float dropout_factor(const DropoutMask& mask, unsigned long long bh, int T, int i, int j) {
    return mask_keeps_element(mask, (mask_head(mask, bh) * T + i) * T + j) ? mask.scale : 0.0f;
}
