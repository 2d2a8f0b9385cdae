// One AdamW step with PyTorch's semantics (decoupled weight decay, bias-corrected moments)
// over every parameter of a stage in one launch, in the CPU backend's arrangement:
//   p = p * decay - step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with decay = 1 - lr * wd (1 for a parameter without weight decay), step_size = lr /
// (1 - beta1^t), bias2_sqrt = sqrt(1 - beta2^t) computed once per step on the host.
//
// One launch, not one a parameter: a GPT-2 124M stage has 148 parameters, most of them
// vectors of 768, and a launch each took 1.72 ms of kernels a step on an H200 (2026-11-27)
// where the bytes (30 a parameter: p, grad, m and v read, p, m, v and the bf16 copy
// written) take about 0.8 ms at HBM speed. The tensors are laid out as sum_squares.cu lays
// them: each block a fixed chunk of one tensor, `first` [count + 1] numbering the blocks
// (tensor t owns blocks first[t] .. first[t + 1]), the tensor found by owner().
//
// Each thread steps 8 elements: two 128-bit packs of 4 floats (common.cuh), and one pack
// of the bf16 copy where the parameter has one, so that the copy's 8 bf16 are one 128-bit
// store too; the arithmetic per element, and so the bits, are those of one element a
// thread. The packs move with the evict-first hint: nothing reads them again this step.
#include "common.cuh"

// One parameter's share of the step, as the host's table gives it (AdamWTensor in
// kernels/src/cuda/adamw.rs, field for field): n elements from each pointer.
struct AdamWTensor {
    float* param;
    unsigned short* copy;  // the parameter's bf16 copy, as bits, refreshed in the same pass; or null
    const float* grad;
    float* m;
    float* v;
    unsigned long long n;
    unsigned long long decays;  // weight decay applies (not to biases and norms)
};

struct AdamWConstants {
    float beta1, beta2, eps, grad_scale, decay, step_size, bias2_sqrt;
};

// The pack of a tensor of n elements at i: where `vector`, one streaming 128-bit access
// (every byte is touched once a step), else element by element below n.
template <typename T>
__device__ __forceinline__ Pack<T> load_once(const T* src, unsigned long long i, unsigned long long n, bool vector) {
    return vector ? load_pack_streaming(src + i) : load_pack(src, i, n, false);
}
template <typename T>
__device__ __forceinline__ void store_once(T* dst, const Pack<T>& p, unsigned long long i, unsigned long long n,
                                           bool vector) {
    if (vector) {
        store_pack_streaming(dst + i, p);
    } else {
        store_pack(dst, p, i, n, false);
    }
}

// The step on the pack of 4 elements at i (those below n): the moments updated in place,
// the parameter's new values returned, not stored.
__device__ __forceinline__ Pack<float> adamw_pack(const AdamWTensor& x, unsigned long long i, bool vector,
                                                  const AdamWConstants& c) {
    const Pack<float> p = load_once(x.param, i, x.n, vector), g = load_once(x.grad, i, x.n, vector);
    Pack<float> pm = load_once(x.m, i, x.n, vector), pv = load_once(x.v, i, x.n, vector), out;
    for (int k = 0; k < Pack<float>::LEN; ++k) {
        const float gk = g.x[k] * c.grad_scale;
        pm.x[k] = c.beta1 * pm.x[k] + (1.0f - c.beta1) * gk;
        pv.x[k] = c.beta2 * pv.x[k] + (1.0f - c.beta2) * gk * gk;
        out.x[k] = p.x[k] * c.decay - c.step_size * pm.x[k] / (sqrtf(pv.x[k]) / c.bias2_sqrt + c.eps);
    }
    store_once(x.m, pm, i, x.n, vector);
    store_once(x.v, pv, i, x.n, vector);
    return out;
}

// Elements a thread steps, and so a block's chunk of a tensor: ADAMW_ELEMENTS * blockDim.x
// (the host's `adamw_first_blocks` counts in the same chunks).
#define ADAMW_ELEMENTS 8

// Launched over first[count] blocks. `decay` is 1 - lr * wd, for the tensors that decay.
extern "C" __global__ void adamw(const AdamWTensor* tensors, const unsigned long long* first, int count,
                                 float beta1, float beta2, float eps, float grad_scale, float decay,
                                 float step_size, float bias2_sqrt) {
    const int t = owner(first, count, blockIdx.x);
    const AdamWTensor x = tensors[t];
    const unsigned long long i = ((blockIdx.x - first[t]) * blockDim.x + threadIdx.x) * ADAMW_ELEMENTS;
    if (i >= x.n) return;
    const bool vector = i + ADAMW_ELEMENTS <= x.n && aligned16(x.param) && aligned16(x.grad) && aligned16(x.m) &&
                        aligned16(x.v) && (x.copy == nullptr || aligned16(x.copy));
    const AdamWConstants c{beta1, beta2, eps, grad_scale, x.decays ? decay : 1.0f, step_size, bias2_sqrt};
    Pack<unsigned short> copy;
    for (int half = 0; half < 2; ++half) {
        // Past n, the pack reads zeros and stores nothing.
        const unsigned long long j = i + half * Pack<float>::LEN;
        const Pack<float> p = adamw_pack(x, j, vector, c);
        store_once(x.param, p, j, x.n, vector);
        if (x.copy == nullptr) continue;
        for (int k = 0; k < Pack<float>::LEN; ++k) copy.x[half * Pack<float>::LEN + k] = bf16_bits(p.x[k]);
    }
    if (x.copy != nullptr) store_once(x.copy, copy, i, x.n, vector);
}
