// Elementwise arithmetic of the residual stream and of gradient accumulation.

// acc += x
extern "C" __global__ void accumulate(float* acc, const float* x, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}

// out = a + b (the residual add)
extern "C" __global__ void add(float* out, const float* a, const float* b, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
