// Causal self-attention in tiles, forward and backward, with no [T, T] tensor: scores are
// recomputed tile by tile, the softmax is taken online (a running maximum and sum per
// query row), tiles wholly above the diagonal are skipped, and the dropout mask of the
// probabilities is drawn from Philox inside the kernel at the CPU's element index
// (bh * T + i) * T + j, so forward and backward see the CPU's mask bit for bit.
//
// qkv [B, T, 3C] holds q, k, v side by side (head h at columns h * hs of each); out and
// dout are [B, T, C]. Forward keeps per query row only lse = max + log(sum) [B*NH*T], from
// which backward recomputes P. Backward adds no atomics: one kernel owns each query tile
// (dq) and one each key tile (dk, dv), so every sum has a fixed order.
//
// Launch: grid (T / TILE rounded up, B * NH), blocks of WARPS warps, each warp taking
// TILE / WARPS rows of its block's tile in turn; head sizes up to HS_MAX.
#include "common.cuh"
#include "philox.cuh"

#define TILE 32
#define WARPS 8
#define HS_MAX 64
// Tile rows are padded by one float: lane l reading element d of row l then hits bank
// (l + d) % 32 instead of all 32 lanes hitting bank d % 32.
#define ROW (HS_MAX + 1)

struct Head {
    unsigned long long qkv;  // offset of the head's q in qkv (row stride 3C)
    unsigned long long io;   // offset of the head's columns in out / dout (row stride C)
    unsigned long long bh;   // b * NH + h
};

__device__ __forceinline__ Head head_of(int T, int NH, int hs) {
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const unsigned long long C = (unsigned long long)NH * hs;
    return Head{(unsigned long long)b * T * 3 * C + (unsigned long long)h * hs, (unsigned long long)b * T * C + h * hs,
                (unsigned long long)bh};
}

// rows [row0, row0 + TILE) of one [T, hs] operand (row stride `stride`) into tile; zeros
// past T.
__device__ __forceinline__ void load_tile(float (*tile)[ROW], const float* src, unsigned long long stride,
                                          int row0, int T, int hs) {
    for (int e = threadIdx.x; e < TILE * hs; e += blockDim.x) {
        const int r = e / hs, d = e % hs;
        tile[r][d] = row0 + r < T ? src[(unsigned long long)(row0 + r) * stride + d] : 0.0f;
    }
}

// The multiplier of element (i, j) of head bh's probabilities: 1 without dropout, else
// 1 / (1 - p) or 0 as the mask keeps or drops it.
__device__ __forceinline__ float dropout_factor(const DropoutMask& mask, int dropout, unsigned long long bh, int T,
                                                int i, int j) {
    if (!dropout) return 1.0f;
    const unsigned long long index = (bh * T + i) * T + j;
    const uint4 words = mask_block_words(mask, (unsigned int)(index / 4));
    return mask_keeps(mask, uint4_word(words, (unsigned int)(index % 4))) ? mask.scale : 0.0f;
}

__device__ __forceinline__ float dot(const float* a, const float* b, int hs) {
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += a[d] * b[d];
    return s;
}

// out [B, T, C] and lse [B * NH * T]. Each warp keeps, for its rows of the query tile, the
// running maximum m, sum l and output o; lane `lane` scores key j0 + lane of each key tile
// and holds dimensions lane and lane + 32 of o.
extern "C" __global__ void fused_attention_forward(float* out, float* lse, const float* qkv, int T, int NH, int hs,
                                                   DropoutMask mask, int dropout) {
    __shared__ float q[TILE][ROW];
    __shared__ float k[TILE][ROW];
    __shared__ float v[TILE][ROW];
    const Head hd = head_of(T, NH, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int i0 = blockIdx.x * TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    load_tile(q, qkv + hd.qkv, 3 * C, i0, T, hs);

    float m[TILE / WARPS], l[TILE / WARPS], o[TILE / WARPS][2];
    for (int r = 0; r < TILE / WARPS; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
        o[r][0] = o[r][1] = 0.0f;
    }
    // Key tiles up to the one holding the tile's last row: the rest are masked out.
    for (int j0 = 0; j0 <= i0 + TILE - 1 && j0 < T; j0 += TILE) {
        __syncthreads();  // every warp is done with the previous key tile
        load_tile(k, qkv + hd.qkv + C, 3 * C, j0, T, hs);
        load_tile(v, qkv + hd.qkv + 2 * C, 3 * C, j0, T, hs);
        __syncthreads();  // the tiles (and the query tile) are loaded
        for (int r = 0; r < TILE / WARPS; ++r) {
            const int row = warp * (TILE / WARPS) + r, i = i0 + row, j = j0 + lane;
            if (i >= T) break;
            const float s = j <= i ? scale * dot(q[row], k[lane], hs) : NEG_INF;
            const float m_new = fmaxf(m[r], warp_max(s));
            const float p = j <= i ? expf(s - m_new) : 0.0f;
            const float correction = expf(m[r] - m_new);
            l[r] = l[r] * correction + warp_sum(p);
            m[r] = m_new;
            const float kept = p * dropout_factor(mask, dropout, hd.bh, T, i, j);
            o[r][0] *= correction;
            o[r][1] *= correction;
            for (int jj = 0; jj < TILE; ++jj) {
                const float pj = __shfl_sync(FULL_MASK, kept, jj);
                if (lane < hs) o[r][0] += pj * v[jj][lane];
                if (lane + WARP_SIZE < hs) o[r][1] += pj * v[jj][lane + WARP_SIZE];
            }
        }
    }
    for (int r = 0; r < TILE / WARPS; ++r) {
        const int i = i0 + warp * (TILE / WARPS) + r;
        if (i >= T) break;
        float* y = out + hd.io + (unsigned long long)i * C;
        if (lane < hs) y[lane] = o[r][0] / l[r];
        if (lane + WARP_SIZE < hs) y[lane + WARP_SIZE] = o[r][1] / l[r];
        if (lane == 0) lse[hd.bh * T + i] = m[r] + logf(l[r]);
    }
}

// Backward through the query side, one block per query tile: delta_i = dout_i . out_i
// (the softmax backward's sum_j P_ij dP_ij) into delta [B * NH * T] for the key side, and
// dq_i = scale * sum_j dS_ij k_j into dqkv, with P_ij = exp(s_ij - lse_i),
// dP_ij = keep_ij * (dout_i . v_j) and dS_ij = P_ij (dP_ij - delta_i).
extern "C" __global__ void fused_attention_backward_query(float* dqkv, float* delta, const float* qkv,
                                                          const float* out, const float* dout, const float* lse,
                                                          int T, int NH, int hs, DropoutMask mask, int dropout) {
    __shared__ float q[TILE][ROW];
    __shared__ float dy[TILE][ROW];
    __shared__ float k[TILE][ROW];
    __shared__ float v[TILE][ROW];
    const Head hd = head_of(T, NH, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int i0 = blockIdx.x * TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    load_tile(q, qkv + hd.qkv, 3 * C, i0, T, hs);
    load_tile(dy, dout + hd.io, C, i0, T, hs);
    __syncthreads();  // dy is loaded

    float D[TILE / WARPS], dq[TILE / WARPS][2];
    for (int r = 0; r < TILE / WARPS; ++r) {
        const int row = warp * (TILE / WARPS) + r, i = i0 + row;
        dq[r][0] = dq[r][1] = 0.0f;
        if (i >= T) break;
        const float* y = out + hd.io + (unsigned long long)i * C;
        float part = lane < hs ? dy[row][lane] * y[lane] : 0.0f;
        if (lane + WARP_SIZE < hs) part += dy[row][lane + WARP_SIZE] * y[lane + WARP_SIZE];
        D[r] = warp_sum(part);
        if (lane == 0) delta[hd.bh * T + i] = D[r];
    }
    for (int j0 = 0; j0 <= i0 + TILE - 1 && j0 < T; j0 += TILE) {
        __syncthreads();  // every warp is done with the previous key tile
        load_tile(k, qkv + hd.qkv + C, 3 * C, j0, T, hs);
        load_tile(v, qkv + hd.qkv + 2 * C, 3 * C, j0, T, hs);
        __syncthreads();  // the key tile is loaded
        for (int r = 0; r < TILE / WARPS; ++r) {
            const int row = warp * (TILE / WARPS) + r, i = i0 + row, j = j0 + lane;
            if (i >= T) break;
            float ds = 0.0f;
            if (j <= i) {
                const float p = expf(scale * dot(q[row], k[lane], hs) - lse[hd.bh * T + i]);
                const float dp = dot(dy[row], v[lane], hs) * dropout_factor(mask, dropout, hd.bh, T, i, j);
                ds = p * (dp - D[r]);
            }
            for (int jj = 0; jj < TILE; ++jj) {
                const float dsj = __shfl_sync(FULL_MASK, ds, jj);
                if (lane < hs) dq[r][0] += dsj * k[jj][lane];
                if (lane + WARP_SIZE < hs) dq[r][1] += dsj * k[jj][lane + WARP_SIZE];
            }
        }
    }
    for (int r = 0; r < TILE / WARPS; ++r) {
        const int i = i0 + warp * (TILE / WARPS) + r;
        if (i >= T) break;
        float* g = dqkv + hd.qkv + (unsigned long long)i * 3 * C;
        if (lane < hs) g[lane] = scale * dq[r][0];
        if (lane + WARP_SIZE < hs) g[lane + WARP_SIZE] = scale * dq[r][1];
    }
}

// Backward through the key side, one block per key tile, after the query side (it reads
// delta): dv_j = sum_i P'_ij dout_i and dk_j = scale * sum_i dS_ij q_i over the query
// tiles from the diagonal on; lane `lane` takes query i0 + lane of each query tile.
extern "C" __global__ void fused_attention_backward_key_value(float* dqkv, const float* qkv, const float* dout,
                                                              const float* lse, const float* delta, int T, int NH,
                                                              int hs, DropoutMask mask, int dropout) {
    __shared__ float q[TILE][ROW];
    __shared__ float dy[TILE][ROW];
    __shared__ float k[TILE][ROW];
    __shared__ float v[TILE][ROW];
    const Head hd = head_of(T, NH, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int j0 = blockIdx.x * TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    load_tile(k, qkv + hd.qkv + C, 3 * C, j0, T, hs);
    load_tile(v, qkv + hd.qkv + 2 * C, 3 * C, j0, T, hs);

    float dk[TILE / WARPS][2], dv[TILE / WARPS][2];
    for (int r = 0; r < TILE / WARPS; ++r) dk[r][0] = dk[r][1] = dv[r][0] = dv[r][1] = 0.0f;
    for (int i0 = j0; i0 < T; i0 += TILE) {
        __syncthreads();  // every warp is done with the previous query tile
        load_tile(q, qkv + hd.qkv, 3 * C, i0, T, hs);
        load_tile(dy, dout + hd.io, C, i0, T, hs);
        __syncthreads();  // the query tile (and the key tile) are loaded
        const int i = i0 + lane;
        const float lse_i = i < T ? lse[hd.bh * T + i] : 0.0f, delta_i = i < T ? delta[hd.bh * T + i] : 0.0f;
        for (int r = 0; r < TILE / WARPS; ++r) {
            const int row = warp * (TILE / WARPS) + r, j = j0 + row;
            if (j >= T) break;
            float kept = 0.0f, ds = 0.0f;
            if (j <= i && i < T) {
                const float p = expf(scale * dot(q[lane], k[row], hs) - lse_i);
                const float factor = dropout_factor(mask, dropout, hd.bh, T, i, j);
                kept = p * factor;
                ds = p * (dot(dy[lane], v[row], hs) * factor - delta_i);
            }
            for (int ii = 0; ii < TILE; ++ii) {
                const float pi = __shfl_sync(FULL_MASK, kept, ii), dsi = __shfl_sync(FULL_MASK, ds, ii);
                if (lane < hs) {
                    dv[r][0] += pi * dy[ii][lane];
                    dk[r][0] += dsi * q[ii][lane];
                }
                if (lane + WARP_SIZE < hs) {
                    dv[r][1] += pi * dy[ii][lane + WARP_SIZE];
                    dk[r][1] += dsi * q[ii][lane + WARP_SIZE];
                }
            }
        }
    }
    for (int r = 0; r < TILE / WARPS; ++r) {
        const int j = j0 + warp * (TILE / WARPS) + r;
        if (j >= T) break;
        float* g = dqkv + hd.qkv + (unsigned long long)j * 3 * C;
        for (int half = 0; half < 2; ++half) {
            const int d = lane + half * WARP_SIZE;
            if (d >= hs) break;
            g[C + d] = scale * dk[r][half];
            g[2 * C + d] = dv[r][half];
        }
    }
}
