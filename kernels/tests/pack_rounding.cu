// mma.cuh's pack_bf16 over pairs of floats, a word a pair: on the GPU one
// cvt.rn.bf16x2.f32, which kernels/tests/cuda_ops.rs holds to the CPU's rounding (the `half`
// crate's) bit for bit, ties, subnormals and overflow included.
#include "mma.cuh"

extern "C" __global__ void pack_rounding(unsigned int* out, const float* x, int pairs) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < pairs) out[i] = pack_bf16(x[2 * i], x[2 * i + 1]);
}
