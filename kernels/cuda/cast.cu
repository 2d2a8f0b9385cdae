// The f32 -> bf16 cast that refreshes a parameter's bf16 copy after an op other than AdamW
// writes the parameter (an upload, a copy): the copy is the master rounded to nearest even.
//
// bf16 is handled as its bits (unsigned short) so no CUDA header is needed at run time;
// the rounding is common.cuh's bf16_bits. Each thread casts 8 elements, two
// 128-bit packs of the input and one of the output (common.cuh): launched over n / 8
// threads, rounded up.
#include "common.cuh"

extern "C" __global__ void f32_to_bf16(unsigned short* out, const float* inp, unsigned long long n) {
    const unsigned long long i = pack_start<unsigned short>();
    if (i >= n) return;
    const bool vector = whole_pack<unsigned short>(i, n) && aligned16(out) && aligned16(inp);
    // Past n, a pack reads zeros, never stored.
    const Pack<float> lo = load_pack(inp, i, n, vector), hi = load_pack(inp, i + Pack<float>::LEN, n, vector);
    Pack<unsigned short> bits;
    for (int k = 0; k < Pack<float>::LEN; ++k) {
        bits.x[k] = bf16_bits(lo.x[k]);
        bits.x[Pack<float>::LEN + k] = bf16_bits(hi.x[k]);
    }
    store_pack(out, bits, i, n, vector);
}
