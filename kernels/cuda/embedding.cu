// Token + position embedding, forward and backward. Each kernel has a bf16-storage twin
// (NAME_bf16) for `precision: bf16` activations: one body, the embedding's output and its
// gradient bf16, the tables and their gradients fp32, the sums fp32. The bodies name their
// storage type S, since T is the sequence length here.
#include "common.cuh"

// out[n,c] = wte[tokens[n],c] + wpe[n % T,c]; one 128-bit pack of out per thread
// (common.cuh), which may span the end of a row: each element looks up its own row's token
// and its own column. A null wpe is a model without a position table (rotary positions):
// out is the wte row itself. A token 0xFFFFFFFF (OTHER_SHARD) is another tensor-parallel
// rank's: its row is zero.
template <typename S>
__device__ __forceinline__ void embedding_forward_body(S* out, const unsigned int* tokens, const float* wte,
                                                       const float* wpe, unsigned long long n_rows, int T,
                                                       int C) {
    constexpr int LEN = Pack<S>::LEN;
    const unsigned long long n = n_rows * C, i = pack_start<S>();
    if (i >= n) return;
    Pack<S> p;
    if (C % LEN == 0 && aligned16(out) && aligned16(wte) && (!wpe || aligned16(wpe))) {
        // The pack lies in one row, and its columns are an aligned run of the token's wte row
        // and the position's wpe row: those are read as packs of 4 floats too.
        const unsigned long long row = i / C;
        const int c = (int)(i % C), t = (int)(row % T);
        const unsigned int id = tokens[row];
        for (int q = 0; q < LEN / 4; ++q) {
            Pack<float> w = {};
            if (id != 0xFFFFFFFFu) w = *reinterpret_cast<const Pack<float>*>(wte + (unsigned long long)id * C + c + 4 * q);
            if (wpe) {
                const Pack<float> pos = *reinterpret_cast<const Pack<float>*>(wpe + (unsigned long long)t * C + c + 4 * q);
                for (int k = 0; k < 4; ++k) w.x[k] = w.x[k] + pos.x[k];
            }
            for (int k = 0; k < 4; ++k) store(&p.x[4 * q + k], w.x[k]);
        }
        store_pack(out, p, i, n, true);
        return;
    }
    for (int k = 0; k < LEN; ++k) {
        const unsigned long long e = i + k < n ? i + k : i;  // past the end: computed, never stored
        const unsigned long long row = e / C;
        const int c = (int)(e % C);
        const int t = (int)(row % T);
        const unsigned int id = tokens[row];
        const float token = id == 0xFFFFFFFFu ? 0.0f : wte[(unsigned long long)id * C + c];
        store(&p.x[k], wpe ? token + wpe[(unsigned long long)t * C + c] : token);
    }
    store_pack(out, p, i, n, whole_pack<S>(i, n) && aligned16(out));
}

extern "C" __global__ void embedding_forward(float* out, const unsigned int* tokens, const float* wte,
                                             const float* wpe, unsigned long long n_rows, int T, int C) {
    embedding_forward_body(out, tokens, wte, wpe, n_rows, T, C);
}

extern "C" __global__ void embedding_forward_bf16(bf16* out, const unsigned int* tokens, const float* wte,
                                                  const float* wpe, unsigned long long n_rows, int T, int C) {
    embedding_forward_body(out, tokens, wte, wpe, n_rows, T, C);
}

// dwte[token,:] += dout rows of that token. Atomics would make the sum order depend on
// timing, so the host groups the rows by token instead (`groups`: G distinct tokens, then
// G+1 offsets into the row list, then the rows of each token in ascending order) and one
// block adds one token's rows in that order.
//
// A common token has thousands of rows in a step, and its block is the launch's tail: its
// rows are loaded SUM_AHEAD at a time (common.cuh's sum_in_order), so that the block waits
// on memory once per batch rather than once per row (1.7 ms of an H200's step at micro
// batch 32, row by row).

template <typename S>
__device__ __forceinline__ void embedding_backward_wte_body(float* dwte, const S* dout,
                                                            const unsigned int* groups, int G, int C) {
    const unsigned int token = groups[blockIdx.x];
    const unsigned int* offsets = groups + G;
    const unsigned int* rows = groups + 2 * G + 1;
    const unsigned int begin = offsets[blockIdx.x], end = offsets[blockIdx.x + 1];
    float* dst = dwte + (unsigned long long)token * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const auto value = [&](int r) { return to_float(dout[(unsigned long long)rows[r] * C + c]); };
        dst[c] = sum_in_order(dst[c], begin, end, value);
    }
}

extern "C" __global__ void embedding_backward_wte(float* dwte, const float* dout,
                                                  const unsigned int* groups, int G, int C) {
    embedding_backward_wte_body(dwte, dout, groups, G, C);
}

extern "C" __global__ void embedding_backward_wte_bf16(float* dwte, const bf16* dout,
                                                       const unsigned int* groups, int G, int C) {
    embedding_backward_wte_body(dwte, dout, groups, G, C);
}

// dwpe[t,c] += sum over b of dout[b,t,c], b ascending; one thread per (t, c).
template <typename S>
__device__ __forceinline__ void embedding_backward_wpe_body(float* dwpe, const S* dout, int B, int T, int C) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long plane = (unsigned long long)T * C;
    if (i >= plane) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += to_float(dout[b * plane + i]);
    dwpe[i] = acc;
}

extern "C" __global__ void embedding_backward_wpe(float* dwpe, const float* dout, int B, int T, int C) {
    embedding_backward_wpe_body(dwpe, dout, B, T, C);
}

extern "C" __global__ void embedding_backward_wpe_bf16(float* dwpe, const bf16* dout, int B, int T, int C) {
    embedding_backward_wpe_body(dwpe, dout, B, T, C);
}
