// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm computes it in fp32:
// rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd).
// Laid out as layernorm.cu: one warp per row for the row-wise passes; the weight gradient is
// a column sum reduced in two fixed stages (per chunk of rows here, then `add_partials` in
// bias.cu) so the result does not depend on scheduling.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, the input, output and their gradients bf16; the weight, rstd and partial sums fp32,
// the arithmetic fp32.
#include "warp_row.cuh"

// out = weight * (x * rstd); rstd saved per row for backward. Two passes over the row in
// runs (warp_row.cuh), the second from L1.
template <typename T>
__device__ __forceinline__ void rmsnorm_forward_body(T* out, float* rstd, const T* inp, const float* weight,
                                                     int N, int C, float eps) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const T* x = inp + (unsigned long long)row * C;
    T* y = out + (unsigned long long)row * C;
    const bool whole = C % RUN == 0 && aligned16(x) && aligned16(y) && aligned16(weight);
    with_whole(whole, [&](auto form) {
        float v[RUN];
        float sq = 0.0f;
        for_runs<RUN>(lane, C, [&](int c) {
            load_run(form, v, x, c, C);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) sq += v[k] * v[k];
        });
        const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);
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
    rmsnorm_forward_body(out, rstd, inp, weight, N, C, eps);
}

extern "C" __global__ void rmsnorm_forward_bf16(bf16* out, float* rstd, const bf16* inp, const float* weight,
                                                int N, int C, float eps) {
    rmsnorm_forward_body(out, rstd, inp, weight, N, C, eps);
}

// residual = a + b, then out = rmsnorm(residual) as rmsnorm_forward: one launch and no
// second pass over the residual from memory.
template <typename T>
__device__ __forceinline__ void rmsnorm_residual_forward_body(T* residual, T* out, float* rstd, const T* a,
                                                              const T* b, const float* weight, int N, int C,
                                                              float eps) {
    residual_add_row(residual, a, b, N, C);
    rmsnorm_forward_body(out, rstd, (const T*)residual, weight, N, C, eps);
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

// dinp (overwrite) = (dnorm - norm * mean(dnorm * norm)) * rstd, with norm = x * rstd and
// dnorm = dout * weight: rstd's dependence on x gives the second term; plus dresidual where
// it is non-null (the residual gradient folded in). Two passes over the row in runs
// (warp_row.cuh).
template <typename T>
__device__ __forceinline__ void rmsnorm_backward_input_body(T* dinp, const T* dresidual, const T* dout,
                                                            const T* inp, const float* weight, const float* rstd,
                                                            int N, int C) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const GradRow<T> rows(dinp, dresidual, dout, inp, weight, row, C);
    with_whole(rows.whole, [&](auto form) {
        const float s = rstd[row];
        float g[RUN], v[RUN], w[RUN];
        float sum_dnorm_norm = 0.0f;
        for_runs<RUN>(lane, C, [&](int c) {
            rows.load(form, c, g, v, w);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) sum_dnorm_norm += g[k] * w[k] * (v[k] * s);
        });
        const float mean_dnorm_norm = warp_sum(sum_dnorm_norm) / C;
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
    rmsnorm_backward_input_body(dinp, (const float*)nullptr, dout, inp, weight, rstd, N, C);
}

extern "C" __global__ void rmsnorm_backward_input_bf16(bf16* dinp, const bf16* dout, const bf16* inp,
                                                       const float* weight, const float* rstd, int N, int C) {
    rmsnorm_backward_input_body(dinp, (const bf16*)nullptr, dout, inp, weight, rstd, N, C);
}

extern "C" __global__ void rmsnorm_residual_backward_input(float* dinp, const float* dresidual,
                                                           const float* dout, const float* inp,
                                                           const float* weight, const float* rstd, int N, int C) {
    rmsnorm_backward_input_body(dinp, dresidual, dout, inp, weight, rstd, N, C);
}

extern "C" __global__ void rmsnorm_residual_backward_input_bf16(bf16* dinp, const bf16* dresidual,
                                                                const bf16* dout, const bf16* inp,
                                                                const float* weight, const float* rstd, int N,
                                                                int C) {
    rmsnorm_backward_input_body(dinp, dresidual, dout, inp, weight, rstd, N, C);
}

// Stage one of dweight += sum_rows(dout * norm): block y sums rows
// [y * rows_per_chunk, (y + 1) * rows_per_chunk) of one column per thread, in row order,
// into partial_w [chunks, C].
template <typename T>
__device__ __forceinline__ void rmsnorm_backward_weight_partial_body(float* partial_w, const T* dout,
                                                                     const T* inp, const float* rstd, int N,
                                                                     int C, int rows_per_chunk) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int chunk = blockIdx.y;
    const int begin = chunk * rows_per_chunk;
    const int end = min(N, begin + rows_per_chunk);
    float w = 0.0f;
    for (int row = begin; row < end; ++row) {
        const unsigned long long i = (unsigned long long)row * C + c;
        w += to_float(dout[i]) * (to_float(inp[i]) * rstd[row]);
    }
    partial_w[(unsigned long long)chunk * C + c] = w;
}

extern "C" __global__ void rmsnorm_backward_weight_partial(float* partial_w, const float* dout, const float* inp,
                                                           const float* rstd, int N, int C, int rows_per_chunk) {
    rmsnorm_backward_weight_partial_body(partial_w, dout, inp, rstd, N, C, rows_per_chunk);
}

extern "C" __global__ void rmsnorm_backward_weight_partial_bf16(float* partial_w, const bf16* dout,
                                                                const bf16* inp, const float* rstd, int N, int C,
                                                                int rows_per_chunk) {
    rmsnorm_backward_weight_partial_body(partial_w, dout, inp, rstd, N, C, rows_per_chunk);
}
