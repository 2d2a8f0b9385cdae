// Token + position embedding, forward and backward.

// out[n,c] = wte[tokens[n],c] + wpe[n % T,c]; one thread per output element.
extern "C" __global__ void embedding_forward(float* out, const unsigned int* tokens, const float* wte,
                                             const float* wpe, unsigned long long n_rows, int T, int C) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * C) return;
    const unsigned long long row = i / C;
    const int c = (int)(i % C);
    const int t = (int)(row % T);
    out[i] = wte[(unsigned long long)tokens[row] * C + c] + wpe[(unsigned long long)t * C + c];
}

// dwte[token,:] += dout rows of that token. Atomics would make the sum order depend on
// timing, so the host groups the rows by token instead (`groups`: G distinct tokens, then
// G+1 offsets into the row list, then the rows of each token in ascending order) and one
// block adds one token's rows in that order.
extern "C" __global__ void embedding_backward_wte(float* dwte, const float* dout,
                                                  const unsigned int* groups, int G, int C) {
    const unsigned int token = groups[blockIdx.x];
    const unsigned int* offsets = groups + G;
    const unsigned int* rows = groups + 2 * G + 1;
    const unsigned int begin = offsets[blockIdx.x], end = offsets[blockIdx.x + 1];
    float* dst = dwte + (unsigned long long)token * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dst[c];
        for (unsigned int r = begin; r < end; ++r) acc += dout[(unsigned long long)rows[r] * C + c];
        dst[c] = acc;
    }
}

// dwpe[t,c] += sum over b of dout[b,t,c], b ascending; one thread per (t, c).
extern "C" __global__ void embedding_backward_wpe(float* dwpe, const float* dout, int B, int T, int C) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long plane = (unsigned long long)T * C;
    if (i >= plane) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[b * plane + i];
    dwpe[i] = acc;
}
