// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm computes it in fp32:
// rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd).
// Laid out as layernorm.cu: one warp per row for the row-wise passes; the weight gradient is
// a column sum reduced in two fixed stages (per chunk of rows here, then `add_partials` in
// bias.cu) so the result does not depend on scheduling.
//
// QK-norm (Qwen3's, OLMo 2's) is this norm in place on qkv, each query and key head, or each
// whole query and key projection, a row: the bodies find a row, its width, its weight and a
// chunk's rows through `Dense` (the rows of [N, C]) or `QkRows` (QK-norm's), so both take the
// same arithmetic. Its weight gradients' chunks are of tokens.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, the input, output and their gradients bf16; the weight, rstd and partial sums fp32,
// the arithmetic fp32.
#include "warp_row.cuh"

// The sum of x^2 over a row of C, every lane of the warp given it: the runs in order, each
// lane's sum, then the warp's.
template <typename Form, typename T>
__device__ __forceinline__ float row_sum_squares(Form form, const T* x, int C, int lane) {
    constexpr int RUN = Pack<T>::LEN;
    float v[RUN];
    float sq = 0.0f;
    for_runs<RUN>(lane, C, [&](int c) {
        load_run(form, v, x, c, C);
        #pragma unroll
        for (int k = 0; k < RUN; ++k) sq += v[k] * v[k];
    });
    return warp_sum(sq);
}

// The rows a norm's kernels take, where each lies, its width and its weight. A weight-gradient
// chunk takes tokens, and a token's rows of weight `g` are `count(g)` consecutive rows from
// `first(n, g)`, `columns(g)` wide and apart; weight g's partial sums start at column
// `columns_before(g)` of each chunk.

// The rows of [N, C], one a token, all of the one weight.
struct Dense {
    const float* w;
    int C;
    __device__ unsigned long long offset(int row) const { return (unsigned long long)row * C; }
    __device__ int width(int) const { return C; }
    __device__ const float* weight(int) const { return w; }
    __device__ int first(int n, int) const { return n; }
    __device__ int count(int) const { return 1; }
    __device__ int columns(int) const { return C; }
    __device__ int columns_before(int) const { return 0; }
};

// The rows QK-norm normalises in qkv [N, (NQ CQ + 2 NK CK)] (kernels' QkNormRows): token n's
// NQ query rows of CQ (its query heads, or its whole query projection) and then its NK key
// rows of CK are rows n (NQ + NK) + h, from the token's start; its value side, NK CK wide, no
// row. Weight 0 (q_weight, [CQ]) is the query rows', weight 1 (k_weight, [CK]) the key rows'.
struct QkRows {
    const float *q_weight, *k_weight;
    int nq, nk, cq, ck;
    __device__ unsigned long long offset(int row) const {
        const int n = row / (nq + nk), h = row % (nq + nk);
        const int at = h < nq ? h * cq : nq * cq + (h - nq) * ck;
        return (unsigned long long)n * (nq * cq + 2 * nk * ck) + at;
    }
    __device__ int width(int row) const { return row % (nq + nk) < nq ? cq : ck; }
    __device__ const float* weight(int row) const { return row % (nq + nk) < nq ? q_weight : k_weight; }
    __device__ int first(int n, int g) const { return n * (nq + nk) + (g == 0 ? 0 : nq); }
    __device__ int count(int g) const { return g == 0 ? nq : nk; }
    __device__ int columns(int g) const { return g == 0 ? cq : ck; }
    __device__ int columns_before(int g) const { return g == 0 ? 0 : cq; }
};

// out = weight * (x * rstd) over N `rows`; rstd saved per row for backward. Two passes over
// the row in runs (warp_row.cuh), the second from L1. out may be inp (QK-norm's, in place):
// a lane reads each run before it writes it, and no other lane touches that run. With
// `parts` > 0 a row is 1/parts of a whole row cut across tensor ranks and rstd holds the
// whole row's sum of squares on entry (the group's), so the first pass is that read.
template <typename T, typename Rows>
__device__ __forceinline__ void rmsnorm_forward_body(T* out, float* rstd, const T* inp, Rows layout, int N,
                                                     float eps, int parts = 0) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const int C = layout.width(row);
    const T* x = inp + layout.offset(row);
    T* y = out + layout.offset(row);
    const float* weight = layout.weight(row);
    const bool whole = C % RUN == 0 && aligned16(x) && aligned16(y) && aligned16(weight);
    with_whole(whole, [&](auto form) {
        float v[RUN];
        float s;
        if (parts == 0) {
            s = 1.0f / sqrtf(row_sum_squares(form, x, C, lane) / C + eps);
        } else {
            // Lane 0 reads it and hands it round, before its own write below.
            const float sum = __shfl_sync(FULL_MASK, lane == 0 ? rstd[row] : 0.0f, 0);
            s = 1.0f / sqrtf(sum / (C * parts) + eps);
        }
        for_runs<RUN>(lane, C, [&](int c) {
            float w[RUN];
            load_run(form, v, x, c, C);
            load_run(form, w, weight, c, C);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) v[k] = w[k] * (v[k] * s);
            store_run(form, y, v, c, C);
        });
        if (lane == 0) rstd[row] = s;
    });
}

extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                                           int C, float eps) {
    rmsnorm_forward_body(out, rstd, inp, Dense{weight, C}, N, eps);
}

extern "C" __global__ void rmsnorm_forward_bf16(bf16* out, float* rstd, const bf16* inp, const float* weight,
                                                int N, int C, float eps) {
    rmsnorm_forward_body(out, rstd, inp, Dense{weight, C}, N, eps);
}

// residual = a + b, then out = rmsnorm(residual) as rmsnorm_forward: one launch and no
// second pass over the residual from memory.
template <typename T>
__device__ __forceinline__ void rmsnorm_residual_forward_body(T* residual, T* out, float* rstd, const T* a,
                                                              const T* b, const float* weight, int N, int C,
                                                              float eps) {
    residual_add_row(residual, a, b, N, C);
    rmsnorm_forward_body(out, rstd, (const T*)residual, Dense{weight, C}, N, eps);
}

extern "C" __global__ void rmsnorm_residual_forward(float* residual, float* out, float* rstd, const float* a,
                                                    const float* b, const float* weight, int N, int C,
                                                    float eps) {
    rmsnorm_residual_forward_body(residual, out, rstd, a, b, weight, N, C, eps);
}

extern "C" __global__ void rmsnorm_residual_forward_bf16(bf16* residual, bf16* out, float* rstd, const bf16* a,
                                                         const bf16* b, const float* weight, int N, int C,
                                                         float eps) {
    rmsnorm_residual_forward_body(residual, out, rstd, a, b, weight, N, C, eps);
}

// The sum of dnorm * norm over a GradRow, every lane of the warp given it.
template <typename Form, typename T>
__device__ __forceinline__ float row_dnorm_norm(Form form, const GradRow<T>& rows, float s, int lane) {
    constexpr int RUN = Pack<T>::LEN;
    float g[RUN], v[RUN], w[RUN];
    float sum = 0.0f;
    for_runs<RUN>(lane, rows.C, [&](int c) {
        rows.load(form, c, g, v, w);
        #pragma unroll
        for (int k = 0; k < RUN; ++k) sum += g[k] * w[k] * (v[k] * s);
    });
    return warp_sum(sum);
}

// dinp (overwrite) = (dnorm - norm * mean(dnorm * norm)) * rstd, with norm = x * rstd and
// dnorm = dout * weight: rstd's dependence on x gives the second term; plus dresidual where
// it is non-null (the residual gradient folded in). Two passes over the row in runs
// (warp_row.cuh). dinp may be dout (QK-norm's, in place), as out may be inp in the forward.
// With `parts` > 0 a row is 1/parts of a whole row cut across tensor ranks, and the mean is
// the whole row's sum in `dots` (the group's) over its width, not the first pass.
template <typename T, typename Rows>
__device__ __forceinline__ void rmsnorm_backward_input_body(T* dinp, const T* dresidual, const T* dout,
                                                            const T* inp, Rows layout, const float* rstd, int N,
                                                            const float* dots = nullptr, int parts = 0) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const int C = layout.width(row);
    const unsigned long long at = layout.offset(row);
    // GradRow's row 0 of the buffers from this row on.
    const GradRow<T> rows(dinp + at, dresidual == nullptr ? nullptr : dresidual + at, dout + at, inp + at,
                          layout.weight(row), 0, C);
    with_whole(rows.whole, [&](auto form) {
        const float s = rstd[row];
        float g[RUN], v[RUN], w[RUN];
        const float mean_dnorm_norm =
            parts == 0 ? row_dnorm_norm(form, rows, s, lane) / C : dots[row] / (C * parts);
        for_runs<RUN>(lane, C, [&](int c) {
            rows.load(form, c, g, v, w);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) {
                const float norm = v[k] * s;
                g[k] = (g[k] * w[k] - norm * mean_dnorm_norm) * s;
            }
            rows.write(form, c, g);
        });
    });
}

extern "C" __global__ void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp,
                                                  const float* weight, const float* rstd, int N, int C) {
    rmsnorm_backward_input_body(dinp, (const float*)nullptr, dout, inp, Dense{weight, C}, rstd, N);
}

extern "C" __global__ void rmsnorm_backward_input_bf16(bf16* dinp, const bf16* dout, const bf16* inp,
                                                       const float* weight, const float* rstd, int N, int C) {
    rmsnorm_backward_input_body(dinp, (const bf16*)nullptr, dout, inp, Dense{weight, C}, rstd, N);
}

extern "C" __global__ void rmsnorm_residual_backward_input(float* dinp, const float* dresidual,
                                                           const float* dout, const float* inp,
                                                           const float* weight, const float* rstd, int N, int C) {
    rmsnorm_backward_input_body(dinp, dresidual, dout, inp, Dense{weight, C}, rstd, N);
}

extern "C" __global__ void rmsnorm_residual_backward_input_bf16(bf16* dinp, const bf16* dresidual,
                                                                const bf16* dout, const bf16* inp,
                                                                const float* weight, const float* rstd, int N,
                                                                int C) {
    rmsnorm_backward_input_body(dinp, dresidual, dout, inp, Dense{weight, C}, rstd, N);
}

// Stage one of dweight += sum_rows(dout * norm) for weight g = blockIdx.z of `layout`: block
// (x, y, g) sums the rows of weight g of tokens [y * tokens_per_chunk, (y + 1) *
// tokens_per_chunk), one column per thread, in token and then row order, into partial_w:
// weight g's [chunks, columns(g)] from chunks * columns_before(g). The grid spans the widest
// weight's columns.
template <typename T, typename Rows>
__device__ __forceinline__ void rmsnorm_backward_weight_partial_body(float* partial_w, const T* dout,
                                                                     const T* inp, const float* rstd, Rows layout,
                                                                     int N, int tokens_per_chunk) {
    const int chunk = blockIdx.y, g = blockIdx.z;
    const int C = layout.columns(g);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int begin = chunk * tokens_per_chunk;
    const int end = min(N, begin + tokens_per_chunk);
    float w = 0.0f;
    for (int n = begin; n < end; ++n) {
        const int first = layout.first(n, g);
        unsigned long long i = layout.offset(first) + c;
        for (int row = first; row < first + layout.count(g); ++row, i += C) {
            w += to_float(dout[i]) * (to_float(inp[i]) * rstd[row]);
        }
    }
    partial_w[(unsigned long long)gridDim.y * layout.columns_before(g) + (unsigned long long)chunk * C + c] = w;
}

extern "C" __global__ void rmsnorm_backward_weight_partial(float* partial_w, const float* dout, const float* inp,
                                                           const float* rstd, int N, int C, int rows_per_chunk) {
    rmsnorm_backward_weight_partial_body(partial_w, dout, inp, rstd, Dense{nullptr, C}, N, rows_per_chunk);
}

extern "C" __global__ void rmsnorm_backward_weight_partial_bf16(float* partial_w, const bf16* dout,
                                                                const bf16* inp, const float* rstd, int N, int C,
                                                                int rows_per_chunk) {
    rmsnorm_backward_weight_partial_body(partial_w, dout, inp, rstd, Dense{nullptr, C}, N, rows_per_chunk);
}

// QK-norm in place on qkv (the rows of QkRows, N tokens): each query row becomes
// q_weight * (q * rstd), each key row k_weight * (k * rstd); rstd [N, NQ + NK]. One warp a
// row. `parts` 0: whole rows; else each row 1/parts of a whole row cut across tensor ranks,
// rstd holding the whole rows' sums of squares on entry.
template <typename T>
__device__ __forceinline__ void qk_norm_forward_body(T* qkv, float* rstd, const float* q_weight,
                                                     const float* k_weight, int N, int NQ, int NK, int CQ, int CK,
                                                     int parts, float eps) {
    const QkRows rows{q_weight, k_weight, NQ, NK, CQ, CK};
    rmsnorm_forward_body(qkv, rstd, (const T*)qkv, rows, N * (NQ + NK), eps, parts);
}

extern "C" __global__ void qk_norm_forward(float* qkv, float* rstd, const float* q_weight, const float* k_weight,
                                           int N, int NQ, int NK, int CQ, int CK, int parts, float eps) {
    qk_norm_forward_body(qkv, rstd, q_weight, k_weight, N, NQ, NK, CQ, CK, parts, eps);
}

extern "C" __global__ void qk_norm_forward_bf16(bf16* qkv, float* rstd, const float* q_weight,
                                                const float* k_weight, int N, int NQ, int NK, int CQ, int CK,
                                                int parts, float eps) {
    qk_norm_forward_body(qkv, rstd, q_weight, k_weight, N, NQ, NK, CQ, CK, parts, eps);
}

// Each row's sum of squares, sums [N, NQ + NK]: the forward's first half where rows are cut
// across tensor ranks, for the group to sum. One warp a row, summing as the forward does.
template <typename T>
__device__ __forceinline__ void qk_norm_sum_squares_body(const T* qkv, float* sums, int N, int NQ, int NK, int CQ,
                                                         int CK) {
    const QkRows rows{nullptr, nullptr, NQ, NK, CQ, CK};
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N * (NQ + NK)) return;
    const int C = rows.width(row);
    const T* x = qkv + rows.offset(row);
    with_whole(C % Pack<T>::LEN == 0 && aligned16(x), [&](auto form) {
        const float sum = row_sum_squares(form, x, C, lane);
        if (lane == 0) sums[row] = sum;
    });
}

extern "C" __global__ void qk_norm_sum_squares(const float* qkv, float* sums, int N, int NQ, int NK, int CQ,
                                               int CK) {
    qk_norm_sum_squares_body(qkv, sums, N, NQ, NK, CQ, CK);
}

extern "C" __global__ void qk_norm_sum_squares_bf16(const bf16* qkv, float* sums, int N, int NQ, int NK, int CQ,
                                                    int CK) {
    qk_norm_sum_squares_body(qkv, sums, N, NQ, NK, CQ, CK);
}

// QK-norm's input gradient in place on dqkv: its query and key rows, the gradient of the
// forward's output, become that of its input `inp` (the qkv the forward normalised); the
// value heads' are untouched. Run after the weight partial sums, which read dqkv first.
// `parts` 0: whole rows (`dots` unread); else each row 1/parts of a whole row, dots
// [N, NQ + NK] the whole rows' sums of dnorm * norm (the group's).
template <typename T>
__device__ __forceinline__ void qk_norm_backward_input_body(T* dqkv, const T* inp, const float* q_weight,
                                                            const float* k_weight, const float* rstd,
                                                            const float* dots, int N, int NQ, int NK, int CQ,
                                                            int CK, int parts) {
    const QkRows rows{q_weight, k_weight, NQ, NK, CQ, CK};
    rmsnorm_backward_input_body(dqkv, (const T*)nullptr, (const T*)dqkv, inp, rows, rstd, N * (NQ + NK), dots,
                                parts);
}

extern "C" __global__ void qk_norm_backward_input(float* dqkv, const float* inp, const float* q_weight,
                                                  const float* k_weight, const float* rstd, const float* dots,
                                                  int N, int NQ, int NK, int CQ, int CK, int parts) {
    qk_norm_backward_input_body(dqkv, inp, q_weight, k_weight, rstd, dots, N, NQ, NK, CQ, CK, parts);
}

extern "C" __global__ void qk_norm_backward_input_bf16(bf16* dqkv, const bf16* inp, const float* q_weight,
                                                       const float* k_weight, const float* rstd, const float* dots,
                                                       int N, int NQ, int NK, int CQ, int CK, int parts) {
    qk_norm_backward_input_body(dqkv, inp, q_weight, k_weight, rstd, dots, N, NQ, NK, CQ, CK, parts);
}

// Each row's sum of dnorm * norm, dots [N, NQ + NK], from dqkv before the input gradient
// overwrites it: the backward's first half where rows are cut across tensor ranks, for the
// group to sum. One warp a row, summing as the whole row's backward does.
template <typename T>
__device__ __forceinline__ void qk_norm_backward_dots_body(const T* dqkv, const T* inp, const float* q_weight,
                                                           const float* k_weight, const float* rstd, float* dots,
                                                           int N, int NQ, int NK, int CQ, int CK) {
    const QkRows layout{q_weight, k_weight, NQ, NK, CQ, CK};
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N * (NQ + NK)) return;
    const unsigned long long at = layout.offset(row);
    // A GradRow that writes nothing: its dinp is dout, never stored to here.
    const GradRow<T> rows(const_cast<T*>(dqkv) + at, nullptr, dqkv + at, inp + at, layout.weight(row), 0,
                          layout.width(row));
    with_whole(rows.whole, [&](auto form) {
        const float sum = row_dnorm_norm(form, rows, rstd[row], lane);
        if (lane == 0) dots[row] = sum;
    });
}

extern "C" __global__ void qk_norm_backward_dots(const float* dqkv, const float* inp, const float* q_weight,
                                                 const float* k_weight, const float* rstd, float* dots, int N,
                                                 int NQ, int NK, int CQ, int CK) {
    qk_norm_backward_dots_body(dqkv, inp, q_weight, k_weight, rstd, dots, N, NQ, NK, CQ, CK);
}

extern "C" __global__ void qk_norm_backward_dots_bf16(const bf16* dqkv, const bf16* inp, const float* q_weight,
                                                      const float* k_weight, const float* rstd, float* dots, int N,
                                                      int NQ, int NK, int CQ, int CK) {
    qk_norm_backward_dots_body(dqkv, inp, q_weight, k_weight, rstd, dots, N, NQ, NK, CQ, CK);
}

// Stage one of dq_weight and dk_weight += over N tokens: partial_w, the query rows' partial
// sums [chunks, CQ] (blockIdx.z 0) and then the key rows' [chunks, CK] (1), from the dqkv the
// input gradient then overwrites.
template <typename T>
__device__ __forceinline__ void qk_norm_backward_weight_partial_body(float* partial_w, const T* dqkv,
                                                                     const T* inp, const float* rstd, int N,
                                                                     int NQ, int NK, int CQ, int CK,
                                                                     int tokens_per_chunk) {
    const QkRows rows{nullptr, nullptr, NQ, NK, CQ, CK};
    rmsnorm_backward_weight_partial_body(partial_w, dqkv, inp, rstd, rows, N, tokens_per_chunk);
}

extern "C" __global__ void qk_norm_backward_weight_partial(float* partial_w, const float* dqkv,
                                                           const float* inp, const float* rstd, int N, int NQ,
                                                           int NK, int CQ, int CK, int tokens_per_chunk) {
    qk_norm_backward_weight_partial_body(partial_w, dqkv, inp, rstd, N, NQ, NK, CQ, CK, tokens_per_chunk);
}

extern "C" __global__ void qk_norm_backward_weight_partial_bf16(float* partial_w, const bf16* dqkv,
                                                                const bf16* inp, const float* rstd, int N,
                                                                int NQ, int NK, int CQ, int CK,
                                                                int tokens_per_chunk) {
    qk_norm_backward_weight_partial_body(partial_w, dqkv, inp, rstd, N, NQ, NK, CQ, CK, tokens_per_chunk);
}
