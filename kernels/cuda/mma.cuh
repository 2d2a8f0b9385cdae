// Warp-level bf16 matrix products on tensor cores: mma.sync.aligned.m16n8k16 with bf16
// operands and fp32 accumulators (sm_80 and later), and the fragments it takes, the B
// fragments loaded from shared memory by ldmatrix.
//
// One instruction computes D = A * B + C for the whole warp: A [16, 16] and B [16, 8] in
// bf16, C and D [16, 8] in fp32. Each lane holds a fixed part of each operand, as the PTX
// ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group); a .b32 register holds two
// bf16, the lower column (A) or row (B) in its low 16 bits:
//   A, 4 registers:  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//                    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B, 2 registers:  b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C and D, 4 fp32: d[0] = D[g][2t]  d[1] = D[g][2t+1]  d[2] = D[g+8][2t]  d[3] = D[g+8][2t+1]
// So the A fragment of a row-major matrix, and the B fragment of the transpose of one
// (B[k][n] = X[n][k]), are pairs of neighbours along a row of X: a tile of bf16 pairs, one
// 32-bit word per two columns, serves both. And the accumulators of two neighbouring
// [16, 8] products are, rounded, the A fragment of their [16, 16] concatenation (see
// a_from_accumulators), so a product's result feeds the next product without shared memory.
//
// On the GPU the product is the instruction. Compiled for the host (the SIMT emulator of
// kernels/tests/simt), the lanes exchange their fragments with shuffles and each computes
// its four elements of D from the same layouts, so the harness checks the kernels'
// fragment bookkeeping; kernels/tests/simt/mma.rs pins the layouts against a plain
// matrix product, and kernels/tests/cuda_ops.rs runs the instruction against it. ldmatrix
// is emulated and pinned the same way (kernels/tests/ldmatrix_layout.cu).
#pragma once

#include "common.cuh"

// d += a * b over the warp, in the layouts above. Every lane of the warp must call it.
__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned int a[4], const unsigned int b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
    // No bf16 mma before sm_80: the file still compiles (the device compiles every source
    // for its GPU), and the device launches no kernel that uses this there.
    __trap();
#else
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    // Lane 4 * r + s holds columns 2s, 2s+1, 2s+8, 2s+9 of A's rows r and r+8, and the same
    // rows of B's column r; this lane needs A's rows g and g+8 and B's columns 2t and 2t+1
    // whole, so it takes them from the four lanes of each of those groups.
    float a_row[2][16], b_col[2][16];
    const auto element = [](unsigned int pair, int high) { return __uint_as_float((high ? pair >> 16 : pair) << 16); };
    for (int s = 0; s < 4; ++s) {
        // Two registers per 64-bit shuffle: a[0], a[1] (columns 2s, 2s+1 of rows g, g+8) and
        // a[2], a[3] (columns 2s+8, 2s+9), then B's registers from its two columns' lanes.
        const unsigned long long a01 = __shfl_sync(FULL_MASK, (unsigned long long)a[1] << 32 | a[0], 4 * g + s);
        const unsigned long long a23 = __shfl_sync(FULL_MASK, (unsigned long long)a[3] << 32 | a[2], 4 * g + s);
        const unsigned long long b_pair = (unsigned long long)b[1] << 32 | b[0];
        const unsigned long long b0 = __shfl_sync(FULL_MASK, b_pair, 4 * (2 * t) + s);
        const unsigned long long b1 = __shfl_sync(FULL_MASK, b_pair, 4 * (2 * t + 1) + s);
        for (int half = 0; half < 2; ++half) {
            a_row[0][2 * s + half] = element((unsigned int)a01, half);
            a_row[1][2 * s + half] = element((unsigned int)(a01 >> 32), half);
            a_row[0][2 * s + 8 + half] = element((unsigned int)a23, half);
            a_row[1][2 * s + 8 + half] = element((unsigned int)(a23 >> 32), half);
            b_col[0][2 * s + half] = element((unsigned int)b0, half);
            b_col[0][2 * s + 8 + half] = element((unsigned int)(b0 >> 32), half);
            b_col[1][2 * s + half] = element((unsigned int)b1, half);
            b_col[1][2 * s + 8 + half] = element((unsigned int)(b1 >> 32), half);
        }
    }
    // Products of bf16 are exact in fp32; the sum is fp32, in k order (the tensor core's
    // order and intermediate rounding are its own: the kernels are checked to a tolerance).
    for (int e = 0; e < 4; ++e) {
        float sum = d[e];
        for (int k = 0; k < 16; ++k) sum += a_row[e / 2][k] * b_col[e % 2][k];
        d[e] = sum;
    }
#endif
}

// Four 8x8 matrices of bf16 from shared memory in one instruction for the warp (ldmatrix
// .x4, sm_75 and later): lane 8i + r gives the address of row r of matrix i (16 bytes,
// 16-byte aligned), and this lane receives row g of each matrix, elements 2t and 2t + 1,
// the layout of a B register: matrices 0 and 1 into `lo`, 2 and 3 into `hi`. The emulator
// has each lane read its words through the addresses the others give.
__device__ __forceinline__ void load_matrices(unsigned int lo[2], unsigned int hi[2], const unsigned int* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(lo[0]), "=r"(lo[1]), "=r"(hi[0]), "=r"(hi[1])
                 : "r"((unsigned int)__cvta_generic_to_shared(row)));
#elif defined(__CUDA_ARCH__)
    __trap();  // as mma_bf16_16816 before sm_80
#else
    const int lane = threadIdx.x % WARP_SIZE;
    for (int i = 0; i < 4; ++i) (i < 2 ? lo : hi)[i % 2] = __shfl_sync(FULL_MASK, row, 8 * i + lane / 4)[lane % 4];
#endif
}

// The same four matrices transposed (ldmatrix .x4 .trans): this lane receives column g of
// each, elements 2t and 2t + 1, that is rows 2t and 2t + 1 of a matrix whose rows run
// along k, the layout of a B register.
__device__ __forceinline__ void load_matrices_transposed(unsigned int lo[2], unsigned int hi[2],
                                                         const unsigned int* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(lo[0]), "=r"(lo[1]), "=r"(hi[0]), "=r"(hi[1])
                 : "r"((unsigned int)__cvta_generic_to_shared(row)));
#elif defined(__CUDA_ARCH__)
    __trap();  // as mma_bf16_16816 before sm_80
#else
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const auto top = reinterpret_cast<const unsigned short*>(__shfl_sync(FULL_MASK, row, 8 * i + 2 * t));
        const auto next = reinterpret_cast<const unsigned short*>(__shfl_sync(FULL_MASK, row, 8 * i + 2 * t + 1));
        (i < 2 ? lo : hi)[i % 2] = (unsigned int)top[g] | (unsigned int)next[g] << 16;
    }
#endif
}

// The row this lane gives load_b_pair's ldmatrix in a tile of bf16 pairs (row stride
// `stride` words), before the pair's offset: lane 8i + r gives row r of matrix i, rows 0-7
// for matrices 0 and 1 and rows 8-15 for 2 and 3, 4 words (8 columns) on for 1 and 3.
__device__ __forceinline__ const unsigned int* b_origin(const unsigned int* tile, int stride) {
    const int lane = threadIdx.x % WARP_SIZE;
    return tile + (8 * (lane / 16) + lane % 8) * stride + 4 * (lane / 8 % 2);
}

// The B fragments B[k][n] = X[n0 + n][16 kk + k] and X[n0 + 8 + n][16 kk + k] of a tile X of
// bf16 pairs, `lo` and `hi`: the transposes of X's rows [n0, n0 + 8) and [n0 + 8, n0 + 16),
// columns [16 kk, 16 kk + 16), as the four matrices of one ldmatrix. `origin` is
// b_origin's of the tile, computed once, so that with n0, kk and stride known at compile
// time the instruction's address is a constant offset from it. Loaded a word at a time,
// the two fragments took four shared loads and, computing each row from the lane, eight
// integer instructions (the SASS of NVRTC 13.0 for sm_90). The rows of a tile padded as
// fused_attention_mma.cu's are (a row 4 words more than a multiple of 32) are read free of
// bank conflicts: 8 rows of 16 bytes start 4 banks apart.
__device__ __forceinline__ void load_b_pair(unsigned int lo[2], unsigned int hi[2], const unsigned int* origin,
                                            int stride, int n0, int kk) {
    load_matrices(lo, hi, origin + n0 * stride + 8 * kk);
}

// The row this lane gives load_bt_pair's ldmatrix in a tile of bf16 pairs (row stride
// `stride` words), before the pair's offset: lane 8i + r gives row r of matrix i, rows 0-7
// for matrices 0 and 2 and rows 8-15 for 1 and 3, 4 words (8 columns) on for 2 and 3.
__device__ __forceinline__ const unsigned int* bt_origin(const unsigned int* tile, int stride) {
    const int lane = threadIdx.x % WARP_SIZE;
    return tile + (8 * (lane / 8 % 2) + lane % 8) * stride + 4 * (lane / 16);
}

// The B fragments B[k][n] = X[k0 + k][8 c0 + n] and X[k0 + k][8 c0 + 8 + n] of a tile X of
// bf16 pairs, `lo` and `hi`: X's rows [k0, k0 + 16), columns [8 c0, 8 c0 + 8) and the next
// 8, read down the columns, as the four matrices of one transposing ldmatrix (`origin`
// bt_origin's of the tile; c0 counts 8-column runs, 4 words each). A product that contracts
// over a tile's rows (P'V) thus takes its B operand from the rows as they are staged.
// Free of bank conflicts in a tile padded as load_b_pair's.
__device__ __forceinline__ void load_bt_pair(unsigned int lo[2], unsigned int hi[2], const unsigned int* origin,
                                             int stride, int k0, int c0) {
    load_matrices_transposed(lo, hi, origin + k0 * stride + 4 * c0);
}

// The A fragment of rows [r0, r0 + 16) and columns [16 kk, 16 kk + 16) of a tile of bf16
// pairs in shared memory, one ldmatrix: `origin` is b_origin's of the tile's row r0. Its
// matrices come in b_origin's order, columns 0-7 and 8-15 of rows 0-7 before those of rows
// 8-15, and the fragment takes them as rows before columns: 0, 2, 1, 3.
__device__ __forceinline__ void load_a_shared(unsigned int a[4], const unsigned int* origin, int kk) {
    unsigned int lo[2], hi[2];
    load_matrices(lo, hi, origin + 8 * kk);
    a[0] = lo[0];
    a[1] = hi[0];
    a[2] = lo[1];
    a[3] = hi[1];
}

// The A fragment of rows [r0, r0 + 16) and columns [16 kk, 16 kk + 16) of a row-major bf16
// matrix x in global memory (row stride `stride`), as it is stored: each register is one
// 4-byte load of a pair of neighbours, aligned where x is 4-byte aligned and `stride` even
// (a pair starts at an even column). Rows from `rows` on read as zeros.
__device__ __forceinline__ void load_a_bf16(unsigned int a[4], const bf16* x, unsigned long long stride, int r0,
                                            int rows, int kk) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = r0 + g + 8 * (r % 2), col = 16 * kk + 2 * t + 8 * (r / 2);
        const bf16* p = x + (unsigned long long)row * stride + col;
        a[r] = row < rows ? *reinterpret_cast<const unsigned int*>(p) : 0u;
    }
}

// The A fragment of columns [16 c, 16 c + 16) of a [16, N] fp32 product held as [16, 8]
// accumulators, rounded to bf16: acc[2c] and acc[2c+1] (`lo` and `hi`) hold exactly the
// rows and columns that the fragment's registers need.
__device__ __forceinline__ void a_from_accumulators(unsigned int a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}
