// GPT-2's tanh GELU (gelu.cuh) on one tensor.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, the result rounded once on its store, one 128-bit pack a thread
// (map_packs and zip_packs, common.cuh).
#include "common.cuh"
#include "gelu.cuh"

extern "C" __global__ void gelu_forward(float* out, const float* inp, unsigned long long n) {
    map_packs(out, inp, n, [](float x) { return gelu_value(x); });
}

extern "C" __global__ void gelu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n) {
    map_packs(out, inp, n, [](float x) { return gelu_value(x); });
}

// dinp (overwrite) = gelu'(inp) * dout.
extern "C" __global__ void gelu_backward(float* dinp, const float* inp, const float* dout,
                                         unsigned long long n) {
    zip_packs(dinp, inp, dout, n, [](float x, float d) { return gelu_slope(x) * d; });
}

extern "C" __global__ void gelu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                              unsigned long long n) {
    zip_packs(dinp, inp, dout, n, [](float x, float d) { return gelu_slope(x) * d; });
}
