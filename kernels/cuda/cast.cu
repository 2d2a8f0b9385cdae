// f32 <-> bf16 casts for bf16 compute with fp32 master weights: matmul operands are cast
// to bf16 just before cuBLAS multiplies them, and results stay f32.
//
// bf16 is handled as its bits (unsigned short) so no CUDA header is needed at run time;
// the rounding is common.cuh's f32_to_bf16_bits.
#include "common.cuh"

extern "C" __global__ void f32_to_bf16(unsigned short* out, const float* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16_bits(inp[i]);
}

// Exact: a bf16 is the top half of an f32.
extern "C" __global__ void bf16_to_f32(float* out, const unsigned short* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __uint_as_float((unsigned int)inp[i] << 16);
}
