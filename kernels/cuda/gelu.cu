// GPT-2's tanh approximation of GELU: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// computed as the equal x * sigmoid(2u), as the CPU backend does: 1 + tanh(u) would cancel
// in the negative tail and lose the small outputs' relative precision there.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, the result rounded once on its store. Each thread takes one
// 128-bit pack (common.cuh): launched over n / Pack<T>::LEN threads, rounded up.
#include "common.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_CUBE 0.044715f

// sigmoid(2u(x)); exp(-2u) overflows to infinity far in the negative tail, giving 0.
__device__ __forceinline__ float sigmoid_2u(float x) {
    return 1.0f / (1.0f + expf(-2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x)));
}

template <typename T>
__device__ __forceinline__ void gelu_forward_body(T* out, const T* inp, unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(inp);
    const Pack<T> px = load_pack(inp, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) {
        const float x = to_float(px.x[k]);
        store(&po.x[k], x * sigmoid_2u(x));
    }
    store_pack(out, po, i, n, vector);
}

extern "C" __global__ void gelu_forward(float* out, const float* inp, unsigned long long n) {
    gelu_forward_body(out, inp, n);
}

extern "C" __global__ void gelu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n) {
    gelu_forward_body(out, inp, n);
}

// dinp (overwrite) = gelu'(x) * dout, with s = sigmoid(2u): gelu' = s + x s (1 - s) 2 u'.
template <typename T>
__device__ __forceinline__ void gelu_backward_body(T* dinp, const T* inp, const T* dout,
                                                   unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(dinp) && aligned16(inp) && aligned16(dout);
    const Pack<T> px = load_pack(inp, i, n, vector), pd = load_pack(dout, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) {
        const float x = to_float(px.x[k]);
        const float s = sigmoid_2u(x);
        const float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        store(&po.x[k], (s + x * s * (1.0f - s) * 2.0f * du_dx) * to_float(pd.x[k]));
    }
    store_pack(dinp, po, i, n, vector);
}

extern "C" __global__ void gelu_backward(float* dinp, const float* inp, const float* dout,
                                         unsigned long long n) {
    gelu_backward_body(dinp, inp, dout, n);
}

extern "C" __global__ void gelu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                              unsigned long long n) {
    gelu_backward_body(dinp, inp, dout, n);
}
