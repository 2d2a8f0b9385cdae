// The f32 -> bf16 cast that refreshes a parameter's bf16 copy after an op other than AdamW
// writes the parameter (an upload, a copy): the copy is the master rounded to nearest even.
//
// bf16 is handled as its bits (unsigned short) so no CUDA header is needed at run time;
// the rounding is common.cuh's f32_to_bf16_bits.
#include "common.cuh"

extern "C" __global__ void f32_to_bf16(unsigned short* out, const float* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16_bits(inp[i]);
}
