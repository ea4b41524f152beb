// Norms, RoPE and element-wise ops on f32 activations (row-major [n_tokens, width]).

// RMSNorm of one row per block (blockDim.x a multiple of 32, at most 1024): the sum of squares
// is accumulated in double like the CPU backend (warp shuffles, then one warp over the warps'
// sums: two barriers instead of a shared-memory tree); out may alias x.
extern "C" __global__ void rms_norm(const float* x, const float* __restrict__ w, float* out,
                                    int width, float eps) {
    PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.x * width;
    float* yr = out + (size_t)blockIdx.x * width;
    double s = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = xr[i];
        s += (double)(v * v);
    }
    float mean = (float)(block_sum_d(s) / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
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
// matvecs' MV_ENTRY / MV_RESUME. VELA_CUDA_DEFINES=ROPE_WAIT_FIRST: wait at entry (A/B).
// H200 tg128 (session 17, before the QK-norm weights moved too): Qwen2.5-0.5B / SmolLM2 / Gemma 3
// geometries 1,517.1 / 1,778.6 / 1,931.1 t/s vs 1,502.3 / 1,751.0 / 1,901.4 (and 1,520.1 /
// 1,777.5 / 1,932.4 vs 1,503.1 / 1,751.4 / 1,900.3).
#ifdef ROPE_WAIT_FIRST
#define ROPE_ENTRY() pdl_resume()
#define ROPE_RESUME() do {} while (0)
#else
#define ROPE_ENTRY() do {} while (0)
#define ROPE_RESUME() pdl_resume()
#endif
// RoPE of q and k plus the KV-cache store of the rotated k and of v, one launch: block (t, 0)
// rotates q's row t, block (t, 1) rotates k's row t and stores it, block (t, 2) stores v's row t
// (slot = position % capacity; f16 caches round to nearest even like kv_store).
template <int KT>
__device__ void rope_store(float* q, float* k, const float* __restrict__ v,
                           const u32* __restrict__ pos, void* kc, void* vc, int n_head,
                           int n_head_kv, int head_dim, int n_rot, float theta_scale,
                           float freq_scale, const float* __restrict__ ff, int neox, int wk, int wv,
                           int capacity) {
    ROPE_RESUME();
    int t = blockIdx.x;
    size_t slot = pos[t] % (u32)capacity;
    if (blockIdx.y == 0) {
        rope_row(q, pos, t, n_head, head_dim, n_rot, theta_scale, freq_scale, ff, neox);
    } else if (blockIdx.y == 1) {
        rope_row(k, pos, t, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, ff, neox);
        __syncthreads();
        for (int i = threadIdx.x; i < wk; i += blockDim.x) {
            float x = k[(size_t)t * wk + i];
            if (KT != 0) ((u16*)kc)[slot * wk + i] = f2kv<KT>(x); else ((float*)kc)[slot * wk + i] = x;
        }
    } else {
        for (int i = threadIdx.x; i < wv; i += blockDim.x) {
            float x = v[(size_t)t * wv + i];
            if (KT != 0) ((u16*)vc)[slot * wv + i] = f2kv<KT>(x); else ((float*)vc)[slot * wv + i] = x;
        }
    }
}
// The extern wrappers of rope_store and rope_store_heads (below), one per cache type.
#define ROPE_STORE(FN, KT, NAME)                                                                     \
    extern "C" __global__ void NAME(float* q, float* k, const float* v, const u32* pos, void* kc, void* vc, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, float freq_scale, const float* ff, int neox, int wk, int wv, int capacity) { ROPE_ENTRY(); \
        FN<KT>(q, k, (float*)v, pos, kc, vc, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, ff, neox, wk, wv, capacity); }
ROPE_STORE(rope_store, 0, rope_store_f32)
ROPE_STORE(rope_store, 1, rope_store_f16)
ROPE_STORE(rope_store, 2, rope_store_bf16)

// RoPE + KV store with one block per head (the default; rope_store above runs three blocks per
// token, each looping over all heads: ~8 us per Llama-3-8B layer): block (t, y) rotates q head y
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
    extern "C" __global__ void NAME(float* q, float* k, float* v, const u32* pos, void* kc, void* vc, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, float freq_scale, const float* ff, int neox, int wk, int wv, int capacity, const float* qn, const float* kn, const float* vn, float eps) { ROPE_ENTRY(); \
        rope_store_heads<KT, true>(q, k, v, pos, kc, vc, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, ff, neox, wk, wv, capacity, qn, kn, vn, eps); }
ROPE_NORM_STORE(0, rope_norm_store_heads_f32)
ROPE_NORM_STORE(1, rope_norm_store_heads_f16)
ROPE_NORM_STORE(2, rope_norm_store_heads_bf16)

// ---- measurement kernels of `CudaBackend::sync_cost` (src/sync_cost.rs) ----
// `phases` grid barriers; in phase p every block writes p + 1 to its flag, waits at the barrier
// and reads the next block's flag, which must be p + 1 or (when that block is already past the
// barrier) p + 2; anything smaller counts as an error in err[0].
extern "C" __global__ void grid_barrier_test(unsigned* bar, unsigned* flags, unsigned* err,
                                             int phases) {
    PDL_ENTRY();
    unsigned nb = gridDim.x, b = blockIdx.x;
    for (int p = 0; p < phases; p++) {
        if (threadIdx.x == 0) ((volatile unsigned*)flags)[b] = (unsigned)p + 1;
        grid_barrier(bar, nb);
        if (threadIdx.x == 0) {
            unsigned v = ((volatile unsigned*)flags)[(b + 1) % nb];
            if (v < (unsigned)p + 1) atomicAdd(err, 1u);
        }
    }
}
// One link of a chain of dependent launches: waits for the previous kernel, adds 1 to x[block].
extern "C" __global__ void launch_chain_link(unsigned* x) {
    PDL_ENTRY();
    if (threadIdx.x == 0) x[blockIdx.x] += 1;
}
// The same chain with counter edges: link k (k >= 2) lets the next link launch at its entry and
// then waits until every block of link k - 1 has counted itself in cnt[k - 1] (a release add
// after its write; an acquire load here), instead of griddepcontrol.wait's whole-grid
// completion. Link 1 waits as every kernel does (after flag_chain_reset), then lets the next
// launch. The next link launches only once every block of this one has started, so the blocks
// waited on are resident: no deadlock. Block b checks that x[b] holds k - 1 (mod n) before adding
// 1 (else err[0] += 1). sm_70+ (acquire/release); the host measures on sm_90 only.
__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
    unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile unsigned*)p;
    __threadfence();
#endif
    return v;
}
__device__ __forceinline__ void red_release_add_u32(unsigned* p, unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __threadfence();
    atomicAdd(p, v);
#endif
}
extern "C" __global__ void flag_chain_reset(unsigned* cnt, int n) {
    PDL_ENTRY();
    for (int i = threadIdx.x; i <= n; i += blockDim.x) cnt[i] = 0u;
}
extern "C" __global__ void flag_chain_link(unsigned* x, unsigned* cnt, int k, int n, unsigned* err) {
    if (k == 1) {
        PDL_ENTRY();
    } else {
        pdl_trigger();
        if (threadIdx.x == 0)
            while (ld_acquire_u32(cnt + k - 1) < gridDim.x) {
            }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        unsigned v = x[blockIdx.x];
        if (v % (unsigned)n != (unsigned)(k - 1)) atomicAdd(err, 1u);
        x[blockIdx.x] = v + 1;
        red_release_add_u32(cnt + k, 1u);
    }
}
// ---- overlap probe (measurement only: `CudaBackend::overlap_probe` in sync_cost.rs) ----
// What a persistent decode kernel could reach: one resident grid (one block per SM) runs
// `layers` decode-shaped layers of five phases, each an all-to-all step of the real layer:
//   0 Q/K/V (qkv rows of d columns), 1 attention (no weights: the block's slice of the d query
//   values, local), 2 o (d x d), 3 gate/up (2 ff x d), 4 down (d x ff, input silu(gate) * up).
// Weights are 4-bit, two per byte (cols / 2 bytes per row, as a Q4_0 block's quants: the low
// nibbles of 16 bytes are weights 0..15, the high ones 16..31); activations int8 with a per-block
// scale. A phase starts once every block has released the previous phase's counter (an edge), and
// every block then reads the whole previous output (the next product needs all of it). Before it
// waits, a block copies the first `pf` bytes of its rows of the phase's weights into shared memory
// (cp.async): the weight stream overlaps the edge, which is what the persistent design is for.
// `err` counts blocks that found a producer's stamp missing after an edge. `flags` (for the
// decomposition, bits): 1 no edges (no waits, no stamp checks: the weight stream and the
// per-phase work alone; outputs race), 2 no weight rows (the edges and the input reads alone), 4
// no input pass (each phase's products use whatever the block's int8 input holds: with 1, the
// weight stream and the dot products alone).
#define OP_MAXC 16384
#define OP_PF_MAX (96 * 1024)
__device__ __forceinline__ void op_release(unsigned* c) {
    __syncthreads();
    if (threadIdx.x == 0) red_release_add_u32(c, 1u);
}
__device__ __forceinline__ void op_wait(const unsigned* c, unsigned n) {
    if (threadIdx.x == 0)
        while (ld_acquire_u32(c) < n) {
        }
    __syncthreads();
}
// Input of a phase into xs (int8) with its scale: in[0..n) (or silu(in[i]) * in[n + i] when act).
// The barrier of op_input's nw warps: the whole block, or (named) barrier 1 of the first nw warps.
__device__ __forceinline__ void op_sync(int nw, bool named) {
    if (named)
        asm volatile("bar.sync 1, %0;" ::"r"(nw * 32) : "memory");
    else
        __syncthreads();
}
__device__ float op_input(const float* in, int n, bool act, signed char* xs, float* red, int nw = 0,
                          bool named = false) {
    if (nw == 0) nw = blockDim.x / 32;
    float mx = 0.0f;
    for (int i = threadIdx.x; i < n; i += nw * 32) {
        float v = act ? in[i] / (1.0f + __expf(-in[i])) * in[n + i] : in[i];
        mx = fmaxf(mx, fabsf(v));
    }
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = mx;
    op_sync(nw, named);
    float m = 0.0f;
    for (int w = 0; w < nw; w++) m = fmaxf(m, red[w]);
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    for (int i = threadIdx.x; i < n; i += nw * 32) {
        float v = act ? in[i] / (1.0f + __expf(-in[i])) * in[n + i] : in[i];
        xs[i] = (signed char)__float2int_rn(v * inv);
    }
    op_sync(nw, named);
    return m / 127.0f;
}
// 32 4-bit weights (16 bytes, a Q4_0 block's quants) times activations 32 c .. 32 c + 31.
__device__ __forceinline__ int op_dot16(uint4 u, const int* xi, int c, int acc) {
    unsigned q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc = dp4a((int)(q[k] & 0x0F0F0F0Fu), xi[8 * c + k], acc);
        acc = dp4a((int)((q[k] >> 4) & 0x0F0F0F0Fu), xi[8 * c + 4 + k], acc);
    }
    return acc;
}
// Rows [r0, r1) of a cols-wide product (one warp per row; the first pf bytes of the block's rows
// are in pfb).
__device__ void op_rows(const u8* __restrict__ w, int cols, int r0, int r1, const signed char* xs,
                        float xscale, float* out, const u8* pfb, long long pf) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    long long rb = cols / 2;
    const int* xi = (const int*)xs;
    for (int r = r0 + warp; r < r1; r += nw) {
        int acc = 0;
        for (int c = lane; c < cols / 32; c += 32) {
            long long off = (long long)(r - r0) * rb + 16LL * c;
            uint4 u = off < pf ? *(const uint4*)(pfb + off) : *(const uint4*)(w + (long long)r * rb + 16LL * c);
            acc = op_dot16(u, xi, c, acc);
        }
        acc = warp_sum_i(acc);
        if (lane == 0) out[r] = (float)acc * xscale * (1.0f / 64.0f);
    }
}
// The probes' layer walk: activations x (d) | qkv out (qkv) | attention out (d) | o out (d) |
// gate/up out (2 ff) | down out (d) in `act`, weights of layer l at w + l * layer_bytes; phase p's
// rows, columns (0 for the attention), weights (nullptr), input and output, and block b's rows
// [r0, r1) of nb blocks.
struct OpPhase {
    int rows, cols, r0, r1;
    const u8* w;
    const float* in;
    float* out;
};
__device__ __forceinline__ long long op_layer_bytes(int d, int qkv, int ff) {
    return (qkv + d + 2LL * ff) * (d / 2) + (long long)d * (ff / 2);
}
__device__ __forceinline__ OpPhase op_phase(const u8* w, float* act, int l, int p, int d, int qkv,
                                            int ff, unsigned b, unsigned nb) {
    float* a_x = act;
    float* a_qkv = a_x + d;
    float* a_att = a_qkv + qkv;
    float* a_o = a_att + d;
    float* a_gu = a_o + d;
    float* a_dn = a_gu + 2 * ff;
    long long rbd = d / 2;
    const u8* wl = w + (long long)l * op_layer_bytes(d, qkv, ff);
    OpPhase ph;
    ph.rows = p == 0 ? qkv : p == 3 ? 2 * ff : d;
    ph.cols = p == 4 ? ff : p == 1 ? 0 : d;
    ph.w = p == 0 ? wl
         : p == 1 ? nullptr
         : p == 2 ? wl + qkv * rbd
         : p == 3 ? wl + (qkv + d) * rbd
                  : wl + (qkv + d + 2LL * ff) * rbd;
    ph.in = p == 0 ? (l == 0 ? a_x : a_dn) : p == 1 ? a_qkv : p == 2 ? a_att : p == 3 ? a_o : a_gu;
    ph.out = p == 0 ? a_qkv : p == 1 ? a_att : p == 2 ? a_o : p == 3 ? a_gu : a_dn;
    int per = (ph.rows + nb - 1) / nb;
    ph.r0 = min(ph.rows, (int)b * per);
    ph.r1 = min(ph.rows, ph.r0 + per);
    return ph;
}
extern "C" __global__ void overlap_probe(const u8* __restrict__ w, float* act, unsigned* cnt,
                                         unsigned* stamp, unsigned* err, int layers, int d,
                                         int qkv, int ff, int pf_max, int flags) {
    PDL_ENTRY();
    extern __shared__ __align__(16) u8 pfb[];
    __shared__ __align__(16) signed char xs[OP_MAXC];
    __shared__ float red[32];
    unsigned nb = gridDim.x, b = blockIdx.x;
    for (int l = 0; l < layers; l++) {
        for (int p = 0; p < 5; p++) {
            int g = l * 5 + p;
            OpPhase ph = op_phase(w, act, l, p, d, qkv, ff, b, nb);
            int cols = ph.cols, r0 = ph.r0, r1 = ph.r1;
            const u8* wph = ph.w;
            long long pf = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            if (wph && pf_max > 0 && !(flags & 2)) {
                // The block's rows of this phase, first pf bytes, into shared memory.
                long long rb = cols / 2;
                pf = min((long long)pf_max, (long long)(r1 - r0) * rb);
                const u8* src = wph + (long long)r0 * rb;
                for (long long o = 16LL * threadIdx.x; o < pf; o += 16LL * blockDim.x) {
                    unsigned sa = (unsigned)__cvta_generic_to_shared(pfb + o);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(src + o) : "memory");
                }
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
#endif
            if (g > 0 && !(flags & 1)) {
                op_wait(cnt + g - 1, nb);
                if (threadIdx.x < nb && ((volatile unsigned*)stamp)[threadIdx.x] < (unsigned)g)
                    atomicAdd(err, 1u);
            }
            if (p == 1) {
                // Attention stand-in: the block's slice of the d query values (local).
                int pd = (d + nb - 1) / nb, j0 = min(d, (int)b * pd), j1 = min(d, j0 + pd);
                for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) ph.out[j] = 0.5f * ph.in[j];
            } else {
                float* out = ph.out;
                float xscale = (flags & 4) ? 1.0f : op_input(ph.in, cols, p == 4, xs, red);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
                asm volatile("cp.async.wait_all;" ::: "memory");
#endif
                __syncthreads();
                if (!(flags & 2)) op_rows(wph, cols, r0, r1, xs, xscale, out, pfb, pf);
            }
            __syncthreads();
            if (threadIdx.x == 0) ((volatile unsigned*)stamp)[b] = (unsigned)g + 1;
            op_release(cnt + g);
        }
    }
}
// ---- stream probe (measurement only: `CudaBackend::stream_probe` in sync_cost.rs) ----
// overlap_probe's five-phase layers, with the weights streamed by a producer warp through a ring
// of SP_STAGES shared-memory slots (cp.async.bulk + mbarriers, sm_90) that runs ahead of the
// consumers across the edges: the producer never waits on an edge, only for a free slot, so the
// next phases' first tiles load while the consumers wait for the previous phase. A tile is the
// most whole rows of the block's contiguous row range that fit a slot. Consumer warps (all but
// the last) compute overlap_probe's rows from the slots; their barriers leave the producer out
// (bar.sync 1). Every wait gives up after `spin` tries with a trap (the launch fails rather than
// hangs). `flags` as overlap_probe's; err counts stamps missing after an edge.
#define SP_STAGES 8
#define SP_RING (192 * 1024)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 sp_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ bool sp_try_wait(u32 bar, u32 parity) {
    u32 ok;
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok != 0;
}
// A wait that gives up after `spin` tries with a trap (the launch fails instead of hanging).
__device__ __forceinline__ void sp_wait(u32 bar, u32 parity, long long spin) {
    for (long long i = 0; i < spin; i++)
        if (sp_try_wait(bar, parity)) return;
    asm volatile("trap;");
}
// Rows [t0, t1) of a phase's tile in slot `buf` (rb bytes per row), warp w of nc.
__device__ __forceinline__ void sp_rows(const u8* buf, int rb, int t0, int t1, int w, int nc,
                                        const signed char* xs, float xscale, float* out) {
    int lane = threadIdx.x & 31;
    const int* xi = (const int*)xs;
    for (int r = t0 + w; r < t1; r += nc) {
        const u8* row = buf + (long long)(r - t0) * rb;
        int acc = 0;
        for (int c = lane; c < rb / 16; c += 32) {
            acc = op_dot16(*(const uint4*)(row + 16 * c), xi, c, acc);
        }
        acc = warp_sum_i(acc);
        if (lane == 0) out[r] = (float)acc * xscale * (1.0f / 64.0f);
    }
}
#endif
extern "C" __launch_bounds__(1024) __global__ void stream_probe(const u8* __restrict__ w, float* act, unsigned* cnt,
                                        unsigned* stamp, unsigned* err, int layers, int d, int qkv,
                                        int ff, int flags, long long spin) {
    PDL_ENTRY();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 ring[];
    __shared__ __align__(16) signed char xs[OP_MAXC];
    __shared__ float red[32];
    __shared__ __align__(8) unsigned long long full[SP_STAGES], empty[SP_STAGES];
    const int slot_bytes = SP_RING / SP_STAGES;
    int nc = blockDim.x / 32 - 1, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        for (int i = 0; i < SP_STAGES; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sp_smem(&full[i])), "r"(1) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sp_smem(&empty[i])), "r"(nc) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    unsigned nb = gridDim.x, b = blockIdx.x;
    bool weights = !(flags & 2);
    long long seq = 0;  // tiles so far (the same walk in the producer and the consumers)
    for (int l = 0; l < layers; l++) {
        for (int p = 0; p < 5; p++) {
            int g = l * 5 + p;
            OpPhase ph = op_phase(w, act, l, p, d, qkv, ff, b, nb);
            int cols = ph.cols, rb = cols / 2, r0 = ph.r0, r1 = ph.r1;
            const u8* wph = ph.w;
            int k = rb > 0 ? max(1, slot_bytes / rb) : 1;  // rows per tile
            int tiles = (p == 1 || !weights) ? 0 : (r1 - r0 + k - 1) / k;
            if (warp == nc) {
                // Producer: lane 0 fills the ring, never waiting on an edge.
                if ((threadIdx.x & 31) == 0) {
                    for (int t = 0; t < tiles; t++, seq++) {
                        int slot = (int)(seq % SP_STAGES);
                        u32 round = (u32)(seq / SP_STAGES);
                        sp_wait(sp_smem(&empty[slot]), (round & 1) ^ 1, spin);
                        int t0 = r0 + t * k, t1 = min(r1, t0 + k);
                        u32 bytes = (u32)((t1 - t0) * rb);
                        u32 fb = sp_smem(&full[slot]);
                        asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}"
                                     ::"r"(fb), "r"(bytes) : "memory");
                        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                                     ::"r"(sp_smem(ring + (size_t)slot * slot_bytes)), "l"(wph + (long long)t0 * rb),
                                     "r"(bytes), "r"(fb) : "memory");
                    }
                }
                continue;
            }
            // Consumers.
            if (g > 0 && !(flags & 1)) {
                if (threadIdx.x == 0) {
                    long long i = 0;
                    while (ld_acquire_u32(cnt + g - 1) < nb && i < spin) i++;
                    if (i == spin) asm volatile("trap;");
                }
                op_sync(nc, true);
                if (threadIdx.x < nb && ((volatile unsigned*)stamp)[threadIdx.x] < (unsigned)g)
                    atomicAdd(err, 1u);
            }
            if (p == 1) {
                int pd = (d + nb - 1) / nb, j0 = min(d, (int)b * pd), j1 = min(d, j0 + pd);
                for (int j = j0 + threadIdx.x; j < j1; j += nc * 32) ph.out[j] = 0.5f * ph.in[j];
            } else {
                float* out = ph.out;
                float xscale = (flags & 4) ? 1.0f : op_input(ph.in, cols, p == 4, xs, red, nc, true);
                for (int t = 0; t < tiles; t++, seq++) {
                    int slot = (int)(seq % SP_STAGES);
                    u32 round = (u32)(seq / SP_STAGES);
                    sp_wait(sp_smem(&full[slot]), round & 1, spin);
                    int t0 = r0 + t * k, t1 = min(r1, t0 + k);
                    sp_rows(ring + (size_t)slot * slot_bytes, rb, t0, t1, warp, nc, xs, xscale, out);
                    __syncwarp();
                    if ((threadIdx.x & 31) == 0)
                        asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}"
                                     ::"r"(sp_smem(&empty[slot])) : "memory");
                }
            }
            op_sync(nc, true);
            if (threadIdx.x == 0) {
                ((volatile unsigned*)stamp)[b] = (unsigned)g + 1;
                red_release_add_u32(cnt + g, 1u);
            }
        }
    }
#endif
}
// L2 prefetch hint for `bytes` bytes from p, one 128-byte line per thread and step, the front
// first (l2pf.rs: a side branch of a captured decode step asks for the next product's weights
// while the short kernels before it run). Reads and writes nothing. (A bulk version,
// cp.async.bulk.prefetch.L2 of 64 KiB per thread from 2-32 one-warp blocks, measured far slower:
// Llama-3-8B Q4_0 tg128 with 4 / 16 MiB 508.7 / 314.2 t/s vs 520.0 without prefetch.)
extern "C" __global__ void prefetch_l2(const char* p, long long bytes) {
    PDL_ENTRY();
    long long step = (long long)gridDim.x * blockDim.x * 128;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 128; i < bytes; i += step)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));
}
