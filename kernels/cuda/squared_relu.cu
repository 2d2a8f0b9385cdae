// Squared ReLU, relu(x)^2 (Megatron's squared_relu, Nemotron's relu2), as the CPU backend's
// kernels/src/cpu/squared_relu.rs: relu keeps x where it is not below 0, a NaN included
// (fmaxf would drop it), and the backward's 2 relu(x) is exact, so both are the CPU's bits.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, fp32 arithmetic, the result rounded once on its store, one 128-bit pack a thread
// (map_packs and zip_packs, common.cuh).
#include "common.cuh"

__device__ __forceinline__ float relu(float x) { return x < 0.0f ? 0.0f : x; }

__device__ __forceinline__ float squared_relu(float x) {
    const float r = relu(x);
    return __fmul_rn(r, r);
}

extern "C" __global__ void squared_relu_forward(float* out, const float* inp, unsigned long long n) {
    map_packs(out, inp, n, [](float x) { return squared_relu(x); });
}

extern "C" __global__ void squared_relu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n) {
    map_packs(out, inp, n, [](float x) { return squared_relu(x); });
}

// dinp (overwrite) = 2 relu(inp) * dout.
extern "C" __global__ void squared_relu_backward(float* dinp, const float* inp, const float* dout,
                                                 unsigned long long n) {
    zip_packs(dinp, inp, dout, n, [](float x, float d) { return __fmul_rn(2.0f * relu(x), d); });
}

extern "C" __global__ void squared_relu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                                      unsigned long long n) {
    zip_packs(dinp, inp, dout, n, [](float x, float d) { return __fmul_rn(2.0f * relu(x), d); });
}
