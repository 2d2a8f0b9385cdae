// GPT-2's tanh GELU (gelu.cuh) on one tensor.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, the result rounded once on its store. Each thread takes one
// 128-bit pack (common.cuh): launched over n / Pack<T>::LEN threads, rounded up.
#include "common.cuh"
#include "gelu.cuh"

template <typename T>
__device__ __forceinline__ void gelu_forward_body(T* out, const T* inp, unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(inp);
    const Pack<T> px = load_pack(inp, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) {
        const float x = to_float(px.x[k]);
        store(&po.x[k], gelu_value(x));
    }
    store_pack(out, po, i, n, vector);
}

extern "C" __global__ void gelu_forward(float* out, const float* inp, unsigned long long n) {
    gelu_forward_body(out, inp, n);
}

extern "C" __global__ void gelu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n) {
    gelu_forward_body(out, inp, n);
}

// dinp (overwrite) = gelu'(x) * dout.
template <typename T>
__device__ __forceinline__ void gelu_backward_body(T* dinp, const T* inp, const T* dout,
                                                   unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(dinp) && aligned16(inp) && aligned16(dout);
    const Pack<T> px = load_pack(inp, i, n, vector), pd = load_pack(dout, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) {
        store(&po.x[k], gelu_slope(to_float(px.x[k])) * to_float(pd.x[k]));
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
