// GPT-2's tanh approximation of GELU: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// computed as the equal x * sigmoid(2u), as the CPU backend does: 1 + tanh(u) would cancel
// in the negative tail and lose the small outputs' relative precision there.

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_CUBE 0.044715f

// sigmoid(2u(x)); exp(-2u) overflows to infinity far in the negative tail, giving 0.
__device__ __forceinline__ float sigmoid_2u(float x) {
    return 1.0f / (1.0f + expf(-2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x)));
}

extern "C" __global__ void gelu_forward(float* out, const float* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = inp[i];
    out[i] = x * sigmoid_2u(x);
}

// dinp (overwrite) = gelu'(x) * dout, with s = sigmoid(2u): gelu' = s + x s (1 - s) 2 u'.
extern "C" __global__ void gelu_backward(float* dinp, const float* inp, const float* dout,
                                         unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = inp[i];
    const float s = sigmoid_2u(x);
    const float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    dinp[i] = (s + x * s * (1.0f - s) * 2.0f * du_dx) * dout[i];
}
