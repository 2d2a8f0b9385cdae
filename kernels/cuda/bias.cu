// Bias add and the deterministic column sums behind every bias / LayerNorm parameter
// gradient: per chunk of rows first, then over the chunks in order.
//
// bias_add and column_partial_sums each have a bf16-storage twin (NAME_bf16) for
// `precision: bf16` activations: one body, the activation bf16 and the bias and the sums
// fp32, the arithmetic fp32. add_partials reads only the fp32 partial sums, so has none.
#include "common.cuh"

// out[n, c] += bias[c]; one 128-bit pack of out per thread (common.cuh), which may span
// the end of a row: each element takes its own column's bias.
template <typename T>
__device__ __forceinline__ void bias_add_body(T* out, const float* bias, unsigned long long n_rows, int C) {
    const unsigned long long n = n_rows * C, i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out);
    Pack<T> p = load_pack(out, i, n, vector);
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&p.x[k], to_float(p.x[k]) + bias[(i + k) % C]);
    store_pack(out, p, i, n, vector);
}

extern "C" __global__ void bias_add(float* out, const float* bias, unsigned long long n_rows, int C) {
    bias_add_body(out, bias, n_rows, C);
}

extern "C" __global__ void bias_add_bf16(bf16* out, const float* bias, unsigned long long n_rows, int C) {
    bias_add_body(out, bias, n_rows, C);
}

// partial[chunk, c] = sum of x[row, c] over the rows of `chunk`, in row order (until
// 2026-11-27 with 4 loads in flight a thread, as the compiler unrolled the plain loop; now
// SUM_AHEAD).
template <typename T>
__device__ __forceinline__ void column_partial_sums_body(float* partial, const T* x, int N, int C,
                                                         int rows_per_chunk) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int chunk = blockIdx.y;
    const int end = min(N, (chunk + 1) * rows_per_chunk);
    const auto value = [&](int row) { return to_float(x[(unsigned long long)row * C + c]); };
    partial[(unsigned long long)chunk * C + c] = sum_in_order(0.0f, chunk * rows_per_chunk, end, value);
}

extern "C" __global__ void column_partial_sums(float* partial, const float* x, int N, int C,
                                               int rows_per_chunk) {
    column_partial_sums_body(partial, x, N, C, rows_per_chunk);
}

extern "C" __global__ void column_partial_sums_bf16(float* partial, const bf16* x, int N, int C,
                                                    int rows_per_chunk) {
    column_partial_sums_body(partial, x, N, C, rows_per_chunk);
}

// out[c] += sum over chunks of partial[chunk, c]: stage two of the column sums above and of
// the norms' parameter gradients. A block takes 32 columns, a lane each; each of its warps
// sums a run of consecutive chunks in order, SUM_AHEAD loads at a time, and the first warp
// adds the runs' sums in warp order. The tree depends on the chunks and the block size
// alone, so the bits are the same on every run. A step of 32768 rows has 512 chunks: 16
// warps sum 32 each. (One thread a column over all 512 waited out 64 rounds of loads, in 3
// blocks at GPT-2's width: about 20 us a launch on an H200, 98 launches a step.)
extern "C" __global__ void add_partials(float* out, const float* partial, int chunks, int C) {
    __shared__ float run_sums[WARP_SIZE][WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const int c = blockIdx.x * WARP_SIZE + lane;
    const int per_warp = (chunks + warps - 1) / warps;
    const int begin = min(chunks, warp * per_warp), end = min(chunks, begin + per_warp);
    const auto value = [&](int k) { return partial[(unsigned long long)k * C + c]; };
    run_sums[warp][lane] = c < C ? sum_in_order(0.0f, begin, end, value) : 0.0f;
    __syncthreads();
    if (warp == 0 && c < C) {
        float total = 0.0f;
        for (int w = 0; w < warps; ++w) total += run_sums[w][lane];
        out[c] += total;
    }
}
