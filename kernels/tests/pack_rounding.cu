// common.cuh's bf16 rounding over pairs of floats: pack_bf16, a word a pair (on the GPU one
// cvt.rn.bf16x2.f32), and bf16_bits, a half-word an element (one cvt.rn.bf16.f32), both
// of which kernels/tests/cuda_ops.rs holds to the CPU's rounding (the `half` crate's) bit
// for bit, ties, subnormals and overflow included.
#include "common.cuh"

extern "C" __global__ void pack_rounding(unsigned int* packed, unsigned short* each, const float* x, int pairs) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    packed[i] = pack_bf16(x[2 * i], x[2 * i + 1]);
    each[2 * i] = bf16_bits(x[2 * i]);
    each[2 * i + 1] = bf16_bits(x[2 * i + 1]);
}
