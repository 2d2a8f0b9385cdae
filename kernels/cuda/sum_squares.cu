// Sums of squares in f64 of many tensors in one pass (every parameter gradient of a stage:
// the global gradient norm), deterministic, written to the device so the host reads them
// with the step's other values in its one synchronisation.
//
// Stage one gives each block a fixed chunk of one tensor, whatever the GPU; stage two
// reduces each tensor's chunk sums in one block, in a fixed order, into that tensor's slot.
// `first` [count + 1] numbers the stage-one blocks (common.cuh's owner()).
#include "common.cuh"

// One tensor of the host's table (kernels/src/cuda/readout.rs): its first element and its
// length.
struct SquaredTensor {
    const float* x;
    unsigned long long n;
};

extern "C" __global__ void sum_squares_chunks(double* partial, const SquaredTensor* tensors,
                                              const unsigned long long* first, int count,
                                              unsigned long long chunk) {
    __shared__ double scratch[WARP_SIZE];
    const int t = owner(first, count, blockIdx.x);
    const SquaredTensor x = tensors[t];
    const unsigned long long begin = (blockIdx.x - first[t]) * chunk;
    const unsigned long long end = min(x.n, begin + chunk);
    // The chunk in packs of 4 floats, one 128-bit global load each (the pointers come from a
    // table, so the compiler would otherwise load them generic and a float at a time), and
    // the last elements past the packs one by one; a part of a tensor that starts off a
    // 16-byte boundary (the distributed optimizer's) goes element by element throughout.
    // Either way each thread adds its elements in a fixed order.
    const float* p = x.x + begin;
    const unsigned long long n = end - begin;  // at least 1: a block is given only a chunk with elements
    const unsigned long long packed = aligned16(p) ? n / 4 * 4 : 0;
    double acc = 0.0;
    for (unsigned long long i = 4 * threadIdx.x; i < packed; i += 4 * blockDim.x) {
        const Pack<float> v = load_pack_streaming(p + i);
        #pragma unroll
        for (int k = 0; k < 4; ++k) acc += (double)v.x[k] * v.x[k];
    }
    for (unsigned long long i = packed + threadIdx.x; i < n; i += blockDim.x) {
        const double xi = p[i];
        acc += xi * xi;
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block per tensor: out[t] = the sum of its chunks' partial sums.
extern "C" __global__ void sum_squares_totals(double* out, const double* partial,
                                              const unsigned long long* first) {
    __shared__ double scratch[WARP_SIZE];
    const int t = blockIdx.x;
    double acc = 0.0;
    for (unsigned long long i = first[t] + threadIdx.x; i < first[t + 1]; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[t] = acc;
}
