// SwiGLU, out [N,F] = silu(a) * b with silu(a) = a sigmoid(a), where a (the gate) and b (the
// up projection) are the two halves of each row of inp [N,2F], as the CPU backend's
// kernels/src/cpu/swiglu.rs computes it, operation for operation. The sigmoid's exp is the
// GPU's expf where the CPU's is a polynomial, so the two agree to a few ulp, not bit for
// bit; far in the negative tail expf(-a) overflows to infinity and the sigmoid is 0 where
// the CPU's stops at e^-87.3.
//
// One 128-bit pack of outputs per thread, as GELU. Each kernel has a bf16-storage twin (NAME_bf16)
// for `precision: bf16` activations: one body, fp32 arithmetic, each result rounded once on
// its store.
#include "common.cuh"

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// Each thread takes one 128-bit pack of out (common.cuh). Where F is a multiple of the pack
// the pack lies in one row, so its gates and ups are packs of inp as well; else, and for a
// partial or misaligned pack, the thread takes its elements one by one.
template <typename T>
__device__ __forceinline__ bool swiglu_vector(const T* rows, const T* inp, unsigned long long i, unsigned long long n,
                                              unsigned long long f) {
    return whole_pack<T>(i, n) && f % Pack<T>::LEN == 0 && aligned16(rows) && aligned16(inp);
}

template <typename T>
__device__ __forceinline__ void swiglu_forward_body(T* out, const T* inp, unsigned long long n,
                                                    unsigned long long f) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = swiglu_vector(out, inp, i, n, f);
    Pack<T> po;
    if (vector) {
        const unsigned long long at = i / f * 2 * f + i % f;
        const Pack<T> pa = load_pack(inp, at, n, true), pb = load_pack(inp, at + f, n, true);
        for (int k = 0; k < Pack<T>::LEN; ++k) {
            const float a = to_float(pa.x[k]), b = to_float(pb.x[k]);
            store(&po.x[k], a * sigmoid(a) * b);
        }
    } else {
        for (int k = 0; k < Pack<T>::LEN && i + k < n; ++k) {
            const T* gate = inp + (i + k) / f * 2 * f + (i + k) % f;
            const float a = to_float(gate[0]), b = to_float(gate[f]);
            store(&po.x[k], a * sigmoid(a) * b);
        }
    }
    store_pack(out, po, i, n, vector);
}

// n = N * F outputs, f = F.
extern "C" __global__ void swiglu_forward(float* out, const float* inp, unsigned long long n,
                                          unsigned long long f) {
    swiglu_forward_body(out, inp, n, f);
}

extern "C" __global__ void swiglu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n,
                                               unsigned long long f) {
    swiglu_forward_body(out, inp, n, f);
}

// dinp [N,2F] (overwrite) = (dout * b * silu'(a), dout * silu(a)), with s = sigmoid(a) and
// silu'(a) = s (1 + a (1 - s)); one pack of dout per thread, writing both halves.
__device__ __forceinline__ void swiglu_grads(float a, float b, float d, float* da, float* db) {
    const float s = sigmoid(a);
    *da = d * b * (s * (1.0f + a * (1.0f - s)));
    *db = d * (a * s);
}

template <typename T>
__device__ __forceinline__ void swiglu_backward_body(T* dinp, const T* inp, const T* dout,
                                                     unsigned long long n, unsigned long long f) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = swiglu_vector(dout, inp, i, n, f) && aligned16(dinp);
    const Pack<T> pd = load_pack(dout, i, n, vector);
    if (vector) {
        const unsigned long long at = i / f * 2 * f + i % f;
        const Pack<T> pa = load_pack(inp, at, n, true), pb = load_pack(inp, at + f, n, true);
        Pack<T> ga, gb;
        for (int k = 0; k < Pack<T>::LEN; ++k) {
            float da, db;
            swiglu_grads(to_float(pa.x[k]), to_float(pb.x[k]), to_float(pd.x[k]), &da, &db);
            store(&ga.x[k], da);
            store(&gb.x[k], db);
        }
        store_pack(dinp, ga, at, n, true);
        store_pack(dinp, gb, at + f, n, true);
        return;
    }
    for (int k = 0; k < Pack<T>::LEN && i + k < n; ++k) {
        const unsigned long long at = (i + k) / f * 2 * f + (i + k) % f;
        float da, db;
        swiglu_grads(to_float(inp[at]), to_float(inp[at + f]), to_float(pd.x[k]), &da, &db);
        store(dinp + at, da);
        store(dinp + at + f, db);
    }
}

extern "C" __global__ void swiglu_backward(float* dinp, const float* inp, const float* dout,
                                           unsigned long long n, unsigned long long f) {
    swiglu_backward_body(dinp, inp, dout, n, f);
}

extern "C" __global__ void swiglu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                                unsigned long long n, unsigned long long f) {
    swiglu_backward_body(dinp, inp, dout, n, f);
}
