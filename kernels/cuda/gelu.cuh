// GPT-2's tanh approximation of GELU, as the CPU backend's kernels/src/cpu/gelu.rs computes
// it: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as the equal
// x * sigmoid(2u), since 1 + tanh(u) would cancel in the negative tail and lose the small
// outputs' relative precision there. For gelu.cu and GeGLU's gate in glu.cu.
#pragma once

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_CUBE 0.044715f

// sigmoid(2u(x)); exp(-2u) overflows to infinity far in the negative tail, giving 0.
__device__ __forceinline__ float sigmoid_2u(float x) {
    return 1.0f / (1.0f + expf(-2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x)));
}

__device__ __forceinline__ float gelu_value(float x) { return x * sigmoid_2u(x); }

// gelu'(x) = s + x s (1 - s) 2 u'(x), with s = sigmoid(2u(x)).
__device__ __forceinline__ float gelu_slope(float x) {
    const float s = sigmoid_2u(x);
    const float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    return s + x * s * (1.0f - s) * 2.0f * du_dx;
}
