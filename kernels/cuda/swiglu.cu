// SwiGLU, out [N,F] = silu(a) * b with silu(a) = a sigmoid(a), where a (the gate) and b (the
// up projection) are the two halves of each row of inp [N,2F], as the CPU backend's
// kernels/src/cpu/swiglu.rs computes it, operation for operation. The sigmoid's exp is the
// GPU's expf where the CPU's is a polynomial, so the two agree to a few ulp, not bit for
// bit; far in the negative tail expf(-a) overflows to infinity and the sigmoid is 0 where
// the CPU's stops at e^-87.3.
//
// One thread per output element, as GELU. Each kernel has a bf16-storage twin (NAME_bf16)
// for `precision: bf16` activations: one body, fp32 arithmetic, each result rounded once on
// its store.
#include "common.cuh"

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

template <typename T>
__device__ __forceinline__ void swiglu_forward_body(T* out, const T* inp, unsigned long long n,
                                                    unsigned long long f) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const T* gate = inp + i / f * 2 * f + i % f;
    const float a = to_float(gate[0]), b = to_float(gate[f]);
    store(out + i, a * sigmoid(a) * b);
}

// n = N * F outputs, f = F.
extern "C" __global__ void swiglu_forward(float* out, const float* inp, unsigned long long n,
                                          unsigned long long f) {
    swiglu_forward_body(out, inp, n, f);
}

extern "C" __global__ void swiglu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n,
                                               unsigned long long f) {
    swiglu_forward_body(out, inp, n, f);
}

// dinp [N,2F] (overwrite) = (dout * b * silu'(a), dout * silu(a)), with s = sigmoid(a) and
// silu'(a) = s (1 + a (1 - s)); one thread per element of dout, writing both halves.
template <typename T>
__device__ __forceinline__ void swiglu_backward_body(T* dinp, const T* inp, const T* dout,
                                                     unsigned long long n, unsigned long long f) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned long long at = i / f * 2 * f + i % f;
    const float a = to_float(inp[at]), b = to_float(inp[at + f]), d = to_float(dout[i]);
    const float s = sigmoid(a);
    store(dinp + at, d * b * (s * (1.0f + a * (1.0f - s))));
    store(dinp + at + f, d * (a * s));
}

extern "C" __global__ void swiglu_backward(float* dinp, const float* inp, const float* dout,
                                           unsigned long long n, unsigned long long f) {
    swiglu_backward_body(dinp, inp, dout, n, f);
}

extern "C" __global__ void swiglu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                                unsigned long long n, unsigned long long f) {
    swiglu_backward_body(dinp, inp, dout, n, f);
}
