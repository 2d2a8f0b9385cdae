// One AdamW step with PyTorch's semantics (decoupled weight decay, bias-corrected moments),
// elementwise over one parameter tensor, in the CPU backend's arrangement:
//   p = p * decay - step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with decay = 1 - lr * wd, step_size = lr / (1 - beta1^t), bias2_sqrt = sqrt(1 - beta2^t)
// computed once per step on the host.

extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, unsigned long long n,
                                 float beta1, float beta2, float eps, float grad_scale, float decay,
                                 float step_size, float bias2_sqrt) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) / bias2_sqrt + eps);
}
