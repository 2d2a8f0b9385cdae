// One warp's load_b_pair and load_bt_pair (kernels/cuda/mma.cuh): 16 rows of 16 words
// (32 bf16 as pairs) staged in shared memory in rows of 36 words, as fused_attention_mma.cu
// pads a tile at head size 64, and this lane's two B fragments from each, written out as
// loaded: out[(32 s + lane) * 4 + i] is lo[0], lo[1], hi[0], hi[1] of load_b_pair at k step
// s (s = 0, 1), then of load_bt_pair at column runs 2 (s - 2) and 2 (s - 2) + 1 (s = 2, 3).
// The words to expect follow from the PTX ISA's B layout for m16n8k16 (g = lane / 4,
// t = lane % 4), in kernels/tests/simt/mma.rs and kernels/tests/cuda_ops.rs. Every bf16 of
// the tile differs, so a wrong row, column or lane fails: in the SIMT emulator and on the
// GPU's ldmatrix.
#include "mma.cuh"

#define STRIDE 36

extern "C" __global__ void ldmatrix_layout(unsigned int* out, const unsigned int* x) {
    alignas(16) __shared__ unsigned int tile[16][STRIDE];
    for (int i = threadIdx.x; i < 16 * 16; i += WARP_SIZE) tile[i / 16][i % 16] = x[i];
    __syncthreads();
    const unsigned int *origin = b_origin(&tile[0][0], STRIDE), *across = bt_origin(&tile[0][0], STRIDE);
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
        unsigned int lo[2], hi[2];
        if (s < 2) load_b_pair(lo, hi, origin, STRIDE, 0, s);
        else load_bt_pair(lo, hi, across, STRIDE, 0, 2 * (s - 2));
        unsigned int* o = out + (s * WARP_SIZE + threadIdx.x) * 4;
        o[0] = lo[0];
        o[1] = lo[1];
        o[2] = hi[0];
        o[3] = hi[1];
    }
}
