// Recurrent (linear-attention) layers: the causal depthwise convolution with a carried state,
// the gated delta rule token by token and its small gates; hyper-connection streams; block-sparse
// attention. The CPU backend
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

// Row sums (one thread per row, ascending, f32).
extern "C" __global__ void rec_sum_rows(const float* __restrict__ x, int n_rows, int width,
                                        float* __restrict__ out) {
    PDL_ENTRY();
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    const float* xr = x + (size_t)r * width;
    float s = 0.0f;
    for (int i = 0; i < width; i++) s = __fadd_rn(s, xr[i]);
    out[r] = s;
}

// x = scale[j] * softplus(x + bias[j]) (softplus(y) = y above 20).
extern "C" __global__ void rec_decay_gate(float* x, const float* __restrict__ bias,
                                          const float* __restrict__ scale, int width,
                                          long long total) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    int j = (int)(e % width);
    float y = x[e] + bias[j];
    float sp = y > 20.0f ? y : log1pf(expf(y));
    x[e] = scale[j] * sp;
}

// x = sigmoid(sign(y) * sqrt(max(|y|, 1e-6))), y = x * scale.
extern "C" __global__ void rec_signed_sqrt_gate(float* x, long long n, float scale) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float y = x[i] * scale;
    float m = sqrtf(fmaxf(fabsf(y), 1e-6f));
    float g = y > 0.0f ? m : (y < 0.0f ? -m : 0.0f);
    x[i] = 1.0f / (1.0f + expf(-g));
}

// One block per value head, thread j owns column j of the head's [dk, dv] state (coalesced
// rows), positions in order. The q and k heads are L2-normalised first (sequential f32 sums, as
// on the CPU) and q scaled by dk^-1/2. dk <= 256. The log-decay g is one per value head
// ([n, n_v]) or, with `channels` (KDA), one per value head and key channel ([n, n_v, dk]):
// row i of the state decays by exp(g_i).
extern "C" __global__ void rec_gated_delta_rule(const float* __restrict__ qkv,
                                                const float* __restrict__ g,
                                                const float* __restrict__ beta, int n, int n_k,
                                                int n_v, int dk, int dv, int tiled, int channels,
                                                float* state, float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float ks[256], qs[256], gs[256], inv[2];
    int h = blockIdx.x, j = threadIdx.x;
    int kh = tiled ? h % n_k : h / (n_v / n_k);
    size_t row = (size_t)2 * n_k * dk + (size_t)n_v * dv;
    float qscale = 1.0f / sqrtf((float)dk);
    float* S = state + (size_t)h * dk * dv;
    for (int t = 0; t < n; t++) {
        const float* r = qkv + (size_t)t * row;
        __syncthreads();
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = r[(size_t)kh * dk + i];
            ks[i] = r[(size_t)(n_k + kh) * dk + i];
            gs[i] = expf(channels ? g[((size_t)t * n_v + h) * dk + i] : g[(size_t)t * n_v + h]);
        }
        __syncthreads();
        if (threadIdx.x < 2) {
            const float* x = threadIdx.x == 0 ? qs : ks;
            float ss = 0.0f;
            for (int i = 0; i < dk; i++) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
            inv[threadIdx.x] = 1.0f / sqrtf(ss + 1e-6f);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = __fmul_rn(__fmul_rn(qs[i], inv[0]), qscale);
            ks[i] = __fmul_rn(ks[i], inv[1]);
        }
        __syncthreads();
        if (j >= dv) continue;
        float b = beta[(size_t)t * n_v + h];
        float mem = 0.0f;
        for (int i = 0; i < dk; i++) {
            float sv = __fmul_rn(S[(size_t)i * dv + j], gs[i]);
            S[(size_t)i * dv + j] = sv;
            mem = __fadd_rn(mem, __fmul_rn(sv, ks[i]));
        }
        float d = __fmul_rn(b, __fsub_rn(r[(size_t)2 * n_k * dk + (size_t)h * dv + j], mem));
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

// rms_norm over rows that use the weight of their group: row r reads w + (r % groups) * width.
extern "C" __global__ void rec_rms_norm_grouped(const float* x, const float* __restrict__ w,
                                                float* out, int width, int groups, float eps) {
    PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.x * width;
    float* yr = out + (size_t)blockIdx.x * width;
    const float* wr = w + (size_t)(blockIdx.x % groups) * width;
    double s = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = xr[i];
        s += (double)(v * v);
    }
    float mean = (float)(block_sum_d(s) / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = (xr[i] * scale) * wr[i];
}

// Block-sparse attention (the indexer's selection, then attention over it). The CPU backend
// (crates/vela-compute/src/cpu/sparse.rs) is the reference.

// One block per query: s_b = sum_h relu(q_h . key_b) / sqrt(di) for the complete blocks
// b < (pos+1)/c, into scores row t (stride entries).
extern "C" __global__ void sparse_index_scores(const float* __restrict__ q,
                                               const float* __restrict__ keys,
                                               const u32* __restrict__ positions, int nh, int di,
                                               int c, int stride, float* __restrict__ scores) {
    PDL_ENTRY();
    int t = blockIdx.x;
    int nb = ((int)positions[t] + 1) / c;
    const float* qt = q + (size_t)t * nh * di;
    float scale = 1.0f / sqrtf((float)di);
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        const float* kb = keys + (size_t)b * di;
        float s = 0.0f;
        for (int h = 0; h < nh; h++) {
            float dot = 0.0f;
            for (int i = 0; i < di; i++) dot = __fadd_rn(dot, __fmul_rn(qt[h * di + i], kb[i]));
            s = __fadd_rn(s, fmaxf(dot, 0.0f));
        }
        scores[(size_t)t * stride + b] = s * scale;
    }
}

// One block per query: the kept blocks (rank among the query's blocks below max_blocks, the
// lower block first among equal scores, NaN lowest), then the positions in ascending order.
// Rank counting is O(blocks^2) per query: correct at any size, fast only for short contexts.
extern "C" __global__ void sparse_index_select(const float* __restrict__ scores,
                                               const u32* __restrict__ positions, int c,
                                               int max_blocks, int stride, int width,
                                               unsigned char* __restrict__ kept, u32* sel,
                                               u32* counts) {
    PDL_ENTRY();
    int t = blockIdx.x;
    int pos = (int)positions[t];
    int nb = (pos + 1) / c;
    u32* row = sel + (size_t)t * width;
    if (nb <= max_blocks) {
        for (int x = threadIdx.x; x <= pos; x += blockDim.x) row[x] = (u32)x;
        if (threadIdx.x == 0) counts[t] = (u32)(pos + 1);
        return;
    }
    const float* s = scores + (size_t)t * stride;
    unsigned char* kt = kept + (size_t)t * stride;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        float sb = isnan(s[b]) ? NEG_INF : s[b];
        int rank = 0;
        for (int o = 0; o < nb; o++) {
            float so = isnan(s[o]) ? NEG_INF : s[o];
            rank += (so > sb) || (so == sb && o < b);
        }
        kt[b] = rank < max_blocks;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        for (int b = 0; b < nb; b++)
            if (kt[b])
                for (int x = b * c; x < (b + 1) * c; x++) row[n++] = (u32)x;
        for (int x = nb * c; x <= pos; x++) row[n++] = (u32)x;
        counts[t] = (u32)n;
    }
}

// One block per (query, head): softmax of scale*q.k over the selected positions (f64 sum),
// then the weighted sum of their V rows in selection order. At most SPARSE_MAX_SEL positions.
#define SPARSE_MAX_SEL 4096
extern "C" __global__ void sparse_attention(const float* __restrict__ q, const float* __restrict__ k,
                                            const float* __restrict__ v, const u32* __restrict__ sel,
                                            const u32* __restrict__ counts, int width, int nh,
                                            int nkv, int hd, float scale, float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float w[SPARSE_MAX_SEL];
    int t = blockIdx.x, h = blockIdx.y;
    int kh = h / (nh / nkv), kvw = nkv * hd;
    int n = (int)counts[t];
    const u32* ids = sel + (size_t)t * width;
    const float* qh = q + ((size_t)t * nh + h) * hd;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float* kr = k + (size_t)ids[j] * kvw + (size_t)kh * hd;
        float dot = 0.0f;
        for (int i = 0; i < hd; i++) dot = __fadd_rn(dot, __fmul_rn(qh[i], kr[i]));
        w[j] = dot * scale;
    }
    __syncthreads();
    float m = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, w[j]);
    m = block_max(m);
    double sum = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(w[j] - m);
        w[j] = e;
        sum += (double)e;
    }
    float total = (float)block_sum_d(sum);
    __syncthreads();
    float* o = out + ((size_t)t * nh + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) {
            float wj = w[j] / total;
            acc = __fadd_rn(acc, __fmul_rn(wj, v[(size_t)ids[j] * kvw + (size_t)kh * hd + i]));
        }
        o[i] = acc;
    }
}

// Fused elementwise chains (Backend::silu_scaled, sigmoid_scaled, sigmoid_mul,
// sigmoid_mix_streams, delta_gates): the values of the kernels they replace (scale, kit_sigmoid,
// kit_mul, rec_mean_streams, rec_decay_gate), the same operations in the same order; a product
// that feeds a sum is spelled __fmul_rn / __fadd_rn so that it cannot contract into an FMA.
__device__ __forceinline__ float fu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// x = v * sigmoid(v), v = x * s.
extern "C" __global__ void fu_silu_scaled(float* x, float s, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i] * s;
    x[i] = v * fu_sigmoid(v);
}

// x = post * sigmoid(pre * x).
extern "C" __global__ void fu_sigmoid_scaled(float* x, float pre, float post, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = fu_sigmoid(x[i] * pre) * post;
}

// x *= sigmoid(g).
extern "C" __global__ void fu_sigmoid_mul(float* x, const float* __restrict__ g, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * fu_sigmoid(g[i]);
}

// out[t, i] = (sum_s sigmoid(a[t, s, i]) * xn[t, s, i]) / streams, ascending s.
extern "C" __global__ void fu_sigmoid_mix_streams(const float* __restrict__ a,
                                                  const float* __restrict__ xn, int streams,
                                                  int width, long long total,
                                                  float* __restrict__ out) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    long long t = e / width, i = e % width;
    const float* ar = a + t * streams * width + i;
    const float* xr = xn + t * streams * width + i;
    float acc = __fmul_rn(fu_sigmoid(ar[0]), xr[0]);
    for (int s = 1; s < streams; s++) {
        size_t o = (size_t)s * width;
        acc = __fadd_rn(acc, __fmul_rn(fu_sigmoid(ar[o]), xr[o]));
    }
    out[e] = __fdiv_rn(acc, (float)streams);
}

// b = sigmoid(b); a = scale[j] * softplus(a + bias[j]) (rec_decay_gate), both [rows, width].
extern "C" __global__ void fu_delta_gates(float* b, float* a, const float* __restrict__ bias,
                                          const float* __restrict__ scale, int width,
                                          long long total) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    b[e] = fu_sigmoid(b[e]);
    int j = (int)(e % width);
    float y = a[e] + bias[j];
    float sp = y > 20.0f ? y : log1pf(expf(y));
    a[e] = scale[j] * sp;
}
