// f32 <-> bf16 casts for bf16 compute with fp32 master weights: matmul operands are cast
// to bf16 just before cuBLAS multiplies them, and results stay f32.
//
// bf16 is handled as its bits (unsigned short) so no CUDA header is needed at run time.
// The rounding is round-to-nearest-even with NaN kept quiet, the same as __float2bfloat16_rn
// and as the `half` crate's bf16::from_f32, so both backends round alike.

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
    const unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    // Adding 0x7fff plus the lowest kept bit rounds the dropped half to nearest, ties to
    // even; a carry into the exponent is the correct rounding up (to infinity at the top).
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

extern "C" __global__ void f32_to_bf16(unsigned short* out, const float* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16_bits(inp[i]);
}

// Exact: a bf16 is the top half of an f32.
extern "C" __global__ void bf16_to_f32(float* out, const unsigned short* inp, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __uint_as_float((unsigned int)inp[i] << 16);
}
