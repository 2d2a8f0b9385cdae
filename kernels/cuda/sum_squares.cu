// Sum of squares in f64 (the global gradient norm), deterministic: stage one gives each
// block a fixed chunk of elements, whatever the GPU; stage two reduces the per-chunk sums
// in one block, in a fixed order.
#include "common.cuh"

extern "C" __global__ void sum_squares_partial(double* partial, const float* x, unsigned long long n,
                                               unsigned long long chunk) {
    __shared__ double scratch[WARP_SIZE];
    const unsigned long long begin = blockIdx.x * chunk;
    const unsigned long long end = min(n, begin + chunk);
    double acc = 0.0;
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double xi = x[i];
        acc += xi * xi;
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Launched as a single block.
extern "C" __global__ void sum_partials(double* out, const double* partial, int count) {
    __shared__ double scratch[WARP_SIZE];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = acc;
}
