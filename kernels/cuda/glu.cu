// The gated linear units, out [N,F] = act(a) * b, where a (the gate) and b (the up
// projection) are the two halves of each row of inp [N,2F], as the CPU backend's
// kernels/src/cpu/glu.rs computes them, operation for operation: SwiGLU's act is
// silu(a) = a sigmoid(a), GeGLU's the tanh GELU of gelu.cuh. The sigmoids' exp is the GPU's
// expf where the CPU's is a polynomial, so the two agree to a few ulp, not bit for bit; far
// in the negative tail expf overflows to infinity and the sigmoid is 0 where the CPU's
// stops at e^-87.3.
//
// One 128-bit pack of outputs per thread, as GELU. Each kernel has a bf16-storage twin (NAME_bf16)
// for `precision: bf16` activations: one body, fp32 arithmetic, each result rounded once on
// its store.
#include "common.cuh"
#include "gelu.cuh"

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// A gate: act(a), and with it act'(a).
struct Silu {
    static __device__ __forceinline__ float act(float a) { return a * sigmoid(a); }
    // silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
    static __device__ __forceinline__ void act_and_slope(float a, float* act, float* slope) {
        const float s = sigmoid(a);
        *act = a * s;
        *slope = s * (1.0f + a * (1.0f - s));
    }
};

struct GeluTanh {
    static __device__ __forceinline__ float act(float a) { return gelu_value(a); }
    static __device__ __forceinline__ void act_and_slope(float a, float* act, float* slope) {
        *act = gelu_value(a);
        *slope = gelu_slope(a);
    }
};

// Each thread takes one 128-bit pack of out (common.cuh). Where F is a multiple of the pack
// the pack lies in one row, so its gates and ups are packs of inp as well; else, and for a
// partial or misaligned pack, the thread takes its elements one by one.
template <typename T>
__device__ __forceinline__ bool glu_vector(const T* rows, const T* inp, unsigned long long i, unsigned long long n,
                                           unsigned long long f) {
    return whole_pack<T>(i, n) && f % Pack<T>::LEN == 0 && aligned16(rows) && aligned16(inp);
}

template <typename G, typename T>
__device__ __forceinline__ void glu_forward_body(T* out, const T* inp, unsigned long long n, unsigned long long f) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = glu_vector(out, inp, i, n, f);
    Pack<T> po;
    if (vector) {
        const unsigned long long at = i / f * 2 * f + i % f;
        const Pack<T> pa = load_pack(inp, at, n, true), pb = load_pack(inp, at + f, n, true);
        for (int k = 0; k < Pack<T>::LEN; ++k) {
            const float a = to_float(pa.x[k]), b = to_float(pb.x[k]);
            store(&po.x[k], G::act(a) * b);
        }
    } else {
        for (int k = 0; k < Pack<T>::LEN && i + k < n; ++k) {
            const T* gate = inp + (i + k) / f * 2 * f + (i + k) % f;
            const float a = to_float(gate[0]), b = to_float(gate[f]);
            store(&po.x[k], G::act(a) * b);
        }
    }
    store_pack(out, po, i, n, vector);
}

// dinp [N,2F] (overwrite) = (dout * b * act'(a), dout * act(a)); one pack of dout per
// thread, writing both halves.
template <typename G>
__device__ __forceinline__ void glu_grads(float a, float b, float d, float* da, float* db) {
    float act, slope;
    G::act_and_slope(a, &act, &slope);
    *da = d * b * slope;
    *db = d * act;
}

template <typename G, typename T>
__device__ __forceinline__ void glu_backward_body(T* dinp, const T* inp, const T* dout, unsigned long long n,
                                                  unsigned long long f) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = glu_vector(dout, inp, i, n, f) && aligned16(dinp);
    const Pack<T> pd = load_pack(dout, i, n, vector);
    if (vector) {
        const unsigned long long at = i / f * 2 * f + i % f;
        const Pack<T> pa = load_pack(inp, at, n, true), pb = load_pack(inp, at + f, n, true);
        Pack<T> ga, gb;
        for (int k = 0; k < Pack<T>::LEN; ++k) {
            float da, db;
            glu_grads<G>(to_float(pa.x[k]), to_float(pb.x[k]), to_float(pd.x[k]), &da, &db);
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
        glu_grads<G>(to_float(inp[at]), to_float(inp[at + f]), to_float(pd.x[k]), &da, &db);
        store(dinp + at, da);
        store(dinp + at + f, db);
    }
}

// n = N * F outputs, f = F.
extern "C" __global__ void swiglu_forward(float* out, const float* inp, unsigned long long n,
                                          unsigned long long f) {
    glu_forward_body<Silu>(out, inp, n, f);
}

extern "C" __global__ void swiglu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n,
                                               unsigned long long f) {
    glu_forward_body<Silu>(out, inp, n, f);
}

extern "C" __global__ void swiglu_backward(float* dinp, const float* inp, const float* dout,
                                           unsigned long long n, unsigned long long f) {
    glu_backward_body<Silu>(dinp, inp, dout, n, f);
}

extern "C" __global__ void swiglu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                                unsigned long long n, unsigned long long f) {
    glu_backward_body<Silu>(dinp, inp, dout, n, f);
}

extern "C" __global__ void geglu_forward(float* out, const float* inp, unsigned long long n,
                                         unsigned long long f) {
    glu_forward_body<GeluTanh>(out, inp, n, f);
}

extern "C" __global__ void geglu_forward_bf16(bf16* out, const bf16* inp, unsigned long long n,
                                              unsigned long long f) {
    glu_forward_body<GeluTanh>(out, inp, n, f);
}

extern "C" __global__ void geglu_backward(float* dinp, const float* inp, const float* dout,
                                          unsigned long long n, unsigned long long f) {
    glu_backward_body<GeluTanh>(dinp, inp, dout, n, f);
}

extern "C" __global__ void geglu_backward_bf16(bf16* dinp, const bf16* inp, const bf16* dout,
                                               unsigned long long n, unsigned long long f) {
    glu_backward_body<GeluTanh>(dinp, inp, dout, n, f);
}
