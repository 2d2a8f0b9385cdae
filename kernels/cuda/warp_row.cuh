// A warp's row: the norms (layernorm.cu, rmsnorm.cu) give each row of [N, C] to a warp,
// which walks it in runs of a 128-bit pack of the activations' T (8 bf16 or 4 floats): lane
// l takes the runs from column RUN (l + 32 i). A run moves in 128-bit accesses of each
// operand (two of an fp32 one beside bf16 activations) where the row is whole, C a multiple
// of the run and every operand's row 16-byte aligned, and element by element otherwise.
// Whether it is whole is a template parameter (Whole, with_whole), so that a whole row's
// loops hold no test of it, and for_runs issues a lane's runs a batch at a time.
// (with_whole's callers pass generic lambdas, which NVRTC compiles as device code under
// -default-device: compile.rs.) Until 2026-11-27 a lane took one column at a time, a 2-byte
// load an element under bf16: about 26 instructions an element over LayerNorm's forward
// passes and 34 over its backward, now about 13 and 18 (bf16, the SASS of NVRTC 13.0 for
// sm_90).
#pragma once

#include "common.cuh"

// The row of [N, C] this thread's warp takes: a block's warps take consecutive rows.
__device__ __forceinline__ int warp_row_index() { return blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE; }

// The form of a row: whole or not, as a type, which load_run and store_run take apart.
template <bool W>
struct Whole {};

// f(Whole<true>{}) where `whole`, else f(Whole<false>{}): a row's passes compiled once for
// each form.
template <typename F>
__device__ __forceinline__ void with_whole(bool whole, F f) {
    if (whole) {
        f(Whole<true>{});
    } else {
        f(Whole<false>{});
    }
}

// The 4 words of a 128-bit load of T as floats: a bf16 pair's word gives its low value
// shifted up and its high value masked, one instruction each (taking each bf16 out of the
// word first cost two).
template <typename T>
__device__ __forceinline__ void unpack(uint4 u, float* v);
template <>
__device__ __forceinline__ void unpack<float>(uint4 u, float* v) {
    v[0] = __uint_as_float(u.x), v[1] = __uint_as_float(u.y), v[2] = __uint_as_float(u.z), v[3] = __uint_as_float(u.w);
}
template <>
__device__ __forceinline__ void unpack<bf16>(uint4 u, float* v) {
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// The floats v (16 bytes of T) as the words of a 128-bit store, rounded once: a bf16 pair
// by one pack_bf16.
template <typename T>
__device__ __forceinline__ uint4 pack_words(const float* v);
template <>
__device__ __forceinline__ uint4 pack_words<float>(const float* v) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
}
template <>
__device__ __forceinline__ uint4 pack_words<bf16>(const float* v) {
    return make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}

// f(c) for the first column c of each of this lane's runs of a row of C, in column order, a
// batch of RUNS_AHEAD runs at a time with a guard each rather than a loop with a remainder:
// at GPT-2's C = 768 a lane has 3 runs of bf16, which a loop unrolled by 4 leaves to its
// remainder, one load in flight at a time; guarded, the 3 loads of a pass go out together.
#define RUNS_AHEAD 4

template <int RUN, typename F>
__device__ __forceinline__ void for_runs(int lane, int C, F f) {
    for (int c0 = RUN * lane; c0 < C; c0 += RUNS_AHEAD * RUN * WARP_SIZE) {
        #pragma unroll
        for (int r = 0; r < RUNS_AHEAD; ++r) {
            const int c = c0 + r * RUN * WARP_SIZE;
            if (c < C) f(c);
        }
    }
}

// Columns [c, c + LEN) of the row x as floats, `fill` past C (a value whose part in the
// pass's sums is zero).
template <bool WHOLE, int LEN, typename T>
__device__ __forceinline__ void load_run(Whole<WHOLE>, float (&v)[LEN], const T* x, int c, int C, float fill = 0.0f) {
    if constexpr (WHOLE) {
        #pragma unroll
        for (int h = 0; h < LEN; h += 16 / sizeof(T)) unpack<T>(*reinterpret_cast<const uint4*>(x + c + h), v + h);
    } else {
        #pragma unroll
        for (int k = 0; k < LEN; ++k) v[k] = c + k < C ? to_float(x[c + k]) : fill;
    }
}

// v rounded once into columns [c, c + LEN) of the row y, those below C.
template <bool WHOLE, int LEN, typename T>
__device__ __forceinline__ void store_run(Whole<WHOLE>, T* y, const float (&v)[LEN], int c, int C) {
    if constexpr (WHOLE) {
        #pragma unroll
        for (int h = 0; h < LEN; h += 16 / sizeof(T)) *reinterpret_cast<uint4*>(y + c + h) = pack_words<T>(v + h);
    } else {
        #pragma unroll
        for (int k = 0; k < LEN; ++k) {
            if (c + k < C) store(y + c + k, v[k]);
        }
    }
}

// residual = a + b over the row of [N, C] that the norm after it gives this warp, run by run:
// the residual add that a fused norm runs first. Each lane stores the runs it then reads back
// in the norm's passes, so the row needs no barrier, and the norm reads the stored (in bf16,
// rounded) values: the bits of `add` in elementwise.cu and then the norm, which is what a
// recompute of the norm from the stored residual gives.
template <typename T>
__device__ __forceinline__ void residual_add_row(T* residual, const T* a, const T* b, int N, int C) {
    constexpr int RUN = Pack<T>::LEN;
    const int row = warp_row_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const unsigned long long base = (unsigned long long)row * C;
    const bool whole = C % RUN == 0 && aligned16(residual + base) && aligned16(a + base) && aligned16(b + base);
    with_whole(whole, [&](auto form) {
        for_runs<RUN>(lane, C, [&](int c) {
            float x[RUN], y[RUN];
            load_run(form, x, a + base, c, C);
            load_run(form, y, b + base, c, C);
            #pragma unroll
            for (int k = 0; k < RUN; ++k) x[k] += y[k];
            store_run(form, residual + base, x, c, C);
        });
    });
}

// The rows a norm's input-gradient kernel walks: this warp's row `row` of dout, inp, dinp and
// dresidual (null where there is none), the weight, and whether all of them are whole.
template <typename T>
struct GradRow {
    const T *dy, *x, *dr;
    T* dx;
    const float* weight;
    int C;
    bool whole;

    __device__ GradRow(T* dinp, const T* dresidual, const T* dout, const T* inp, const float* weight, int row,
                       int C)
        : weight(weight), C(C) {
        const unsigned long long base = (unsigned long long)row * C;
        dy = dout + base, x = inp + base, dr = dresidual == nullptr ? nullptr : dresidual + base, dx = dinp + base;
        whole = C % Pack<T>::LEN == 0 && aligned16(dy) && aligned16(x) && aligned16(dx) && aligned16(weight) &&
                (dr == nullptr || aligned16(dr));
    }

    // Columns [c, c + LEN) of dout, inp and the weight; zero past C, so no part in a sum.
    template <bool WHOLE, int LEN>
    __device__ __forceinline__ void load(Whole<WHOLE> form, int c, float (&g)[LEN], float (&v)[LEN],
                                         float (&w)[LEN]) const {
        load_run(form, g, dy, c, C);
        load_run(form, v, x, c, C);
        load_run(form, w, weight, c, C);
    }

    // The input gradients g of columns [c, c + LEN) into dinp, each plus the gradient that
    // reaches the norm's input along the residual path where there is one: added after g is
    // rounded to fp32 and never contracted into the multiply before it, as the separate
    // `accumulate` of elementwise.cu adds it, so fp32 gives that pair's bits.
    template <bool WHOLE, int LEN>
    __device__ __forceinline__ void write(Whole<WHOLE> form, int c, float (&g)[LEN]) const {
        if (dr != nullptr) {
            float r[LEN];
            load_run(form, r, dr, c, C);
            #pragma unroll
            for (int k = 0; k < LEN; ++k) g[k] = __fadd_rn(g[k], r[k]);
        }
        store_run(form, dx, g, c, C);
    }
};
