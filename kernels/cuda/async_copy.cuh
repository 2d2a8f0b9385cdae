// Copies from global memory into shared memory that pass through no register
// (cp.async.cg, sm_80 and later): a thread issues them and goes on computing, and they land
// by the time it calls copies_landed. Other threads see them after a barrier that follows
// that call. A tile staged this way costs no registers while in flight and no store
// instructions, where loading it into registers and storing it after the products took
// both. The SIMT emulator lands each copy at the wait, not before, so that a read of the
// tile before it reads what was there (simt.hpp).
#pragma once

#include "common.cuh"

// The 16 bytes at `global` into `shared` (both 16-byte aligned), or 16 zero bytes where
// `valid` is false, when no byte is read: `global` must then still be an address of the
// buffer, as the instruction takes one.
__device__ __forceinline__ void copy_async16(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :
                 : "r"((unsigned int)__cvta_generic_to_shared(shared)), "l"(global), "r"(valid ? 16 : 0)
                 : "memory");
#elif defined(__CUDA_ARCH__)
    __trap();  // no cp.async before sm_80, where the device launches no kernel that uses it
#else
    const uint4* from = reinterpret_cast<const uint4*>(global);
    ::simt::copy_async(shared, valid ? *::simt::aligned_access(from) : make_uint4(0u, 0u, 0u, 0u));
#endif
}

// Every copy this thread has issued has landed.
__device__ __forceinline__ void copies_landed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#else
    ::simt::wait_copies();
#endif
}
