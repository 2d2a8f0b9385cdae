// Elementwise arithmetic of the residual stream and of gradient accumulation. Each kernel
// has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one body, the sum
// taken in fp32 and rounded once on its store.
#include "common.cuh"

// acc += x
template <typename T>
__device__ __forceinline__ void accumulate_body(T* acc, const T* x, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store(acc + i, to_float(acc[i]) + to_float(x[i]));
}

extern "C" __global__ void accumulate(float* acc, const float* x, unsigned long long n) {
    accumulate_body(acc, x, n);
}

extern "C" __global__ void accumulate_bf16(bf16* acc, const bf16* x, unsigned long long n) {
    accumulate_body(acc, x, n);
}

// out = a + b (the residual add)
template <typename T>
__device__ __forceinline__ void add_body(T* out, const T* a, const T* b, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store(out + i, to_float(a[i]) + to_float(b[i]));
}

extern "C" __global__ void add(float* out, const float* a, const float* b, unsigned long long n) {
    add_body(out, a, b, n);
}

extern "C" __global__ void add_bf16(bf16* out, const bf16* a, const bf16* b, unsigned long long n) {
    add_body(out, a, b, n);
}
