// LayerNorm over the last dimension, statistics in fp32.
// One warp per row for the row-wise passes; the parameter gradients are column sums,
// reduced in two fixed stages (per chunk of rows here, then `add_partials` in bias.cu) so
// the result does not depend on scheduling.
//
// Each kernel has a bf16-storage twin (NAME_bf16) for `precision: bf16` activations: one
// body, the input, output and their gradients bf16; the weights, mean, rstd and partial
// sums fp32, the arithmetic fp32.
#include "warp_row.cuh"

// out = (x - mean) * rstd * weight + bias with rstd = 1 / sqrt(var + eps); mean and rstd
// saved per row for backward. Three passes over the row in runs (warp_row.cuh), the second
// and third from L1.
template <typename T>
__device__ __forceinline__ void layernorm_forward_body(T* out, float* mean, float* rstd, const T* inp,
                                                       const float* weight, const float* bias, int N, int C,
                                                       float eps) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const T* x = inp + (unsigned long long)row * C;
    T* y = out + (unsigned long long)row * C;
    const bool whole = C % RUN == 0 && aligned16(x) && aligned16(y) && aligned16(weight) && aligned16(bias);
    with_whole(whole, [&](auto form) {
        float v[RUN];
        float sum = 0.0f;
        for_runs<RUN>(lane, C, [&](int c) {
            load_run(form, v, x, c, C);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) sum += v[k];
        });
        const float m = warp_sum(sum) / C;
        float sq = 0.0f;
        for_runs<RUN>(lane, C, [&](int c) {
            load_run(form, v, x, c, C, m);  // past C the mean: no deviation
            #pragma unroll
            for (int k = 0; k < RUN; ++k) {
                const float d = v[k] - m;
                sq += d * d;
            }
        });
        const float s = 1.0f / sqrtf(warp_sum(sq) / C + eps);
        for_runs<RUN>(lane, C, [&](int c) {
            float w[RUN], b[RUN];
            load_run(form, v, x, c, C);
            load_run(form, w, weight, c, C);
            load_run(form, b, bias, c, C);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) v[k] = (v[k] - m) * s * w[k] + b[k];
            store_run(form, y, v, c, C);
        });
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
    });
}

extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, int N, int C, float eps) {
    layernorm_forward_body(out, mean, rstd, inp, weight, bias, N, C, eps);
}

extern "C" __global__ void layernorm_forward_bf16(bf16* out, float* mean, float* rstd, const bf16* inp,
                                                  const float* weight, const float* bias, int N, int C,
                                                  float eps) {
    layernorm_forward_body(out, mean, rstd, inp, weight, bias, N, C, eps);
}

// residual = a + b, then out = layernorm(residual) as layernorm_forward: llm.c's
// fused_residual_forward, one launch and no second pass over the residual from memory.
template <typename T>
__device__ __forceinline__ void layernorm_residual_forward_body(T* residual, T* out, float* mean, float* rstd,
                                                                const T* a, const T* b, const float* weight,
                                                                const float* bias, int N, int C, float eps) {
    residual_add_row(residual, a, b, N, C);
    layernorm_forward_body(out, mean, rstd, (const T*)residual, weight, bias, N, C, eps);
}

extern "C" __global__ void layernorm_residual_forward(float* residual, float* out, float* mean, float* rstd,
                                                      const float* a, const float* b, const float* weight,
                                                      const float* bias, int N, int C, float eps) {
    layernorm_residual_forward_body(residual, out, mean, rstd, a, b, weight, bias, N, C, eps);
}

extern "C" __global__ void layernorm_residual_forward_bf16(bf16* residual, bf16* out, float* mean, float* rstd,
                                                           const bf16* a, const bf16* b, const float* weight,
                                                           const float* bias, int N, int C, float eps) {
    layernorm_residual_forward_body(residual, out, mean, rstd, a, b, weight, bias, N, C, eps);
}

// dinp (overwrite) = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)),
// with norm = (x - mean) * rstd and dnorm = dout * weight; plus dresidual where it is
// non-null (the residual gradient folded in, as llm.c's layernorm_backward adds into it).
// Two passes over the row in runs (warp_row.cuh).
template <typename T>
__device__ __forceinline__ void layernorm_backward_input_body(T* dinp, const T* dresidual, const T* dout,
                                                              const T* inp, const float* weight,
                                                              const float* mean, const float* rstd, int N,
                                                              int C) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const GradRow<T> rows(dinp, dresidual, dout, inp, weight, row, C);
    with_whole(rows.whole, [&](auto form) {
        const float m = mean[row], s = rstd[row];
        float g[RUN], v[RUN], w[RUN];
        float sum_dnorm = 0.0f, sum_dnorm_norm = 0.0f;
        for_runs<RUN>(lane, C, [&](int c) {
            rows.load(form, c, g, v, w);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) {
                const float dnorm = g[k] * w[k];
                sum_dnorm += dnorm;
                sum_dnorm_norm += dnorm * (v[k] - m) * s;
            }
        });
        const float mean_dnorm = warp_sum(sum_dnorm) / C;
        const float mean_dnorm_norm = warp_sum(sum_dnorm_norm) / C;
        for_runs<RUN>(lane, C, [&](int c) {
            rows.load(form, c, g, v, w);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) {
                const float dnorm = g[k] * w[k];
                const float norm = (v[k] - m) * s;
                g[k] = (dnorm - mean_dnorm - norm * mean_dnorm_norm) * s;
            }
            rows.write(form, c, g);
        });
    });
}

extern "C" __global__ void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                                    const float* weight, const float* mean,
                                                    const float* rstd, int N, int C) {
    layernorm_backward_input_body(dinp, (const float*)nullptr, dout, inp, weight, mean, rstd, N, C);
}

extern "C" __global__ void layernorm_backward_input_bf16(bf16* dinp, const bf16* dout, const bf16* inp,
                                                         const float* weight, const float* mean,
                                                         const float* rstd, int N, int C) {
    layernorm_backward_input_body(dinp, (const bf16*)nullptr, dout, inp, weight, mean, rstd, N, C);
}

extern "C" __global__ void layernorm_residual_backward_input(float* dinp, const float* dresidual,
                                                             const float* dout, const float* inp,
                                                             const float* weight, const float* mean,
                                                             const float* rstd, int N, int C) {
    layernorm_backward_input_body(dinp, dresidual, dout, inp, weight, mean, rstd, N, C);
}

extern "C" __global__ void layernorm_residual_backward_input_bf16(bf16* dinp, const bf16* dresidual,
                                                                  const bf16* dout, const bf16* inp,
                                                                  const float* weight, const float* mean,
                                                                  const float* rstd, int N, int C) {
    layernorm_backward_input_body(dinp, dresidual, dout, inp, weight, mean, rstd, N, C);
}

// Stage one of dweight += sum_rows(dout * norm) and dbias += sum_rows(dout): block y sums
// rows [y * rows_per_chunk, (y + 1) * rows_per_chunk) of one column per thread, in row
// order, into partial_w / partial_b [chunks, C].
template <typename T>
__device__ __forceinline__ void layernorm_backward_params_partial_body(float* partial_w, float* partial_b,
                                                                       const T* dout, const T* inp,
                                                                       const float* mean, const float* rstd,
                                                                       int N, int C, int rows_per_chunk) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int chunk = blockIdx.y;
    const int begin = chunk * rows_per_chunk;
    const int end = min(N, begin + rows_per_chunk);
    float w = 0.0f, b = 0.0f;
    for (int row = begin; row < end; ++row) {
        const unsigned long long i = (unsigned long long)row * C + c;
        const float d = to_float(dout[i]);
        w += d * (to_float(inp[i]) - mean[row]) * rstd[row];
        b += d;
    }
    partial_w[(unsigned long long)chunk * C + c] = w;
    partial_b[(unsigned long long)chunk * C + c] = b;
}

extern "C" __global__ void layernorm_backward_params_partial(float* partial_w, float* partial_b,
                                                             const float* dout, const float* inp,
                                                             const float* mean, const float* rstd,
                                                             int N, int C, int rows_per_chunk) {
    layernorm_backward_params_partial_body(partial_w, partial_b, dout, inp, mean, rstd, N, C, rows_per_chunk);
}

extern "C" __global__ void layernorm_backward_params_partial_bf16(float* partial_w, float* partial_b,
                                                                  const bf16* dout, const bf16* inp,
                                                                  const float* mean, const float* rstd,
                                                                  int N, int C, int rows_per_chunk) {
    layernorm_backward_params_partial_body(partial_w, partial_b, dout, inp, mean, rstd, N, C, rows_per_chunk);
}
