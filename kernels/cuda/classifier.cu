// The fused classifier: softmax cross-entropy over the vocabulary and its gradient, one
// block per row of logits [N, Vp]; and the same arithmetic split around a tensor-parallel
// group's exchange, for a rank that holds a shard of the vocabulary (the vocab_shard kernels). A row's first V columns are the vocabulary; the rest is
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

// The SoftmaxSum of a row's first V columns, in every thread.
//
// Each thread takes the row a 128-bit pack at a time (common.cuh): whole packs of an aligned
// row in one access, the row's last pack (V is rarely a multiple of the pack) element by
// element, so nothing past V is read. One bf16 at a time, the classifier moved 2 bytes a
// thread an access and took 7.6 ms of an H200's step at micro batch 32.
template <typename T>
__device__ SoftmaxSum row_softmax_sum(const T* x, int V, bool aligned, float* max_scratch, float* sum_scratch) {
    constexpr int LEN = Pack<T>::LEN;
    const int stride = blockDim.x * LEN, first = threadIdx.x * LEN;
    // Packs below `whole` lie wholly in the row; the one from `whole` to V (when V is not a
    // multiple of LEN) is its last, taken element by element.
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
    return block_merge(acc, max_scratch, sum_scratch);
}

// d/dlogit of the loss times grad_scale, less the target's onehot: grad_scale * softmax,
// 2^(x log2(e) - max log2(e)) * grad_scale / sum.
struct SoftmaxGrad {
    float shift, scale;
    __device__ SoftmaxGrad(SoftmaxSum row, float grad_scale) : shift(row.max * LOG2E), scale(grad_scale / row.sum) {}
    __device__ __forceinline__ float operator()(float logit) const { return exp2_ftz(fmaf(logit, LOG2E, -shift)) * scale; }
};

// Overwrites row x [Vp] with grad over its first V columns and 0 over the rest (the
// padding, never read). The target's onehot is the caller's: it is written again by the
// thread whose pack holds it (owns_column), after its pack, so no element of a pack
// tests whether it is the target.
template <typename T>
__device__ void write_softmax_grad(T* x, int V, int Vp, bool aligned, SoftmaxGrad grad) {
    constexpr int LEN = Pack<T>::LEN;
    const int stride = blockDim.x * LEN, whole = V / LEN * LEN;
    for (int j = threadIdx.x * LEN; j < Vp; j += stride) {
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
}

// Whether this thread wrote the pack that holds column `column` in write_softmax_grad.
template <typename T>
__device__ __forceinline__ bool owns_column(unsigned int column) {
    return column / Pack<T>::LEN % blockDim.x == threadIdx.x;
}

// losses [N] = -log softmax(row)[target]; with write_grad, each row [Vp] becomes
// grad_scale * (softmax - onehot(target)) over its V columns and 0 over its padding.
template <typename T>
__device__ __forceinline__ void fused_classifier_body(float* losses, T* logits, const unsigned int* targets,
                                                      int V, int Vp, int write_grad, float grad_scale) {
    __shared__ float max_scratch[WARP_SIZE];
    __shared__ float sum_scratch[WARP_SIZE];
    T* x = logits + (unsigned long long)blockIdx.x * Vp;
    const bool aligned = aligned16(x);
    const unsigned int target = targets[blockIdx.x];
    const SoftmaxSum row = row_softmax_sum(x, V, aligned, max_scratch, sum_scratch);
    // Every thread has read x[target] before any thread overwrites it below.
    const float target_logit = to_float(x[target]);
    __syncthreads();
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(row.sum) - (target_logit - row.max);
    if (!write_grad) return;
    const SoftmaxGrad grad(row, grad_scale);
    write_softmax_grad(x, V, Vp, aligned, grad);
    if (owns_column<T>(target)) store(&x[target], grad(target_logit) - grad_scale);
}

extern "C" __global__ void fused_classifier(float* losses, float* logits, const unsigned int* targets,
                                            int V, int Vp, int write_grad, float grad_scale) {
    fused_classifier_body(losses, logits, targets, V, Vp, write_grad, grad_scale);
}

extern "C" __global__ void fused_classifier_bf16(float* losses, bf16* logits, const unsigned int* targets,
                                                 int V, int Vp, int write_grad, float grad_scale) {
    fused_classifier_body(losses, logits, targets, V, Vp, write_grad, grad_scale);
}

// ---- one tensor-parallel rank's shard of the vocabulary --------------------------------
// Megatron's vocab_parallel_cross_entropy in two kernels around the group's exchange of
// three floats a row (stages' layers/vocab_parallel.rs): a rank's logits [N, V/t] never
// leave it. A target another rank's columns hold is OTHER_SHARD (kernels/src/op_args.rs).
#define OTHER_SHARD 0xFFFFFFFFu

// stats [N,3] = each row's max, its sum of exp(logit - max), and its target's logit (0 for
// another shard's target).
template <typename T>
__device__ __forceinline__ void vocab_shard_stats_body(float* stats, const T* logits, const unsigned int* targets,
                                                       int V) {
    __shared__ float max_scratch[WARP_SIZE];
    __shared__ float sum_scratch[WARP_SIZE];
    const T* x = logits + (unsigned long long)blockIdx.x * V;
    const SoftmaxSum row = row_softmax_sum(x, V, aligned16(x), max_scratch, sum_scratch);
    if (threadIdx.x != 0) return;
    const unsigned int target = targets[blockIdx.x];
    float* s = stats + 3ull * blockIdx.x;
    s[0] = row.max;
    s[1] = row.sum;
    s[2] = target == OTHER_SHARD ? 0.0f : to_float(x[target]);
}

// Each row of logits [N,V/t] becomes grad_scale * (softmax - onehot(target)) on the shard's
// columns, the softmax the whole row's: rows [N,2] holds its max and its sum of exp below it.
template <typename T>
__device__ __forceinline__ void vocab_shard_dlogits_body(T* logits, const float* rows, const unsigned int* targets,
                                                         int V, float grad_scale) {
    T* x = logits + (unsigned long long)blockIdx.x * V;
    const unsigned int target = targets[blockIdx.x];
    // Only the thread that writes the target's pack reads its logit, before it does: no
    // barrier (the fused kernel's thread 0 needs the logit for the loss).
    const bool holds_target = target != OTHER_SHARD && owns_column<T>(target);
    const float target_logit = holds_target ? to_float(x[target]) : 0.0f;
    const SoftmaxGrad grad({rows[2ull * blockIdx.x], rows[2ull * blockIdx.x + 1]}, grad_scale);
    write_softmax_grad(x, V, V, aligned16(x), grad);
    if (holds_target) store(&x[target], grad(target_logit) - grad_scale);
}

// losses [N] and rows [N,2] (each whole row's max and its sum of exp(logit - max)) from the
// group's statistics stats [members, N, 3], every rank's vocab_shard_stats in rank order,
// combined in that order: the max of the maxima, each sum rescaled to it, the one target
// logit (the others are 0). One thread a row.
extern "C" __global__ void vocab_shard_combine(float* losses, float* rows, const float* stats, int N, int members) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float max = NEG_INF, sum = 0.0f, target = 0.0f;
    for (int k = 0; k < members; ++k) max = fmaxf(max, stats[3ull * ((unsigned long long)k * N + n)]);
    for (int k = 0; k < members; ++k) {
        const float* s = stats + 3ull * ((unsigned long long)k * N + n);
        sum += s[1] * expf(s[0] - max);
        target += s[2];
    }
    losses[n] = logf(sum) - (target - max);
    rows[2ull * n] = max;
    rows[2ull * n + 1] = sum;
}

extern "C" __global__ void vocab_shard_stats(float* stats, const float* logits, const unsigned int* targets, int V) {
    vocab_shard_stats_body(stats, logits, targets, V);
}

extern "C" __global__ void vocab_shard_stats_bf16(float* stats, const bf16* logits, const unsigned int* targets,
                                                  int V) {
    vocab_shard_stats_body(stats, logits, targets, V);
}

extern "C" __global__ void vocab_shard_dlogits(float* logits, const float* rows, const unsigned int* targets, int V,
                                               float grad_scale) {
    vocab_shard_dlogits_body(logits, rows, targets, V, grad_scale);
}

extern "C" __global__ void vocab_shard_dlogits_bf16(bf16* logits, const float* rows, const unsigned int* targets,
                                                    int V, float grad_scale) {
    vocab_shard_dlogits_body(logits, rows, targets, V, grad_scale);
}
