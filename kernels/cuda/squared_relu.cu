// Squared ReLU, relu(x)^2 (Megatron's squared_relu, Nemotron's relu2), as the CPU backend's
// kernels/src/cpu/squared_relu.rs: relu keeps x where it is not below 0, a NaN included
// (fmaxf would drop it), and the backward's 2 relu(x) is exact, so both are the CPU's bits.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, the result rounded once on its store. Each thread takes one
// 128-bit pack (common.cuh): launched over n / Pack<T>::LEN threads, rounded up.
#include "common.cuh"

__device__ __forceinline__ float relu(float x) { return x < 0.0f ? 0.0f : x; }

template <typename T>
__device__ __forceinline__ void squared_relu_forward_body(T* out, const T* inp, unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(inp);
    const Pack<T> px = load_pack(inp, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) {
        const float r = relu(to_float(px.x[k]));
        store(&po.x[k], __fmul_rn(r, r));
    }
    store_pack(out, po, i, n, vector);
}

extern "C" __global__ void squared_relu_forward(float* out, const float* inp, unsigned long long n) {
    squared_relu_forward_body(out, inp, n);
}

extern "C" __global__ void squared_relu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n) {
    squared_relu_forward_body(out, inp, n);
}

// dinp (overwrite) = 2 relu(x) * dout.
template <typename T>
__device__ __forceinline__ void squared_relu_backward_body(T* dinp, const T* inp, const T* dout,
                                                           unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(dinp) && aligned16(inp) && aligned16(dout);
    const Pack<T> px = load_pack(inp, i, n, vector), pd = load_pack(dout, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) {
        store(&po.x[k], __fmul_rn(2.0f * relu(to_float(px.x[k])), to_float(pd.x[k])));
    }
    store_pack(dinp, po, i, n, vector);
}

extern "C" __global__ void squared_relu_backward(float* dinp, const float* inp, const float* dout,
                                                 unsigned long long n) {
    squared_relu_backward_body(dinp, inp, dout, n);
}

extern "C" __global__ void squared_relu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                                      unsigned long long n) {
    squared_relu_backward_body(dinp, inp, dout, n);
}
