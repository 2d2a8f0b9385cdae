// Elementwise arithmetic of the residual stream, of gradient accumulation, of a
// zero-centred norm weight's shift and of an embedding's multiplier. Each kernel
// has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one body, the sum
// taken in fp32 and rounded once on its store. Each thread takes one 128-bit pack
// (common.cuh): launched over n / Pack<T>::LEN threads, rounded up.
#include "common.cuh"

// acc += x
template <typename T>
__device__ __forceinline__ void accumulate_body(T* acc, const T* x, unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(acc) && aligned16(x);
    Pack<T> pa = load_pack(acc, i, n, vector);
    const Pack<T> px = load_pack(x, i, n, vector);
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&pa.x[k], to_float(pa.x[k]) + to_float(px.x[k]));
    store_pack(acc, pa, i, n, vector);
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
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(a) && aligned16(b);
    const Pack<T> pa = load_pack(a, i, n, vector), pb = load_pack(b, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&po.x[k], to_float(pa.x[k]) + to_float(pb.x[k]));
    store_pack(out, po, i, n, vector);
}

extern "C" __global__ void add(float* out, const float* a, const float* b, unsigned long long n) {
    add_body(out, a, b, n);
}

extern "C" __global__ void add_bf16(bf16* out, const bf16* a, const bf16* b, unsigned long long n) {
    add_body(out, a, b, n);
}

// out = a + s (a zero-centred norm weight's 1 + w)
template <typename T>
__device__ __forceinline__ void add_scalar_body(T* out, const T* a, float s, unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(a);
    const Pack<T> pa = load_pack(a, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&po.x[k], to_float(pa.x[k]) + s);
    store_pack(out, po, i, n, vector);
}

extern "C" __global__ void add_scalar(float* out, const float* a, float s, unsigned long long n) {
    add_scalar_body(out, a, s, n);
}

extern "C" __global__ void add_scalar_bf16(bf16* out, const bf16* a, float s, unsigned long long n) {
    add_scalar_body(out, a, s, n);
}

// t *= s (Gemma's embedding multiplier)
template <typename T>
__device__ __forceinline__ void scale_body(T* t, float s, unsigned long long n) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(t);
    Pack<T> pt = load_pack(t, i, n, vector);
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&pt.x[k], to_float(pt.x[k]) * s);
    store_pack(t, pt, i, n, vector);
}

extern "C" __global__ void scale(float* t, float s, unsigned long long n) { scale_body(t, s, n); }

extern "C" __global__ void scale_bf16(bf16* t, float s, unsigned long long n) { scale_body(t, s, n); }
