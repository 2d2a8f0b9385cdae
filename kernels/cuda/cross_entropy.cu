// Softmax cross-entropy over the vocabulary, fused with its gradient: one block per row of
// logits [N, V]; two reading passes (max, then sum of exponentials), and a third that
// overwrites the row with dloss/dlogits when a gradient is wanted.
#include "common.cuh"

extern "C" __global__ void cross_entropy(float* losses, float* logits, const unsigned int* targets,
                                         int V, int write_grad, float grad_scale) {
    __shared__ float scratch[WARP_SIZE];
    const unsigned long long row = blockIdx.x;
    float* x = logits + row * V;
    const unsigned int target = targets[row];

    float m = NEG_INF;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, scratch);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - m);
    sum = block_sum(sum, scratch);

    // Every thread has read x[target] before any thread overwrites it below.
    const float target_logit = x[target];
    __syncthreads();
    if (threadIdx.x == 0) losses[row] = logf(sum) - (target_logit - m);
    if (!write_grad) return;
    // d/dlogit_j = s * softmax_j - s * [j == target], as s / sum * exp, then the target.
    const float k = grad_scale / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float g = expf(x[j] - m) * k;
        x[j] = j == (int)target ? g - grad_scale : g;
    }
}
