// Rotary position embedding in Hugging Face's rotate-half layout, in place on the query
// and key heads of qkv [B,T,(NH+2*KV)*hs] (queries, then keys, then the untouched values in
// each token's row), as the CPU backend's kernels/src/cpu/rope.rs: with half = hs/2, pair
// (x[i], x[i + half]) of a head at position p turns by p * inv_freq_i, where
// inv_freq_i = 1 / base^(2i/hs) in f32 (Hugging Face's f32 `base ** exponent`), the angle
// is an f32 product, and cos and sin are computed in double and rounded once to f32. The
// backward turns the gradient back: the same with sin negated.
//
// One thread per (row, pair): it computes its angle's cos and sin once and turns that pair
// in every query and key head of the row; neighbouring threads take neighbouring pairs, so
// each head's loads and stores are coalesced.
//
// The emulator of kernels/tests/simt uses the host's libm, as the CPU backend does, and so
// gives the CPU's bits. A real GPU's powf, cos and sin may differ from the host's by an
// ulp (and NVRTC may contract the rotation into FMAs), so there the result is within a few
// ulp of the CPU's, not equal.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, each result rounded once on its store.
#include "common.cuh"

// `sign` is 1 (forward) or -1 (backward: the inverse rotation); `first` is the position of
// each sequence's first token (0 in training).
template <typename T>
__device__ __forceinline__ void rope_body(T* qkv, unsigned long long rows, int seq_len, int n_head,
                                          int n_kv_head, int head_size, unsigned long long first,
                                          float base, float sign) {
    const int half = head_size / 2;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * half) return;
    const unsigned long long row = i / half;
    const int pair = (int)(i % half);
    const float inv_freq = 1.0f / powf(base, (float)(2 * pair) / (float)head_size);
    const float position = (float)(first + row % seq_len);
    const double angle = (double)(position * inv_freq);
    const float c = (float)cos(angle);
    const float s = sign * (float)sin(angle);
    const unsigned long long width = (unsigned long long)(n_head + 2 * n_kv_head) * head_size;
    T* x = qkv + row * width + pair;
    for (int head = 0; head < n_head + n_kv_head; ++head, x += head_size) {
        const float a = to_float(x[0]), b = to_float(x[half]);
        store(x, a * c - b * s);
        store(x + half, b * c + a * s);
    }
}

extern "C" __global__ void rope_forward(float* qkv, unsigned long long rows, int seq_len, int n_head,
                                        int n_kv_head, int head_size, unsigned long long first,
                                        float base) {
    rope_body(qkv, rows, seq_len, n_head, n_kv_head, head_size, first, base, 1.0f);
}

extern "C" __global__ void rope_forward_bf16(bf16* qkv, unsigned long long rows, int seq_len,
                                             int n_head, int n_kv_head, int head_size,
                                             unsigned long long first, float base) {
    rope_body(qkv, rows, seq_len, n_head, n_kv_head, head_size, first, base, 1.0f);
}

extern "C" __global__ void rope_backward(float* dqkv, unsigned long long rows, int seq_len,
                                         int n_head, int n_kv_head, int head_size, float base) {
    rope_body(dqkv, rows, seq_len, n_head, n_kv_head, head_size, 0ull, base, -1.0f);
}

extern "C" __global__ void rope_backward_bf16(bf16* dqkv, unsigned long long rows, int seq_len,
                                              int n_head, int n_kv_head, int head_size, float base) {
    rope_body(dqkv, rows, seq_len, n_head, n_kv_head, head_size, 0ull, base, -1.0f);
}
