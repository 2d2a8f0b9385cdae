// Causal self-attention on tensor cores for `precision: bf16`: the fused kernels of
// fused_attention.cu (the same arguments, with qkv, out, dout and dqkv stored as bf16; the
// same contract: causal, online softmax, tiles above the diagonal skipped, lse = max +
// log(sum), the CPU's Philox dropout mask drawn in the kernel at element (bh * T + i) * T
// + j, no atomics on any value, deterministic) with every matrix product a warp's
// mma.sync m16n8k16 in bf16 (mma.cuh), FlashAttention-2 style. The fp32 kernels spend
// most of a GPT-2 step in attention on CUDA cores; bf16 operands into fp32 accumulators run
// those products on the tensor cores.
//
// The backward at head sizes up to 64 is one kernel from the key side (DQ), which also
// sums dq: each query tile's dq is a chain of fp32 partial sums in global memory, handed
// from key tile to key tile, n, n - 1, ..., 0, by turns (turns.cuh), so that its order is
// fixed, as FlashAttention 3's deterministic backward fixes it. That makes five products a
// tile where the query side and the key side make seven between them (S and dP are
// computed once, not once a side). At 128 the key tile, dS and the double-buffered query
// tiles would not fit 48 KB of static shared memory, and the two kernels stay.
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
// Tiles: blocks of WARPS = 4 warps own ROWS = 64 rows (queries for the forward and the
// query side, keys for the key side), 16 rows a warp, the rows of one m16n8k16 product;
// the forward at head size 64 owns 128, two such row tiles a warp (M = 2), so that each
// B fragment it loads feeds two products. The other side streams through in tiles of 64
// (HS = 64) or 32 (HS = 128) rows, staged in shared memory as bf16
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
// Staging, double-buffered with one barrier per tile: tile n + 1's global loads are issued
// (fetch_tile: 16-byte loads of 8 bf16 along the rows, every load of a thread in flight at
// once) before a product of tile n and written as loaded to the other buffer (store_tile)
// after it, so their latency runs under tile n's tensor-core work; the barrier at the top
// of each tile both publishes the tile staged during the previous one and retires the
// buffer the next will overwrite. Only tiles that cross the diagonal (or T) are masked;
// the others take no per-element test. With dropout on, a lane draws its 32 elements' mask
// bits in a loop of their own (kept); with it off nothing is drawn and no element tests a
// bit.
//
// Registers (ptxas through NVRTC 13.0, -Xptxas -v, sm_80 and sm_90; scripts/sass-mix):
// at head size 64 the forward, which holds two row tiles' queries, scores and outputs,
// takes 255 and spills none, 2 blocks (8 warps) an SM (with one row tile a warp, until
// 2026-11-27, it took 158 to 163, and 3 blocks shared an SM). The backward kernels, which
// hold two [16, 64] fp32 accumulators and the next tile's loads (4 of 16 bytes a thread)
// besides, take 229 to 253, 2 blocks an SM; none spills. The one-kernel backward at 64, which adds dq's [16, 64]
// accumulators after dS is staged, takes 254 (sm_90) with 16 bytes spilled (two 64-bit
// values, stored once and read back before and after the loops over tiles), 2 blocks an
// SM; its 47,108 bytes of shared memory (the double-buffered query and output gradient
// tiles, its key tile, lse and delta) allow 4. At 128 the forward and query side take 216
// to 236, and the key side, which holds dk and dv [16, 128] and its keys and values, 255
// with 32 (sm_80) to 52 (sm_90) bytes spilled, some within its loop over tiles: at sm_90
// 8 local stores and 15 loads of the loop body's 875 instructions.
//
// Instructions (the SASS of NVRTC 13.0 for sm_90, scripts/sass-mix): with one row tile a
// warp, a tile of the forward at head size 64, unmasked and without dropout, issued about
// 406 instructions a warp for its 64 products (traced by hand), of which the softmax is
// 147 (a max, a multiply-add, an exponential and an add an element); that form ran at 173
// TFLOP/s on an H200 (2026-11-27). With two row tiles a warp, the loop body with the mask
// and dropout compiled out is 786 instructions for 128 products, where the same count
// gives 464 for 64: 6.1 a product where 7.3 were, an ldmatrix for 4 products where it was
// for 2, and twice the independent products a warp has in flight, with 8 warps an SM where
// 12 were. Not yet timed on a GPU. Until 2026-11-27 a tile issued about 960: a branch
// between any two products over the head dimension (the test of the run-time hs, now
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
// (S = q k^T, O = P' v), 2 * 2 * B * NH * (T^2 / 2) * hs FLOPs; the backward 5 at head
// sizes up to 64 (S^T, dP^T, dv, dk and dq), 7 above (the query side S, dP = dout v^T and
// dq; the key side S^T, dP^T, dv and dk), 5 or 7 times 2 * B * NH * (T^2 / 2) * hs. At
// GPT-2 124M's B = 4, T = 1024, 12 heads of 64: 6.4 GFLOP forward and 16.1 GFLOP backward
// per layer (22.5 in the two kernels before 2026-11-27). The chain adds 16 KiB of fp32 a
// query tile and key tile, written and read back (from L2, mostly: the next key tile's
// block reads it a tile's work later).
//
// Launch (per_attention_tile_bf16 in launch.rs, per_attention_forward_bf16 for the
// forward): grid (T / ROWS rounded up, B * NH), one block of WARPS warps per tile of a
// query head (T / 128 for the forward at head size 64); the key side's grid is (T / ROWS rounded
// up, B * KV), a block per key tile of a key/value head, which streams the query tiles of
// each query head of its group in turn (grouped-query attention reads the shared k and v
// in place). GPUs in practice dispatch blocks in order of blockIdx.x
// (x fastest), and the causal half makes a block's work proportional to the tiles it
// streams, so the longest go first and the last wave holds the shortest: the forward and
// the query side take their query tiles in reverse (block 0 the last tile, which streams
// every key tile), the key side its key tiles in order (block 0 the first, which streams
// every query tile). The one-kernel backward's blocks take their key tiles from tickets
// instead, the last tile first, since key tile j waits on j + 1's sums: a block always
// waits on one that started before it (turns.cuh), and, key tile by key tile, trails it by
// one query tile.
#include "attention_head.cuh"
#include "common.cuh"
#include "mma.cuh"
#include "philox.cuh"
#include "turns.cuh"

#define ROWS 64  // a block's own rows: queries (query side; the forward's M times) or keys (key side)
#define WARPS 4  // of 16 rows each, the rows of one m16n8k16 product
#define THREADS (WARPS * WARP_SIZE)
#define LN2 0.6931471805599453f

// The kernels' sizes at head sizes up to HS, 64 or 128 (each kernel is compiled for both).
// The other side streams through in tiles of STREAM rows: 64 at HS = 64, 32 at HS = 128,
// so that the four staged tiles of a kernel (two buffers of two operands) stay within the
// 48 KB of static shared memory and a warp's [16, STREAM] scores within its registers.
template <int HS>
struct Shape {
    static constexpr int STREAM = HS == 64 ? 64 : 32;
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
};
// Fragments, accumulators and fetched tiles are arrays that must live in registers, so
// every index into them must be known at compile time: loops over them are bounded by the
// array's size (STEPS, DTILES, FETCHES) and unrolled, and stop early at the head size.

// STREAM rows of one operand as bf16 pairs along the row: tile[r][w] = (x[r][2w], x[r][2w+1]).
template <int HS>
using Tile = unsigned int[Shape<HS>::STREAM][Shape<HS>::WORDS];

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
template <int HS>
__device__ __forceinline__ void fetch_tile(uint4 f[Shape<HS>::FETCHES], const bf16* x, unsigned long long stride,
                                           int row0, int T, int hs) {
    using S = Shape<HS>;
    const int r = row0 + threadIdx.x / S::OCTS, c = 8 * (threadIdx.x % S::OCTS);
    const bf16* p = x + (unsigned long long)r * stride + c;
    const int step = S::FETCH_ROWS * (int)stride;
    if (row0 + S::STREAM <= T && hs == HS) {
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
template <int HS>
__device__ __forceinline__ void store_tile(Tile<HS> tile, const uint4 f[Shape<HS>::FETCHES]) {
    using S = Shape<HS>;
    const int r = threadIdx.x / S::OCTS, o = threadIdx.x % S::OCTS;
    #pragma unroll
    for (int e = 0; e < S::FETCHES; ++e) *reinterpret_cast<uint4*>(&tile[r + e * S::FETCH_ROWS][4 * o]) = f[e];
}

// Rows [row0, row0 + STREAM) of x fetched and staged at once, with `f` as the fetch's
// registers: the first tile of a loop, which then stages each next tile around its products.
template <int HS>
__device__ __forceinline__ void stage_tile(Tile<HS> tile, uint4 f[Shape<HS>::FETCHES], const bf16* x,
                                           unsigned long long stride, int row0, int T, int hs) {
    fetch_tile<HS>(f, x, stride, row0, T, hs);
    store_tile<HS>(tile, f);
}

// s[m] = X[m] Y^T over the head dimension for M row tiles of one warp, s[m][n] its columns
// [8n, 8n + 8): X's A fragments `x` (each tile's 16 rows; zeros past hs) against the staged
// rows of `y` (zeros past hs too), over all of HS: below it the products of zeros add
// nothing, as in accumulate. Each B fragment pair, one ldmatrix, feeds the M tiles' products
// (the forward at head size 64 takes two tiles a warp, so that it reads shared memory half
// as often a product; a single tile passes its arrays' addresses, `scores<HS, 1>(&s, &x,
// y)`). No step tests hs: that test is a branch, and until 2026-11-27, with it in the loop,
// every product sat between two of them, so that each column's 4 (HS = 64) or 8 products
// ran as a chain, each waiting out the last one's latency, and no two chains overlapped
// (half the forward's products and two thirds of the query side's, in the SASS of NVRTC
// 13.0 for sm_90). Now the products of a step are M * KTILES independent ones, and the
// steps follow each other with no branch between. Each s[m][n] adds its steps in order.
template <int HS, int M>
__device__ __forceinline__ void scores(float s[M][Shape<HS>::KTILES][4],
                                       const unsigned int x[M][Shape<HS>::STEPS][4], const Tile<HS> y) {
    using S = Shape<HS>;
    #pragma unroll
    for (int m = 0; m < M; ++m) {
        #pragma unroll
        for (int n = 0; n < S::KTILES; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    }
    const unsigned int* origin = b_origin(&y[0][0], S::WORDS);
    #pragma unroll
    for (int kk = 0; kk < S::STEPS; ++kk) {
        #pragma unroll
        for (int n = 0; n < S::KTILES; n += 2) {
            unsigned int lo[2], hi[2];
            load_b_pair(lo, hi, origin, S::WORDS, 8 * n, kk);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                mma_bf16_16816(s[m][n], x[m][kk], lo);
                mma_bf16_16816(s[m][n + 1], x[m][kk], hi);
            }
        }
    }
}

// acc[m] += A[m] Y for M row tiles of one warp, over the STREAM staged rows of Y, read
// down its columns: acc[m][n] is columns [8n, 8n + 8). `a_step(a, c)` gives each tile's A
// fragment of k step c, a[m], the product's columns [16 c, 16 c + 16), against Y's rows
// [16 c, 16 c + 16). The B fragments of two column tiles and a k step are one transposing
// ldmatrix (load_bt_pair), which feeds the M tiles' products. Until 2026-11-27 they were
// 16-byte loads of 4 rows with the products' columns permuted, and a byte permutation
// (PRMT) a register to pick each column's pair out of the rows' words: 2 integer
// instructions a product. Below HS the zero columns past hs cost their products.
template <int HS, int M, typename AStep>
__device__ __forceinline__ void accumulate_over_rows(float acc[M][Shape<HS>::DTILES][4], const Tile<HS> y,
                                                     AStep a_step) {
    using S = Shape<HS>;
    const unsigned int* origin = bt_origin(&y[0][0], S::WORDS);
    #pragma unroll
    for (int c = 0; c < S::STREAM / 16; ++c) {
        unsigned int a[M][4];
        a_step(a, c);
        #pragma unroll
        for (int n = 0; n < S::DTILES; n += 2) {
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
template <int HS, int M>
__device__ __forceinline__ void accumulate(float acc[M][Shape<HS>::DTILES][4],
                                           const float p[M][Shape<HS>::KTILES][4], const Tile<HS> y) {
    accumulate_over_rows<HS, M>(acc, y, [&](unsigned int a[M][4], int c) {
        #pragma unroll
        for (int m = 0; m < M; ++m) a_from_accumulators(a[m], p[m][2 * c], p[m][2 * c + 1]);
    });
}

// acc += dS Y for one warp's 16 queries, columns [16 w, 16 w + 16) of `ds`, the staged
// dS^T (ROWS keys by STREAM queries, bf16 pairs along the queries): a product over the
// block's keys, Y [ROWS, HS] the staged key tile. dS's A fragments are the transposes of
// ds's 8x8 matrices, one transposing ldmatrix a k step: matrix i at keys 16 c + 8 (i / 2),
// queries 16 w + 8 (i % 2), which is b_origin's order of rows and words, so the fragment's
// four registers are the instruction's four in order. Only at HS = 64, where a tile of
// STREAM = ROWS queries fits a row of ds.
template <int HS>
__device__ __forceinline__ void accumulate_transposed(float (&acc)[Shape<HS>::DTILES][4], const Tile<HS> ds,
                                                      const Tile<HS> y) {
    using S = Shape<HS>;
    static_assert(S::STREAM == ROWS && S::WORDS >= ROWS / 2, "dS^T of a query tile fits a staged tile");
    const unsigned int* a_origin = b_origin(&ds[0][0], S::WORDS) + 8 * (threadIdx.x / WARP_SIZE);
    accumulate_over_rows<HS, 1>(&acc, y, [&](unsigned int a[1][4], int c) {
        load_matrices_transposed(a[0], a[0] + 2, a_origin + 16 * c * S::WORDS);
    });
}

// Row g + 8h of a warp's [16, HS] product accumulated by `accumulate`, times `scale`, into
// the bf16 `row` (4-byte aligned): this lane holds columns 8n + 2t and 8n + 2t + 1 of each
// accumulator n (acc[n][2h], acc[n][2h + 1]), written as one word unless they lie past hs.
// Each value is rounded once, to nearest even, by pack_bf16, as common.cuh's store rounds
// it. The 4 lanes of a quad write 16 consecutive bytes; a block stores its rows once.
template <int HS>
__device__ __forceinline__ void store_columns(bf16* row, const float acc[Shape<HS>::DTILES][4], int h, float scale,
                                              int hs) {
    const int t = threadIdx.x % 4;
    #pragma unroll
    for (int n = 0; n < Shape<HS>::DTILES; ++n) {
        if (8 * n >= hs) return;
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

// A warp's [16, STREAM] scores of a tile that crosses the diagonal or T, rows from r0 and
// columns from c0: -inf where key j may not see query i, so that their exponentials are 0.
// With queries in the rows (`transposed` false) that is j > i; rows past T are computed
// and never stored. With queries in the columns (the key side), also i >= T, which would
// otherwise add to every key's sums.
template <int HS>
__device__ __forceinline__ void mask_scores(float s[Shape<HS>::KTILES][4], int r0, int c0, int T, bool transposed) {
    #pragma unroll
    for (int n = 0; n < Shape<HS>::KTILES; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = r0 + acc_row(e), col = c0 + 8 * n + acc_col(e);
            const int i = transposed ? col : row, j = transposed ? row : col;
            if (j > i || (transposed && i >= T)) s[n][e] = NEG_INF;
        }
    }
}

// The dropout factors of this lane's elements of a warp's [16, STREAM] tile, rows from r0 and
// columns from c0 (queries in the rows, or with `transposed` in the columns): bit 4n + e
// of the result is set where attention_head.cuh's dropout_factor keeps element s[n][e]
// (its factor mask.scale, else 0). The elements are drawn one at a time in a loop that is
// not unrolled, so that 32 elements' Philox rounds do not compete for registers with the
// products' accumulators, and the bits index no register array.
template <int HS>
__device__ __forceinline__ unsigned int kept(const DropoutMask& mask, unsigned long long bh, int T, int r0, int c0,
                                             bool transposed) {
    unsigned int bits = 0;
    #pragma unroll 1
    for (int b = 0; b < 4 * Shape<HS>::KTILES; ++b) {
        const int row = r0 + acc_row(b % 4), col = c0 + 8 * (b / 4) + acc_col(b % 4);
        const int i = transposed ? col : row, j = transposed ? row : col;
        if (dropout_factor(mask, bh, T, i, j) != 0.0f) bits |= 1u << b;
    }
    return bits;
}

// out[n][e] = x[n][e] times its dropout factor: mask.scale where bit 4n + e of `bits`
// (kept's) is set, else 0. `out` may be `x`.
template <int HS>
__device__ __forceinline__ void times_kept(float out[Shape<HS>::KTILES][4], const float x[Shape<HS>::KTILES][4],
                                           unsigned int bits, float scale) {
    #pragma unroll
    for (int c = 0; c < Shape<HS>::KTILES; ++c) {
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
#define SHAPE_ARGS int T, int NH, int KV, int hs, DropoutMask mask, int dropout
#define SHAPE T, NH, KV, hs, mask, dropout

// out [B, T, NH hs] (bf16) and lse [B * NH * T] (fp32) from qkv [B, T, (NH + 2 KV) hs]
// (bf16), with k and v two buffers of staged key and value tiles (tile n in [n % 2]). Warp
// w owns M row tiles of 16 queries, rows r0 = i0 + 16 M w .. + 16 M - 1 of the block's
// 16 M WARPS; this lane keeps the running maximum m (log2 units), its part of the sum l
// and the output o of its two rows g and g + 8 of each. Key tiles up to the block's last
// row, of which a warp multiplies those up to its own: a tile wholly past its rows would
// leave its sums as they are (every weight 0, the maximum unchanged), so skipping it
// changes no bit, and every row's tiles are those a block of 64 rows takes.
template <int HS, int M>
__device__ __forceinline__ void forward(Tile<HS> k[2], Tile<HS> v[2], bf16* out, float* lse, const bf16* qkv,
                                        SHAPE_ARGS) {
    using S = Shape<HS>;
    const Head hd = head_of(T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const bf16 *keys = qkv + hd.k, *values = qkv + hd.v;
    const int warp = threadIdx.x / WARP_SIZE, tile = gridDim.x - 1 - blockIdx.x;
    const int i0 = tile * 16 * M * WARPS, r0 = i0 + 16 * M * warp, tiles = (i0 + 16 * M * WARPS) / S::STREAM;
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

    // The end of the warp's rows, read from lane 0 so that the compiler knows it is the same
    // across the warp: the test of a tile against it is then a branch the whole warp takes,
    // and ptxas does not wrap the quad's shuffles inside it in code that gathers diverged
    // lanes (NVRTC 13.0). With one row tile a warp every tile holds keys of its rows.
    const int end = M == 1 ? T : __shfl_sync(FULL_MASK, r0 + 16 * M, 0);

    uint4 f[S::FETCHES];
    stage_tile<HS>(k[0], f, keys, hd.stride, 0, T, hs);
    stage_tile<HS>(v[0], f, values, hd.stride, 0, T, hs);
    for (int n = 0; n < tiles; ++n) {
        const int j0 = n * S::STREAM, cur = n % 2, next = n + 1 < tiles;
        const bool mine = M == 1 || j0 < end;  // the tile holds a key some row of the warp sees
        __syncthreads();  // tile n is staged, and every warp is done with tile n - 1's buffer
        if (next) fetch_tile<HS>(f, keys, hd.stride, j0 + S::STREAM, T, hs);
        float s[M][S::KTILES][4];
        if (mine) scores<HS, M>(s, q, k[cur]);
        if (next) {
            store_tile<HS>(k[1 - cur], f);
            fetch_tile<HS>(f, values, hd.stride, j0 + S::STREAM, T, hs);
        }
        if (mine) {
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                const int rows = r0 + 16 * m;
                if (j0 + S::STREAM > rows) mask_scores<HS>(s[m], rows, j0, T, false);  // crossing the diagonal
                // The rows' new maxima over the quad, in log2 units: the scores' maximum times
                // scale, which is the maximum of the scaled scores (rounding keeps their order),
                // one multiply a row where scaling each score took one an element. Key 0 is in
                // the first tile and every row's, so a row's maximum is finite from the first
                // tile (a later tile may mask a tile's rows whole: their maximum stays, and
                // their exponentials are 0).
                float m_new[2] = {NEG_INF, NEG_INF};
                #pragma unroll
                for (int c = 0; c < S::KTILES; ++c) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) m_new[e / 2] = fmaxf(m_new[e / 2], s[m][c][e]);
                }
                float correction[2];
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    m_new[h] = fmaxf(mx[m][h], scale * quad_max(m_new[h]));
                    correction[h] = exp2_ftz(mx[m][h] - m_new[h]);
                    mx[m][h] = m_new[h];
                    l[m][h] *= correction[h];
                }
                // P into s, 2^(s scale - m) with the exponent one multiply-add, summed
                // undropped (this lane's columns; the quad's parts add up at the end).
                #pragma unroll
                for (int c = 0; c < S::KTILES; ++c) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[m][c][e] = exp2_ftz(fmaf(s[m][c][e], scale, -mx[m][e / 2]));
                        l[m][e / 2] += s[m][c][e];
                    }
                }
                if (dropout)  // P', which o accumulates
                    times_kept<HS>(s[m], s[m], kept<HS>(mask, hd.bh, T, rows, j0, false), mask.scale);
                #pragma unroll
                for (int d = 0; d < S::DTILES; ++d) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) o[m][d][e] *= correction[e / 2];
                }
            }
            accumulate<HS, M>(o, s, v[cur]);
        }
        if (next) store_tile<HS>(v[1 - cur], f);
    }
    #pragma unroll
    for (int m = 0; m < M; ++m) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = r0 + 16 * m + acc_row(2 * h);
            l[m][h] = quad_sum(l[m][h]);
            if (i < T) store_columns<HS>(out + hd.io + (unsigned long long)i * C, o[m], h, 1.0f / l[m][h], hs);
            if (threadIdx.x % 4 == 0 && i < T) lse[hd.bh * T + i] = mx[m][h] * LN2 + logf(l[m][h]);
        }
    }
}

// delta_i = dout_i . out_i (fp32, from the bf16 dout and out) of this lane's rows of a
// warp's 16 from r0, g and g + 8, into D and, for rows below T, into delta [B * NH * T]:
// the quad splits a row's dimensions, 8 bf16 of each of dout and out at a time (16-byte
// loads, aligned as fetch_tile's), and adds its parts in a fixed order.
__device__ __forceinline__ void row_deltas(float D[2], float* delta, const bf16* out, const bf16* dout,
                                           const Head& hd, int r0, int T, int NH, int hs) {
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
        D[h] = quad_sum(part);
        if (t == 0 && i < T) delta[hd.bh * T + i] = D[h];
    }
}

// Backward through the query side, one block per query tile: delta_i = dout_i . out_i
// (fp32, from the bf16 dout and out) into delta [B * NH * T] for the key side, and
// dq_i = scale * sum_j dS_ij k_j into dqkv (bf16), with P_ij = exp(s_ij - lse_i),
// dP_ij = keep_ij * (dout_i . v_j) and dS_ij = P_ij (dP_ij - delta_i).
template <int HS>
__device__ __forceinline__ void backward_query(Tile<HS> k[2], Tile<HS> v[2], bf16* dqkv, float* delta,
                                               const bf16* qkv, const bf16* out, const bf16* dout, const float* lse,
                                               SHAPE_ARGS) {
    using S = Shape<HS>;
    const Head hd = head_of(T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const bf16 *keys = qkv + hd.k, *values = qkv + hd.v;
    const int warp = threadIdx.x / WARP_SIZE, tile = gridDim.x - 1 - blockIdx.x;
    const int i0 = tile * ROWS, r0 = i0 + 16 * warp, tiles = (i0 + ROWS) / S::STREAM;
    const float scale = 1.0f / sqrtf((float)hs), scale2 = LOG2E * scale;

    unsigned int q[S::STEPS][4] = {}, dy[S::STEPS][4] = {};  // the warp's queries and output gradients
    #pragma unroll
    for (int kk = 0; kk < S::STEPS && 16 * kk < hs; ++kk) {
        load_a_bf16(q[kk], qkv + hd.q, hd.stride, r0, T, kk);
        load_a_bf16(dy[kk], dout + hd.io, C, r0, T, kk);
    }
    // delta and lse (log2 units) of this lane's rows g and g + 8.
    float D[2], L[2];
    row_deltas(D, delta, out, dout, hd, r0, T, NH, hs);
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = r0 + acc_row(2 * h);
        L[h] = i < T ? LOG2E * lse[hd.bh * T + i] : 0.0f;
    }
    float dq[S::DTILES][4] = {};

    uint4 f[S::FETCHES];
    stage_tile<HS>(k[0], f, keys, hd.stride, 0, T, hs);
    stage_tile<HS>(v[0], f, values, hd.stride, 0, T, hs);
    for (int n = 0; n < tiles; ++n) {
        const int j0 = n * S::STREAM, cur = n % 2, next = n + 1 < tiles;
        __syncthreads();  // tile n is staged, and every warp is done with tile n - 1's buffer
        if (next) fetch_tile<HS>(f, keys, hd.stride, j0 + S::STREAM, T, hs);
        float s[S::KTILES][4], dp[S::KTILES][4];
        scores<HS, 1>(&s, &q, k[cur]);
        if (next) store_tile<HS>(k[1 - cur], f);
        scores<HS, 1>(&dp, &dy, v[cur]);
        if (j0 + S::STREAM > i0) mask_scores<HS>(s, r0, j0, T, false);  // the tiles crossing the diagonal
        if (dropout) times_kept<HS>(dp, dp, kept<HS>(mask, hd.bh, T, r0, j0, false), mask.scale);
        // dS into s; zero where masked (P = 0).
        #pragma unroll
        for (int c = 0; c < S::KTILES; ++c) {
            #pragma unroll
            for (int e = 0; e < 4; ++e)
                s[c][e] = exp2_ftz(scale2 * s[c][e] - L[e / 2]) * (dp[c][e] - D[e / 2]);
        }
        // The next value tile's loads run under dq's product, which leaves s, not dp, live.
        if (next) fetch_tile<HS>(f, values, hd.stride, j0 + S::STREAM, T, hs);
        accumulate<HS, 1>(&dq, &s, k[cur]);
        if (next) store_tile<HS>(v[1 - cur], f);
    }
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = r0 + acc_row(2 * h);
        if (i < T) store_columns<HS>(dqkv + hd.q + (unsigned long long)i * hd.stride, dq, h, scale, hs);
    }
}

// What the key side needs to sum dq as well, in the one-kernel backward at head size 64
// (DQ): the block's key tile staged for dS k, where its ticket is broadcast (both shared
// memory), and the chain of dq's partial sums (global): a [ROWS, HS] fp32 tile for each
// query tile of each query head, in fragment order (warp, accumulator, lane: one 16-byte
// load a lane an accumulator), handed from key tile to key tile by turns (turns.cuh), and
// the turns' counters, B * NH * tiles of them (one a query tile of a query head), then B *
// KV tickets (one a key/value head).
template <int HS>
struct DqChain {
    Tile<HS>* keys;
    unsigned int* ticket;
    float4* partials;
    unsigned int* turns;
};

// dq's terms from the block's keys for query tile n of head hd: dS, in dp as this warp's
// keys' rows of dS^T, staged as bf16 over the tile's output gradients `ds` (every warp is
// done with them), then dS k over the block's ROWS keys for each warp's 16 queries, added
// to the partial sum. Query tile n's sum runs over key tiles n, n - 1, ..., 0 in that
// order, each adding its terms to the sum of those before (the diagonal's block starts it;
// key tile 0's rounds it to bf16 times 1 / sqrt(hs) into dqkv): fixed whatever the timing,
// so dq is bitwise deterministic, as the two-kernel backward's is.
template <int HS>
__device__ __forceinline__ void add_dq(const DqChain<HS>& chain, Tile<HS> ds, const float dp[Shape<HS>::KTILES][4],
                                       bf16* dqkv, const Head& hd, int key_tile, int n, int tiles, int T, int hs,
                                       float scale) {
    using S = Shape<HS>;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    __syncthreads();  // every warp is done with the tile's output gradients
    #pragma unroll
    for (int c = 0; c < S::KTILES; ++c) {
        ds[16 * warp + g][4 * c + t] = pack_bf16(dp[c][0], dp[c][1]);
        ds[16 * warp + g + 8][4 * c + t] = pack_bf16(dp[c][2], dp[c][3]);
    }
    __syncthreads();  // dS^T is whole before any warp reads its columns
    float dq[S::DTILES][4] = {};
    accumulate_transposed<HS>(dq, ds, *chain.keys);
    const unsigned long long at = hd.bh * tiles + n;
    float4* part = chain.partials + (at * WARPS + warp) * S::DTILES * WARP_SIZE + lane;
    if (n != key_tile) {
        wait_turn(chain.turns + at, n - key_tile);
        #pragma unroll
        for (int d = 0; d < S::DTILES; ++d) {
            const float4 sum = __ldcg(part + d * WARP_SIZE);
            dq[d][0] = sum.x + dq[d][0];
            dq[d][1] = sum.y + dq[d][1];
            dq[d][2] = sum.z + dq[d][2];
            dq[d][3] = sum.w + dq[d][3];
        }
    }
    if (key_tile == 0) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = n * ROWS + 16 * warp + acc_row(2 * h);
            if (i < T) store_columns<HS>(dqkv + hd.q + (unsigned long long)i * hd.stride, dq, h, scale, hs);
        }
        return;
    }
    #pragma unroll
    for (int d = 0; d < S::DTILES; ++d) __stcg(part + d * WARP_SIZE, make_float4(dq[d][0], dq[d][1], dq[d][2], dq[d][3]));
    pass_turn(chain.turns + at);
}

// The block's key tile: blockIdx.x, or with DQ its ticket's, the last tile taking the
// first ticket of its key/value head.
template <int HS, bool DQ>
__device__ __forceinline__ int key_tile_of(const DqChain<HS>& chain, int tiles, int NH, int KV) {
    if constexpr (DQ) {
        unsigned int* tickets = chain.turns + (unsigned long long)gridDim.y / KV * NH * tiles;
        return tiles - 1 - (int)take_ticket(tickets + blockIdx.y, chain.ticket);
    } else {
        return blockIdx.x;
    }
}

// Backward through the key side, one block per key tile of a key/value head (blockIdx.y =
// b * KV + g), after the query side (it reads delta): dv_j = sum_i P'_ij dout_i and dk_j =
// scale * sum_i dS_ij q_i over the query tiles from the diagonal on, of each query head of
// the group in ascending order, into dqkv (bf16). Warp w owns keys j0 + 16w .. + 15 and
// works on the transposed products: S^T = k q^T and dP^T = v dout^T, whose columns are
// queries. q and dy are two buffers of staged query and output gradient tiles, L and D two
// of those queries' lse (log2 units) and delta. With DQ (head size 64) the block also adds
// dq's terms (add_dq), after the delta launch instead of the query side: its key tile is
// then its ticket's, taken in the order the blocks start (the last tile first), as the
// chain of each query tile's sum needs.
template <int HS, bool DQ>
__device__ __forceinline__ void backward_key_value(Tile<HS> q[2], Tile<HS> dy[2], float L[2][Shape<HS>::STREAM],
                                                   float D[2][Shape<HS>::STREAM], DqChain<HS> chain, bf16* dqkv,
                                                   const bf16* qkv, const bf16* dout, const float* lse,
                                                   const float* delta, SHAPE_ARGS) {
    using S = Shape<HS>;
    const Head kv = group_head(0, T, NH, KV, hs);
    const unsigned long long C = (unsigned long long)NH * hs;
    const int warp = threadIdx.x / WARP_SIZE, tiles = (T + S::STREAM - 1) / S::STREAM;
    const int key_tile = key_tile_of<HS, DQ>(chain, tiles, NH, KV);
    const int j0 = key_tile * ROWS, c0 = j0 + 16 * warp, first = j0 / S::STREAM;
    const float scale = 1.0f / sqrtf((float)hs), scale2 = LOG2E * scale;

    unsigned int k[S::STEPS][4] = {}, v[S::STEPS][4] = {};  // the warp's keys and values, read once
    #pragma unroll
    for (int kk = 0; kk < S::STEPS && 16 * kk < hs; ++kk) {
        load_a_bf16(k[kk], qkv + kv.k, kv.stride, c0, T, kk);
        load_a_bf16(v[kk], qkv + kv.v, kv.stride, c0, T, kk);
    }
    float dk[S::DTILES][4] = {}, dv[S::DTILES][4] = {};

    uint4 f[S::FETCHES];
    if constexpr (DQ) stage_tile<HS>(*chain.keys, f, qkv + kv.k, kv.stride, j0, T, hs);  // read after a tile's barrier
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
                L[buffer][threadIdx.x] = lse_i;
                D[buffer][threadIdx.x] = delta_i;
            }
        };
        __syncthreads();  // every warp is done with the previous head's last tile
        fetch_stats(first * S::STREAM);
        store_stats(first % 2);
        stage_tile<HS>(q[first % 2], f, queries, hd.stride, first * S::STREAM, T, hs);
        stage_tile<HS>(dy[first % 2], f, grads, C, first * S::STREAM, T, hs);
        for (int n = first; n < tiles; ++n) {
            const int i0 = n * S::STREAM, cur = n % 2, next = n + 1 < tiles;
            __syncthreads();  // tile n is staged, and every warp is done with tile n - 1's buffer
            if (next) {
                fetch_stats(i0 + S::STREAM);
                fetch_tile<HS>(f, queries, hd.stride, i0 + S::STREAM, T, hs);
            }
            // S^T, then P, and dv's product before dP^T's, so that P and dP^T are live
            // together only while dS is formed.
            float s[S::KTILES][4], dp[S::KTILES][4];
            scores<HS, 1>(&s, &k, q[cur]);
            if (next) {
                store_stats(1 - cur);
                store_tile<HS>(q[1 - cur], f);
            }
            // The tiles crossing the diagonal, and the last if it runs past T.
            if (i0 < j0 + ROWS || i0 + S::STREAM > T) mask_scores<HS>(s, c0, i0, T, true);
            // P into s, transposed (row j, column i); zero where masked.
            #pragma unroll
            for (int c = 0; c < S::KTILES; ++c) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) s[c][e] = exp2_ftz(scale2 * s[c][e] - L[cur][8 * c + acc_col(e)]);
            }
            const unsigned int bits = dropout ? kept<HS>(mask, hd.bh, T, c0, i0, true) : 0u;
            if (dropout) {  // dv takes P' = P * keep, dS below P itself
                times_kept<HS>(dp, s, bits, mask.scale);
                accumulate<HS, 1>(&dv, &dp, dy[cur]);
            } else {
                accumulate<HS, 1>(&dv, &s, dy[cur]);
            }
            scores<HS, 1>(&dp, &v, dy[cur]);
            // dS into dp: P (keep * dP - delta).
            if (dropout) times_kept<HS>(dp, dp, bits, mask.scale);
            #pragma unroll
            for (int c = 0; c < S::KTILES; ++c) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) dp[c][e] = s[c][e] * (dp[c][e] - D[cur][8 * c + acc_col(e)]);
            }
            // The next output gradient tile's loads run under dk's product, which leaves only
            // dS live.
            if (next) fetch_tile<HS>(f, grads, C, i0 + S::STREAM, T, hs);
            accumulate<HS, 1>(&dk, &dp, q[cur]);
            if (next) store_tile<HS>(dy[1 - cur], f);
            if constexpr (DQ) add_dq<HS>(chain, dy[cur], dp, dqkv, hd, key_tile, n, tiles, T, hs, scale);
        }
    }
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = c0 + acc_row(2 * h);
        if (j >= T) continue;
        bf16* g = dqkv + (unsigned long long)j * kv.stride;
        store_columns<HS>(g + kv.k, dk, h, scale, hs);
        store_columns<HS>(g + kv.v, dv, h, 1.0f, hs);
    }
}

// The entry points, head sizes up to 64 and (suffix _hs128) up to 128, each with its
// shared memory, 2 blocks an SM (see the header).
extern "C" __global__ void __launch_bounds__(THREADS, 2)
    fused_attention_forward_bf16(bf16* out, float* lse, const bf16* qkv, SHAPE_ARGS) {
    alignas(16) __shared__ Tile<64> k[2], v[2];
    forward<64, 2>(k, v, out, lse, qkv, SHAPE);
}
extern "C" __global__ void __launch_bounds__(THREADS, 2)
    fused_attention_forward_bf16_hs128(bf16* out, float* lse, const bf16* qkv, SHAPE_ARGS) {
    alignas(16) __shared__ Tile<128> k[2], v[2];
    forward<128, 1>(k, v, out, lse, qkv, SHAPE);
}
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_query_bf16_hs128(bf16* dqkv, float* delta, const bf16* qkv, const bf16* out,
                                              const bf16* dout, const float* lse, SHAPE_ARGS) {
    alignas(16) __shared__ Tile<128> k[2], v[2];
    backward_query<128>(k, v, dqkv, delta, qkv, out, dout, lse, SHAPE);
}
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_key_value_bf16_hs128(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                                                  const float* delta, SHAPE_ARGS) {
    alignas(16) __shared__ Tile<128> q[2], dy[2];
    __shared__ float L[2][Shape<128>::STREAM], D[2][Shape<128>::STREAM];
    backward_key_value<128, false>(q, dy, L, D, DqChain<128>{}, dqkv, qkv, dout, lse, delta, SHAPE);
}

// The backward at head sizes up to 64 in two launches: delta, and the turns' counters
// zeroed, a block per query tile of each query head as the forward's; then every gradient
// from the key side (DQ), five products a tile where the query side and the key side make
// seven between them.
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_delta_bf16(float* delta, unsigned int* turns, const bf16* out, const bf16* dout, int T,
                                        int NH, int KV, int hs) {
    const Head hd = head_of(T, NH, KV, hs);
    float D[2];
    row_deltas(D, delta, out, dout, hd, blockIdx.x * ROWS + 16 * (threadIdx.x / WARP_SIZE), T, NH, hs);
    if (threadIdx.x != 0) return;
    turns[hd.bh * gridDim.x + blockIdx.x] = 0;
    // The group's ticket, from its first query head's first tile.
    const int group = NH / KV, h = blockIdx.y % NH;
    if (blockIdx.x == 0 && h % group == 0) turns[gridDim.y * gridDim.x + blockIdx.y / NH * KV + h / group] = 0;
}
extern "C" __global__ void __launch_bounds__(THREADS)
    fused_attention_backward_bf16(bf16* dqkv, float4* partials, unsigned int* turns, const bf16* qkv,
                                  const bf16* dout, const float* lse, const float* delta, SHAPE_ARGS) {
    alignas(16) __shared__ Tile<64> q[2], dy[2], k;
    __shared__ float L[2][Shape<64>::STREAM], D[2][Shape<64>::STREAM];
    __shared__ unsigned int ticket;
    backward_key_value<64, true>(q, dy, L, D, DqChain<64>{&k, &ticket, partials, turns}, dqkv, qkv, dout, lse, delta,
                                 SHAPE);
}
