// Recurrent (linear-attention) layers: the causal depthwise convolution with a carried state,
// row L2 normalisation and the gated delta rule, token by token. The CPU backend
// (crates/vela-compute/src/cpu/recurrent.rs) is the reference: the convolution and the delta
// rule sum in its order with separately rounded products and sums (__fmul_rn / __fadd_rn, no
// contraction into FMA), so they give its bits up to expf.

// One thread per channel, all positions in order; the state holds the (k-1)*dil rows before x
// and is advanced to end after it (each thread owns its channel: no hazards).
extern "C" __global__ void rec_conv1d_causal(const float* __restrict__ x, int n, int width,
                                             const float* __restrict__ w, int k, int dil,
                                             int silu, float* state, float* __restrict__ out) {
    PDL_ENTRY();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    int s = (k - 1) * dil;
    for (int t = 0; t < n; t++) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = t + j * dil;
            float xv = r < s ? state[(size_t)r * width + c] : x[(size_t)(r - s) * width + c];
            acc = __fadd_rn(acc, __fmul_rn(w[(size_t)c * k + j], xv));
        }
        out[(size_t)t * width + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
    }
    // New state row i = row n + i of [state; x]; rows are read ahead of where they are written.
    for (int i = 0; i < s; i++) {
        int r = n + i;
        float v = r < s ? state[(size_t)r * width + c] : x[(size_t)(r - s) * width + c];
        state[(size_t)i * width + c] = v;
    }
}

// One block per row: x * 1/sqrt(sum x^2 + eps), the sum in f64.
extern "C" __global__ void rec_l2_norm_rows(float* x, int width, float eps) {
    PDL_ENTRY();
    float* r = x + (size_t)blockIdx.x * width;
    double ss = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += (double)r[i] * (double)r[i];
    float inv = 1.0f / sqrtf((float)block_sum_d(ss) + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) r[i] *= inv;
}

// One block per value head, thread j owns column j of the head's [dk, dv] state (coalesced
// rows), positions in order. dk <= 256.
extern "C" __global__ void rec_gated_delta_rule(const float* __restrict__ q,
                                                const float* __restrict__ k,
                                                const float* __restrict__ v,
                                                const float* __restrict__ g,
                                                const float* __restrict__ beta, int n, int n_k,
                                                int n_v, int dk, int dv, float* state,
                                                float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float ks[256], qs[256];
    int h = blockIdx.x, j = threadIdx.x;
    int kh = h / (n_v / n_k);
    float* S = state + (size_t)h * dk * dv;
    for (int t = 0; t < n; t++) {
        __syncthreads();
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            ks[i] = k[((size_t)t * n_k + kh) * dk + i];
            qs[i] = q[((size_t)t * n_k + kh) * dk + i];
        }
        __syncthreads();
        if (j >= dv) continue;
        float decay = expf(g[(size_t)t * n_v + h]), b = beta[(size_t)t * n_v + h];
        float mem = 0.0f;
        for (int i = 0; i < dk; i++) {
            float sv = __fmul_rn(S[(size_t)i * dv + j], decay);
            S[(size_t)i * dv + j] = sv;
            mem = __fadd_rn(mem, __fmul_rn(sv, ks[i]));
        }
        float d = __fmul_rn(b, __fsub_rn(v[((size_t)t * n_v + h) * dv + j], mem));
        float o = 0.0f;
        for (int i = 0; i < dk; i++) {
            float sv = __fadd_rn(S[(size_t)i * dv + j], __fmul_rn(ks[i], d));
            S[(size_t)i * dv + j] = sv;
            o = __fadd_rn(o, __fmul_rn(sv, qs[i]));
        }
        out[((size_t)t * n_v + h) * dv + j] = o;
    }
}

// Hyper-connection streams. out[t, i] = (sum_s x[t, s, i]) / streams, ascending s.
extern "C" __global__ void rec_mean_streams(const float* __restrict__ x, int streams, int width,
                                            long long total, float* __restrict__ out) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    long long t = e / width, i = e % width;
    const float* r = x + t * streams * width + i;
    float acc = r[0];
    for (int s = 1; s < streams; s++) acc = __fadd_rn(acc, r[(size_t)s * width]);
    out[e] = __fdiv_rn(acc, (float)streams);
}

// x[t, s, i] += w[t, s] * y[t, i].
extern "C" __global__ void rec_inject_streams(float* x, const float* __restrict__ w,
                                              const float* __restrict__ y, int streams, int width,
                                              long long total) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    long long ts = e / width, i = e % width, t = ts / streams;
    x[e] = __fadd_rn(x[e], __fmul_rn(w[ts], y[t * width + i]));
}
