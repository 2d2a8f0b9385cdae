// Helpers shared by the kernels: fixed-shape warp and block reductions, the bf16
// rounding, the loads and stores of kernels templated on their storage type, their 128-bit
// packs and the pointwise kernels' loop over them, and in-order column sums.
//
// Every reduction here combines values in an order fixed by the thread layout alone
// (butterfly shuffles, then one warp over the per-warp results), never by timing, so a
// kernel that uses them is bitwise deterministic.
#pragma once

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
// NVRTC compiles without the C headers, so no INFINITY macro.
#define NEG_INF __int_as_float(0xff800000)

// `name`, a reference to a `type` in the block's dynamic shared memory: the shared memory a
// kernel's launch gives (its shared_mem_bytes, at least sizeof(type)), which alone may pass
// the 48 KB of static shared memory, once the kernel's MAX_DYNAMIC_SHARED_SIZE_BYTES is
// raised to it (kernels/src/cuda/gpu.rs). The SIMT emulator defines its own, which fails a
// launch that gives fewer bytes.
#ifndef DYNAMIC_SHARED
#define DYNAMIC_SHARED(type, name)                                \
    extern __shared__ __align__(16) unsigned char name##_bytes[]; \
    type& name = *reinterpret_cast<type*>(name##_bytes)
#endif

// warp_sum and warp_max reduce over each aligned group of `lanes` lanes (a power of two
// up to the warp: a row of a 16-wide thread grid is half a warp); every lane of the warp
// takes part, and each receives its group's result.
__device__ __forceinline__ float warp_sum(float v, int lanes = WARP_SIZE) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v, int lanes = WARP_SIZE) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    }
    return v;
}

// Sum over the whole block; every thread receives the result. blockDim.x must be a
// multiple of 32 (at most 1024); `scratch` holds 32 values in shared memory.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // a previous call may still be reading scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : T(0);
    return warp_sum(v);
}

// Many tensors in one launch (sum_squares.cu, adamw.cu): each block a fixed chunk of one
// tensor, `first` [count + 1] numbering the blocks, so that tensor t owns blocks first[t] ..
// first[t + 1] (none for an empty tensor). The tensor that owns block `b` is the last t with
// first[t] <= b.
__device__ __forceinline__ int owner(const unsigned long long* first, int count, unsigned long long b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (first[mid] <= b) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// log2(e): the kernels' exponentials are powers of 2 (exp2_ftz) of exponents scaled by it.
#define LOG2E 1.4426950408889634f

// 2^x as the one instruction MUFU.EX2 (ex2.approx.ftz), which is what exp2f computes for x
// >= -126. exp2f sets three more around it, a test of x against -126, a halving of x
// before and a squaring after, so that results under 2^-126 come out as denormals; here
// they are 0. Those three were about a tenth of the attention forward's instructions a
// tile (the SASS of NVRTC 13.0 for sm_90); an exponential under 2^-126 is a probability
// that adds nothing to a softmax's sum, which holds a 1. The emulator flushes exp2f's
// result as the instruction does.
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    const float y = exp2f(x);
    return y < 0x1p-126f ? 0.0f : y;
#endif
}

// An f32 rounded to bf16, as its bits (unsigned short: no CUDA header needed at run time):
// round to nearest even with NaN kept quiet, the same as __float2bfloat16_rn and as the
// `half` crate's bf16::from_f32, so both backends round alike.
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
    const unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    // Adding 0x7fff plus the lowest kept bit rounds the dropped half to nearest, ties to
    // even; a carry into the exponent is the correct rounding up (to infinity at the top).
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// x rounded to bf16, as f32_to_bf16_bits rounds it: on the GPU one cvt.rn.bf16.f32 (sm_80
// on), which rounds every number as that function does (a NaN becomes the canonical one),
// checked on the GPU by kernels/tests/cuda_ops.rs; the emulator takes the function. The
// function costs about 6 integer instructions an element, a sixth of a light bf16 kernel's
// (add_bf16: 288 instructions with it, 240 without; the SASS of NVRTC 13.0 for sm_90,
// scripts/sass-mix).
__device__ __forceinline__ unsigned short bf16_bits(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
    return bits;
#else
    return f32_to_bf16_bits(x);
#endif
}

// Two floats rounded to bf16 and packed into one word, `lo` in the low half: on the GPU one
// cvt.rn.bf16x2.f32, which rounds as bf16_bits does. The function's dozen integer
// instructions a pair had made the integer ALU the attention forward's busiest pipe (50%,
// ncu on an H200 at micro batch 32), above the tensor cores.
__device__ __forceinline__ unsigned int pack_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
#else
    return (unsigned int)f32_to_bf16_bits(lo) | ((unsigned int)f32_to_bf16_bits(hi) << 16);
#endif
}

// A bf16 element of a tensor stored in bf16 (`precision: bf16` activations and weight
// copies), as its bits. A struct rather than a bare unsigned short, so that a kernel
// templated on its storage type overloads on it and never mistakes it for an integer.
struct bf16 {
    unsigned short bits;
};

// Loads and stores of a kernel templated on its storage type T (float or bf16): the
// arithmetic is fp32 either way, and a bf16 store rounds once, to nearest even.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __uint_as_float((unsigned int)x.bits << 16); }
__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(bf16* p, float x) { p->bits = bf16_bits(x); }

// acc plus load(i) for i in [begin, end), added in order, with the loads of SUM_AHEAD of
// them issued before their adds, so that a thread waits on memory once a batch rather than
// once a value; the adds keep their order, so the sum is the plain loop's, bit for bit. For
// the deterministic column sums (bias.cu) and the wte gradient's rows (embedding.cu), whose
// threads each walk a column down many rows.
#define SUM_AHEAD 8

// The indices are signed: their overflow is undefined, so that the compiler may step an
// address from one value to the next, where with unsigned ones (whose wrap is defined) it
// computes each address anew, 2 more instructions a value.
template <typename Load>
__device__ __forceinline__ float sum_in_order(float acc, int begin, int end, Load load) {
    int i = begin;
    for (; i + SUM_AHEAD <= end; i += SUM_AHEAD) {
        float batch[SUM_AHEAD];
        #pragma unroll
        for (int k = 0; k < SUM_AHEAD; ++k) batch[k] = load(i + k);
        #pragma unroll
        for (int k = 0; k < SUM_AHEAD; ++k) acc += batch[k];
    }
    for (; i < end; ++i) acc += load(i);
    return acc;
}

// ---- 128-bit packs --------------------------------------------------------------------
// An elementwise kernel moves its tensors in packs of 16 bytes (4 floats or 8 bf16), one
// pack per thread, so each load and store is one 128-bit access (llm.c's Packed128).
// A pack is whole and its tensors 16-byte aligned (as the device's buffers are; a view at
// another offset is not) or the thread takes it element by element: the tail of a length
// that is not a multiple, or every pack of a misaligned tensor. The arithmetic is the
// same either way, per element.
template <typename T>
struct alignas(16) Pack {
    static constexpr int LEN = 16 / sizeof(T);
    T x[LEN];
};

// The first element of this thread's pack of a tensor of T.
template <typename T>
__device__ __forceinline__ unsigned long long pack_start() {
    return ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * Pack<T>::LEN;
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((unsigned long long)p & 15u) == 0; }

// Whether the pack at `start` of a tensor of n elements is whole, so that it moves in one
// access where its tensors are aligned.
template <typename T>
__device__ __forceinline__ bool whole_pack(unsigned long long start, unsigned long long n) {
    return start + Pack<T>::LEN <= n;
}

// The pack of src at `start`: one 128-bit load where `vector`, else its elements below n
// one by one (the others zero, never stored).
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* src, unsigned long long start, unsigned long long n,
                                             bool vector) {
    Pack<T> p;
    if (vector) return *reinterpret_cast<const Pack<T>*>(src + start);
    for (int k = 0; k < Pack<T>::LEN; ++k) p.x[k] = start + k < n ? src[start + k] : T{};
    return p;
}

// The pack at p (16-byte aligned, in global memory) in one 128-bit load or store with the
// evict-first hint (ld.global.cs, st.global.cs): for a kernel that touches each byte once
// a launch through pointers it reads from a table (AdamW), which the compiler would
// otherwise move with generic loads and stores, not knowing the pointers global.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack_streaming(const T* p) {
    const uint4 bits = __ldcs(reinterpret_cast<const uint4*>(p));
    Pack<T> pack;
    memcpy(&pack, &bits, sizeof pack);
    return pack;
}
template <typename T>
__device__ __forceinline__ void store_pack_streaming(T* p, const Pack<T>& pack) {
    uint4 bits;
    memcpy(&bits, &pack, sizeof bits);
    __stcs(reinterpret_cast<uint4*>(p), bits);
}

// Stores the pack p at `start` of dst: one 128-bit store where `vector`, else its elements
// below n one by one.
template <typename T>
__device__ __forceinline__ void store_pack(T* dst, const Pack<T>& p, unsigned long long start, unsigned long long n,
                                           bool vector) {
    if (vector) {
        *reinterpret_cast<Pack<T>*>(dst + start) = p;
        return;
    }
    for (int k = 0; k < Pack<T>::LEN && start + k < n; ++k) dst[start + k] = p.x[k];
}

// ---- pointwise kernels ----------------------------------------------------------------
// The scaffolding every pointwise kernel shares, so that each keeps only its arithmetic `f`
// (fp32 in, fp32 out; a bf16 store rounds once): out[i] = f(a[i]), and out[i] = f(a[i],
// b[i]), over n elements, one pack per thread, launched over n / Pack<T>::LEN threads
// rounded up. out may be a or b: each thread loads its packs before it stores.
template <typename T, typename F>
__device__ __forceinline__ void map_packs(T* out, const T* a, unsigned long long n, F f) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(a);
    const Pack<T> pa = load_pack(a, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&po.x[k], f(to_float(pa.x[k])));
    store_pack(out, po, i, n, vector);
}

template <typename T, typename F>
__device__ __forceinline__ void zip_packs(T* out, const T* a, const T* b, unsigned long long n, F f) {
    const unsigned long long i = pack_start<T>();
    if (i >= n) return;
    const bool vector = whole_pack<T>(i, n) && aligned16(out) && aligned16(a) && aligned16(b);
    const Pack<T> pa = load_pack(a, i, n, vector), pb = load_pack(b, i, n, vector);
    Pack<T> po;
    for (int k = 0; k < Pack<T>::LEN; ++k) store(&po.x[k], f(to_float(pa.x[k]), to_float(pb.x[k])));
    store_pack(out, po, i, n, vector);
}
