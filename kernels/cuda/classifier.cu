// The fused classifier: softmax cross-entropy over the vocabulary and its gradient, one
// block per row of logits [N, Vp]. A row's first V columns are the vocabulary; the rest is
// padding (the CUDA device pads rows to a multiple of 128 columns), never read: it is never
// predicted and never in the loss, and its gradient is written as zero.
//
// One reading pass finds the row's maximum and its sum of exponentials together (online
// softmax: a thread rescales its running sum when its maximum grows); a second pass
// overwrites the row with dloss/dlogits when a gradient is wanted. No probabilities are
// stored: each is recomputed from the logit as its gradient is written.
//
// The kernel has a bf16-storage twin (fused_classifier_bf16) for `precision: bf16`: one
// body, the logits and dlogits bf16 (each dlogit rounded once as it is stored), the
// softmax sums and the losses fp32.
#include "common.cuh"

// The running maximum of the values seen and the sum of exp(x - max) over them. A thread
// that has seen no value (past the end of a short row) holds {NEG_INF, 0}.
struct SoftmaxSum {
    float max;
    float sum;
};

// a with a pack's values pushed, those past the row's end NEG_INF (each pack holds at least
// one value before it). The sum is rescaled at most once a pack, when the pack's maximum
// exceeds the running one; each value then adds 2^(x log2(e) - max log2(e)), the exponent
// one multiply-add. Until 2026-11-27 each value took a test (a new maximum?) and expf,
// about 17 instructions an element in all (the SASS of NVRTC 13.0 for sm_90).
template <int LEN>
__device__ __forceinline__ SoftmaxSum push_pack(SoftmaxSum a, const float (&x)[LEN]) {
    float m = x[0];
    #pragma unroll
    for (int k = 1; k < LEN; ++k) m = fmaxf(m, x[k]);
    if (m > a.max) {
        a.sum *= exp2_ftz((a.max - m) * LOG2E);
        a.max = m;
    }
    const float shift = a.max * LOG2E;
    #pragma unroll
    for (int k = 0; k < LEN; ++k) a.sum += exp2_ftz(fmaf(x[k], LOG2E, -shift));
    return a;
}

// Both sums rescaled to the larger maximum. Commutative bit for bit (IEEE addition is), so
// both lanes of a butterfly exchange hold the same result; two empty sums stay empty rather
// than meet exp(-inf - -inf).
__device__ __forceinline__ SoftmaxSum merge(SoftmaxSum a, SoftmaxSum b) {
    const float m = fmaxf(a.max, b.max);
    if (m == NEG_INF) return a;
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ SoftmaxSum warp_merge(SoftmaxSum v) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const SoftmaxSum other = {__shfl_xor_sync(FULL_MASK, v.max, offset),
                                  __shfl_xor_sync(FULL_MASK, v.sum, offset)};
        v = merge(v, other);
    }
    return v;
}

// The whole block's SoftmaxSum, in every thread; in a fixed order (warps, then one warp
// over the warps' results), so bitwise repeatable. The kernel's only block reduction, so no
// earlier reader of the scratch to wait for.
__device__ SoftmaxSum block_merge(SoftmaxSum v, float* max_scratch, float* sum_scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    v = warp_merge(v);
    if (lane == 0) {
        max_scratch[warp] = v.max;
        sum_scratch[warp] = v.sum;
    }
    __syncthreads();
    v = lane < warps ? SoftmaxSum{max_scratch[lane], sum_scratch[lane]} : SoftmaxSum{NEG_INF, 0.0f};
    return warp_merge(v);
}

// losses [N] = -log softmax(row)[target]; with write_grad, each row [Vp] becomes
// grad_scale * (softmax - onehot(target)) over its V columns and 0 over its padding.
//
// Each thread takes the row a 128-bit pack at a time (common.cuh): whole packs of an aligned
// row in one access, the vocabulary's last pack (V is rarely a multiple of the pack) element
// by element, so the padding is never read. One bf16 at a time, the kernel moved 2 bytes a
// thread an access and took 7.6 ms of an H200's step at micro batch 32.
template <typename T>
__device__ __forceinline__ void fused_classifier_body(float* losses, T* logits, const unsigned int* targets,
                                                      int V, int Vp, int write_grad, float grad_scale) {
    __shared__ float max_scratch[WARP_SIZE];
    __shared__ float sum_scratch[WARP_SIZE];
    constexpr int LEN = Pack<T>::LEN;
    T* x = logits + (unsigned long long)blockIdx.x * Vp;
    const bool aligned = aligned16(x);
    const int target = targets[blockIdx.x], stride = blockDim.x * LEN, first = threadIdx.x * LEN;
    // Packs below `whole` lie wholly in the vocabulary; the one from `whole` to V (when V is
    // not a multiple of LEN) is its last, taken element by element, as are packs of the
    // padding, which hold no logit.
    const int whole = V / LEN * LEN;

    SoftmaxSum acc = {NEG_INF, 0.0f};
    float values[LEN];
    for (int j = first; j < whole; j += stride) {
        const Pack<T> p = load_pack(x, j, V, aligned);
        #pragma unroll
        for (int k = 0; k < LEN; ++k) values[k] = to_float(p.x[k]);
        acc = push_pack(acc, values);
    }
    if (whole < V && whole / LEN % blockDim.x == threadIdx.x) {
        #pragma unroll
        for (int k = 0; k < LEN; ++k) values[k] = whole + k < V ? to_float(x[whole + k]) : NEG_INF;
        acc = push_pack(acc, values);
    }
    acc = block_merge(acc, max_scratch, sum_scratch);

    // Every thread has read x[target] before any thread overwrites it below.
    const float target_logit = to_float(x[target]);
    __syncthreads();
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(acc.sum) - (target_logit - acc.max);
    if (!write_grad) return;
    // d/dlogit_j = s * softmax_j - s * [j == target]: s / sum * 2^(x log2(e) - max log2(e)),
    // and at the target s less, written again by the thread whose pack holds it, after its
    // pack: no element of a pack tests whether it is the target.
    const float scale = grad_scale / acc.sum, shift = acc.max * LOG2E;
    const auto grad = [&](float logit) { return exp2_ftz(fmaf(logit, LOG2E, -shift)) * scale; };
    for (int j = first; j < Vp; j += stride) {
        Pack<T> g;
        if (j < whole) {
            const Pack<T> p = load_pack(x, j, V, aligned);
            #pragma unroll
            for (int k = 0; k < LEN; ++k) store(&g.x[k], grad(to_float(p.x[k])));
        } else {
            #pragma unroll
            for (int k = 0; k < LEN; ++k) store(&g.x[k], j + k < V ? grad(to_float(x[j + k])) : 0.0f);
        }
        store_pack(x, g, j, Vp, aligned && whole_pack<T>(j, Vp));
    }
    if (target / LEN % blockDim.x == threadIdx.x) store(&x[target], grad(target_logit) - grad_scale);
}

extern "C" __global__ void fused_classifier(float* losses, float* logits, const unsigned int* targets,
                                            int V, int Vp, int write_grad, float grad_scale) {
    fused_classifier_body(losses, logits, targets, V, Vp, write_grad, grad_scale);
}

extern "C" __global__ void fused_classifier_bf16(float* losses, bf16* logits, const unsigned int* targets,
                                                 int V, int Vp, int write_grad, float grad_scale) {
    fused_classifier_body(losses, logits, targets, V, Vp, write_grad, grad_scale);
}
