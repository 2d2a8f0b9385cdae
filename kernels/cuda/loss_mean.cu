// A microbatch's mean loss, written to the device so the host reads every microbatch's with
// the step's other values in its one synchronisation. One thread adds the per-token losses
// in f64 in token order, as the CPU does, so both give the same bits; a step has a few
// thousand tokens per microbatch, so this is not worth a tree and its other rounding.

extern "C" __global__ void loss_mean(double* out, const float* losses, unsigned long long n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double acc = 0.0;
    for (unsigned long long i = 0; i < n; ++i) acc += (double)losses[i];
    out[0] = acc / (double)n;
}
