// Zeroes many f32 tensors in one launch: a stage's gradients after its AdamW update, which
// took a memset each (149 a step for GPT-2 124M's stage, most of them vectors of 768). The
// tensors are laid out as sum_squares.cu and adamw.cu lay theirs: each block a fixed chunk
// of one tensor, `first` [count + 1] numbering the blocks, the tensor found by owner().
// Each thread zeroes one 128-bit pack of 4 floats, or where the pack is partial or the
// tensor off 16-byte alignment (a part of a tensor), its elements one by one.
#include "common.cuh"

// One tensor of the host's table (kernels/src/cuda/pointwise.rs): its first element and its
// length.
struct ZeroedTensor {
    float* x;
    unsigned long long n;
};

// Launched over first[count] blocks of ZERO_CHUNK / 4 threads.
extern "C" __global__ void zero_tensors(const ZeroedTensor* tensors, const unsigned long long* first, int count) {
    const int t = owner(first, count, blockIdx.x);
    const ZeroedTensor x = tensors[t];
    const unsigned long long i = ((blockIdx.x - first[t]) * blockDim.x + threadIdx.x) * Pack<float>::LEN;
    if (i >= x.n) return;
    const Pack<float> zeros{};
    if (whole_pack<float>(i, x.n) && aligned16(x.x)) {
        store_pack_streaming(x.x + i, zeros);
    } else {
        store_pack(x.x, zeros, i, x.n, false);
    }
}
