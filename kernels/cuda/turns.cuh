// Blocks of one launch taking turns at a sum they share, in an order fixed in advance, so
// that a sum across blocks is bitwise deterministic without atomics on its values
// (fused_attention_mma.cu's dq, whose terms come from every key tile's block).
//
// - A block's place comes from a ticket, taken in the order the blocks start, not from
//   blockIdx: every block a block waits on holds an earlier ticket, so has started and is
//   resident or done, and a waiting block never waits on one that cannot get an SM. No
//   deadlock, whatever order the GPU dispatches blocks in.
// - A turn is a counter in global memory: the holder's stores, then a release of the count
//   (thread 0, after a barrier that orders every thread's stores before it); the next
//   holder polls it with acquire loads (thread 0), and a barrier passes what they saw on to
//   the block. Reads of the sum must bypass L1, which is not coherent across SMs (__ldcg).
//   This is the pattern of CUTLASS's generic barrier, which FlashAttention 3's
//   deterministic backward uses.
//
// The SIMT emulator runs one block at a time, so it checks the order of the turns (a wait
// for a turn no earlier block has given fails there, where a GPU would hang) but not the
// memory ordering between blocks: kernels/tests/simt/barriers.rs lists the two barriers
// here as ones it cannot judge. They have run on no GPU yet.
#pragma once

#include "common.cuh"

// This block's ticket in `tickets` (0 for the first block of its group to start, then 1,
// ...), broadcast to the block through `slot` in shared memory.
__device__ __forceinline__ unsigned int take_ticket(unsigned int* tickets, unsigned int* slot) {
#if defined(__CUDA_ARCH__)
    if (threadIdx.x == 0) *slot = atomicAdd(tickets, 1u);
#else
    if (threadIdx.x == 0) *slot = (*tickets)++;
#endif
    __syncthreads();
    return *slot;
}

// Waits until `counter` holds `turn`. Every thread of the block must call it.
__device__ __forceinline__ void wait_turn(const unsigned int* counter, unsigned int turn) {
    if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__)
        unsigned int seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen != turn);
#else
        // Blocks run one at a time here: a turn not yet given never will be.
        if (*counter != turn)
            simt::fail("a block waits for turn %u of a counter at %u: on a GPU, a deadlock", turn, *counter);
#endif
    }
    __syncthreads();
}

// Gives the next holder its turn. Every thread of the block must call it, after its
// stores to the shared sum.
__device__ __forceinline__ void pass_turn(unsigned int* counter) {
    __syncthreads();
    if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" : : "l"(counter) : "memory");
#else
        ++*counter;
#endif
    }
}
