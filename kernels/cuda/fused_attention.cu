// Causal self-attention in tiles, forward and backward, with no [T, T] tensor: scores are
// recomputed tile by tile, the softmax is taken online (a running maximum and sum per
// query row), tiles wholly above the diagonal are skipped (and under a sliding window of
// `window` keys, those wholly before it: query i sees keys j with i - window < j <= i;
// window = T is the causal mask), and the dropout mask of the
// probabilities is drawn from Philox inside the kernel at the CPU's element index
// (bh * T + i) * T + j, so forward and backward see the CPU's mask bit for bit.
//
// qkv [B, T, (NH + 2 KV) hs] holds each token's NH query heads, then KV key and KV value
// heads; query head h reads key/value head h / (NH / KV) in place (attention_head.cuh), so
// grouped-query attention copies nothing. out and dout are [B, T, NH hs]. Forward keeps per
// query row only lse = max + log(sum) [B*NH*T], from which backward recomputes P. Backward
// adds no atomics: one kernel owns each query tile (dq) and one each key tile of a
// key/value head (dk, dv, summed over the group's query heads in ascending order), so every
// sum has a fixed order.
//
// Launch: grid (T / TILE rounded up, B * NH) for the forward and the query side, (T / TILE
// rounded up, B * KV) for the key side; blocks of SIDE * SIDE = 256 threads; head sizes up
// to HS_MAX.
//
// Why the tiling is shaped so: every product here is a small matrix product out of shared
// memory, and fp32 FMAs on CUDA cores outrun shared loads unless each loaded value is used
// several times from registers. Thread (ty, tx) of the 16 x 16 grid owns a micro-tile:
// rows ty + 16a of the block's tile (a < 4) by columns tx + 16b (a key, a query or a
// dimension), so per step of a product it loads 4 + 4 values and makes 16 FMAs (0.5 loads
// per FMA, against 2 for one dot product per lane). Lanes of a warp differ in tx (16
// columns) and in ty by one, so with the XOR layout of `at` below no two lanes read one
// bank at different addresses. Per tile of work (hs = 64):
//   forward: S = Q K^T and O += P V over 64 x 64 keys: 8 loads per 16 FMAs in both.
//   backward, query side, 32 keys: S and dP = dO V^T (4 x 2 each: 12 loads per 16 FMAs),
//     dq += dS K (4 x 4: 8 per 16).
//   backward, key side, 16 queries: S^T and dP^T (4 x 1 each: 10 loads per 8 FMAs),
//     dk += dS^T Q and dv += P'^T dO (4 x 4 each: 16 loads per 32 FMAs).
// Shared memory is 48 KB per block in each kernel: the largest tiles that fit, the
// streaming tile of the backward kernels smaller than the block's own because those hold
// two stationary [64, 64] operands.
//
// Forward at GPT-2 small (B = 4, T = 1024, 12 heads of 64) makes 48 heads x 136 tiles x
// 64 x 64 pairs x 128 FMAs = 6.8 GFLOP; backward about twice that in each kernel. Shared
// loads alone would allow about 0.25 ms for the forward on an H100. Measured there, against
// one score per lane before: forward 0.66 ms (10 TFLOP/s; 1.5 ms before), query side
// 0.98 ms (2.5), key side 1.33 ms (4.3). What bounds them now is instruction issue, a
// scalar load and its address for every two FMAs, and a tile's global loads not overlapping
// its products.
#include "attention_head.cuh"
#include "common.cuh"
#include "philox.cuh"

#define TILE 64        // query rows (forward, backward query side) or keys (key side) per block
#define SIDE 16        // the thread grid is SIDE x SIDE
#define MICRO 4        // TILE / SIDE: rows, and columns of [., 64] products, per thread
#define HS_MAX 64      // the micro-tile of a [TILE, hs] output covers 64 columns
#define KEYS_BACK 32   // keys per step of the query side's backward
#define QUERIES_BACK 16  // queries per step of the key side's backward
// Three blocks per SM, as 3 x 48 KB of shared memory fit an H100's (or an A100's) SM:
// registers capped to fit, so one block computes while another waits on its loads.
#define BLOCKS_PER_SM 3

// Index of element (r, c) of a shared tile `cols` wide (a power of two, 16 to 64): columns
// are permuted within each aligned group of 16 by XOR with the row's low four bits, so both
// 16 consecutive columns of one row and one column of 16 consecutive rows fall in distinct
// banks (the tiles are read both ways and have no room for padding within 48 KB). As only
// low bits move, at(r + 16m, c + 16n) = at(r, c) + 16 (m cols + n) for r, c < 16: the
// elements of a micro-tile lie at one computed address plus constants.
__device__ __forceinline__ int at(int r, int c, int cols) { return r * cols + (c ^ (r & (SIDE - 1))); }

// How a tile holds rows of an operand: as [rows][HS_MAX], or transposed as [hs][rows].
enum Layout { ROWS, TRANSPOSED };

// Rows [row0, row0 + rows) of one [T, hs] operand (row stride `stride`) into tile, zeros
// past T; columns from hs on are not written. Consecutive threads read consecutive columns
// of a row, so the global loads coalesce (transposed, their stores meet two to a bank).
__device__ __forceinline__ void load_tile(float* tile, Layout layout, const float* src, unsigned long long stride,
                                          int row0, int rows, int T, int hs) {
#pragma unroll 4  // several loads in flight, not one at a time
    for (int e = threadIdx.x; e < rows * hs; e += blockDim.x) {
        const int r = e / hs, d = e % hs;
        const float x = row0 + r < T ? src[(unsigned long long)(row0 + r) * stride + d] : 0.0f;
        tile[layout == TRANSPOSED ? at(d, r, rows) : at(r, d, HS_MAX)] = x;
    }
}

// out [B, T, C] and lse [B * NH * T]. Thread (ty, tx) keeps, for query rows i0 + ty + 16a,
// the running maximum m, its own part of the sum l (over its key columns; the 16 lanes of
// the row add theirs at the end) and dimensions tx + 16c of the output o.
extern "C" __global__ void __launch_bounds__(SIDE * SIDE, BLOCKS_PER_SM)
    fused_attention_forward(float* out, float* lse, const float* qkv, int T, int NH, int KV, int hs, int window,
                            DropoutMask mask, int dropout) {
    __shared__ float q[HS_MAX * TILE];   // [hs][TILE]: the query tile, transposed
    __shared__ float kp[HS_MAX * TILE];  // [hs][TILE]: the key tile, transposed; then P [TILE][TILE]
    __shared__ float v[TILE * HS_MAX];   // [TILE][hs]: the value tile
    const Head hd = head_of(T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int tx = threadIdx.x % SIDE, ty = threadIdx.x / SIDE;
    const int i0 = blockIdx.x * TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    load_tile(q, TRANSPOSED, qkv + hd.q, hd.stride, i0, TILE, T, hs);

    float m[MICRO], l[MICRO], o[MICRO][MICRO];
    for (int a = 0; a < MICRO; ++a) {
        m[a] = NEG_INF;
        l[a] = 0.0f;
        for (int c = 0; c < MICRO; ++c) o[a][c] = 0.0f;
    }
    // Key tiles from the one holding the block's first row's first key up to the diagonal
    // one: the rest are masked out. Under the causal mask every row meets key j0 <= i in
    // each, so its maximum is finite from the first; under a window a row's first tiles may
    // hold none of its keys, and it stays at -inf, with nothing to scale, until one does.
    for (int j0 = max(0, i0 + 1 - window) / TILE * TILE; j0 <= i0; j0 += TILE) {
        __syncthreads();  // every thread is done with the previous tile's P and V
        load_tile(kp, TRANSPOSED, qkv + hd.k, hd.stride, j0, TILE, T, hs);
        load_tile(v, ROWS, qkv + hd.v, hd.stride, j0, TILE, T, hs);
        __syncthreads();  // the tiles (and the query tile) are loaded

        float s[MICRO][MICRO] = {};  // [row a][key b]
        for (int d = 0; d < hs; ++d) {
            const float *qd = q + at(d, ty, TILE), *kd = kp + at(d, tx, TILE);
            float qa[MICRO], kb[MICRO];
            for (int a = 0; a < MICRO; ++a) qa[a] = qd[SIDE * a];
            for (int b = 0; b < MICRO; ++b) kb[b] = kd[SIDE * b];
            for (int a = 0; a < MICRO; ++a)
                for (int b = 0; b < MICRO; ++b) s[a][b] += qa[a] * kb[b];
        }
        // The online softmax: s becomes p = exp(s - m_new), and what was summed under the old
        // maximum is scaled down to the new.
        for (int a = 0; a < MICRO; ++a) {
            const int i = i0 + ty + SIDE * a;
            float row_max = NEG_INF;
            for (int b = 0; b < MICRO; ++b) {
                const int j = j0 + tx + SIDE * b;
                s[a][b] = j <= i && i - j < window ? scale * s[a][b] : NEG_INF;
                row_max = fmaxf(row_max, s[a][b]);
            }
            const float m_new = fmaxf(m[a], warp_max(row_max, SIDE));
            const float shift = m_new == NEG_INF ? 0.0f : m_new;  // no key yet: every weight 0
            const float correction = expf(m[a] - shift);
            m[a] = m_new;
            l[a] *= correction;
            for (int c = 0; c < MICRO; ++c) o[a][c] *= correction;
            for (int b = 0; b < MICRO; ++b) {
                s[a][b] = expf(s[a][b] - shift);
                l[a] += s[a][b];
            }
        }
        if (dropout) {
            for (int a = 0; a < MICRO; ++a)
                for (int b = 0; b < MICRO; ++b)
                    s[a][b] *= dropout_factor(mask, hd.bh, T, i0 + ty + SIDE * a, j0 + tx + SIDE * b);
        }
        __syncthreads();  // every thread is done reading the key tile, which P overwrites
        for (int a = 0; a < MICRO; ++a)
            for (int b = 0; b < MICRO; ++b) kp[at(ty + SIDE * a, tx + SIDE * b, TILE)] = s[a][b];
        __syncthreads();  // P is written

        // o += P V; keys past T have P = 0 and zero rows of v. Dimensions from hs on read
        // columns of v never written and are never stored.
        for (int j = 0; j < TILE; ++j) {
            const float *pj = kp + at(ty, j, TILE), *vj = v + at(j, tx, HS_MAX);
            float pa[MICRO], vc[MICRO];
            for (int a = 0; a < MICRO; ++a) pa[a] = pj[SIDE * TILE * a];
            for (int c = 0; c < MICRO; ++c) vc[c] = vj[SIDE * c];
            for (int a = 0; a < MICRO; ++a)
                for (int c = 0; c < MICRO; ++c) o[a][c] += pa[a] * vc[c];
        }
    }
    for (int a = 0; a < MICRO; ++a) {
        const int i = i0 + ty + SIDE * a;
        const float sum = warp_sum(l[a], SIDE);
        if (i >= T) continue;
        float* y = out + hd.io + (unsigned long long)i * C;
        for (int c = 0; c < MICRO; ++c) {
            const int d = tx + SIDE * c;
            if (d < hs) y[d] = o[a][c] / sum;
        }
        if (tx == 0) lse[hd.bh * T + i] = m[a] + logf(sum);
    }
}

// Backward through the query side, one block per query tile: delta_i = dout_i . out_i
// (the softmax backward's sum_j P_ij dP_ij) into delta [B * NH * T] for the key side, and
// dq_i = scale * sum_j dS_ij k_j into dqkv, with P_ij = exp(s_ij - lse_i),
// dP_ij = keep_ij * (dout_i . v_j) and dS_ij = P_ij (dP_ij - delta_i). Thread (ty, tx)
// takes query rows i0 + ty + 16a: keys tx + 16b of each key tile, dimensions tx + 16c of dq.
extern "C" __global__ void __launch_bounds__(SIDE * SIDE, BLOCKS_PER_SM)
    fused_attention_backward_query(float* dqkv, float* delta, const float* qkv, const float* out, const float* dout,
                                   const float* lse, int T, int NH, int KV, int hs, int window, DropoutMask mask,
                                   int dropout) {
    __shared__ float q[HS_MAX * TILE];        // [hs][TILE]: the query tile, transposed
    __shared__ float dy[HS_MAX * TILE];       // [hs][TILE]: dout's rows, transposed
    __shared__ float k[HS_MAX * KEYS_BACK];   // [hs][KEYS_BACK]: the key tile, transposed
    __shared__ float vds[HS_MAX * KEYS_BACK];  // [hs][KEYS_BACK]: the value tile; then dS [TILE][KEYS_BACK]
    const Head hd = head_of(T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int tx = threadIdx.x % SIDE, ty = threadIdx.x / SIDE;
    const int i0 = blockIdx.x * TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    load_tile(q, TRANSPOSED, qkv + hd.q, hd.stride, i0, TILE, T, hs);
    load_tile(dy, TRANSPOSED, dout + hd.io, C, i0, TILE, T, hs);
    __syncthreads();  // dy is loaded

    float D[MICRO], row_lse[MICRO], dq[MICRO][MICRO];
    for (int a = 0; a < MICRO; ++a) {
        const int i = i0 + ty + SIDE * a;
        float part = 0.0f;
        for (int c = 0; c < MICRO; ++c) {
            const int d = tx + SIDE * c;
            if (i < T && d < hs) part += dy[at(d, ty + SIDE * a, TILE)] * out[hd.io + (unsigned long long)i * C + d];
            dq[a][c] = 0.0f;
        }
        D[a] = warp_sum(part, SIDE);
        if (tx == 0 && i < T) delta[hd.bh * T + i] = D[a];
        row_lse[a] = i < T ? lse[hd.bh * T + i] : 0.0f;
    }
    for (int j0 = max(0, i0 + 1 - window) / KEYS_BACK * KEYS_BACK; j0 < i0 + TILE && j0 < T; j0 += KEYS_BACK) {
        __syncthreads();  // every thread is done with the previous key tile and its dS
        load_tile(k, TRANSPOSED, qkv + hd.k, hd.stride, j0, KEYS_BACK, T, hs);
        load_tile(vds, TRANSPOSED, qkv + hd.v, hd.stride, j0, KEYS_BACK, T, hs);
        __syncthreads();  // the key tile is loaded

        float s[MICRO][2] = {}, dp[MICRO][2] = {};  // [row a][key b]
        for (int d = 0; d < hs; ++d) {
            const int row = at(d, ty, TILE), key = at(d, tx, KEYS_BACK);
            float qa[MICRO], ya[MICRO], kb[2], vb[2];
            for (int a = 0; a < MICRO; ++a) {
                qa[a] = q[row + SIDE * a];
                ya[a] = dy[row + SIDE * a];
            }
            for (int b = 0; b < 2; ++b) {
                kb[b] = k[key + SIDE * b];
                vb[b] = vds[key + SIDE * b];
            }
            for (int a = 0; a < MICRO; ++a)
                for (int b = 0; b < 2; ++b) {
                    s[a][b] += qa[a] * kb[b];
                    dp[a][b] += ya[a] * vb[b];
                }
        }
        if (dropout) {
            for (int a = 0; a < MICRO; ++a)
                for (int b = 0; b < 2; ++b)
                    dp[a][b] *= dropout_factor(mask, hd.bh, T, i0 + ty + SIDE * a, j0 + tx + SIDE * b);
        }
        // s becomes dS, 0 above the diagonal (and so for keys past T) and before the window.
        for (int a = 0; a < MICRO; ++a)
            for (int b = 0; b < 2; ++b) {
                const int i = i0 + ty + SIDE * a, j = j0 + tx + SIDE * b;
                const bool below = j <= i && i - j < window;
                s[a][b] = below ? expf(scale * s[a][b] - row_lse[a]) * (dp[a][b] - D[a]) : 0.0f;
            }
        __syncthreads();  // every thread is done reading the value tile, which dS overwrites
        for (int a = 0; a < MICRO; ++a)
            for (int b = 0; b < 2; ++b) vds[at(ty + SIDE * a, tx + SIDE * b, KEYS_BACK)] = s[a][b];
        __syncthreads();  // dS is written

        // dq += dS K. Dimensions from hs on read rows of k never written and are never stored.
        for (int j = 0; j < KEYS_BACK; ++j) {
            const float *dsj = vds + at(ty, j, KEYS_BACK), *kj = k + at(tx, j, KEYS_BACK);
            float dsa[MICRO], kc[MICRO];
            for (int a = 0; a < MICRO; ++a) dsa[a] = dsj[SIDE * KEYS_BACK * a];
            for (int c = 0; c < MICRO; ++c) kc[c] = kj[SIDE * KEYS_BACK * c];
            for (int a = 0; a < MICRO; ++a)
                for (int c = 0; c < MICRO; ++c) dq[a][c] += dsa[a] * kc[c];
        }
    }
    for (int a = 0; a < MICRO; ++a) {
        const int i = i0 + ty + SIDE * a;
        if (i >= T) break;
        float* g = dqkv + hd.q + (unsigned long long)i * hd.stride;
        for (int c = 0; c < MICRO; ++c) {
            const int d = tx + SIDE * c;
            if (d < hs) g[d] = scale * dq[a][c];
        }
    }
}

// Backward through the key side, one block per key tile of a key/value head (blockIdx.y =
// b * KV + g), after the query side (it reads delta): dv_j = sum_i P'_ij dout_i and dk_j =
// scale * sum_i dS_ij q_i over the query tiles from the diagonal on, of each query head of
// the group in ascending order. Thread (ty, tx) takes keys j0 + ty + 16a: query tx of each
// query tile, dimensions tx + 16c of dk and dv.
extern "C" __global__ void __launch_bounds__(SIDE * SIDE, BLOCKS_PER_SM)
    fused_attention_backward_key_value(float* dqkv, const float* qkv, const float* dout, const float* lse,
                                       const float* delta, int T, int NH, int KV, int hs, int window, DropoutMask mask,
                                       int dropout) {
    __shared__ float k[HS_MAX * TILE];             // [hs][TILE]: the key tile, transposed
    __shared__ float v[HS_MAX * TILE];             // [hs][TILE]: the value tile, transposed
    __shared__ float q[HS_MAX * QUERIES_BACK];     // [hs][QUERIES_BACK]: the query tile, transposed
    __shared__ float dy[HS_MAX * QUERIES_BACK];    // [hs][QUERIES_BACK]: dout's rows, transposed
    __shared__ float kept[TILE * QUERIES_BACK];    // [TILE][QUERIES_BACK]: P' = P keep, transposed
    __shared__ float ds[TILE * QUERIES_BACK];      // [TILE][QUERIES_BACK]: dS, transposed
    const Head kv = group_head(0, T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int tx = threadIdx.x % SIDE, ty = threadIdx.x / SIDE;
    const int j0 = blockIdx.x * TILE;
    const float scale = 1.0f / sqrtf((float)hs);
    load_tile(k, TRANSPOSED, qkv + kv.k, kv.stride, j0, TILE, T, hs);
    load_tile(v, TRANSPOSED, qkv + kv.v, kv.stride, j0, TILE, T, hs);

    float dk[MICRO][MICRO] = {}, dv[MICRO][MICRO] = {};
    for (int r = 0; r < NH / KV; ++r) {
        const Head hd = group_head(r, T, NH, KV, hs);
        // Query tiles up to the last query that sees the block's last key.
        for (int i0 = j0; i0 < T && i0 < j0 + TILE - 1 + window; i0 += QUERIES_BACK) {
            __syncthreads();  // every thread is done with the previous query tile, P' and dS
            load_tile(q, TRANSPOSED, qkv + hd.q, hd.stride, i0, QUERIES_BACK, T, hs);
            load_tile(dy, TRANSPOSED, dout + hd.io, C, i0, QUERIES_BACK, T, hs);
            __syncthreads();  // the query tile (and the key tile) are loaded

            const int i = i0 + tx;
            float s[MICRO] = {}, dp[MICRO] = {};  // [key a]
            for (int d = 0; d < hs; ++d) {
                const int query = at(d, tx, QUERIES_BACK), key = at(d, ty, TILE);
                const float qd = q[query], yd = dy[query];
                for (int a = 0; a < MICRO; ++a) {
                    s[a] += qd * k[key + SIDE * a];
                    dp[a] += yd * v[key + SIDE * a];
                }
            }
            float keep[MICRO];
            for (int a = 0; a < MICRO; ++a)
                keep[a] = dropout ? dropout_factor(mask, hd.bh, T, i, j0 + ty + SIDE * a) : 1.0f;
            // P' and dS, 0 above the diagonal, past the window and for queries past T.
            const float lse_i = i < T ? lse[hd.bh * T + i] : 0.0f, delta_i = i < T ? delta[hd.bh * T + i] : 0.0f;
            for (int a = 0; a < MICRO; ++a) {
                const int j = j0 + ty + SIDE * a;
                const bool below = j <= i && i - j < window && i < T;
                const float p = below ? expf(scale * s[a] - lse_i) : 0.0f;
                kept[at(ty + SIDE * a, tx, QUERIES_BACK)] = p * keep[a];
                ds[at(ty + SIDE * a, tx, QUERIES_BACK)] = p * (dp[a] * keep[a] - delta_i);
            }
            __syncthreads();  // P' and dS are written

            // dv += P'^T dO and dk += dS^T Q. Dimensions from hs on read rows of q and dy never
            // written and are never stored.
            for (int ii = 0; ii < QUERIES_BACK; ++ii) {
                const int key = at(ty, ii, QUERIES_BACK), dim = at(tx, ii, QUERIES_BACK);
                float pa[MICRO], dsa[MICRO], yc[MICRO], qc[MICRO];
                for (int a = 0; a < MICRO; ++a) {
                    pa[a] = kept[key + SIDE * QUERIES_BACK * a];
                    dsa[a] = ds[key + SIDE * QUERIES_BACK * a];
                }
                for (int c = 0; c < MICRO; ++c) {
                    yc[c] = dy[dim + SIDE * QUERIES_BACK * c];
                    qc[c] = q[dim + SIDE * QUERIES_BACK * c];
                }
                for (int a = 0; a < MICRO; ++a)
                    for (int c = 0; c < MICRO; ++c) {
                        dv[a][c] += pa[a] * yc[c];
                        dk[a][c] += dsa[a] * qc[c];
                    }
            }
        }
    }
    for (int a = 0; a < MICRO; ++a) {
        const int j = j0 + ty + SIDE * a;
        if (j >= T) break;
        float* g = dqkv + (unsigned long long)j * kv.stride;
        for (int c = 0; c < MICRO; ++c) {
            const int d = tx + SIDE * c;
            if (d < hs) {
                g[kv.k + d] = scale * dk[a][c];
                g[kv.v + d] = dv[a][c];
            }
        }
    }
}
