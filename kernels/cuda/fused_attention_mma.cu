// Causal self-attention on tensor cores for `precision: bf16`: the fused kernels of
// fused_attention.cu (same arguments, same contract: causal, online softmax, tiles above
// the diagonal skipped, lse = max + log(sum), the CPU's Philox dropout mask drawn in the
// kernel at element (bh * T + i) * T + j, backward without atomics, deterministic) with
// every matrix product a warp's mma.sync m16n8k16 in bf16 (mma.cuh), FlashAttention-2
// style. The fp32 kernels spend most of a GPT-2 step in attention on CUDA cores; bf16
// operands into fp32 accumulators run those products on the tensor cores.
//
// Rounding: q, k, v and dout are rounded to bf16 as they are staged or loaded into
// fragments, and P, P' and dS before they enter a product; every accumulator, the softmax's maximum and sum, lse,
// delta and the outputs stay fp32.
//
// Tiles: blocks of WARPS = 4 warps own TILE = 64 rows (queries for the forward and the
// query side, keys for the key side), 16 rows a warp, the rows of one m16n8k16 product;
// the other side comes in tiles of 64, staged in shared memory as bf16 pairs (mma.cuh), in
// rows for the products that contract over the head dimension and in columns (transposed)
// for those that contract over the tile. A warp's [16, 64] scores are 8 accumulators of
// [16, 8], which, rounded, are the A operand of the next product with no trip through
// shared memory. Head sizes are multiples of 16 (the k of one product) up to HS_MAX.
//
// Work per call, counting a multiply-add as 2 FLOPs over the causal half of the T x T
// scores (the diagonal tiles' masked half is computed too): the forward makes 2 products
// (S = q k^T, O = P' v), 2 * 2 * B * NH * (T^2 / 2) * hs FLOPs; the backward 7 (the query
// side S, dP = dout v^T and dq; the key side S^T, dP^T, dv and dk), 7 * 2 * B * NH *
// (T^2 / 2) * hs. At GPT-2 124M's B = 4, T = 1024, 12 heads of 64: 6.4 GFLOP forward and
// 22.5 GFLOP backward per layer.
//
// Launch (per_attention_tile_bf16 in launch.rs): grid (T / TILE rounded up, B * NH), one
// block of WARPS warps per tile.
#include "attention_head.cuh"
#include "common.cuh"
#include "mma.cuh"
#include "philox.cuh"

#define TILE 64
#define WARPS 4
#define HS_MAX 64
// A staged row of bf16 pairs: TILE / 2 (= HS_MAX / 2) words, padded by 4 so that the
// lanes of a fragment load (rows g, words t: word 36 g + t) hit 32 different banks.
#define WORDS (TILE / 2 + 4)
#define STEPS (HS_MAX / 16)  // head-dimension k steps of a product, at most
#define DTILES (HS_MAX / 8)  // [16, 8] accumulators across the head dimension, at most
#define KTILES (TILE / 8)    // [16, 8] accumulators across a tile
// Fragments and accumulators are arrays that must live in registers, so every index into
// them must be known at compile time: loops over them are bounded by the array's size
// (STEPS, DTILES) and unrolled, and stop early at the head size.

// Rows [row0, row0 + TILE) of one [T, hs] operand (row stride `stride`) as bf16 pairs
// along the row: tile[r][w] = (x[row0 + r][2w], x[row0 + r][2w + 1]); zeros past T.
__device__ __forceinline__ void stage_rows(unsigned int (*tile)[WORDS], const float* x, unsigned long long stride,
                                           int row0, int T, int hs) {
    const int words = hs / 2;
    for (int e = threadIdx.x; e < TILE * words; e += blockDim.x) {
        const int r = e / words, w = e % words;
        const float* p = x + (unsigned long long)(row0 + r) * stride + 2 * w;
        tile[r][w] = row0 + r < T ? pack_bf16(p[0], p[1]) : 0u;
    }
}

// The same rows transposed, as bf16 pairs along the column: tile[d][w] =
// (x[row0 + 2w][d], x[row0 + 2w + 1][d]); zeros past T.
__device__ __forceinline__ void stage_columns(unsigned int (*tile)[WORDS], const float* x,
                                              unsigned long long stride, int row0, int T, int hs) {
    for (int e = threadIdx.x; e < TILE / 2 * hs; e += blockDim.x) {
        const int w = e / hs, d = e % hs, r = row0 + 2 * w;  // neighbouring threads read along a row
        const float lo = r < T ? x[(unsigned long long)r * stride + d] : 0.0f;
        const float hi = r + 1 < T ? x[(unsigned long long)(r + 1) * stride + d] : 0.0f;
        tile[d][w] = pack_bf16(lo, hi);
    }
}

// The multiplier of element (i, j) of head bh's probabilities: 1 without dropout, else
// attention_head.cuh's dropout factor.
__device__ __forceinline__ float keep_factor(const DropoutMask& mask, int dropout, unsigned long long bh, int T, int i,
                                             int j) {
    return dropout ? dropout_factor(mask, bh, T, i, j) : 1.0f;
}

// s = X Y^T over the head dimension for one warp, s[n] its columns [8n, 8n + 8): X's A
// fragments `x` (the warp's 16 rows, hs / 16 steps) against the staged rows of `y`.
__device__ __forceinline__ void scores(float s[KTILES][4], const unsigned int x[STEPS][4],
                                       const unsigned int (*y)[WORDS], int hs) {
    #pragma unroll
    for (int n = 0; n < KTILES; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < STEPS && 16 * kk < hs; ++kk) {
            unsigned int b[2];
            load_b(b, &y[0][0], WORDS, 8 * n, kk);
            mma_bf16_16816(s[n], x[kk], b);
        }
    }
}

// acc += P Y over the tile for one warp: P [16, TILE] in accumulators (rounded to bf16 as
// they enter), Y [TILE, hs] staged in columns (yt[d][w] pairs rows 2w, 2w + 1).
__device__ __forceinline__ void accumulate(float acc[DTILES][4], const float p[KTILES][4],
                                           const unsigned int (*yt)[WORDS], int hs) {
    #pragma unroll
    for (int c = 0; c < TILE / 16; ++c) {
        unsigned int a[4];
        a_from_accumulators(a, p[2 * c], p[2 * c + 1]);
        #pragma unroll
        for (int n = 0; n < DTILES && 8 * n < hs; ++n) {
            unsigned int b[2];
            load_b(b, &yt[0][0], WORDS, 8 * n, c);
            mma_bf16_16816(acc[n], a, b);
        }
    }
}

// The row and the column, within a warp's [16, 8] accumulator, of this lane's element e
// (0..3): rows g and g + 8, columns 2t and 2t + 1.
__device__ __forceinline__ int acc_row(int e) { return threadIdx.x % WARP_SIZE / 4 + 8 * (e / 2); }
__device__ __forceinline__ int acc_col(int e) { return 2 * (threadIdx.x % 4) + e % 2; }

// Over the four lanes of a quad (t = 0..3), which together hold a row of a product.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// out [B, T, C] and lse [B * NH * T]. Warp w owns query rows i0 + 16w .. + 15; this lane
// keeps the running maximum m, sum l and output o of its two rows g and g + 8.
extern "C" __global__ void fused_attention_forward_bf16(float* out, float* lse, const float* qkv, int T, int NH,
                                                        int hs, DropoutMask mask, int dropout) {
    __shared__ unsigned int k[TILE][WORDS];     // k[j][w]: key j0 + j, dimensions 2w, 2w + 1
    __shared__ unsigned int vt[HS_MAX][WORDS];  // vt[d][w]: dimension d of values j0 + 2w, j0 + 2w + 1
    const Head hd = head_of(T, NH, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int warp = threadIdx.x / WARP_SIZE;
    const int i0 = blockIdx.x * TILE, r0 = i0 + 16 * warp;
    const float scale = 1.0f / sqrtf((float)hs);

    unsigned int q[STEPS][4];  // the warp's [16, hs] queries, read once
    #pragma unroll
    for (int kk = 0; kk < STEPS && 16 * kk < hs; ++kk) load_a_rounded(q[kk], qkv + hd.qkv, 3 * C, r0, T, kk);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, o[DTILES][4];
    #pragma unroll
    for (int n = 0; n < DTILES; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // Key tiles up to the one holding the tile's last row: the rest are masked out.
    for (int j0 = 0; j0 <= i0 + TILE - 1 && j0 < T; j0 += TILE) {
        __syncthreads();  // every warp is done with the previous key tile
        stage_rows(k, qkv + hd.qkv + C, 3 * C, j0, T, hs);
        stage_columns(vt, qkv + hd.qkv + 2 * C, 3 * C, j0, T, hs);
        __syncthreads();  // the key tile is staged
        float s[KTILES][4];
        scores(s, q, k, hs);
        // Scaled and masked (j > i is -inf); the rows' new maxima over the quad. Key 0 is in
        // the first tile and every row's, so a row's maximum is finite from the first tile.
        float m_new[2] = {m[0], m[1]};
        #pragma unroll
        for (int n = 0; n < KTILES; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = r0 + acc_row(e), j = j0 + 8 * n + acc_col(e);
                s[n][e] = j <= i ? scale * s[n][e] : NEG_INF;
                m_new[e / 2] = fmaxf(m_new[e / 2], s[n][e]);
            }
        }
        float correction[2], sum[2] = {0.0f, 0.0f};
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_new[h] = quad_max(m_new[h]);
            correction[h] = expf(m[h] - m_new[h]);
            m[h] = m_new[h];
        }
        // P into s, summed undropped; then P' = P * keep, which the output accumulates.
        #pragma unroll
        for (int n = 0; n < KTILES; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = r0 + acc_row(e), j = j0 + 8 * n + acc_col(e);
                const float p = j <= i ? expf(s[n][e] - m[e / 2]) : 0.0f;
                sum[e / 2] += p;
                s[n][e] = p == 0.0f ? 0.0f : p * keep_factor(mask, dropout, hd.bh, T, i, j);
            }
        }
        #pragma unroll
        for (int h = 0; h < 2; ++h) l[h] = l[h] * correction[h] + quad_sum(sum[h]);
        #pragma unroll
        for (int n = 0; n < DTILES && 8 * n < hs; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] *= correction[e / 2];
        }
        accumulate(o, s, vt, hs);
    }
    #pragma unroll
    for (int n = 0; n < DTILES && 8 * n < hs; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = r0 + acc_row(e);
            if (i < T) out[hd.io + (unsigned long long)i * C + 8 * n + acc_col(e)] = o[n][e] / l[e / 2];
        }
    }
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = r0 + acc_row(2 * h);
        if (threadIdx.x % 4 == 0 && i < T) lse[hd.bh * T + i] = m[h] + logf(l[h]);
    }
}

// Backward through the query side, one block per query tile: delta_i = dout_i . out_i
// (fp32) into delta [B * NH * T] for the key side, and dq_i = scale * sum_j dS_ij k_j into
// dqkv, with P_ij = exp(s_ij - lse_i), dP_ij = keep_ij * (dout_i . v_j) and
// dS_ij = P_ij (dP_ij - delta_i).
extern "C" __global__ void fused_attention_backward_query_bf16(float* dqkv, float* delta, const float* qkv,
                                                               const float* out, const float* dout, const float* lse,
                                                               int T, int NH, int hs, DropoutMask mask, int dropout) {
    __shared__ unsigned int k[TILE][WORDS];     // keys in rows, for the scores
    __shared__ unsigned int kt[HS_MAX][WORDS];  // keys in columns, for dq
    __shared__ unsigned int v[TILE][WORDS];     // values in rows, for dP
    const Head hd = head_of(T, NH, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int warp = threadIdx.x / WARP_SIZE, t = threadIdx.x % 4;
    const int i0 = blockIdx.x * TILE, r0 = i0 + 16 * warp;
    const float scale = 1.0f / sqrtf((float)hs);

    unsigned int q[STEPS][4], dy[STEPS][4];  // the warp's queries and output gradients
    #pragma unroll
    for (int kk = 0; kk < STEPS && 16 * kk < hs; ++kk) {
        load_a_rounded(q[kk], qkv + hd.qkv, 3 * C, r0, T, kk);
        load_a_rounded(dy[kk], dout + hd.io, C, r0, T, kk);
    }
    // delta and lse of this lane's rows g and g + 8; the quad splits a row's dimensions.
    float D[2], L[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = r0 + acc_row(2 * h);
        float part = 0.0f;
        for (int d = t; i < T && d < hs; d += 4) {
            const unsigned long long at = hd.io + (unsigned long long)i * C + d;
            part += dout[at] * out[at];
        }
        D[h] = quad_sum(part);
        L[h] = i < T ? lse[hd.bh * T + i] : 0.0f;
        if (t == 0 && i < T) delta[hd.bh * T + i] = D[h];
    }
    float dq[DTILES][4];
    #pragma unroll
    for (int n = 0; n < DTILES; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int j0 = 0; j0 <= i0 + TILE - 1 && j0 < T; j0 += TILE) {
        __syncthreads();  // every warp is done with the previous key tile
        stage_rows(k, qkv + hd.qkv + C, 3 * C, j0, T, hs);
        stage_columns(kt, qkv + hd.qkv + C, 3 * C, j0, T, hs);
        stage_rows(v, qkv + hd.qkv + 2 * C, 3 * C, j0, T, hs);
        __syncthreads();  // the key tile is staged
        float s[KTILES][4], dp[KTILES][4];
        scores(s, q, k, hs);
        scores(dp, dy, v, hs);
        // dS into s; zero above the diagonal and in rows past T.
        #pragma unroll
        for (int n = 0; n < KTILES; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = r0 + acc_row(e), j = j0 + 8 * n + acc_col(e);
                float ds = 0.0f;
                if (j <= i && i < T) {
                    const float p = expf(scale * s[n][e] - L[e / 2]);
                    ds = p * (dp[n][e] * keep_factor(mask, dropout, hd.bh, T, i, j) - D[e / 2]);
                }
                s[n][e] = ds;
            }
        }
        accumulate(dq, s, kt, hs);
    }
    #pragma unroll
    for (int n = 0; n < DTILES && 8 * n < hs; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = r0 + acc_row(e);
            if (i < T) dqkv[hd.qkv + (unsigned long long)i * 3 * C + 8 * n + acc_col(e)] = scale * dq[n][e];
        }
    }
}

// Backward through the key side, one block per key tile, after the query side (it reads
// delta): dv_j = sum_i P'_ij dout_i and dk_j = scale * sum_i dS_ij q_i over the query
// tiles from the diagonal on. Warp w owns keys j0 + 16w .. + 15 and works on the
// transposed products: S^T = k q^T and dP^T = v dout^T, whose columns are queries.
extern "C" __global__ void fused_attention_backward_key_value_bf16(float* dqkv, const float* qkv, const float* dout,
                                                                   const float* lse, const float* delta, int T,
                                                                   int NH, int hs, DropoutMask mask, int dropout) {
    __shared__ unsigned int q[TILE][WORDS];      // queries in rows, for S^T
    __shared__ unsigned int qt[HS_MAX][WORDS];   // queries in columns, for dk
    __shared__ unsigned int dy[TILE][WORDS];     // output gradients in rows, for dP^T
    __shared__ unsigned int dyt[HS_MAX][WORDS];  // output gradients in columns, for dv
    __shared__ float L[TILE], D[TILE];           // lse and delta of the query tile
    const Head hd = head_of(T, NH, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int warp = threadIdx.x / WARP_SIZE;
    const int j0 = blockIdx.x * TILE, c0 = j0 + 16 * warp;
    const float scale = 1.0f / sqrtf((float)hs);

    unsigned int k[STEPS][4], v[STEPS][4];  // the warp's keys and values, read once
    #pragma unroll
    for (int kk = 0; kk < STEPS && 16 * kk < hs; ++kk) {
        load_a_rounded(k[kk], qkv + hd.qkv + C, 3 * C, c0, T, kk);
        load_a_rounded(v[kk], qkv + hd.qkv + 2 * C, 3 * C, c0, T, kk);
    }
    float dk[DTILES][4], dv[DTILES][4];
    #pragma unroll
    for (int n = 0; n < DTILES; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
    }

    for (int i0 = j0; i0 < T; i0 += TILE) {
        __syncthreads();  // every warp is done with the previous query tile
        stage_rows(q, qkv + hd.qkv, 3 * C, i0, T, hs);
        stage_columns(qt, qkv + hd.qkv, 3 * C, i0, T, hs);
        stage_rows(dy, dout + hd.io, C, i0, T, hs);
        stage_columns(dyt, dout + hd.io, C, i0, T, hs);
        for (int r = threadIdx.x; r < TILE; r += blockDim.x) {
            L[r] = i0 + r < T ? lse[hd.bh * T + i0 + r] : 0.0f;
            D[r] = i0 + r < T ? delta[hd.bh * T + i0 + r] : 0.0f;
        }
        __syncthreads();  // the query tile is staged
        float s[KTILES][4], dp[KTILES][4];
        scores(s, k, q, hs);
        scores(dp, v, dy, hs);
        // P' into s and dS into dp, both transposed (row j, column i); zero above the
        // diagonal and past T.
        #pragma unroll
        for (int n = 0; n < KTILES; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * n + acc_col(e), i = i0 + col, j = c0 + acc_row(e);
                float kept = 0.0f, ds = 0.0f;
                if (j <= i && i < T) {
                    const float p = expf(scale * s[n][e] - L[col]);
                    const float factor = keep_factor(mask, dropout, hd.bh, T, i, j);
                    kept = p * factor;
                    ds = p * (dp[n][e] * factor - D[col]);
                }
                s[n][e] = kept;
                dp[n][e] = ds;
            }
        }
        accumulate(dv, s, dyt, hs);
        accumulate(dk, dp, qt, hs);
    }
    #pragma unroll
    for (int n = 0; n < DTILES && 8 * n < hs; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = c0 + acc_row(e);
            if (j >= T) continue;
            float* g = dqkv + hd.qkv + (unsigned long long)j * 3 * C + 8 * n + acc_col(e);
            g[C] = scale * dk[n][e];
            g[2 * C] = dv[n][e];
        }
    }
}
