// Norms, RoPE and element-wise ops on f32 activations (row-major [n_tokens, width]).

// RMSNorm of one row per block (blockDim.x a multiple of 32, at most 1024): the sum of squares
// is accumulated in double like the CPU backend (warp shuffles, then one warp over the warps'
// sums: two barriers instead of a shared-memory tree); out may alias x.
extern "C" __global__ void rms_norm(const float* x, const float* __restrict__ w, float* out,
                                    int width, float eps) {
    PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.x * width;
    float* yr = out + (size_t)blockIdx.x * width;
    // Eight loads in flight per thread (a wide row, mHC's 4 x 4096 streams, is one block: one
    // load at a time made it latency-bound); each thread still adds its elements in order.
    const int bd = blockDim.x;
    double s = 0.0;
    int i = threadIdx.x;
    for (; i + 7 * bd < width; i += 8 * bd) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = xr[i + u * bd];
#pragma unroll
        for (int u = 0; u < 8; u++) s += (double)(v[u] * v[u]);
    }
    for (; i < width; i += bd) {
        float v = xr[i];
        s += (double)(v * v);
    }
    float mean = (float)(block_sum_d(s) / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    // out may be x (in place): each element is read before it is written, by the same thread.
    i = threadIdx.x;
    for (; i + 7 * bd < width; i += 8 * bd) {
        float v[8], g[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            v[u] = xr[i + u * bd];
            g[u] = w[i + u * bd];
        }
#pragma unroll
        for (int u = 0; u < 8; u++) yr[i + u * bd] = (v[u] * scale) * g[u];
    }
    for (; i < width; i += bd) yr[i] = (xr[i] * scale) * w[i];
}

// RoPE: block per token, thread per (head, pair). The angle of pair i is built like the CPU's
// table: theta = pos, multiplied i times by theta_scale in f32 (theta_scale is computed on the
// host so both backends use the same value). ff (may be null) holds per-pair divisors.
#define ROPE_MAX_PAIRS 256
// The angle of rotated pair i at position p (cos, sin).
__device__ __forceinline__ void rope_angle(u32 p, int i, float theta_scale, float freq_scale,
                                           const float* __restrict__ ff, float& c, float& sn) {
    float theta = (float)p;
    for (int j = 0; j < i; j++) theta *= theta_scale;
    float f = ff ? ff[i] : 1.0f;
    float a = freq_scale * (theta / f);
    c = cosf(a);
    sn = sinf(a);
}
__device__ __forceinline__ void rope_row(float* x, const u32* __restrict__ pos, int t, int n_head,
                                         int head_dim, int n_rot, float theta_scale,
                                         float freq_scale, const float* __restrict__ ff, int neox) {
    int half_rot = n_rot / 2;
    // The angles depend on the pair only: computed once per block (a serial chain of up to
    // half_rot multiplications each), then applied to every head. Same values as computing
    // them per element.
    __shared__ float cs[2][ROPE_MAX_PAIRS];
    bool shared = half_rot <= ROPE_MAX_PAIRS;
    if (shared) {
        for (int i = threadIdx.x; i < half_rot; i += blockDim.x)
            rope_angle(pos[t], i, theta_scale, freq_scale, ff, cs[0][i], cs[1][i]);
        __syncthreads();
    }
    for (int k = threadIdx.x; k < n_head * half_rot; k += blockDim.x) {
        int h = k / half_rot, i = k % half_rot;
        float c, s;
        if (shared) {
            c = cs[0][i];
            s = cs[1][i];
        } else {
            rope_angle(pos[t], i, theta_scale, freq_scale, ff, c, s);
        }
        float* hx = x + ((size_t)t * n_head + h) * head_dim;
        int ia = neox ? i : 2 * i;
        int ib = neox ? i + half_rot : 2 * i + 1;
        float x0 = hx[ia], x1 = hx[ib];
        hx[ia] = x0 * c - x1 * s;
        hx[ib] = x0 * s + x1 * c;
    }
}

extern "C" __global__ void rope(float* x, const u32* __restrict__ pos, int n_head, int head_dim,
                                int n_rot, float theta_scale, float freq_scale,
                                const float* __restrict__ ff, int neox) {
    PDL_ENTRY();
    rope_row(x, pos, blockIdx.x, n_head, head_dim, n_rot, theta_scale, freq_scale, ff, neox);
}

// RoPE of q (blockIdx.y = 0, n_head heads) and k (blockIdx.y = 1, n_head_kv heads) in one launch.
extern "C" __global__ void rope_qk(float* q, float* k, const u32* __restrict__ pos, int n_head,
                                   int n_head_kv, int head_dim, int n_rot, float theta_scale,
                                   float freq_scale, const float* __restrict__ ff, int neox) {
    PDL_ENTRY();
    if (blockIdx.y == 0)
        rope_row(q, pos, blockIdx.x, n_head, head_dim, n_rot, theta_scale, freq_scale, ff, neox);
    else
        rope_row(k, pos, blockIdx.x, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, ff, neox);
}

extern "C" __global__ void add(float* x, const float* __restrict__ y, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void add_bias(float* x, const float* __restrict__ b, int width, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % width];
}

extern "C" __global__ void scale(float* x, float s, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void act_mul_silu(float* g, const float* __restrict__ u, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = act_silu_mul(g[i], u[i]);
}

extern "C" __global__ void act_mul_gelu(float* g, const float* __restrict__ u, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = act_gelu_mul(g[i], u[i]);
}

extern "C" __global__ void softcap(float* x, float cap, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

extern "C" __global__ void copy_f32(const float* __restrict__ src, float* __restrict__ dst, long long n) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// Index of the largest element of each row: the lowest index among equal maxima, like a
// sequential scan with `>`; NaNs are skipped (a row of only NaNs gives 0). Two kernels: blocks of
// 256 threads × 4 elements write one (value, index) candidate each, then one block per row
// reduces the candidates (a single block per row scanning 49k logits took 21 us).
__device__ __forceinline__ void argmax_merge(float& best, int& bi, float v2, int i2) {
    if (v2 > best || (v2 == best && i2 < bi)) { best = v2; bi = i2; }
}
__device__ __forceinline__ void argmax_block(float& best, int& bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_merge(best, bi, v2, i2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x / 32;
        best = lane < nw ? sv[lane] : NEG_INF;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            argmax_merge(best, bi, v2, i2);
        }
    }
}

#define ARGMAX_CHUNK 1024
// Grid (ceil(width / ARGMAX_CHUNK), n_rows), 256 threads: candidate of chunk blockIdx.x of row
// blockIdx.y into cand[row * gridDim.x + chunk] (index 0x7fffffff: no candidate).
extern "C" __global__ void argmax_part(const float* __restrict__ x, int width, float* __restrict__ cv,
                                       int* __restrict__ ci) {
    PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.y * width;
    int base = blockIdx.x * ARGMAX_CHUNK;
    float v[ARGMAX_CHUNK / 256];
#pragma unroll
    for (int k = 0; k < ARGMAX_CHUNK / 256; k++) {
        int i = base + k * 256 + threadIdx.x;
        v[k] = i < width ? xr[i] : NEG_INF;
    }
    float best = NEG_INF;
    int bi = 0x7fffffff;
#pragma unroll
    for (int k = 0; k < ARGMAX_CHUNK / 256; k++) {
        int i = base + k * 256 + threadIdx.x;
        if (i < width) argmax_merge(best, bi, v[k], i);
    }
    argmax_block(best, bi);
    if (threadIdx.x == 0) {
        cv[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = best;
        ci[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = bi;
    }
}

// One block per row over its n_cand candidates.
extern "C" __global__ void argmax_final(const float* __restrict__ cv, const int* __restrict__ ci,
                                        int n_cand, u32* __restrict__ out) {
    PDL_ENTRY();
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int c = threadIdx.x; c < n_cand; c += blockDim.x)
        argmax_merge(best, bi, cv[(size_t)blockIdx.x * n_cand + c], ci[(size_t)blockIdx.x * n_cand + c]);
    argmax_block(best, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0u : (u32)bi;
}

// argmax_final of one row that also hands the id to the next decode step: io[0] = the id (its
// token), io[1] += 1 (its position; graph.rs, pipelined greedy decoding).
extern "C" __global__ void argmax_final_io(const float* __restrict__ cv, const int* __restrict__ ci,
                                           int n_cand, u32* __restrict__ out, u32* io) {
    PDL_ENTRY();
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int c = threadIdx.x; c < n_cand; c += blockDim.x) argmax_merge(best, bi, cv[c], ci[c]);
    argmax_block(best, bi);
    if (threadIdx.x == 0) {
        u32 id = bi == 0x7fffffff ? 0u : (u32)bi;
        out[0] = id;
        io[0] = id;
        io[1] += 1;
    }
}

// Programmatic dependent launch in the RoPE + store kernels: they start with ROPE_ENTRY() and
// every thread reaches ROPE_RESUME() once, after reading only the position and constants (the
// angles of rope_store_heads) and before anything the previous kernel writes, like the
// matvecs' MV_ENTRY / MV_RESUME: decode +1 to +1.6 % on the small models' geometries against
// waiting at entry (docs/perf-log.md).
#define ROPE_ENTRY() do {} while (0)
#define ROPE_RESUME() pdl_resume()
// The extern wrappers of rope_store_heads (below), one per cache type.
#define ROPE_STORE(FN, KT, NAME)                                                                     \
    extern "C" __global__ void NAME(float* q, float* k, const float* v, const u32* pos, void* kc, void* vc, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, float freq_scale, const float* ff, int neox, int wk, int wv, int capacity, const unsigned long long* kvt) { KVT_ROW(blockIdx.x); ROPE_ENTRY(); \
        FN<KT>(q, k, (float*)v, pos, kc, vc, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, ff, neox, wk, wv, capacity); }

// RoPE + KV store with one block per head (three blocks per token, each looping over all heads,
// took ~8 us per Llama-3-8B layer): block (t, y) rotates q head y
// (y < n_head), or rotates k head y - n_head and stores it (and its unrotated tail) in the cache,
// or stores v head y - n_head - n_head_kv. Thread i takes pair i (a serial loop when the head has
// more pairs than threads); angles computed as in rope_row, so the results are identical.
// NORM (`rope_norm_store_heads_*`): each q and k head is first RMS-normalized in place with qn / kn
// (Qwen3's and Gemma's QK norm) exactly like rms_norm on head rows (launched with 256 threads like
// rms_norm, so the double sums are grouped the same way): two launches fewer per layer; with vn
// (Gemma 4) each v head too, before it is stored: three.
template <int KT, bool NORM = false>
__device__ void rope_store_heads(float* q, float* k, float* __restrict__ v,
                                 const u32* __restrict__ pos, void* kc, void* vc, int n_head,
                                 int n_head_kv, int head_dim, int n_rot, float theta_scale,
                                 float freq_scale, const float* __restrict__ ff, int neox, int wk,
                                 int wv, int capacity, const float* __restrict__ qn = nullptr,
                                 const float* __restrict__ kn = nullptr,
                                 const float* __restrict__ vn = nullptr, float eps = 0.0f) {
    int t = blockIdx.x, y = blockIdx.y;
    // Before the wait: the step's position (written before the step's first kernel) and the
    // thread's first angle, from constants only.
    u32 p = pos[t];
    size_t slot = p % (u32)capacity;
    int half_rot = n_rot / 2;
    float c0 = 1.0f, s0 = 0.0f;
    if (y < n_head + n_head_kv && (int)threadIdx.x < half_rot)
        rope_angle(p, threadIdx.x, theta_scale, freq_scale, ff, c0, s0);
    // NORM: the thread's first weight of its head's norm (q, k, or v: Gemma 4).
    const float* nw = !NORM ? nullptr : y < n_head ? qn : y < n_head + n_head_kv ? kn : vn;
    int nlen = y < n_head + n_head_kv ? head_dim : wv / n_head_kv;
    float nw0 = nw && (int)threadIdx.x < nlen ? nw[threadIdx.x] : 0.0f;
    ROPE_RESUME();
    if (y >= n_head + n_head_kv) {
        int hv = y - n_head - n_head_kv, hdv = wv / n_head_kv;
        float* src = v + (size_t)t * wv + (size_t)hv * hdv;
        size_t dst = slot * wv + (size_t)hv * hdv;
        float scale = 1.0f;
        if (NORM && vn) {
            // Gemma 4's V norm, as rms_norm computes it (v is normalized in place too).
            double s = 0.0;
            for (int i = threadIdx.x; i < hdv; i += blockDim.x) {
                float x = src[i];
                s += (double)(x * x);
            }
            float mean = (float)(block_sum_d(s) / (double)hdv);
            scale = 1.0f / sqrtf(mean + eps);
        }
        for (int i = threadIdx.x; i < hdv; i += blockDim.x) {
            float x = src[i];
            if (NORM && vn) {
                x = (x * scale) * (i == (int)threadIdx.x ? nw0 : vn[i]);
                src[i] = x;
            }
            if (KT != 0) ((u16*)vc)[dst + i] = f2kv<KT>(x); else ((float*)vc)[dst + i] = x;
        }
        return;
    }
    bool is_k = y >= n_head;
    int hh = is_k ? y - n_head : y;
    float* hx = is_k ? k + ((size_t)t * n_head_kv + hh) * head_dim : q + ((size_t)t * n_head + hh) * head_dim;
    size_t dst = slot * wk + (size_t)hh * head_dim;
    if constexpr (NORM) {
        double s = 0.0;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            float x = hx[i];
            s += (double)(x * x);
        }
        float mean = (float)(block_sum_d(s) / (double)head_dim);
        float scale = 1.0f / sqrtf(mean + eps);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            hx[i] = (hx[i] * scale) * (i == (int)threadIdx.x ? nw0 : nw[i]);
        // (The rotation below reads elements other threads normalized.)
        __syncthreads();
    }
    for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
        float c = c0, sn = s0;
        if (i != (int)threadIdx.x) rope_angle(p, i, theta_scale, freq_scale, ff, c, sn);
        int ia = neox ? i : 2 * i;
        int ib = neox ? i + half_rot : 2 * i + 1;
        float x0 = hx[ia], x1 = hx[ib];
        float y0 = x0 * c - x1 * sn, y1 = x0 * sn + x1 * c;
        hx[ia] = y0;
        hx[ib] = y1;
        if (is_k) {
            if (KT != 0) {
                ((u16*)kc)[dst + ia] = f2kv<KT>(y0);
                ((u16*)kc)[dst + ib] = f2kv<KT>(y1);
            } else {
                ((float*)kc)[dst + ia] = y0;
                ((float*)kc)[dst + ib] = y1;
            }
        }
    }
    if (is_k) {
        for (int i = n_rot + threadIdx.x; i < head_dim; i += blockDim.x) {
            float x = hx[i];
            if (KT != 0) ((u16*)kc)[dst + i] = f2kv<KT>(x); else ((float*)kc)[dst + i] = x;
        }
    }
}
ROPE_STORE(rope_store_heads, 0, rope_store_heads_f32)
ROPE_STORE(rope_store_heads, 1, rope_store_heads_f16)
ROPE_STORE(rope_store_heads, 2, rope_store_heads_bf16)
#define ROPE_NORM_STORE(KT, NAME)                                                                    \
    extern "C" __global__ void NAME(float* q, float* k, float* v, const u32* pos, void* kc, void* vc, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, float freq_scale, const float* ff, int neox, int wk, int wv, int capacity, const float* qn, const float* kn, const float* vn, float eps, const unsigned long long* kvt) { KVT_ROW(blockIdx.x); ROPE_ENTRY(); \
        rope_store_heads<KT, true>(q, k, v, pos, kc, vc, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, ff, neox, wk, wv, capacity, qn, kn, vn, eps); }
ROPE_NORM_STORE(0, rope_norm_store_heads_f32)
ROPE_NORM_STORE(1, rope_norm_store_heads_f16)
ROPE_NORM_STORE(2, rope_norm_store_heads_bf16)

// L2 prefetch hint for `bytes` bytes from p, one 128-byte line per thread and step, the front
// first (l2pf.rs: a side branch of a captured decode step asks for the next product's weights
// while the short kernels before it run). Reads and writes nothing. (A bulk version,
// cp.async.bulk.prefetch.L2 from one-warp blocks, was far slower, docs/perf-log.md.)
extern "C" __global__ void prefetch_l2(const char* p, long long bytes) {
    PDL_ENTRY();
    long long step = (long long)gridDim.x * blockDim.x * 128;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 128; i < bytes; i += step)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));
}
