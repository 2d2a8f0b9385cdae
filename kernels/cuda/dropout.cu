// Dropout: y = x * keep / (1 - p), with keep drawn from Philox at (mask, element index).
// The same kernel serves forward and backward: the gradient is masked and scaled exactly as
// the activation was. One thread per 128-bit pack (common.cuh): 4 floats, the four words of
// one Philox call, or 8 bf16, two calls. dropout_apply has a bf16-storage twin for
// `precision: bf16` activations: one body, so the same mask element for element, the
// product rounded once on its store.
#include "common.cuh"
#include "philox.cuh"

// Element i of the tensor is element mask.first + i of the mask (a sequence-parallel rank's
// rows start there).
template <typename T>
__device__ __forceinline__ void dropout_apply_body(T* out, const T* inp, unsigned long long n,
                                                   const DropoutMask& mask) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(inp);
    Pack<T> p = load_pack(inp, i, n, vector);
    const unsigned long long index = mask.first + i;
    if (index % 4 == 0) {
        // A pack starts at a multiple of 4, and so does its mask: its groups of four are
        // whole Philox calls.
        for (int g = 0; g < Pack<T>::LEN / 4; ++g) {
            const uint4 words = mask_block_words(mask, (unsigned int)(index / 4 + g));
            for (int k = 0; k < 4; ++k) {
                const float factor = mask_keeps(mask, uint4_word(words, k)) ? mask.scale : 0.0f;
                store(&p.x[4 * g + k], to_float(p.x[4 * g + k]) * factor);
            }
        }
    } else {
        // A part from a mask element that is not a multiple of 4 (rows of a width that is
        // not): each element its own call, four times the draws.
        for (int k = 0; k < Pack<T>::LEN; ++k) {
            const float factor = mask_keeps_element(mask, index + k) ? mask.scale : 0.0f;
            store(&p.x[k], to_float(p.x[k]) * factor);
        }
    }
    store_pack(out, p, i, n, vector);
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
