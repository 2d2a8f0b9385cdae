// GPT-2's tanh approximation of GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_CUBE 0.044715f

extern "C" __global__ void gelu_forward(float* out, const float* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x)));
}

// dinp (overwrite) = gelu'(x) * dout. sech^2 is taken as 1 - tanh^2, which stays finite
// where cosh would overflow.
extern "C" __global__ void gelu_backward(float* dinp, const float* inp, const float* dout,
                                         unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = inp[i];
    const float th = tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    dinp[i] = grad * dout[i];
}
