// Causal self-attention on tensor cores for `precision: bf16`: the fused kernels of
// fused_attention.cu (the same arguments, with qkv, out, dout and dqkv stored as bf16; the
// same contract: causal (or a sliding window of `window` keys), online softmax, tiles
// above the diagonal (and wholly before the window) skipped, lse = max +
// log(sum), the CPU's Philox dropout mask drawn in the kernel at element (bh * T + i) * T
// + j, no atomics on any value, deterministic) with every matrix product a warp's
// mma.sync m16n8k16 in bf16 (mma.cuh), FlashAttention-2 style. The fp32 kernels spend
// most of a GPT-2 step in attention on CUDA cores; bf16 operands into fp32 accumulators run
// those products on the tensor cores.
//
// The backward is one kernel from the key side, which also sums dq: each streamed query
// tile's dq is a chain of fp32 partial sums in global memory, handed from key tile to key
// tile, from the one holding its queries down to 0, by turns (turns.cuh), so that its
// order is fixed, as FlashAttention 3's deterministic backward fixes it. That makes five
// products a tile where a query side and a key side make seven between them (S and dP are
// computed once, not once a side). Until 2026-11-27 the kernels for heads up to 128 kept
// the two sides: the key tile, dS^T and double-buffered query and output gradient tiles
// would not fit 48 KB of static shared memory. The output gradients are now staged in one
// buffer, the next tile's after every warp is done with the current one, and dS^T over the
// query tile the dk product was the last to read; the warps read their keys' fragments
// from the staged key tile, which frees the registers that held them.
//
// Storage and rounding: under `precision: bf16` every [B, T, *] tensor is stored as bf16
// (common.cuh's bf16): qkv, out and dout arrive as bf16 and enter the products as they are,
// staged and loaded into fragments with no rounding; lse and delta, per-row statistics,
// are fp32. Inside the kernels P, P' and dS are rounded to bf16 before they enter a
// product; every accumulator, the softmax's maximum and sum, lse and delta (dout_i . out_i
// in fp32 from the bf16 values) stay fp32, and out and dqkv are rounded once, to nearest
// even, as they are stored. Exponentials are powers of 2 (exp2_ftz, one instruction) of
// one multiply-add, s log2(e) / sqrt(hs) - m, the softmax's maximum m in those units (in
// the backward, lse in them).
//
// Tiles: blocks of WARPS = 4 warps own ROWS = 64 rows (queries for the forward, keys for
// the backward), 16 rows a warp, the rows of one m16n8k16 product;
// the forward at head size 64 owns 128, two such row tiles a warp (M = 2), so that each
// B fragment it loads feeds two products. The other side streams through in tiles of 64
// rows (the backward's at HS = 128: 32), staged in shared memory as bf16
// pairs along the row (mma.cuh). Products that contract over the head dimension take
// their B fragments from those rows with one ldmatrix a pair of column tiles
// (load_b_pair); products that contract over the tile (P' v, dS k, P'^T dout, dS^T q)
// take them from the same rows with one transposing ldmatrix (load_bt_pair): no tile is
// staged twice, transposed. A warp's [16, 64] scores are 8 accumulators of [16, 8],
// which, rounded, are the A operand of the next product with no trip through shared
// memory. Head sizes are multiples of 16 (the k of one product) up to HS; below it the
// products run over HS, the zeros past hs (in the fragments and the staged tiles)
// included.
//
// Staging, double-buffered with one barrier per tile, so that tile n + 1's loads run under
// tile n's tensor-core work: the forward copies tile n + 1's keys and values straight into
// the other buffers as tile n begins (copy_tile: cp.async, 16 bytes of 8 bf16 along the
// rows a copy, no register in between; since 2026-11-27, when it freed 31 registers at head
// size 128 and 14 at 64 (sm_90), and issued the values' loads a tile's scores earlier); the
// backward issues tile n + 1's loads into registers (fetch_tile, every load of a thread in
// flight at once) before a product of tile n and stores them as loaded to the other buffer
// (store_tile) after it. The barrier at the top of each tile both publishes the tile
// staged during the previous one and retires the buffer the next will overwrite. Only
// tiles that cross the diagonal (or T, or a window's edge) are masked;
// the others take no per-element test. With dropout on, a lane draws its 32 elements' mask
// bits in a loop of their own (kept); with it off nothing is drawn and no element tests a
// bit.
//
// Registers (ptxas through NVRTC 13.0, -Xptxas -v, sm_80 and sm_90; scripts/sass-mix): at
// head size 64 the forward, which holds two row tiles' queries, scores and outputs, takes
// 241 (sm_90) to 255 (sm_80) and spills none, 2 blocks (8 warps) an SM (with one row tile a
// warp, until 2026-11-27, it took 158 to 163, and 3 blocks shared an SM). The backward
// kernels, which hold two [16, HS] fp32 accumulators and the next tile's loads (4 of 16
// bytes a thread) besides, and dq's [16, 64] after dS^T is staged, take 255, 2 blocks an
// SM; at 64 they spill none. Their shared memory (KeySide: 37,892 bytes at 64, 44,036 at
// 128) would allow 5 and 4. At 128 the backward, which holds dk and dv [16, 128] and its
// values, takes 255 with 20 (sm_90) to 32 (sm_80) bytes spilled, of which one local access
// (sm_90) is within its loop over tiles, where the two-sided key side's had 23. At 128 the
// forward streams 64 keys a tile (since 2026-11-27; 32 before, in static shared memory):
// 217 registers (211 at sm_80) and no spills, its 69,632 bytes of staged tiles in dynamic
// shared memory, 2 blocks an SM where it has the 136 KB for two (the A100's 164 KB, the
// H100's 228), 1 on sm_86 and sm_89 (100 KB).
//
// Instructions (the SASS of NVRTC 13.0 for sm_90, scripts/sass-mix): with one row tile a
// warp, a tile of the forward at head size 64, unmasked and without dropout, issued about
// 406 instructions a warp for its 64 products (traced by hand), of which the softmax is
// 147 (a max, a multiply-add, an exponential and an add an element); that form ran at 173
// TFLOP/s on an H200 (2026-11-27). With two row tiles a warp, the loop body with the mask
// and dropout compiled out is 786 instructions for 128 products, where the same count
// gives 464 for 64: 6.1 a product where 7.3 were, an ldmatrix for 4 products where it was
// for 2, and twice the independent products a warp has in flight, with 8 warps an SM where
// 12 were. Not yet timed on a GPU. At 128, with the same count, a tile of 64 keys is 736
// instructions for 128 products, where a tile of 32 was 423 for 64: 5.8 a product where
// 6.6 were, the fixed work of a tile (its barrier, the rows' maxima and their correction
// of the [16, 128] outputs, 64 multiplies) now spread over twice the products. Not yet
// timed on a GPU either. With the tiles copied by cp.async the two bodies are 764 and 742
// instructions: the copies' addresses cost what the stores saved; the gain is in registers
// and in the values' loads in flight for longer. Until 2026-11-27 a tile issued about 960:
// a branch between any two products over the head dimension (the test of the run-time hs, now
// gone), which also kept their chains from overlapping; 2 integer instructions a shared
// load for its address and 2 a P'V product to pick its B register's halves (now ldmatrix,
// straight and transposed); the 3 instructions exp2f sets around each exponential for
// denormal results (now none, exp2_ftz); a multiply a score for the scale (now inside the
// exponent's multiply-add); the fetches' bounds tests on every tile (now the last only).
// The loop bodies, every path counted once, went from 1186 to 703 (forward; 1292 for two
// row tiles), 1308 to 702 (query side) and 1939 to 1044 (key side).
//
// Where the time went before this design (an estimate from the code and the measured
// 0.69 / 0.78 / 1.02 ms per call at GPT-2 small on an H100, not a profile): staging loops
// of scalar 4-byte loads with a run-time division per element, each iteration waiting on
// its own loads, between two barriers per tile, so that every tile cost a few global
// round trips that nothing overlapped; transposed copies written with 8-way bank
// conflicts; expf and a causal test on every element of every tile. Measured on the same
// H100 (ncu, its locked clocks) this design takes 0.168 / 0.214 / 0.270 ms, about 4x less,
// with qkv, out and dout still stored as fp32; bf16 storage halves the bytes the kernels
// read and write.
//
// Work per call, counting a multiply-add as 2 FLOPs over the causal half of the T x T
// scores (the diagonal tiles' masked half is computed too): the forward makes 2 products
// (S = q k^T, O = P' v), 2 * 2 * B * NH * (T^2 / 2) * hs FLOPs; the backward 5 (S^T, dP^T,
// dv, dk and dq), 5 times 2 * B * NH * (T^2 / 2) * hs, where a query side and a key side
// made 7 (S, dP = dout v^T and dq; S^T, dP^T, dv and dk). At
// GPT-2 124M's B = 4, T = 1024, 12 heads of 64: 6.4 GFLOP forward and 16.1 GFLOP backward
// per layer (22.5 in the two kernels before 2026-11-27). The chain adds 16 KiB of fp32 a
// query tile and key tile, written and read back (from L2, mostly: the next key tile's
// block reads it a tile's work later); at 128 the query tiles are 32 rows of 128 columns.
//
// Launch (per_attention_tile_bf16 in launch.rs, per_attention_forward_bf16 for the
// forward): grid (T / ROWS rounded up, B * NH), one block of WARPS warps per tile of a
// query head (T / 128 for the forward at head size 64; so too the backward's delta
// launch, at T / ROWS); the backward's grid is (T / ROWS rounded up, B * KV), a block per
// key tile of a key/value head, which streams the query tiles of each query head of its
// group in turn (grouped-query attention reads the shared k and v in place). GPUs in
// practice dispatch blocks in order of blockIdx.x (x fastest), and the causal half makes
// a block's work proportional to the tiles it streams, so the longest go first and the
// last wave holds the shortest: the forward takes its query tiles in reverse (block 0 the
// last tile, which streams every key tile). The backward's blocks take their key tiles
// from tickets, the last tile first, since key tile j waits on j + 1's sums: a block
// always waits on one that started before it (turns.cuh), and, key tile by key tile,
// trails it by a query tile's work (two at 128, whose query tiles are half a key tile).
#include "async_copy.cuh"
#include "attention_head.cuh"
#include "common.cuh"
#include "mma.cuh"
#include "philox.cuh"
#include "turns.cuh"

#define ROWS 64  // a block's own rows: keys (backward) or queries (the forward, M times)
#define WARPS 4  // of 16 rows each, the rows of one m16n8k16 product
#define THREADS (WARPS * WARP_SIZE)
#define LN2 0.6931471805599453f

// A kernel's sizes at head sizes up to HS, 64 or 128 (each kernel is compiled for both),
// the other side streaming through in tiles of STREAM rows (the shapes below).
template <int HS_, int STREAM_>
struct Shape {
    static constexpr int HS = HS_, STREAM = STREAM_;
    // A staged row of bf16 pairs: HS / 2 words, padded by 4 so that the 8 rows of 16 bytes
    // an ldmatrix matrix reads (rows r0 + r: word (HS / 2 + 4) r = 4r mod 32 on from the
    // first) start 4 banks apart and cover the 32 banks once, and a quarter-warp's 16-byte
    // stores in store_tile cover 32 consecutive words. A row is 144 or 272 bytes, so every
    // run of 4 words from a multiple of 4 is 16-byte aligned, as ldmatrix's rows must be.
    static constexpr int WORDS = HS / 2 + 4;
    static constexpr int STEPS = HS / 16;   // head-dimension k steps of a product, at most
    static constexpr int DTILES = HS / 8;   // [16, 8] accumulators across the head dimension
    static constexpr int KTILES = STREAM / 8;  // [16, 8] accumulators across a streamed tile
    static constexpr int OCTS = HS / 8;     // 16-byte runs of 8 bf16 in a row, at most
    static constexpr int FETCHES = STREAM * OCTS / THREADS;  // 16-byte loads a thread makes of a tile
    static constexpr int FETCH_ROWS = THREADS / OCTS;
    // dq of a streamed query tile in the backward: its QUERY_TILES row tiles of 16 queries
    // share the WARPS warps, each taking DQ_TILES [16, 8] column tiles (the whole head
    // dimension at 64, half of it at 128); dS^T is staged in rows of DS_WORDS words, the
    // tile's queries as bf16 pairs, padded as a tile's rows are.
    static constexpr int QUERY_TILES = STREAM / 16;
    static constexpr int DQ_TILES = DTILES * QUERY_TILES / WARPS;
    static constexpr int DS_WORDS = STREAM / 2 + 4;
};
// The kernels' shapes. The backward streams 32 query rows at head size 128, so that KeySide
// fits 48 KB of static shared memory and its scores beside dk and dv fit a warp's registers;
// the forward streams 64 key rows at both, its staged tiles at 128 (69,632 bytes) in
// dynamic shared memory, so that each tile's fixed work (a barrier, the rows' maxima, the
// correction of the [16, 128] outputs) serves 128 products a warp where it served 64.
using Forward64 = Shape<64, 64>;
using Forward128 = Shape<128, 64>;
using Backward64 = Shape<64, 64>;
using Backward128 = Shape<128, 32>;
// Fragments, accumulators and fetched tiles are arrays that must live in registers, so
// every index into them must be known at compile time: loops over them are bounded by the
// array's size (STEPS, DTILES, FETCHES) and unrolled, and stop early at the head size.

// STREAM rows of one operand as bf16 pairs along the row: tile[r][w] = (x[r][2w], x[r][2w+1]).
template <class S>
using Tile = unsigned int[S::STREAM][S::WORDS];
// The forward block's two buffers of staged key tiles and of value tiles (tile n in [n % 2]).
template <class S>
struct alignas(16) Staged {
    Tile<S> k[2], v[2];
};
// The backward block's own ROWS keys, staged as a tile's rows are.
template <class S>
using Keys = unsigned int[ROWS][S::WORDS];

// This thread's share of rows [row0, row0 + STREAM) of a [T, hs] bf16 operand (row stride
// `stride`), into registers: OCTS threads cover a row, 8 bf16 (16 bytes) at a time, so
// that a quarter-warp reads one row's 128 bytes, and fetch e takes the thread's row plus
// e * FETCH_ROWS; all of a thread's loads are in flight together. Zeros past T and past
// hs (a multiple of 16, so a run of 8 lies wholly before it or past it). A tile wholly
// within T and hs, every tile but the last at T a multiple of STREAM and hs = HS, takes
// its loads with no test and no zeros first, which cost a fetch about 25 instructions
// (the SASS of NVRTC 13.0 for sm_90). One 64-bit
// address a call, 32-bit offsets from it, so that the compiler keeps no per-fetch address
// live across the loop over tiles. For a 16-byte aligned buffer (as allocated) the loads
// are 16-byte aligned: a row of qkv is (NH + 2 KV) hs bf16, of out and dout NH hs, and a
// head's columns start at a multiple of hs, all multiples of 16 bf16, 32 bytes.
template <class S>
__device__ __forceinline__ void fetch_tile(uint4 f[S::FETCHES], const bf16* x, unsigned long long stride,
                                           int row0, int T, int hs) {
    const int r = row0 + threadIdx.x / S::OCTS, c = 8 * (threadIdx.x % S::OCTS);
    const bf16* p = x + (unsigned long long)r * stride + c;
    const int step = S::FETCH_ROWS * (int)stride;
    if (row0 + S::STREAM <= T && hs == S::HS) {
        #pragma unroll
        for (int e = 0; e < S::FETCHES; ++e) f[e] = *reinterpret_cast<const uint4*>(p + e * step);
        return;
    }
    #pragma unroll
    for (int e = 0; e < S::FETCHES; ++e) {
        f[e] = make_uint4(0u, 0u, 0u, 0u);
        if (r + e * S::FETCH_ROWS < T && c < hs) f[e] = *reinterpret_cast<const uint4*>(p + e * step);
    }
}

// The fetched share into a staged tile, as it was loaded (8 bf16, 4 words of pairs, a
// lane): a quarter-warp writes 32 consecutive words of a row, free of bank conflicts.
// Columns past hs are staged as the zeros fetched there, which the products over HS read.
template <class S>
__device__ __forceinline__ void store_tile(Tile<S> tile, const uint4 f[S::FETCHES]) {
    const int r = threadIdx.x / S::OCTS, o = threadIdx.x % S::OCTS;
    #pragma unroll
    for (int e = 0; e < S::FETCHES; ++e) *reinterpret_cast<uint4*>(&tile[r + e * S::FETCH_ROWS][4 * o]) = f[e];
}

// Rows [row0, row0 + STREAM) of x into a staged tile by asynchronous copies (async_copy.cuh),
// this thread's share as fetch_tile's, landed by the thread's next copies_landed. Zeros
// past T and past hs; a tile wholly within them, as in fetch_tile, makes no test.
template <class S>
__device__ __forceinline__ void copy_tile(Tile<S> tile, const bf16* x, unsigned long long stride, int row0, int T,
                                          int hs) {
    const int r = threadIdx.x / S::OCTS, o = threadIdx.x % S::OCTS, c = 8 * o;
    const bf16* p = x + (unsigned long long)(row0 + r) * stride + c;
    const int step = S::FETCH_ROWS * (int)stride;
    unsigned int* to = &tile[r][4 * o];
    if (row0 + S::STREAM <= T && hs == S::HS) {
        #pragma unroll
        for (int e = 0; e < S::FETCHES; ++e) copy_async16(to + e * S::FETCH_ROWS * S::WORDS, p + e * step, true);
        return;
    }
    #pragma unroll
    for (int e = 0; e < S::FETCHES; ++e) {
        const bool valid = row0 + r + e * S::FETCH_ROWS < T && c < hs;
        copy_async16(to + e * S::FETCH_ROWS * S::WORDS, valid ? p + e * step : x, valid);
    }
}

// Rows [row0, row0 + STREAM) of x fetched and staged at once, with `f` as the fetch's
// registers: the first tile of a loop, which then stages each next tile around its products.
template <class S>
__device__ __forceinline__ void stage_tile(Tile<S> tile, uint4 f[S::FETCHES], const bf16* x,
                                           unsigned long long stride, int row0, int T, int hs) {
    fetch_tile<S>(f, x, stride, row0, T, hs);
    store_tile<S>(tile, f);
}

// s[m] = X[m] Y^T over the head dimension for M row tiles of one warp, s[m][n] its columns
// [8n, 8n + 8): `a_step(a, kk)` gives each tile's A fragment of k step kk, a[m] (X's rows;
// zeros past hs), against the staged rows of `y` (zeros past hs too), over all of HS: below
// it the products of zeros add nothing, as in accumulate. Each B fragment pair, one
// ldmatrix, feeds the M tiles' products (the forward at head size 64 takes two tiles a
// warp, so that it reads shared memory half as often a product). No step tests hs: that
// test is a branch, and until 2026-11-27, with it in the loop, every product sat between
// two of them, so that each column's 4 (HS = 64) or 8 products ran as a chain, each
// waiting out the last one's latency, and no two chains overlapped (half the forward's
// products and two thirds of the query side's, in the SASS of NVRTC 13.0 for sm_90). Now
// the products of a step are M * KTILES independent ones, and the steps follow each other
// with no branch between. Each s[m][n] adds its steps in order.
template <class S, int M, typename AStep>
__device__ __forceinline__ void scores_of(float s[M][S::KTILES][4], const Tile<S> y, AStep a_step) {
    #pragma unroll
    for (int m = 0; m < M; ++m) {
        #pragma unroll
        for (int n = 0; n < S::KTILES; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    }
    const unsigned int* origin = b_origin(&y[0][0], S::WORDS);
    #pragma unroll
    for (int kk = 0; kk < S::STEPS; ++kk) {
        unsigned int a[M][4];
        a_step(a, kk);
        #pragma unroll
        for (int n = 0; n < S::KTILES; n += 2) {
            unsigned int lo[2], hi[2];
            load_b_pair(lo, hi, origin, S::WORDS, 8 * n, kk);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                mma_bf16_16816(s[m][n], a[m], lo);
                mma_bf16_16816(s[m][n + 1], a[m], hi);
            }
        }
    }
}

// The same with X's fragments `x` in registers, read once (a single tile passes its
// arrays' addresses, `scores<S, 1>(&s, &x, y)`).
template <class S, int M>
__device__ __forceinline__ void scores(float s[M][S::KTILES][4],
                                       const unsigned int x[M][S::STEPS][4], const Tile<S> y) {
    scores_of<S, M>(s, y, [&](unsigned int a[M][4], int kk) {
        #pragma unroll
        for (int m = 0; m < M; ++m) {
            #pragma unroll
            for (int r = 0; r < 4; ++r) a[m][r] = x[m][kk][r];
        }
    });
}

// acc[m] += A[m] Y for M row tiles of one warp, over the first K staged rows of Y, read
// down its columns from column tile n0: acc[m][n] is columns [8 (n0 + n), 8 (n0 + n) + 8).
// `a_step(a, c)` gives each tile's A fragment of k step c, a[m], the product's columns
// [16 c, 16 c + 16), against Y's rows [16 c, 16 c + 16). The B fragments of two column
// tiles and a k step are one transposing ldmatrix (load_bt_pair), which feeds the M tiles'
// products. Until 2026-11-27 they were 16-byte loads of 4 rows with the products' columns
// permuted, and a byte permutation (PRMT) a register to pick each column's pair out of the
// rows' words: 2 integer instructions a product. Below HS the zero columns past hs cost
// their products.
template <class S, int M, int K, int N, typename AStep>
__device__ __forceinline__ void accumulate_over_rows(float acc[M][N][4], const unsigned int (*y)[S::WORDS],
                                                     int n0, AStep a_step) {
    const unsigned int* origin = bt_origin(&y[0][0], S::WORDS) + 4 * n0;
    #pragma unroll
    for (int c = 0; c < K / 16; ++c) {
        unsigned int a[M][4];
        a_step(a, c);
        #pragma unroll
        for (int n = 0; n < N; n += 2) {
            unsigned int lo[2], hi[2];
            load_bt_pair(lo, hi, origin, S::WORDS, 16 * c, n);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                mma_bf16_16816(acc[m][n], a[m], lo);
                mma_bf16_16816(acc[m][n + 1], a[m], hi);
            }
        }
    }
}

// acc[m] += P[m] Y over the tile for M row tiles of one warp: P[m] [16, STREAM] in
// accumulators, rounded to bf16 as they enter.
template <class S, int M>
__device__ __forceinline__ void accumulate(float acc[M][S::DTILES][4],
                                           const float p[M][S::KTILES][4], const Tile<S> y) {
    accumulate_over_rows<S, M, S::STREAM, S::DTILES>(acc, y, 0, [&](unsigned int a[M][4], int c) {
        #pragma unroll
        for (int m = 0; m < M; ++m) a_from_accumulators(a[m], p[m][2 * c], p[m][2 * c + 1]);
    });
}

// dq += dS K for one warp's share of a streamed query tile, its 16 queries 16 r on and its
// DQ_TILES column tiles from n0: a product over the block's ROWS keys, K the staged key
// tile. `ds` is dS^T, staged as ROWS keys by STREAM queries (bf16 pairs along the
// queries); dS's A fragments are the transposes of its 8x8 matrices, one transposing
// ldmatrix a k step: matrix i at keys 16 c + 8 (i / 2), queries 16 r + 8 (i % 2), which is
// b_origin's order of rows and words, so the fragment's four registers are the
// instruction's four in order.
template <class S>
__device__ __forceinline__ void dq_terms(float (&dq)[S::DQ_TILES][4],
                                         const unsigned int (*ds)[S::DS_WORDS], const Keys<S> keys, int r,
                                         int n0) {
    const unsigned int* a_origin = b_origin(&ds[0][0], S::DS_WORDS) + 8 * r;
    accumulate_over_rows<S, 1, ROWS, S::DQ_TILES>(&dq, keys, n0, [&](unsigned int a[1][4], int c) {
        load_matrices_transposed(a[0], a[0] + 2, a_origin + 16 * c * S::DS_WORDS);
    });
}

// Row g + 8h of a warp's [16, 8 N] product accumulated by `accumulate`, times `scale`,
// into the bf16 `row` (4-byte aligned): this lane holds columns 8n + 2t and 8n + 2t + 1 of
// each accumulator n (acc[n][2h], acc[n][2h + 1]), written as one word unless they lie at
// or past `width` (hs, less the columns before `row`). Each value is rounded once, to
// nearest even, by pack_bf16, as common.cuh's store rounds it. The 4 lanes of a quad write
// 16 consecutive bytes; a block stores its rows once.
template <int N>
__device__ __forceinline__ void store_columns(bf16* row, const float (&acc)[N][4], int h, float scale, int width) {
    const int t = threadIdx.x % 4;
    #pragma unroll
    for (int n = 0; n < N; ++n) {
        if (8 * n >= width) return;
        *reinterpret_cast<unsigned int*>(row + 8 * n + 2 * t) =
            pack_bf16(scale * acc[n][2 * h], scale * acc[n][2 * h + 1]);
    }
}

// The dot product of two runs of 8 bf16 (16-byte loads: 4 words of pairs, the lower
// column in the low half), in fp32, column by column.
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    float sum = 0.0f;
    #pragma unroll
    for (int w = 0; w < 4; ++w) {
        const unsigned int x = uint4_word(a, w), y = uint4_word(b, w);
        sum += to_float(bf16{(unsigned short)x}) * to_float(bf16{(unsigned short)y});
        sum += to_float(bf16{(unsigned short)(x >> 16)}) * to_float(bf16{(unsigned short)(y >> 16)});
    }
    return sum;
}

// The row and the column, within a warp's [16, 8] accumulator, of this lane's element e
// (0..3): rows g and g + 8, columns 2t and 2t + 1.
__device__ __forceinline__ int acc_row(int e) { return threadIdx.x % WARP_SIZE / 4 + 8 * (e / 2); }
__device__ __forceinline__ int acc_col(int e) { return 2 * (threadIdx.x % 4) + e % 2; }

// A warp's [16, STREAM] scores of a tile that crosses the diagonal, the window's edge or
// T, rows from r0 and columns from c0: -inf where query i may not see key j, so that
// their exponentials are 0. With queries in the rows (`transposed` false) that is j > i or
// i - j >= window; rows past T are computed and never stored. With queries in the columns
// (the key side), also i >= T, which would otherwise add to every key's sums.
template <class S>
__device__ __forceinline__ void mask_scores(float s[S::KTILES][4], int r0, int c0, int T, int window,
                                            bool transposed) {
    #pragma unroll
    for (int n = 0; n < S::KTILES; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = r0 + acc_row(e), col = c0 + 8 * n + acc_col(e);
            const int i = transposed ? col : row, j = transposed ? row : col;
            if (j > i || i - j >= window || (transposed && i >= T)) s[n][e] = NEG_INF;
        }
    }
}

// The dropout factors of this lane's elements of a warp's [16, STREAM] tile, rows from r0 and
// columns from c0 (queries in the rows, or with `transposed` in the columns): bit 4n + e
// of the result is set where attention_head.cuh's dropout_factor keeps element s[n][e]
// (its factor mask.scale, else 0). The elements are drawn one at a time in a loop that is
// not unrolled, so that 32 elements' Philox rounds do not compete for registers with the
// products' accumulators, and the bits index no register array.
template <class S>
__device__ __forceinline__ unsigned int kept(const DropoutMask& mask, unsigned long long bh, int T, int r0, int c0,
                                             bool transposed) {
    unsigned int bits = 0;
    #pragma unroll 1
    for (int b = 0; b < 4 * S::KTILES; ++b) {
        const int row = r0 + acc_row(b % 4), col = c0 + 8 * (b / 4) + acc_col(b % 4);
        const int i = transposed ? col : row, j = transposed ? row : col;
        if (dropout_factor(mask, bh, T, i, j) != 0.0f) bits |= 1u << b;
    }
    return bits;
}

// out[n][e] = x[n][e] times its dropout factor: mask.scale where bit 4n + e of `bits`
// (kept's) is set, else 0. `out` may be `x`.
template <class S>
__device__ __forceinline__ void times_kept(float out[S::KTILES][4], const float x[S::KTILES][4],
                                           unsigned int bits, float scale) {
    #pragma unroll
    for (int c = 0; c < S::KTILES; ++c) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) out[c][e] = x[c][e] * (bits >> (4 * c + e) & 1u ? scale : 0.0f);
    }
}

// Over the four lanes of a quad (t = 0..3), which together hold a row of a product.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// The arguments every kernel takes after its buffers.
#define SHAPE_ARGS int T, int NH, int KV, int hs, int window, DropoutMask mask, int dropout
#define SHAPE T, NH, KV, hs, window, mask, dropout

// out [B, T, NH hs] (bf16) and lse [B * NH * T] (fp32) from qkv [B, T, (NH + 2 KV) hs]
// (bf16), with k and v two buffers of staged key and value tiles (tile n in [n % 2]). Warp
// w owns M row tiles of 16 queries, rows r0 = i0 + 16 M w .. + 16 M - 1 of the block's
// 16 M WARPS; this lane keeps the running maximum m (log2 units), its part of the sum l
// and the output o of its two rows g and g + 8 of each. Key tiles from the one holding the
// block's first row's first key (key 0 under the causal mask) up to the block's last row,
// of which a warp multiplies those that hold a key of its rows: a tile wholly past its
// rows, or wholly before their window, would leave its sums as they are (every weight 0,
// the maximum unchanged), so skipping it changes no bit, and every row's tiles are those
// a block of 64 rows takes.
template <class S, int M>
__device__ __forceinline__ void forward(Tile<S> k[2], Tile<S> v[2], bf16* out, float* lse, const bf16* qkv,
                                        SHAPE_ARGS) {
    const Head hd = head_of(T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const bf16 *keys = qkv + hd.k, *values = qkv + hd.v;
    const int warp = threadIdx.x / WARP_SIZE, tile = gridDim.x - 1 - blockIdx.x;
    const int i0 = tile * 16 * M * WARPS, r0 = i0 + 16 * M * warp, tiles = (i0 + 16 * M * WARPS) / S::STREAM;
    const int first = max(0, i0 + 1 - window) / S::STREAM;
    const float scale = LOG2E / sqrtf((float)hs);

    unsigned int q[M][S::STEPS][4] = {};  // the warp's [16 M, hs] queries, read once (zeros past hs)
    #pragma unroll
    for (int m = 0; m < M; ++m) {
        #pragma unroll
        for (int kk = 0; kk < S::STEPS && 16 * kk < hs; ++kk)
            load_a_bf16(q[m][kk], qkv + hd.q, hd.stride, r0 + 16 * m, T, kk);
    }
    float mx[M][2], l[M][2] = {}, o[M][S::DTILES][4] = {};
    #pragma unroll
    for (int m = 0; m < M; ++m) mx[m][0] = mx[m][1] = NEG_INF;

    // The end of the warp's rows and the first key its first row sees, read from lane 0 so
    // that the compiler knows they are the same across the warp: the test of a tile against
    // them is then a branch the whole warp takes, and ptxas does not wrap the quad's
    // shuffles inside it in code that gathers diverged lanes (NVRTC 13.0). With one row
    // tile a warp every tile up to the diagonal holds keys of its rows but under a window.
    const int end = M == 1 ? T : __shfl_sync(FULL_MASK, r0 + 16 * M, 0);
    const int begin = __shfl_sync(FULL_MASK, r0 + 1 - window, 0);

    copy_tile<S>(k[first % 2], keys, hd.stride, first * S::STREAM, T, hs);
    copy_tile<S>(v[first % 2], values, hd.stride, first * S::STREAM, T, hs);
    copies_landed();
    for (int n = first; n < tiles; ++n) {
        const int j0 = n * S::STREAM, cur = n % 2, next = n + 1 < tiles;
        // The tile holds a key some row of the warp sees.
        const bool mine = (M == 1 || j0 < end) && j0 + S::STREAM > begin;
        __syncthreads();  // tile n has landed, and every warp is done with tile n - 1's buffers
        if (next) {  // tile n + 1's keys and values, in flight under tile n's products
            copy_tile<S>(k[1 - cur], keys, hd.stride, j0 + S::STREAM, T, hs);
            copy_tile<S>(v[1 - cur], values, hd.stride, j0 + S::STREAM, T, hs);
        }
        if (mine) {
            float s[M][S::KTILES][4];
            scores<S, M>(s, q, k[cur]);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                const int rows = r0 + 16 * m;
                // Crossing the diagonal, or the window's edge.
                if (j0 + S::STREAM > rows || rows + 16 - window > j0) mask_scores<S>(s[m], rows, j0, T, window, false);
                // The rows' new maxima over the quad, in log2 units: the scores' maximum times
                // scale, which is the maximum of the scaled scores (rounding keeps their order),
                // one multiply a row where scaling each score took one an element. Under the
                // causal mask key 0 is in the first tile and every row's, so a row's maximum is
                // finite from the first tile (a later tile may mask a tile's rows whole: their
                // maximum stays, and their exponentials are 0). Under a window a row may see
                // no key of its first tiles: its maximum stays -inf, and its shift 0 leaves
                // every weight 0 and its (zero) sums as they are.
                float m_new[2] = {NEG_INF, NEG_INF};
                #pragma unroll
                for (int c = 0; c < S::KTILES; ++c) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) m_new[e / 2] = fmaxf(m_new[e / 2], s[m][c][e]);
                }
                float correction[2], shift[2];
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    m_new[h] = fmaxf(mx[m][h], scale * quad_max(m_new[h]));
                    shift[h] = m_new[h] == NEG_INF ? 0.0f : m_new[h];
                    correction[h] = exp2_ftz(mx[m][h] - shift[h]);
                    mx[m][h] = m_new[h];
                    l[m][h] *= correction[h];
                }
                // P into s, 2^(s scale - m) with the exponent one multiply-add, summed
                // undropped (this lane's columns; the quad's parts add up at the end).
                #pragma unroll
                for (int c = 0; c < S::KTILES; ++c) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[m][c][e] = exp2_ftz(fmaf(s[m][c][e], scale, -shift[e / 2]));
                        l[m][e / 2] += s[m][c][e];
                    }
                }
                if (dropout)  // P', which o accumulates
                    times_kept<S>(s[m], s[m], kept<S>(mask, hd.bh, T, rows, j0, false), mask.scale);
                #pragma unroll
                for (int d = 0; d < S::DTILES; ++d) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) o[m][d][e] *= correction[e / 2];
                }
            }
            accumulate<S, M>(o, s, v[cur]);
        }
        copies_landed();  // tile n + 1's, which the next barrier publishes
    }
    #pragma unroll
    for (int m = 0; m < M; ++m) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = r0 + 16 * m + acc_row(2 * h);
            l[m][h] = quad_sum(l[m][h]);
            if (i < T) store_columns(out + hd.io + (unsigned long long)i * C, o[m], h, 1.0f / l[m][h], hs);
            if (threadIdx.x % 4 == 0 && i < T) lse[hd.bh * T + i] = mx[m][h] * LN2 + logf(l[m][h]);
        }
    }
}

// delta_i = dout_i . out_i (fp32, from the bf16 dout and out) of this lane's rows of a
// warp's 16 from r0, g and g + 8, for rows below T into delta [B * NH * T]: the quad
// splits a row's dimensions, 8 bf16 of each of dout and out at a time (16-byte loads,
// aligned as fetch_tile's), and adds its parts in a fixed order.
__device__ __forceinline__ void row_deltas(float* delta, const bf16* out, const bf16* dout, const Head& hd, int r0,
                                           int T, int NH, int hs) {
    const unsigned long long C = (unsigned long long)NH * hs;
    const int t = threadIdx.x % 4;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = r0 + acc_row(2 * h);
        float part = 0.0f;
        for (int d = 8 * t; i < T && d < hs; d += 32) {
            const unsigned long long at = hd.io + (unsigned long long)i * C + d;
            part += dot8(*reinterpret_cast<const uint4*>(dout + at), *reinterpret_cast<const uint4*>(out + at));
        }
        const float D = quad_sum(part);
        if (t == 0 && i < T) delta[hd.bh * T + i] = D;
    }
}

// The backward's first launch, a block per ROWS queries of a query head as the forward's
// grid at one row tile a warp: delta of its rows, and zeros in the turns' counters of its
// streamed query tiles (ROWS / STREAM of them, those below T) and, from the group's first
// query head's first block, in the group's ticket. The counters follow the heads' tiles:
// B * NH * tiles of them (tiles = T / STREAM rounded up), then a ticket a key/value head.
template <class S>
__device__ __forceinline__ void delta_and_turns(float* delta, unsigned int* turns, const bf16* out, const bf16* dout,
                                                int T, int NH, int KV, int hs) {
    const Head hd = head_of(T, NH, KV, hs);
    row_deltas(delta, out, dout, hd, blockIdx.x * ROWS + 16 * (threadIdx.x / WARP_SIZE), T, NH, hs);
    if (threadIdx.x != 0) return;
    const int tiles = (T + S::STREAM - 1) / S::STREAM, per_block = ROWS / S::STREAM;
    for (int n = blockIdx.x * per_block; n < (blockIdx.x + 1) * per_block && n < tiles; ++n)
        turns[hd.bh * tiles + n] = 0;
    const int group = NH / KV, h = blockIdx.y % NH;
    if (blockIdx.x == 0 && h % group == 0)
        turns[(unsigned long long)gridDim.y * tiles + blockIdx.y / NH * KV + h / group] = 0;
}

// The lowest key tile (of ROWS keys) that query tile n (of STREAM queries) sees a key of:
// the one whose last key, ROWS (t + 1) - 1, is at least the tile's first query's first,
// n STREAM + 1 - window. 0 under the causal mask (window = T).
template <class S>
__device__ __forceinline__ int lowest_key_tile(int n, int window) {
    const int x = n * S::STREAM - ROWS - window + 1;
    return x < 0 ? 0 : x / ROWS + 1;
}

// The backward block's shared memory: two buffers of staged query tiles and one of output
// gradients, its key tile, the query tiles' lse (log2 units) and delta in two buffers, and
// its ticket. Tile n + 1's output gradients are staged after every warp is done with tile
// n's, and dS^T over the query tile the dk product was the last to read: 37,892 bytes at
// head size 64 and 44,036 at 128, within 48 KB of static shared memory.
template <class S>
struct alignas(16) KeySide {
    Tile<S> q[2], dy;
    Keys<S> keys;
    float L[2][S::STREAM], D[2][S::STREAM];
    unsigned int ticket;
};

// dq's terms from the block's keys for query tile n of head hd, from dS^T staged in `ds`:
// each warp's share of the tile (dq_terms) added to the partial sum of the key tiles
// before. Query tile n's sum runs over the key tiles that see it, from the one holding its
// queries (the diagonal's, n STREAM / ROWS) down to 0, or under a window to the lowest
// whose last key the tile's first query sees (`lowest_key_tile`), each adding its terms to
// the sum of those before; that lowest key tile's block rounds it to bf16 times
// 1 / sqrt(hs) into dqkv. The partial sums are a [STREAM, HS] fp32 tile for each query
// tile of each query head (in global memory), in fragment order (warp, accumulator, lane:
// one 16-byte load a lane an accumulator), handed on by turns (turns.cuh). The order of
// every sum is fixed whatever the timing, so dq is bitwise deterministic.
template <class S>
__device__ __forceinline__ void add_dq(const unsigned int (*ds)[S::DS_WORDS], const Keys<S> keys,
                                       float4* partials, unsigned int* turns, bf16* dqkv, const Head& hd,
                                       int key_tile, int n, int tiles, int T, int hs, int window, float scale) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    // This warp's 16 queries of the tile and its first column tile.
    const int r = warp % S::QUERY_TILES, n0 = S::DQ_TILES * (warp / S::QUERY_TILES);
    float dq[S::DQ_TILES][4] = {};
    dq_terms<S>(dq, ds, keys, r, n0);
    const unsigned long long at = hd.bh * tiles + n;
    float4* part = partials + (at * WARPS + warp) * S::DQ_TILES * WARP_SIZE + lane;
    const int diagonal = n * S::STREAM / ROWS;
    if (key_tile != diagonal) {
        wait_turn(turns + at, diagonal - key_tile);
        #pragma unroll
        for (int d = 0; d < S::DQ_TILES; ++d) {
            const float4 sum = __ldcg(part + d * WARP_SIZE);
            dq[d][0] = sum.x + dq[d][0];
            dq[d][1] = sum.y + dq[d][1];
            dq[d][2] = sum.z + dq[d][2];
            dq[d][3] = sum.w + dq[d][3];
        }
    }
    if (key_tile == lowest_key_tile<S>(n, window)) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = n * S::STREAM + 16 * r + acc_row(2 * h);
            bf16* row = dqkv + hd.q + (unsigned long long)i * hd.stride + 8 * n0;
            if (i < T) store_columns(row, dq, h, scale, hs - 8 * n0);
        }
        return;
    }
    #pragma unroll
    for (int d = 0; d < S::DQ_TILES; ++d)
        __stcg(part + d * WARP_SIZE, make_float4(dq[d][0], dq[d][1], dq[d][2], dq[d][3]));
    pass_turn(turns + at);
}

// The backward's second launch, a block per key tile of a key/value head (blockIdx.y = b *
// KV + g), after delta_and_turns: dv_j = sum_i P'_ij dout_i and dk_j = scale * sum_i dS_ij
// q_i over the query tiles from the diagonal on, of each query head of the group in
// ascending order (up to the last query that sees the block's last key), into dqkv
// (bf16), with P_ij = exp(s_ij - lse_i), dP_ij = keep_ij *
// (dout_i . v_j) and dS_ij = P_ij (dP_ij - delta_i); and dq_i = scale * sum_j dS_ij k_j,
// each query tile's summed over the key tiles' blocks in turn (add_dq). Warp w owns keys
// j0 + 16w .. + 15 and works on the transposed products: S^T = k q^T and dP^T = v dout^T,
// whose columns are queries. Its values are read once into registers; its keys' fragments
// come from the staged key tile, which dq's product reads whole. The key tile is the
// block's ticket's, taken in the order the blocks start, the last tile first: key tile j's
// dq terms follow j + 1's, whose block has thus started.
template <class S>
__device__ __forceinline__ void backward_key_value(KeySide<S>& sm, float4* partials, unsigned int* turns, bf16* dqkv,
                                                   const bf16* qkv, const bf16* dout, const float* lse,
                                                   const float* delta, SHAPE_ARGS) {
    static_assert(ROWS * S::DS_WORDS <= S::STREAM * S::WORDS, "dS^T of a query tile fits a staged tile");
    const Head kv = group_head(0, T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int warp = threadIdx.x / WARP_SIZE, tiles = (T + S::STREAM - 1) / S::STREAM;
    unsigned int* tickets = turns + (unsigned long long)gridDim.y / KV * NH * tiles;
    const int key_tile = gridDim.x - 1 - (int)take_ticket(tickets + blockIdx.y, &sm.ticket);
    const int j0 = key_tile * ROWS, c0 = j0 + 16 * warp, first = j0 / S::STREAM;
    // One past the last query tile holding a query that sees a key of the block.
    const int last = min(tiles, (min(T, j0 + ROWS - 1 + window) + S::STREAM - 1) / S::STREAM);
    const float scale = 1.0f / sqrtf((float)hs), scale2 = LOG2E * scale;

    unsigned int v[S::STEPS][4] = {};  // the warp's values, read once (zeros past hs)
    #pragma unroll
    for (int kk = 0; kk < S::STEPS && 16 * kk < hs; ++kk) load_a_bf16(v[kk], qkv + kv.v, kv.stride, c0, T, kk);
    const unsigned int* keys = b_origin(&sm.keys[16 * warp][0], S::WORDS);  // the warp's 16 keys' fragments
    float dk[S::DTILES][4] = {}, dv[S::DTILES][4] = {};

    uint4 f[S::FETCHES];
    #pragma unroll
    for (int i = 0; i < ROWS / S::STREAM; ++i)  // read after a tile's barrier
        stage_tile<S>(&sm.keys[i * S::STREAM], f, qkv + kv.k, kv.stride, j0 + i * S::STREAM, T, hs);
    for (int r = 0; r < NH / KV; ++r) {
        const Head hd = group_head(r, T, NH, KV, hs);
        const bf16 *queries = qkv + hd.q, *grads = dout + hd.io;
        // lse and delta of query i0 + threadIdx.x (threads below STREAM), fetched with the rows.
        float lse_i = 0.0f, delta_i = 0.0f;
        const auto fetch_stats = [&](int i0) {
            const int i = i0 + threadIdx.x;
            lse_i = threadIdx.x < S::STREAM && i < T ? LOG2E * lse[hd.bh * T + i] : 0.0f;
            delta_i = threadIdx.x < S::STREAM && i < T ? delta[hd.bh * T + i] : 0.0f;
        };
        const auto store_stats = [&](int buffer) {
            if (threadIdx.x < S::STREAM) {
                sm.L[buffer][threadIdx.x] = lse_i;
                sm.D[buffer][threadIdx.x] = delta_i;
            }
        };
        __syncthreads();  // every warp is done with the previous head's last tile
        fetch_stats(first * S::STREAM);
        store_stats(first % 2);
        stage_tile<S>(sm.q[first % 2], f, queries, hd.stride, first * S::STREAM, T, hs);
        stage_tile<S>(sm.dy, f, grads, C, first * S::STREAM, T, hs);
        for (int n = first; n < last; ++n) {
            const int i0 = n * S::STREAM, cur = n % 2, next = n + 1 < last;
            __syncthreads();  // tile n is staged, and every warp is done with tile n - 1's buffers
            if (next) {
                fetch_stats(i0 + S::STREAM);
                fetch_tile<S>(f, queries, hd.stride, i0 + S::STREAM, T, hs);
            }
            // S^T, then P, and dv's product before dP^T's, so that P and dP^T are live
            // together only while dS is formed.
            float s[S::KTILES][4], dp[S::KTILES][4];
            scores_of<S, 1>(&s, sm.q[cur], [&](unsigned int a[1][4], int kk) { load_a_shared(a[0], keys, kk); });
            if (next) {
                store_stats(1 - cur);
                store_tile<S>(sm.q[1 - cur], f);
            }
            // The tiles crossing the diagonal or the window's edge, and the last if it runs
            // past T.
            if (i0 < j0 + ROWS || i0 + S::STREAM - 1 - j0 >= window || i0 + S::STREAM > T)
                mask_scores<S>(s, c0, i0, T, window, true);
            // P into s, transposed (row j, column i); zero where masked.
            #pragma unroll
            for (int c = 0; c < S::KTILES; ++c) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) s[c][e] = exp2_ftz(scale2 * s[c][e] - sm.L[cur][8 * c + acc_col(e)]);
            }
            const unsigned int bits = dropout ? kept<S>(mask, hd.bh, T, c0, i0, true) : 0u;
            if (dropout) {  // dv takes P' = P * keep, dS below P itself
                times_kept<S>(dp, s, bits, mask.scale);
                accumulate<S, 1>(&dv, &dp, sm.dy);
            } else {
                accumulate<S, 1>(&dv, &s, sm.dy);
            }
            scores<S, 1>(&dp, &v, sm.dy);
            // dS into dp: P (keep * dP - delta).
            if (dropout) times_kept<S>(dp, dp, bits, mask.scale);
            #pragma unroll
            for (int c = 0; c < S::KTILES; ++c) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) dp[c][e] = s[c][e] * (dp[c][e] - sm.D[cur][8 * c + acc_col(e)]);
            }
            // The next output gradient tile's loads run under dk's product, which leaves only
            // dS live.
            if (next) fetch_tile<S>(f, grads, C, i0 + S::STREAM, T, hs);
            accumulate<S, 1>(&dk, &dp, sm.q[cur]);
            __syncthreads();  // every warp is done with tile n's queries and output gradients
            if (next) store_tile<S>(sm.dy, f);  // tile n + 1's, which its barrier publishes
            // dS^T as bf16 over tile n's queries, this warp's 16 keys' rows of it.
            const auto ds = reinterpret_cast<unsigned int (*)[S::DS_WORDS]>(&sm.q[cur][0][0]);
            const int g = threadIdx.x % WARP_SIZE / 4, t = threadIdx.x % 4;
            #pragma unroll
            for (int c = 0; c < S::KTILES; ++c) {
                ds[16 * warp + g][4 * c + t] = pack_bf16(dp[c][0], dp[c][1]);
                ds[16 * warp + g + 8][4 * c + t] = pack_bf16(dp[c][2], dp[c][3]);
            }
            __syncthreads();  // dS^T is whole before any warp reads its columns
            add_dq<S>(ds, sm.keys, partials, turns, dqkv, hd, key_tile, n, tiles, T, hs, window, scale);
        }
    }
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = c0 + acc_row(2 * h);
        if (j >= T) continue;
        bf16* g = dqkv + (unsigned long long)j * kv.stride;
        store_columns(g + kv.k, dk, h, scale, hs);
        store_columns(g + kv.v, dv, h, 1.0f, hs);
    }
}

// The entry points, head sizes up to 64 and (suffix _hs128) up to 128, each with its
// shared memory, the forward 2 blocks an SM (see the header).
extern "C" __global__ void __launch_bounds__(THREADS, 2)
    fused_attention_forward_bf16(bf16* out, float* lse, const bf16* qkv, SHAPE_ARGS) {
    __shared__ Staged<Forward64> sm;
    forward<Forward64, 2>(sm.k, sm.v, out, lse, qkv, SHAPE);
}
extern "C" __global__ void __launch_bounds__(THREADS, 2)
    fused_attention_forward_bf16_hs128(bf16* out, float* lse, const bf16* qkv, SHAPE_ARGS) {
    DYNAMIC_SHARED(Staged<Forward128>, sm);
    forward<Forward128, 1>(sm.k, sm.v, out, lse, qkv, SHAPE);
}

// The backward in two launches: delta, with the turns' counters zeroed, a block per ROWS
// queries of each query head; then every gradient from the key side, five products a tile
// (S^T, dP^T, dv, dk and dq) where a query side and a key side would make seven between
// them.
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_delta_bf16(float* delta, unsigned int* turns, const bf16* out, const bf16* dout, int T,
                                        int NH, int KV, int hs) {
    delta_and_turns<Backward64>(delta, turns, out, dout, T, NH, KV, hs);
}
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_delta_bf16_hs128(float* delta, unsigned int* turns, const bf16* out, const bf16* dout,
                                              int T, int NH, int KV, int hs) {
    delta_and_turns<Backward128>(delta, turns, out, dout, T, NH, KV, hs);
}
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_bf16(bf16* dqkv, float4* partials, unsigned int* turns, const bf16* qkv,
                                  const bf16* dout, const float* lse, const float* delta, SHAPE_ARGS) {
    __shared__ KeySide<Backward64> sm;
    backward_key_value<Backward64>(sm, partials, turns, dqkv, qkv, dout, lse, delta, SHAPE);
}
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_bf16_hs128(bf16* dqkv, float4* partials, unsigned int* turns, const bf16* qkv,
                                        const bf16* dout, const float* lse, const float* delta, SHAPE_ARGS) {
    __shared__ KeySide<Backward128> sm;
    backward_key_value<Backward128>(sm, partials, turns, dqkv, qkv, dout, lse, delta, SHAPE);
}
