// A SIMT emulator: runs the CUDA kernels of kernels/cuda/ on the host, as a GPU would run
// them as far as correctness goes. The Rust side (harness.rs) compiles one kernel family
// with this header and drives the program through its standard input and output.
//
// - Every CUDA thread is a fiber with its own stack; a block's threads all exist at once,
//   so a thread can stop at a barrier and resume after it.
// - Blocks run one at a time, in a shuffled order. Within a block the warps run in a
//   shuffled order, each as far as it can go (to a __syncthreads or its end); within a warp
//   the lanes run in a shuffled order, each until its next warp shuffle. Every shuffle is a
//   real exchange: it completes when every lane of the warp has reached one.
// - __syncthreads releases the block only when every thread waits at the same barrier; a
//   barrier some thread never reaches, a shuffle some lane never reaches, or a deadlock
//   ends the program with a message.
// - __shared__ variables are statics in one section, set to all ones bits (NaN) before each
//   block, so a read of shared memory no thread has written shows. So is a kernel's dynamic
//   shared memory (common.cuh's DYNAMIC_SHARED), whose launch must give its bytes.
// - A kernel with shared memory runs twice from the same inputs: once with every warp
//   seeing only its own writes to shared memory between barriers, once seeing those of the
//   warps before it, in another order. Results that differ are reported as a race, which
//   is what a missing barrier is (SharedMemory and launch_kernel below).
// - Every buffer ends at an unmapped page, so a read or write past its end faults.
// All orders come from the seed of the launch: a run is repeatable.
#pragma once

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#error "the emulator's context switch is written for x86-64"
#endif

// ---- the CUDA language, as far as the kernels use it ------------------------------------

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)  // a register budget: nothing to the emulator
#define __shared__ static __attribute__((section("simt_shared")))
// The kernel's dynamic shared memory as a `type`: a static of the shared section, as its
// other shared variables, which the launch must give at least the bytes of (on a GPU a
// kernel that reads past them reads what is not its own, or faults).
#define DYNAMIC_SHARED(type, name)   \
    __shared__ type name##_storage; \
    type& name = ::simt::dynamic_shared(name##_storage)

struct uint4 {
    unsigned int x, y, z, w;
};
struct uint2 {
    unsigned int x, y;
};
// CUDA's vector type of four floats, aligned as CUDA aligns it (a vector load or store
// must be).
struct alignas(16) float4 {
    float x, y, z, w;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

inline uint4 make_uint4(unsigned int a, unsigned int b, unsigned int c, unsigned int d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned int a, unsigned int b) { return {a, b}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
inline unsigned int __float_as_uint(float x) {
    unsigned int u;
    memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(unsigned int u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline float __int_as_float(int i) {
    float x;
    memcpy(&x, &i, 4);
    return x;
}
// A multiply rounded on its own, never contracted into a multiply-add (the host build has
// -ffp-contract=off, so a plain multiply is one).
inline float __fmul_rn(float a, float b) { return a * b; }
// An add rounded on its own, never contracted into a multiply-add (the host build has
// -ffp-contract=off, so a plain add is one).
inline float __fadd_rn(float a, float b) { return a + b; }
// Loads and stores with a cache hint: the hint is the GPU's business, but the access must
// be aligned to its size, as on the GPU, where a misaligned one faults (the host's would
// not: so checked here).
namespace simt {
[[noreturn]] void fail(const char* fmt, ...);
template <typename T>
inline const T* aligned_access(const T* p) {
    if ((unsigned long long)p % sizeof(T) != 0) fail("a %zu-byte access at %p, off its alignment", sizeof(T), (const void*)p);
    return p;
}
}  // namespace simt
template <typename T>
inline T __ldcs(const T* p) {
    return *simt::aligned_access(p);
}
template <typename T>
inline void __stcs(T* p, T v) {
    *const_cast<T*>(simt::aligned_access(p)) = v;
}
template <typename T>
inline T __ldcg(const T* p) {
    return *simt::aligned_access(p);
}
template <typename T>
inline void __stcg(T* p, T v) {
    *const_cast<T*>(simt::aligned_access(p)) = v;
}
template <typename T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
    return a < b ? b : a;
}

namespace simt {

// ---- fibers ------------------------------------------------------------------------------

// Saves the callee-saved registers on the current stack, stores the stack pointer in
// *save, and continues on the stack `load` (which was saved the same way, or prepared by
// Fiber::start).
extern "C" void simt_switch(void** save, void* load);
asm(R"(
    .text
    .globl simt_switch
    .hidden simt_switch
    .type simt_switch, @function
simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size simt_switch, .-simt_switch
)");

// Enough for any kernel's locals; the page below it is unmapped, so an overflow faults.
constexpr size_t STACK_BYTES = 256 * 1024;

struct Fiber {
    void* sp = nullptr;

    // A stack whose first switch "returns" into `entry` with the alignment of a call.
    void start(void (*entry)()) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        char* base = (char*)mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) != 0) fail("cannot map a fiber stack");
        void** top = (void**)(base + page + STACK_BYTES);
        top -= 8;  // six saved registers, the return address, and a slot for alignment
        for (int i = 0; i < 6; ++i) top[i] = nullptr;
        top[6] = (void*)entry;
        sp = top;
    }
};

// ---- threads, warps and the block scheduler ------------------------------------------------

constexpr unsigned WARP = 32;

enum class State { Ready, AtShuffle, AtBarrier, Done };

struct Thread {
    Fiber fiber;
    dim3 idx;
    unsigned lane = 0, warp = 0;
    State state = State::Done;
    int barrier_line = 0;  // which __syncthreads it waits at
    const char* barrier_file = "";
    unsigned src_lane = 0;  // the lane whose value its shuffle reads
    unsigned long long value = 0, result = 0;
    std::vector<std::pair<uint4*, uint4>> copies;  // its asynchronous copies not yet waited for
};

inline dim3 gridDim_, blockIdx_, blockDim_;
inline std::vector<Thread> threads;  // those of the running block, fibers kept between blocks
inline Thread* current = nullptr;
inline void* scheduler_sp = nullptr;
inline void (*body)(void*) = nullptr;  // the kernel call, as every thread makes it
inline void* body_args = nullptr;
inline std::string kernel_name;
inline unsigned dynamic_shared_bytes;  // the running launch's

[[noreturn]] inline void fail(const char* fmt, ...) {
    fprintf(stderr, "simt: %s, block (%u,%u,%u)", kernel_name.c_str(), blockIdx_.x, blockIdx_.y, blockIdx_.z);
    if (current) fprintf(stderr, ", thread (%u,%u,%u)", current->idx.x, current->idx.y, current->idx.z);
    fprintf(stderr, ": ");
    va_list args;
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n");
    exit(3);
}

inline void yield() { simt_switch(&current->fiber.sp, scheduler_sp); }

[[noreturn]] inline void fiber_main() {
    for (;;) {
        body(body_args);
        if (!current->copies.empty())
            fail("a thread ends with %zu asynchronous copies it never waited for", current->copies.size());
        current->state = State::Done;
        yield();
    }
}

inline void resume(Thread& t) {
    current = &t;
    simt_switch(&scheduler_sp, t.fiber.sp);
    current = nullptr;
}

// SplitMix64: the shuffles' random numbers.
struct Rng {
    unsigned long long s;
    unsigned long long next() {
        unsigned long long z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    template <typename T>
    void shuffle(std::vector<T>& v) {
        for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
    }
};

extern "C" char __start_simt_shared[] __attribute__((weak));
extern "C" char __stop_simt_shared[] __attribute__((weak));

// Asynchronous copies (async_copy.cuh's cp.async): each is read when issued and lands in
// shared memory when its thread waits for its copies, not before, so that a read of the
// tile before the wait reads what was there, and one by another thread before a barrier
// after the wait too.
inline void copy_async(void* shared, uint4 value) {
    char* at = static_cast<char*>(shared);
    if (at < __start_simt_shared || at + sizeof(uint4) > __stop_simt_shared)
        fail("an asynchronous copy to %p, outside shared memory", shared);
    current->copies.emplace_back(const_cast<uint4*>(aligned_access(static_cast<uint4*>(shared))), value);
}
inline void wait_copies() {
    for (const auto& [to, value] : current->copies) *to = value;
    current->copies.clear();
}

// The block's shared memory between two barriers, seen by the warps in one of two ways.
// Shared: a warp sees every write of the warps that ran before it. Isolated: each warp
// starts from what the last barrier left and sees only its own writes, and the writes of
// all warps are merged at the barrier (two warps writing a byte differently is an error).
// A kernel with no race between barriers computes the same bits either way; one that
// reads what another warp wrote, or overwrites what another warp reads, without a barrier
// between, does not (see launch_kernel).
struct SharedMemory {
    char* const begin = __start_simt_shared;
    const size_t bytes = __start_simt_shared ? (size_t)(__stop_simt_shared - __start_simt_shared) : 0;
    bool isolated = false;
    std::vector<char> base, merged;
    std::vector<int> writer;  // the warp that wrote each byte since the barrier, or -1

    // Uninitialised memory reads as all ones bits (NaN), so a read of it shows.
    void start_block() {
        memset(begin, 0xff, bytes);
        start_interval();
    }
    void start_interval() {
        if (!isolated) return;
        base.assign(begin, begin + bytes);
        merged = base;
        writer.assign(bytes, -1);
    }
    void start_warp() {
        if (isolated) memcpy(begin, base.data(), bytes);
    }
    void end_warp(int warp) {
        for (size_t i = 0; isolated && i < bytes; ++i) {
            if (begin[i] == base[i]) continue;
            if (writer[i] >= 0 && merged[i] != begin[i])
                fail("warps %d and %d write shared byte %zu between the same barriers", writer[i], warp, i);
            merged[i] = begin[i];
            writer[i] = warp;
        }
    }
    void end_interval() {
        if (isolated) memcpy(begin, merged.data(), bytes);
    }
};
inline SharedMemory shared;

// Runs the lanes of warp `w` until none can go on without the other warps.
inline void run_warp(std::vector<Thread*>& warp, Rng& rng) {
    std::vector<Thread*> ready;
    for (;;) {
        ready.clear();
        for (Thread* t : warp)
            if (t->state == State::Ready) ready.push_back(t);
        if (ready.empty()) return;
        rng.shuffle(ready);
        for (Thread* t : ready) resume(*t);
        size_t at_shuffle = 0;
        for (Thread* t : warp) at_shuffle += t->state == State::AtShuffle;
        if (at_shuffle == 0) continue;
        if (at_shuffle != warp.size()) {
            current = warp[0];
            fail("a warp shuffle that only %zu of the warp's %zu lanes reach", at_shuffle, warp.size());
        }
        for (Thread* t : warp) {
            t->result = warp[t->src_lane]->value;
            t->state = State::Ready;
        }
    }
}

inline void run_block(Rng& rng) {
    const unsigned n = blockDim_.x * blockDim_.y * blockDim_.z;
    shared.start_block();
    std::vector<std::vector<Thread*>> warps((n + WARP - 1) / WARP);
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = threads[i];
        t.idx = {i % blockDim_.x, i / blockDim_.x % blockDim_.y, i / (blockDim_.x * blockDim_.y)};
        t.lane = i % WARP;
        t.warp = i / WARP;
        t.state = State::Ready;
        warps[t.warp].push_back(&t);
    }
    std::vector<unsigned> order(warps.size());
    for (;;) {
        for (unsigned w = 0; w < order.size(); ++w) order[w] = w;
        rng.shuffle(order);
        for (unsigned w : order) {
            shared.start_warp();
            run_warp(warps[w], rng);
            shared.end_warp((int)w);
        }
        shared.end_interval();
        // Every thread now waits at a barrier or is done.
        const Thread* waiting = nullptr;
        bool exited = false;
        for (unsigned i = 0; i < n; ++i) {
            const Thread& t = threads[i];
            if (t.state == State::Done) {
                exited = true;
            } else if (!waiting) {
                waiting = &t;
            } else if (t.barrier_line != waiting->barrier_line || strcmp(t.barrier_file, waiting->barrier_file)) {
                fail("threads wait at different __syncthreads (%s:%d and %s:%d)", waiting->barrier_file,
                     waiting->barrier_line, t.barrier_file, t.barrier_line);
            }
        }
        if (!waiting) return;
        if (exited) fail("__syncthreads at %s:%d, which some threads of the block never reach", waiting->barrier_file,
                         waiting->barrier_line);
        for (unsigned i = 0; i < n; ++i) threads[i].state = State::Ready;
        shared.start_interval();
    }
}

// How a kernel is launched: its grid and blocks, its bytes of dynamic shared memory, the
// seed of its orders, and the blocks to run (their linear ids, x fastest), or none for all
// of them.
struct Launch {
    dim3 grid, block;
    unsigned dynamic_shared;
    unsigned long long seed;
    std::vector<unsigned long long> only;
};

template <typename T>
T& dynamic_shared(T& storage) {
    if (dynamic_shared_bytes < sizeof(T))
        fail("%zu bytes of dynamic shared memory, where the launch gives %u", sizeof(T), dynamic_shared_bytes);
    return storage;
}

// Runs the blocks of the launch, in an order shuffled by `seed`.
inline void run_grid(const Launch& launch, unsigned long long seed) {
    const dim3 grid = launch.grid, block = launch.block;
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    const unsigned n = block.x * block.y * block.z;
    if (n == 0 || n > 1024) fail("a block of %u threads", n);
    while (threads.size() < n) {
        threads.emplace_back();
        threads.back().fiber.start(fiber_main);
    }
    gridDim_ = grid;
    blockDim_ = block;
    dynamic_shared_bytes = launch.dynamic_shared;
    Rng rng{seed};
    std::vector<unsigned long long> order = launch.only;
    for (unsigned long long b = 0; launch.only.empty() && b < blocks; ++b) order.push_back(b);
    for (unsigned long long b : order)
        if (b >= blocks) fail("block %llu of a grid of %llu", b, blocks);
    rng.shuffle(order);
    for (unsigned long long b : order) {
        blockIdx_ = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
        run_block(rng);
    }
}

inline void syncthreads(const char* file, int line) {
    current->barrier_file = file;
    current->barrier_line = line;
    current->state = State::AtBarrier;
    yield();
}

// Lane `src`'s value of `v` when every lane of the warp has called this.
template <typename T>
T shuffle_from(unsigned mask, T v, unsigned src) {
    static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffle moves at most 8 bytes");
    const unsigned in_warp = blockDim_.x * blockDim_.y * blockDim_.z - current->warp * WARP;
    const unsigned present = in_warp >= WARP ? 0xffffffffu : (1u << in_warp) - 1;
    if ((mask & present) != present) fail("a shuffle with mask %#x: only whole warps are emulated", mask);
    if (src >= WARP || !(present >> src & 1)) fail("a shuffle from lane %u, which does not exist", src);
    memcpy(&current->value, &v, sizeof(T));
    current->src_lane = src;
    current->state = State::AtShuffle;
    yield();
    T out;
    memcpy(&out, &current->result, sizeof(T));
    return out;
}

// ---- the program: buffers and launches from standard input -----------------------------

struct Buffer {
    char* data;
    size_t len;
};
inline std::vector<Buffer> buffers;

inline void read_exact(void* dst, size_t len) {
    if (fread(dst, 1, len, stdin) != len) fail("standard input ended inside a command");
}
template <typename T>
T read_value() {
    T v;
    read_exact(&v, sizeof v);
    return v;
}

// `len` bytes that end where an unmapped page begins.
inline Buffer allocate(size_t len) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t used = (len + 15) / 16 * 16;
    const size_t span = (used + page - 1) / page * page;
    char* base = (char*)mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || mprotect(base + span, page, PROT_NONE) != 0) fail("cannot map %zu bytes", len);
    return {base + span - used, len};
}

// The arguments of one launch, as the harness encodes them: 'p' and a buffer id for a
// pointer, 'n' for a null pointer, 's', a size and the bytes for a value.
struct Args {
    std::vector<char> bytes;
    size_t at = 0;
    int index = 0;
    std::vector<unsigned> buffer_ids;  // those the kernel is passed

    template <typename P>
    P take() {
        ++index;
        if (at >= bytes.size()) fail("too few arguments: the kernel's parameter %d is missing", index);
        const char kind = bytes[at++];
        if constexpr (std::is_pointer_v<P>) {
            if (kind == 'n') return nullptr;
            if (kind != 'p') fail("parameter %d is a pointer, the harness passed a value", index);
            unsigned id;
            memcpy(&id, &bytes[at], 4);
            at += 4;
            if (id >= buffers.size()) fail("parameter %d: no buffer %u", index, id);
            buffer_ids.push_back(id);
            return reinterpret_cast<P>(buffers[id].data);
        } else {
            if (kind != 's') fail("parameter %d is a value, the harness passed a pointer", index);
            unsigned size;
            memcpy(&size, &bytes[at], 4);
            at += 4;
            if (size != sizeof(P)) fail("parameter %d has %zu bytes, the harness passed %u", index, sizeof(P), size);
            P v;
            memcpy(&v, &bytes[at], sizeof(P));
            at += size;
            return v;
        }
    }
};

template <typename... P>
void launch_kernel(void (*kernel)(P...), Args& args, const Launch& launch) {
    // Braced initialisation evaluates the arguments left to right, in parameter order.
    std::tuple<std::decay_t<P>...> values{args.template take<std::decay_t<P>>()...};
    if (args.at != args.bytes.size()) fail("more arguments than the kernel's %zu parameters", sizeof...(P));
    auto call = [&] { std::apply(kernel, values); };
    body = [](void* f) { (*static_cast<decltype(call)*>(f))(); };
    body_args = &call;
    if (shared.bytes == 0) {
        run_grid(launch, launch.seed);
        return;
    }
    // With shared memory, the launch runs twice from the same inputs, isolated and then
    // shared, in two orders; different results mean a race between barriers.
    std::vector<std::vector<char>> inputs, isolated;
    for (unsigned id : args.buffer_ids) inputs.emplace_back(buffers[id].data, buffers[id].data + buffers[id].len);
    shared.isolated = true;
    run_grid(launch, launch.seed);
    for (size_t i = 0; i < args.buffer_ids.size(); ++i) {
        Buffer& b = buffers[args.buffer_ids[i]];
        isolated.emplace_back(b.data, b.data + b.len);
        memcpy(b.data, inputs[i].data(), b.len);
    }
    shared.isolated = false;
    run_grid(launch, ~launch.seed);
    for (size_t i = 0; i < args.buffer_ids.size(); ++i) {
        const Buffer& b = buffers[args.buffer_ids[i]];
        if (memcmp(b.data, isolated[i].data(), b.len) != 0)
            fail("the result in buffer %u depends on the order of the warps between barriers: a race (a missing "
                 "__syncthreads?)", args.buffer_ids[i]);
    }
}

struct Kernel {
    const char* name;
    void (*launch)(Args&, const Launch&);
};

template <auto K>
void launch_entry(Args& args, const Launch& launch) {
    launch_kernel(K, args, launch);
}

// Commands: 'b' id len bytes (a buffer), 't' id count words (a buffer of 64-bit words, each
// 'p' id offset, the address of a buffer's byte; 'n', a null pointer; or 'v' value: a
// table of records that hold device pointers), 'l' name grid block shared seed blocks args
// (a launch, with its bytes of dynamic shared memory), 'r' id (write the buffer to
// standard output).
inline int serve(const Kernel* kernels, size_t count) {
    int command;
    while ((command = getchar()) != EOF) {
        if (command == 'b') {
            const unsigned id = read_value<unsigned>();
            const unsigned long long len = read_value<unsigned long long>();
            if (id != buffers.size()) fail("buffer %u out of order", id);
            buffers.push_back(allocate(len));
            read_exact(buffers.back().data, len);
        } else if (command == 't') {
            const unsigned id = read_value<unsigned>();
            const unsigned count = read_value<unsigned>();
            if (id != buffers.size()) fail("buffer %u out of order", id);
            Buffer table = allocate(count * sizeof(unsigned long long));
            for (unsigned i = 0; i < count; ++i) {
                unsigned long long word = 0;
                const int kind = getchar();
                if (kind == 'p') {
                    const unsigned target = read_value<unsigned>();
                    const unsigned long long offset = read_value<unsigned long long>();
                    if (target >= buffers.size()) fail("table %u: no buffer %u", id, target);
                    if (offset > buffers[target].len) fail("table %u: byte %llu of buffer %u", id, offset, target);
                    word = (unsigned long long)(buffers[target].data + offset);
                } else if (kind == 'v') {
                    word = read_value<unsigned long long>();
                } else if (kind != 'n') {
                    fail("table %u: entry %u of unknown kind %d", id, i, kind);
                }
                reinterpret_cast<unsigned long long*>(table.data)[i] = word;
            }
            buffers.push_back(table);
        } else if (command == 'l') {
            std::string name(read_value<unsigned>(), '\0');
            read_exact(&name[0], name.size());
            Launch launch;
            read_exact(&launch.grid, sizeof launch.grid);
            read_exact(&launch.block, sizeof launch.block);
            launch.dynamic_shared = read_value<unsigned>();
            launch.seed = read_value<unsigned long long>();
            launch.only.resize(read_value<unsigned>());
            read_exact(launch.only.data(), launch.only.size() * sizeof(unsigned long long));
            Args args;
            args.bytes.resize(read_value<unsigned>());
            read_exact(args.bytes.data(), args.bytes.size());
            const Kernel* k = nullptr;
            for (size_t i = 0; i < count; ++i)
                if (name == kernels[i].name) k = &kernels[i];
            kernel_name = name;
            if (!k) fail("no such kernel in this family");
            k->launch(args, launch);
        } else if (command == 'r') {
            const unsigned id = read_value<unsigned>();
            if (id >= buffers.size()) fail("no buffer %u to read", id);
            fwrite(buffers[id].data, 1, buffers[id].len, stdout);
        } else {
            fail("unknown command %d", command);
        }
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

// ---- the library: kernels launched in-process by the CUDA stand-in (standin/) -----------

// A kernel as cuLaunchKernel passes it: the size of each parameter, in order (so the
// caller can copy the values at launch, as CUDA does), and a launch that reads parameter i
// from params[i], a pointer to its value.
struct LibraryKernel {
    const char* name;
    std::vector<size_t> param_sizes;
    void (*launch)(void** params, const Launch& launch);
};

template <typename... P, size_t... I>
void launch_with_params(void (*kernel)(P...), void** params, const Launch& launch, std::index_sequence<I...>) {
    std::tuple<std::decay_t<P>...> values{*static_cast<std::decay_t<P>*>(params[I])...};
    auto call = [&] { std::apply(kernel, values); };
    body = [](void* f) { (*static_cast<decltype(call)*>(f))(); };
    body_args = &call;
    // One run, warps seeing each other's writes as on a GPU: the harness's second,
    // isolated run (its race check) would need every buffer the kernel touches copied.
    shared.isolated = false;
    run_grid(launch, launch.seed);
}

template <typename... P>
void launch_by_params(void (*kernel)(P...), void** params, const Launch& launch) {
    launch_with_params(kernel, params, launch, std::index_sequence_for<P...>{});
}

template <typename... P>
std::vector<size_t> param_sizes(void (*)(P...)) {
    return {sizeof(std::decay_t<P>)...};
}

template <auto K>
void library_launch(void** params, const Launch& launch) {
    launch_by_params(K, params, launch);
}

template <auto K>
LibraryKernel library_entry(const char* name) {
    return {name, param_sizes(K), library_launch<K>};
}

}  // namespace simt

// The C interface of a family built as a shared object for the stand-in: `table` is an
// array of simt::LibraryKernel.
#define SIMT_LIBRARY(table)                                                                             \
    extern "C" __attribute__((visibility("default"))) unsigned simt_kernel_count() {                    \
        return sizeof table / sizeof table[0];                                                          \
    }                                                                                                   \
    extern "C" __attribute__((visibility("default"))) const char* simt_kernel_name(unsigned i) {        \
        return table[i].name;                                                                           \
    }                                                                                                   \
    extern "C" __attribute__((visibility("default"))) unsigned simt_kernel_params(unsigned i,          \
                                                                                  unsigned long long* sizes, \
                                                                                  unsigned max) {       \
        const auto& p = table[i].param_sizes;                                                           \
        for (unsigned j = 0; j < p.size() && j < max; ++j) sizes[j] = p[j];                            \
        return (unsigned)p.size();                                                                      \
    }                                                                                                   \
    extern "C" __attribute__((visibility("default"))) void simt_kernel_launch(                         \
        unsigned i, const unsigned* grid, const unsigned* block, unsigned shared, unsigned long long seed, \
        void** params) {                                                                                \
        ::simt::kernel_name = table[i].name;                                                            \
        ::simt::Launch launch{{grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, shared, seed, {}}; \
        table[i].launch(params, launch);                                                                \
    }

#define threadIdx (::simt::current->idx)
#define blockIdx (::simt::blockIdx_)
#define blockDim (::simt::blockDim_)
#define gridDim (::simt::gridDim_)
#define __syncthreads() ::simt::syncthreads(__FILE__, __LINE__)

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    return ::simt::shuffle_from(mask, v, ::simt::current->lane ^ (unsigned)lane_mask);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane) {
    return ::simt::shuffle_from(mask, v, (unsigned)src_lane);
}
