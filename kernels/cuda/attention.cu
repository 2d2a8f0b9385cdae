// Helpers of the causal self-attention core; the matmuls around them are cuBLAS batched
// gemms over the B*NH heads. Heads are laid out [B, NH, T, hs] so each is one contiguous
// matrix for those gemms.
#include "common.cuh"

// dst[b, h, t, d] = src[b, t, offset + h * hs + d], src rows `src_stride` wide: one of
// q, k, v out of qkv [B, T, 3C] (stride 3C), or a [B, T, C] gradient (stride C).
extern "C" __global__ void split_heads(float* dst, const float* src, int B, int T, int NH, int hs,
                                       int src_stride, int offset) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)B * NH * T * hs) return;
    const int d = (int)(i % hs);
    const int t = (int)((i / hs) % T);
    const int h = (int)((i / ((unsigned long long)hs * T)) % NH);
    const unsigned long long b = i / ((unsigned long long)hs * T * NH);
    dst[i] = src[(b * T + t) * src_stride + offset + h * hs + d];
}

// The inverse: dst[b, t, offset + h * hs + d] = src[b, h, t, d], dst rows `dst_stride` wide.
// Writes every element of its columns, so it overwrites (input gradients).
extern "C" __global__ void merge_heads(float* dst, const float* src, int B, int T, int NH, int hs,
                                       int dst_stride, int offset) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)B * NH * T * hs) return;
    const int d = (int)(i % hs);
    const int t = (int)((i / hs) % T);
    const int h = (int)((i / ((unsigned long long)hs * T)) % NH);
    const unsigned long long b = i / ((unsigned long long)hs * T * NH);
    dst[(b * T + t) * dst_stride + offset + h * hs + d] = src[i];
}

// In place over att [rows = B*NH*T, T]: the scaled scores of row (.., t) become the softmax
// over the keys it sees, the `window` positions up to t (T: positions 0..t), and the
// masked positions become 0. One warp per row; lane l takes keys first + l + 32n.
extern "C" __global__ void causal_softmax_forward(float* att, unsigned long long rows, int T, int window) {
    const unsigned long long row = (unsigned long long)blockIdx.x * (blockDim.x / WARP_SIZE) +
                                   threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    const int t = (int)(row % T), first = max(0, t + 1 - window);
    float* a = att + row * T;
    float m = NEG_INF;
    for (int j = first + lane; j <= t; j += WARP_SIZE) m = fmaxf(m, a[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = first + lane; j <= t; j += WARP_SIZE) {
        const float e = expf(a[j] - m);
        a[j] = e;
        sum += e;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += WARP_SIZE) a[j] = first <= j && j <= t ? a[j] * inv : 0.0f;
}

// In place: datt (gradient of the probabilities) becomes the gradient of the scores,
// dscore[j] = p[j] * (datt[j] - sum_k p[k] * datt[k]) over the keys the row sees (as the
// forward's `window` says), 0 elsewhere.
extern "C" __global__ void causal_softmax_backward(float* datt, const float* att, unsigned long long rows,
                                                   int T, int window) {
    const unsigned long long row = (unsigned long long)blockIdx.x * (blockDim.x / WARP_SIZE) +
                                   threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    const int t = (int)(row % T), first = max(0, t + 1 - window);
    float* d = datt + row * T;
    const float* p = att + row * T;
    float dot = 0.0f;
    for (int j = first + lane; j <= t; j += WARP_SIZE) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += WARP_SIZE) d[j] = first <= j && j <= t ? p[j] * (d[j] - dot) : 0.0f;
}
