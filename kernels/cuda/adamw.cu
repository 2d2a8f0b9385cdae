// One AdamW step with PyTorch's semantics (decoupled weight decay, bias-corrected moments),
// elementwise over one parameter tensor, in the CPU backend's arrangement:
//   p = p * decay - step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with decay = 1 - lr * wd, step_size = lr / (1 - beta1^t), bias2_sqrt = sqrt(1 - beta2^t)
// computed once per step on the host.
//
// Each thread steps one 128-bit pack of 4 floats (common.cuh), or with a bf16 copy two, so
// that the copy's 8 bf16 are one 128-bit store too; the arithmetic per element, and so the
// bits, are those of one element a thread.
#include "common.cuh"

struct AdamWConstants {
    float beta1, beta2, eps, grad_scale, decay, step_size, bias2_sqrt;
};

// The step on the pack of 4 elements at i (those below n): the moments updated in place,
// the parameter's new values returned, not stored.
__device__ __forceinline__ Pack<float> adamw_pack(const float* param, const float* grad, float* m, float* v,
                                                  unsigned long long i, unsigned long long n, bool vector,
                                                  const AdamWConstants& c) {
    const Pack<float> p = load_pack(param, i, n, vector), g = load_pack(grad, i, n, vector);
    Pack<float> pm = load_pack(m, i, n, vector), pv = load_pack(v, i, n, vector), out;
    for (int k = 0; k < Pack<float>::LEN; ++k) {
        const float gk = g.x[k] * c.grad_scale;
        pm.x[k] = c.beta1 * pm.x[k] + (1.0f - c.beta1) * gk;
        pv.x[k] = c.beta2 * pv.x[k] + (1.0f - c.beta2) * gk * gk;
        out.x[k] = p.x[k] * c.decay - c.step_size * pm.x[k] / (sqrtf(pv.x[k]) / c.bias2_sqrt + c.eps);
    }
    store_pack(m, pm, i, n, vector);
    store_pack(v, pv, i, n, vector);
    return out;
}

__device__ __forceinline__ bool aligned16(const float* a, const float* b, const float* c, const float* d) {
    return aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

// Launched over n / 4 threads, rounded up.
extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, unsigned long long n,
                                 float beta1, float beta2, float eps, float grad_scale, float decay,
                                 float step_size, float bias2_sqrt) {
    const unsigned long long i = pack_start<float>();
    if (i >= n) return;
    const bool vector = whole_pack<float>(i, n) && aligned16(param, grad, m, v);
    const AdamWConstants c{beta1, beta2, eps, grad_scale, decay, step_size, bias2_sqrt};
    store_pack(param, adamw_pack(param, grad, m, v, i, n, vector, c), i, n, vector);
}

// The same step on fp32 master weights that also refreshes their bf16 copy (as bits) in
// the same pass, rounded to nearest even from the updated value: the weights bf16 matmuls
// read, with no cast kernel per step (every parameter on a bf16 device). Launched over
// n / 8 threads, rounded up: a thread's 8 elements are two packs of each fp32 tensor and
// one of the copy.
extern "C" __global__ void adamw_with_bf16_copy(float* param, unsigned short* param_bf16, const float* grad,
                                                float* m, float* v, unsigned long long n, float beta1,
                                                float beta2, float eps, float grad_scale, float decay,
                                                float step_size, float bias2_sqrt) {
    const unsigned long long i = pack_start<unsigned short>();
    if (i >= n) return;
    const bool vector =
        whole_pack<unsigned short>(i, n) && aligned16(param, grad, m, v) && aligned16(param_bf16);
    const AdamWConstants c{beta1, beta2, eps, grad_scale, decay, step_size, bias2_sqrt};
    Pack<unsigned short> copy;
    for (int half = 0; half < 2; ++half) {
        // Past n, the pack reads zeros and stores nothing.
        const unsigned long long j = i + half * Pack<float>::LEN;
        const Pack<float> p = adamw_pack(param, grad, m, v, j, n, vector, c);
        store_pack(param, p, j, n, vector);
        for (int k = 0; k < Pack<float>::LEN; ++k) copy.x[half * Pack<float>::LEN + k] = bf16_bits(p.x[k]);
    }
    store_pack(param_bf16, copy, i, n, vector);
}
