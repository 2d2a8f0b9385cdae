// Dropout: y = x * keep / (1 - p), with keep drawn from Philox at (mask, element index).
// The same kernel serves forward and backward: the gradient is masked and scaled exactly as
// the activation was. One thread per group of four elements, the four words of one Philox
// call. dropout_apply has a bf16-storage twin for `precision: bf16` activations: one body,
// so the same mask element for element, the product rounded once on its store.
#include "common.cuh"
#include "philox.cuh"

template <typename T>
__device__ __forceinline__ void dropout_group(T* out, const T* inp, unsigned long long n,
                                              const DropoutMask& mask, unsigned long long group) {
    const uint4 words = mask_block_words(mask, (unsigned int)group);
    for (unsigned int i = 0; i < 4; ++i) {
        const unsigned long long index = group * 4 + i;
        if (index < n) {
            const float factor = mask_keeps(mask, uint4_word(words, i)) ? mask.scale : 0.0f;
            store(out + index, to_float(inp[index]) * factor);
        }
    }
}

template <typename T>
__device__ __forceinline__ void dropout_apply_body(T* out, const T* inp, unsigned long long n,
                                                   const DropoutMask& mask) {
    const unsigned long long group = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (group * 4 < n) dropout_group(out, inp, n, mask, group);
}

extern "C" __global__ void dropout_apply(float* out, const float* inp, unsigned long long n,
                                         DropoutMask mask) {
    dropout_apply_body(out, inp, n, mask);
}

extern "C" __global__ void dropout_apply_bf16(bf16* out, const bf16* inp, unsigned long long n,
                                              DropoutMask mask) {
    dropout_apply_body(out, inp, n, mask);
}

// In place, for a buffer that is both input and output: the unfused attention's probability
// gradient, which is f32 only (bf16 activations have the fused attention alone).
extern "C" __global__ void dropout_apply_inplace(float* x, unsigned long long n, DropoutMask mask) {
    dropout_apply_body(x, x, n, mask);
}
