// The model kit's generic ops (MoE and hybrid architectures): softmax, sigmoid, elementwise
// product, row gather / scatter-add and expert routing, on f32 rows and u32 id buffers. The CPU
// backend (crates/vela-compute/src/cpu/kit.rs, route.rs) is the reference: same operation order
// where it matters (scatter-add is bit-identical), expf for exp (a few ulps from the host's).

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

// out[r, i] = act(gu[r, i]) * gu[r, width + i] over len = rows * width elements (rows of 2*width
// in gu: a fused gate/up product); the functions of act_mul_silu / act_mul_gelu (kind 0 / 1),
// kind 2 DeepSeek V4's SwiGLU with a limit.
extern "C" __global__ void kit_act_mul_split(const float* __restrict__ gu, float* __restrict__ out,
                                             long long width, long long len, int kind,
                                             float limit) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    long long r = i / width, c = i - r * width;
    float g = gu[2 * r * width + c], u = gu[2 * r * width + width + c];
    if (kind == 2) {
        // SwiGLU with a limit: silu(min(g, L)) * clamp(u, -L, L).
        float x = fminf(g, limit);
        out[i] = x / (1.0f + expf(-x)) * fminf(fmaxf(u, -limit), limit);
        return;
    }
    out[i] = kind == 1 ? act_gelu_mul(g, u) : act_silu_mul(g, u);
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

// ---- mixture-of-experts routing: one warp (block of 32) per token, as route.rs on the CPU ----
#define KIT_MAX_EXPERTS 1024
#define KIT_MAX_K 32

// The scores of one logits row into s (score 0 softmax, 1 sigmoid, 2 sqrt(softplus) with torch's
// threshold 20); the warp's lanes stride over the experts. Ends with __syncwarp.
__device__ void route_scores(const float* __restrict__ row, int n, int score, float* s) {
    int lane = threadIdx.x;
    if (score == 0) {
        float m = NEG_INF;
        for (int e = lane; e < n; e += 32) m = fmaxf(m, row[e]);
        m = warp_max(m);
        double z = 0.0;
        for (int e = lane; e < n; e += 32) {
            float v = m == NEG_INF ? 0.0f : expf(row[e] - m);
            s[e] = v;
            z += (double)v;
        }
        float sum = (float)warp_sum_d(z);
        for (int e = lane; e < n; e += 32) s[e] = m == NEG_INF ? 0.0f : s[e] / sum;
    } else {
        for (int e = lane; e < n; e += 32) {
            float x = row[e];
            s[e] = score == 1 ? 1.0f / (1.0f + expf(-x)) : sqrtf(x > 20.0f ? x : log1pf(expf(x)));
        }
    }
    __syncwarp();
}

// The index of the largest v[i] (i < n) with taken[i] == 0, the lowest index among equal values
// (also among -inf; NaN must already be -inf); every lane gets it. n >= 1 untaken entries.
__device__ int warp_best(const float* v, const u8* taken, int n) {
    int lane = threadIdx.x;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = lane; i < n; i += 32) {
        if (taken[i]) continue;
        if (v[i] > bv || bi == 0x7fffffff) {
            bv = v[i];
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    return bi;
}

// Lane 0: the weights of the k chosen experts (w[j] holds its score): renormalised (sum in slot
// order, plus eps; a zero sum is left as is), times scale, as `finish` in route.rs.
__device__ void route_finish(float* w, int k, int renorm, float eps, float scale) {
    if (renorm) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum = __fadd_rn(sum, w[j]);
        float d = __fadd_rn(sum, eps);
        if (d != 0.0f)
            for (int j = 0; j < k; j++) w[j] = w[j] / d;
    }
    for (int j = 0; j < k; j++) w[j] = __fmul_rn(w[j], scale);
}

// Lane 0: store a token's k slots in ascending expert id (insertion sort, stable; k <= 32).
__device__ void route_store_sorted(u32* ev, float* w, int k, u32* __restrict__ ids_t,
                                   float* __restrict__ w_t) {
    for (int i = 1; i < k; i++) {
        u32 e = ev[i];
        float x = w[i];
        int j = i - 1;
        while (j >= 0 && ev[j] > e) {
            ev[j + 1] = ev[j];
            w[j + 1] = w[j];
            j--;
        }
        ev[j + 1] = e;
        w[j + 1] = x;
    }
    for (int j = 0; j < k; j++) {
        ids_t[j] = ev[j];
        w_t[j] = w[j];
    }
}

// Top-k routing of token blockIdx.x (see Backend::route): scores, keys = scores + bias (NaN as
// -inf), group masking (the topk_group groups with the largest sum of their two best keys), the
// k best keys in descending order, weights from the unbiased scores. bias / escale may be null.
extern "C" __global__ void kit_route(const float* __restrict__ logits, int n, int k, int score,
                                     int n_group, int topk_group, int renorm, float eps,
                                     float scale, const float* __restrict__ bias,
                                     const float* __restrict__ escale, u32* __restrict__ ids,
                                     float* __restrict__ weights) {
    PDL_ENTRY();
    __shared__ float s[KIT_MAX_EXPERTS], sel[KIT_MAX_EXPERTS];
    __shared__ u8 taken[KIT_MAX_EXPERTS];
    __shared__ float gscore[32];
    __shared__ u8 gtaken[32];
    int t = blockIdx.x, lane = threadIdx.x;
    route_scores(logits + (size_t)t * n, n, score, s);
    for (int e = lane; e < n; e += 32) {
        float v = bias ? __fadd_rn(s[e], bias[e]) : s[e];
        sel[e] = isnan(v) ? NEG_INF : v;
        taken[e] = 0;
    }
    __syncwarp();
    if (topk_group < n_group) {
        int gs = n / n_group;
        if (lane < n_group) {
            float a = NEG_INF, b = NEG_INF;
            for (int e = lane * gs; e < (lane + 1) * gs; e++) {
                float v = sel[e];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            gscore[lane] = gs == 1 ? a : __fadd_rn(a, b);
            gtaken[lane] = 0;
        }
        __syncwarp();
        for (int i = 0; i < topk_group; i++) {
            int g = warp_best(gscore, gtaken, n_group);
            if (lane == 0) gtaken[g] = 1;
            __syncwarp();
        }
        for (int e = lane; e < n; e += 32)
            if (!gtaken[e / gs]) sel[e] = NEG_INF;
        __syncwarp();
    }
    float w[KIT_MAX_K];
    u32 ev[KIT_MAX_K];
    for (int j = 0; j < k; j++) {
        int e = warp_best(sel, taken, n);
        if (lane == 0) taken[e] = 1;
        ev[j] = (u32)e;
        w[j] = s[e];
        __syncwarp();
    }
    if (lane == 0) {
        route_finish(w, k, renorm, eps, scale);
        if (escale)
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(w[j], escale[ev[j]]);
        route_store_sorted(ev, w, k, ids + (size_t)t * k, weights + (size_t)t * k);
    }
}

// Hash routing of token blockIdx.x (see Backend::route_hash): experts from row tokens[t] of
// table ([n_vocab, k]); an out-of-range token or expert gives expert 0 with weight 0.
extern "C" __global__ void kit_route_hash(const float* __restrict__ logits,
                                          const u32* __restrict__ tokens,
                                          const u32* __restrict__ table, long long n_vocab,
                                          int n, int k, int score, int renorm, float eps,
                                          float scale, u32* __restrict__ ids,
                                          float* __restrict__ weights) {
    PDL_ENTRY();
    __shared__ float s[KIT_MAX_EXPERTS];
    int t = blockIdx.x;
    route_scores(logits + (size_t)t * n, n, score, s);
    if (threadIdx.x != 0) return;
    u32 tok = tokens[t];
    float w[KIT_MAX_K];
    u32 ev[KIT_MAX_K];
    for (int j = 0; j < k; j++) {
        u32 e = (long long)tok < n_vocab ? table[(size_t)tok * k + j] : 0xffffffffu;
        bool ok = e < (u32)n;
        ev[j] = ok ? e : 0;
        w[j] = ok ? s[e] : 0.0f;
    }
    route_finish(w, k, renorm, eps, scale);
    route_store_sorted(ev, w, k, ids + (size_t)t * k, weights + (size_t)t * k);
}
