// Elementwise arithmetic of the residual stream, of gradient accumulation, of a
// zero-centred norm weight's shift and of an embedding's multiplier. Each kernel
// has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one body, the sum
// taken in fp32 and rounded once on its store, one 128-bit pack a thread (map_packs and
// zip_packs, common.cuh).
#include "common.cuh"

// acc += x
extern "C" __global__ void accumulate(float* acc, const float* x, unsigned long long n) {
    zip_packs(acc, acc, x, n, [](float a, float b) { return a + b; });
}

extern "C" __global__ void accumulate_bf16(bf16* acc, const bf16* x, unsigned long long n) {
    zip_packs(acc, acc, x, n, [](float a, float b) { return a + b; });
}

// out = a + b (the residual add)
extern "C" __global__ void add(float* out, const float* a, const float* b, unsigned long long n) {
    zip_packs(out, a, b, n, [](float a, float b) { return a + b; });
}

extern "C" __global__ void add_bf16(bf16* out, const bf16* a, const bf16* b, unsigned long long n) {
    zip_packs(out, a, b, n, [](float a, float b) { return a + b; });
}

// out = a + s (a zero-centred norm weight's 1 + w)
extern "C" __global__ void add_scalar(float* out, const float* a, float s, unsigned long long n) {
    map_packs(out, a, n, [s](float a) { return a + s; });
}

extern "C" __global__ void add_scalar_bf16(bf16* out, const bf16* a, float s, unsigned long long n) {
    map_packs(out, a, n, [s](float a) { return a + s; });
}

// t *= s (Gemma's embedding multiplier)
extern "C" __global__ void scale(float* t, float s, unsigned long long n) {
    map_packs(t, t, n, [s](float x) { return x * s; });
}

extern "C" __global__ void scale_bf16(bf16* t, float s, unsigned long long n) {
    map_packs(t, t, n, [s](float x) { return x * s; });
}
