// One warp's mma_bf16_16816 (kernels/cuda/mma.cuh) on whole matrices: d = a * b + c for
// a [16, 16], b [16, 8] and c [16, 8], row-major fp32 holding bf16 values. The fragments
// are written out here from the PTX ISA's layouts for m16n8k16 (g = lane / 4,
// t = lane % 4), independently of mma.cuh's loaders, so that a product that matches a plain
// matrix product pins both the layouts and the product: in the SIMT emulator
// (kernels/tests/simt/mma.rs) and on the GPU's tensor cores (kernels/tests/cuda_ops.rs).
#include "mma.cuh"

extern "C" __global__ void mma_layout(float* d, const float* a, const float* b, const float* c) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const unsigned int fa[4] = {
        pack_bf16(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),                    // row g, columns 2t, 2t+1
        pack_bf16(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),        // row g+8
        pack_bf16(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),                // row g, columns 2t+8, 2t+9
        pack_bf16(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]),    // row g+8
    };
    const unsigned int fb[2] = {
        pack_bf16(b[2 * t * 8 + g], b[(2 * t + 1) * 8 + g]),        // rows 2t, 2t+1 of column g
        pack_bf16(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]),  // rows 2t+8, 2t+9
    };
    float acc[4];
    for (int e = 0; e < 4; ++e) acc[e] = c[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2];  // rows g, g+8; columns 2t, 2t+1
    mma_bf16_16816(acc, fa, fb);
    for (int e = 0; e < 4; ++e) d[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = acc[e];
}
