// A microbatch's mean loss, written to the device so the host reads every microbatch's with
// the step's other values in its one synchronisation. Thread 0 adds the per-token losses in
// f64 in token order, as the CPU does, so both give the same bits. The block's other threads
// stage the losses into shared memory a chunk at a time, so that the adds never wait on a
// global load: one thread loading and adding alone took 1.3 ms for 32768 tokens on an H200.
#define LOSS_CHUNK 2048

extern "C" __global__ void loss_mean(double* out, const float* losses, unsigned long long n) {
    __shared__ float chunk[LOSS_CHUNK];
    double acc = 0.0;
    for (unsigned long long first = 0; first < n; first += LOSS_CHUNK) {
        const unsigned int len = (unsigned int)(n - first < LOSS_CHUNK ? n - first : LOSS_CHUNK);
        for (unsigned int i = threadIdx.x; i < len; i += blockDim.x) chunk[i] = losses[first + i];
        __syncthreads();
        if (threadIdx.x == 0)
            for (unsigned int i = 0; i < len; ++i) acc += (double)chunk[i];
        // Thread 0 has read the chunk before the next one overwrites it.
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = acc / (double)n;
}
