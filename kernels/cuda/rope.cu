// Rotary position embedding in Hugging Face's rotate-half layout, in place on the query
// and key heads of qkv [B,T,(NH+2*KV)*hs] (queries, then keys, then the untouched values in
// each token's row), as the CPU backend's kernels/src/cpu/rope.rs: of each head the first
// rot channels turn (rot = hs, or a partial rotary embedding's share; the rest pass
// through); with half = rot/2, pair (x[i], x[i + half]) of a head at position p turns by
// p * inv_freq_i, where inv_freq_i = 1 / base^(2i/rot) in f32 (Hugging Face's f32
// `base ** exponent`), slowed
// where its wavelength is long by Llama 3.1's scaling when llama3_factor is not 0
// (kernels/src/rope_frequencies.rs, step for step), the angle is an f32 product, and cos
// and sin are computed in double and rounded once to f32. The backward turns the gradient
// back: the same with sin negated.
//
// One thread per (row, pack of pairs), or per (row, pair) where half is not a multiple of
// the 128-bit pack: it computes its angles' cos and sin once and turns those pairs in every
// query and key head of the row; neighbouring threads take neighbouring pairs, so each
// head's loads and stores are coalesced.
//
// The emulator of kernels/tests/simt uses the host's libm, as the CPU backend does, and so
// gives the CPU's bits. A real GPU's powf, cos and sin may differ from the host's by an
// ulp (and NVRTC may contract the rotation into FMAs), so there the result is within a few
// ulp of the CPU's, not equal.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, each result rounded once on its store.
#include "common.cuh"

// The pairs a thread turns: Pack<T>::LEN neighbouring ones where half is a multiple of the
// pack (every Llama's), so that each head's two halves move as 128-bit packs; else one.
// The launch (kernels::cuda::launch::per_rope_thread) takes the same rule.
template <typename T>
__device__ __forceinline__ int rope_pairs(int half) {
    return half % Pack<T>::LEN == 0 ? Pack<T>::LEN : 1;
}

// Llama 3.1's fixed scaling: first trained on 8192 positions, low and high frequency
// factors 1 and 4 (rope_frequencies.rs's LLAMA3_* constants).
constexpr float LLAMA3_ORIGINAL_POSITIONS = 8192.0f, LLAMA3_LOW_FREQ_FACTOR = 1.0f,
                LLAMA3_HIGH_FREQ_FACTOR = 4.0f;

// transformers' _compute_llama3_parameters, one f32 operation per step in its order; the
// products that an add follows are __fmul_rn, so that no FMA contraction changes a bit.
__device__ __forceinline__ float llama3_scaled(float inv_freq, float factor) {
    const float low_freq_wavelen = LLAMA3_ORIGINAL_POSITIONS / LLAMA3_LOW_FREQ_FACTOR;
    const float high_freq_wavelen = LLAMA3_ORIGINAL_POSITIONS / LLAMA3_HIGH_FREQ_FACTOR;
    const float wavelen = (1.0f / inv_freq) * 6.28318548f;  // 2 pi rounded to f32
    if (wavelen > low_freq_wavelen) return inv_freq / factor;
    if (wavelen < high_freq_wavelen) return inv_freq;
    const float smooth = (__fmul_rn(1.0f / wavelen, LLAMA3_ORIGINAL_POSITIONS) - LLAMA3_LOW_FREQ_FACTOR) /
                         (LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR);
    return __fmul_rn(1.0f - smooth, inv_freq) / factor + __fmul_rn(smooth, inv_freq);
}

// `sign` is 1 (forward) or -1 (backward: the inverse rotation); `first` is the position of
// each sequence's first token (0 in training).
template <typename T>
__device__ __forceinline__ void rope_body(T* qkv, unsigned long long rows, int seq_len, int n_head,
                                          int n_kv_head, int head_size, int rot,
                                          unsigned long long first, float base,
                                          float llama3_factor, float sign) {
    constexpr int LEN = Pack<T>::LEN;
    const int half = rot / 2, per = rope_pairs<T>(half), threads_per_row = half / per;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * threads_per_row) return;
    const unsigned long long row = i / threads_per_row;
    const int pair = (int)(i % threads_per_row) * per;
    const float position = (float)(first + row % seq_len);
    float c[LEN], s[LEN];
    for (int k = 0; k < LEN && k < per; ++k) {
        float inv_freq = 1.0f / powf(base, (float)(2 * (pair + k)) / (float)rot);
        if (llama3_factor != 0.0f) inv_freq = llama3_scaled(inv_freq, llama3_factor);
        const double angle = (double)(position * inv_freq);
        c[k] = (float)cos(angle);
        s[k] = sign * (float)sin(angle);
    }
    const unsigned long long width = (unsigned long long)(n_head + 2 * n_kv_head) * head_size;
    T* x = qkv + row * width + pair;
    for (int head = 0; head < n_head + n_kv_head; ++head, x += head_size) {
        if (per == LEN) {
            const bool vector = aligned16(x) && aligned16(x + half);
            Pack<T> a = load_pack(x, 0, LEN, vector), b = load_pack(x + half, 0, LEN, vector);
            for (int k = 0; k < LEN; ++k) {
                const float ak = to_float(a.x[k]), bk = to_float(b.x[k]);
                store(&a.x[k], ak * c[k] - bk * s[k]);
                store(&b.x[k], bk * c[k] + ak * s[k]);
            }
            store_pack(x, a, 0, LEN, vector);
            store_pack(x + half, b, 0, LEN, vector);
        } else {
            const float a = to_float(x[0]), b = to_float(x[half]);
            store(x, a * c[0] - b * s[0]);
            store(x + half, b * c[0] + a * s[0]);
        }
    }
}

extern "C" __global__ void rope_forward(float* qkv, unsigned long long rows, int seq_len, int n_head,
                                        int n_kv_head, int head_size, int rot,
                                        unsigned long long first, float base, float llama3_factor) {
    rope_body(qkv, rows, seq_len, n_head, n_kv_head, head_size, rot, first, base, llama3_factor,
              1.0f);
}

extern "C" __global__ void rope_forward_bf16(bf16* qkv, unsigned long long rows, int seq_len,
                                             int n_head, int n_kv_head, int head_size, int rot,
                                             unsigned long long first, float base,
                                             float llama3_factor) {
    rope_body(qkv, rows, seq_len, n_head, n_kv_head, head_size, rot, first, base, llama3_factor,
              1.0f);
}

extern "C" __global__ void rope_backward(float* dqkv, unsigned long long rows, int seq_len,
                                         int n_head, int n_kv_head, int head_size, int rot,
                                         float base, float llama3_factor) {
    rope_body(dqkv, rows, seq_len, n_head, n_kv_head, head_size, rot, 0ull, base, llama3_factor,
              -1.0f);
}

extern "C" __global__ void rope_backward_bf16(bf16* dqkv, unsigned long long rows, int seq_len,
                                              int n_head, int n_kv_head, int head_size, int rot,
                                              float base, float llama3_factor) {
    rope_body(dqkv, rows, seq_len, n_head, n_kv_head, head_size, rot, 0ull, base, llama3_factor,
              -1.0f);
}
