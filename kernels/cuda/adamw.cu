// One AdamW step with PyTorch's semantics (decoupled weight decay, bias-corrected moments),
// elementwise over one parameter tensor, in the CPU backend's arrangement:
//   p = p * decay - step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with decay = 1 - lr * wd, step_size = lr / (1 - beta1^t), bias2_sqrt = sqrt(1 - beta2^t)
// computed once per step on the host.
#include "common.cuh"

// Element i's step: its moments updated in place; returns its new fp32 value.
__device__ __forceinline__ float adamw_element(const float* param, const float* grad, float* m, float* v,
                                               unsigned long long i, float beta1, float beta2, float eps,
                                               float grad_scale, float decay, float step_size, float bias2_sqrt) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    return param[i] * decay - step_size * mi / (sqrtf(vi) / bias2_sqrt + eps);
}

extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, unsigned long long n,
                                 float beta1, float beta2, float eps, float grad_scale, float decay,
                                 float step_size, float bias2_sqrt) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    param[i] = adamw_element(param, grad, m, v, i, beta1, beta2, eps, grad_scale, decay, step_size, bias2_sqrt);
}

// The same step on fp32 master weights that also refreshes their bf16 copy (as bits) in
// the same pass, rounded to nearest even from the updated value: the weights bf16 matmuls
// read, with no cast kernel per step (a matrix parameter on a bf16 device).
extern "C" __global__ void adamw_with_bf16_copy(float* param, unsigned short* param_bf16, const float* grad,
                                                float* m, float* v, unsigned long long n, float beta1,
                                                float beta2, float eps, float grad_scale, float decay,
                                                float step_size, float bias2_sqrt) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float p = adamw_element(param, grad, m, v, i, beta1, beta2, eps, grad_scale, decay, step_size, bias2_sqrt);
    param[i] = p;
    param_bf16[i] = f32_to_bf16_bits(p);
}
