// The model kit's generic ops (MoE and hybrid architectures): softmax, sigmoid, elementwise
// product, row gather / scatter-add and expert routing, on f32 rows and u32 id buffers. The CPU
// backend (crates/vela-compute/src/cpu/kit.rs, route.rs) is the reference: same operation order
// where it matters (scatter-add is bit-identical), expf for exp (a few ulps from the host's).

// Maximum over the whole block of one float per thread (blockDim.x a multiple of 32, at most
// 1024; NaN ignored like fmaxf); every thread gets it. Contains two __syncthreads.
__device__ __forceinline__ float block_max(float m) {
    __shared__ float part[32];
    m = warp_max(m);
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = m;
    __syncthreads();
    if (warp == 0) {
        float t = lane < (int)(blockDim.x / 32) ? part[lane] : NEG_INF;
        t = warp_max(t);
        if (lane == 0) part[0] = t;
    }
    __syncthreads();
    return part[0];
}

// Softmax of one row per block, in place: max, expf(x - max), f64 block sum, divide. A row
// whose max is -inf becomes all 0 (as on the CPU).
extern "C" __global__ void kit_softmax_rows(float* x, int width) {
    PDL_ENTRY();
    float* r = x + (size_t)blockIdx.x * width;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < width; i += blockDim.x) m = fmaxf(m, r[i]);
    m = block_max(m);
    if (m == NEG_INF) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) r[i] = 0.0f;
        return;
    }
    double s = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float e = expf(r[i] - m);
        r[i] = e;
        s += (double)e;
    }
    float sum = (float)block_sum_d(s);
    // Each thread divides the elements it wrote itself.
    for (int i = threadIdx.x; i < width; i += blockDim.x) r[i] = r[i] / sum;
}

extern "C" __global__ void kit_sigmoid(float* x, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 1.0f / (1.0f + expf(-x[i]));
}

extern "C" __global__ void kit_mul(float* x, const float* __restrict__ y, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= y[i];
}

// out row i = src row idx[i] (block i, threads over the row); an index at or past n_src rows
// gives a zero row.
extern "C" __global__ void kit_gather_rows(const float* __restrict__ src, const u32* __restrict__ idx,
                                           float* __restrict__ out, int width, long long n_src) {
    PDL_ENTRY();
    u32 r = idx[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * width;
    const float* s = src + (size_t)r * width;
    bool ok = (long long)r < n_src;
    for (int c = threadIdx.x; c < width; c += blockDim.x) o[c] = ok ? s[c] : 0.0f;
}

// dst row idx[j] += w[j] * src row j without float atomics: block i does the work only if i is
// the first j with idx[j] == idx[i]; it then adds every such row j >= i in ascending j, with a
// rounded product then a rounded sum (no FMA contraction), like the CPU loop. O(n^2) index scans:
// meant for the few hundred to few thousand routed rows of an MoE step. w may be null (plain
// adds); indices at or past n_dst rows are skipped.
extern "C" __global__ void kit_scatter_add_rows(float* dst, const float* __restrict__ src,
                                                const u32* __restrict__ idx,
                                                const float* __restrict__ w, int n, int width,
                                                long long n_dst) {
    PDL_ENTRY();
    int i = blockIdx.x;
    u32 d = idx[i];
    if ((long long)d >= n_dst) return;
    int seen = 0;
    for (int j = threadIdx.x; j < i; j += blockDim.x) seen |= idx[j] == d;
    if (__syncthreads_or(seen)) return;
    float* o = dst + (size_t)d * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        float acc = o[c];
        for (int j = i; j < n; j++) {
            if (idx[j] != d) continue;
            float s = src[(size_t)j * width + c];
            acc = __fadd_rn(acc, w ? __fmul_rn(w[j], s) : s);
        }
        o[c] = acc;
    }
}
