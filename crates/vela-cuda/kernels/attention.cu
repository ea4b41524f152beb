// KV-cache stores and causal attention over the cache rings (slot = position % capacity).

template <bool H>
__device__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                         const u32* __restrict__ pos, void* kc, void* vc, int wk, int wv,
                         int capacity) {
    int t = blockIdx.x;
    size_t slot = pos[t] % (u32)capacity;
    for (int i = threadIdx.x; i < wk || i < wv; i += blockDim.x) {
        if (i < wk) {
            float x = k[(size_t)t * wk + i];
            if (H) ((u16*)kc)[slot * wk + i] = f2h(x); else ((float*)kc)[slot * wk + i] = x;
        }
        if (i < wv) {
            float x = v[(size_t)t * wv + i];
            if (H) ((u16*)vc)[slot * wv + i] = f2h(x); else ((float*)vc)[slot * wv + i] = x;
        }
    }
}
extern "C" __global__ void kv_store_f32(const float* k, const float* v, const u32* pos, void* kc,
                                        void* vc, int wk, int wv, int capacity) {
    kv_store<false>(k, v, pos, kc, vc, wk, wv, capacity);
}
extern "C" __global__ void kv_store_f16(const float* k, const float* v, const u32* pos, void* kc,
                                        void* vc, int wk, int wv, int capacity) {
    kv_store<true>(k, v, pos, kc, vc, wk, wv, capacity);
}

#define ATT_WARPS 32
#define ATT_MAXD 256

template <bool H>
__device__ __forceinline__ float ld_kv(const void* p, size_t i) {
    return H ? h2f(((const u16*)p)[i]) : ((const float*)p)[i];
}

// q . k for one key row of `hdk` elements starting at element `ko` (q in shared memory).
// 16-byte loads when the row allows it (8 halves or 4 floats at a time).
template <bool H>
__device__ __forceinline__ float qk_dot(const float* qs, const void* kc, size_t ko, int hdk) {
    float dot = 0.0f;
    if (H && (hdk & 7) == 0) {
        const uint4* kr = (const uint4*)((const u16*)kc + ko);
#pragma unroll 8
        for (int c = 0; c < hdk / 8; c++) {
            uint4 u = kr[c];
            u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                dot += qs[8 * c + 2 * e] * h2f((u16)(w[e] & 0xffffu));
                dot += qs[8 * c + 2 * e + 1] * h2f((u16)(w[e] >> 16));
            }
        }
    } else if (!H && (hdk & 3) == 0) {
        const float4* kr = (const float4*)((const float*)kc + ko);
#pragma unroll 8
        for (int c = 0; c < hdk / 4; c++) {
            float4 u = kr[c];
            dot += qs[4 * c] * u.x;
            dot += qs[4 * c + 1] * u.y;
            dot += qs[4 * c + 2] * u.z;
            dot += qs[4 * c + 3] * u.w;
        }
    } else {
        for (int d = 0; d < hdk; d++) dot += qs[d] * ld_kv<H>(kc, ko + d);
    }
    return dot;
}

// One warp's share of a query row's keys: chunks of 32 consecutive keys starting at key j_begin,
// every j_step keys, up to position p. Every lane computes one key's whole score (no per-key
// reductions), the warp updates its online softmax (running max m, sum l) once per chunk, then
// accumulates the chunk's V rows with lanes over the value dimension (coalesced).
template <bool H>
__device__ __forceinline__ void attend_chunks(const float* qs, const void* __restrict__ kc,
                                              const void* __restrict__ vc, int g, int n_head_kv,
                                              int hdk, int hdv, int capacity, float scale,
                                              float softcap, int p, int j_begin, int j_step,
                                              float acc[ATT_MAXD / 32], float& m, float& l) {
    int lane = threadIdx.x & 31;
    for (int j0 = j_begin; j0 <= p; j0 += j_step) {
        int j = j0 + lane;
        float s = NEG_INF;
        if (j <= p) {
            size_t slot = (size_t)(j % capacity);
            s = qk_dot<H>(qs, kc, (slot * n_head_kv + g) * hdk, hdk) * scale;
            if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
        }
        // Lane 0 always holds a real key, so mn is finite.
        float mn = fmaxf(m, warp_max(s));
        float corr = expf(m - mn);
        float e = j <= p ? expf(s - mn) : 0.0f;
        l = l * corr + warp_sum(e);
#pragma unroll
        for (int i = 0; i < ATT_MAXD / 32; i++) acc[i] *= corr;
        int cnt = min(32, p - j0 + 1);
        // Unrolled so that several V rows are in flight at once (this loop is latency-bound).
#pragma unroll 8
        for (int u = 0; u < cnt; u++) {
            float eu = __shfl_sync(0xffffffffu, e, u);
            size_t vo = ((size_t)((j0 + u) % capacity) * n_head_kv + g) * hdv;
#pragma unroll
            for (int i = 0; i < ATT_MAXD / 32; i++) {
                int d = lane + 32 * i;
                if (d < hdv) acc[i] += eu * ld_kv<H>(vc, vo + d);
            }
        }
        m = mn;
    }
}

// One block of ATT_WARPS (32) warps per (head, token), so that a decode step over ~1000 keys has
// one chunk per warp and the per-chunk memory latency is paid about once (16 warps: 305 instead
// of 357 tok/s SmolLM2 decode on the H200, but 18.1k instead of 14.5k tok/s prefill). Each warp
// takes chunks of 32 consecutive keys (chunk c goes to warp c % ATT_WARPS; `attend_chunks`).
// The warps' partial results are merged at the end. Head dims <= 256 (8 values per lane).
// W (warps per block) is ATT_WARPS for few query rows; prefill batches, which already have
// n_head * n_rows blocks, use W = 4 (8x fewer idle warps, 8x more resident blocks per SM).
template <bool H, int W>
__device__ void attention(const float* __restrict__ q, const void* __restrict__ kc,
                          const void* __restrict__ vc, const u32* __restrict__ pos,
                          float* __restrict__ out, int n_head, int n_head_kv, int hdk, int hdv,
                          int capacity, int window, float scale, float softcap) {
    __shared__ float qs[ATT_MAXD];
    __shared__ float sm[W], sl[W];
    __shared__ float sacc[W][ATT_MAXD];
    int h = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int g = h / (n_head / n_head_kv);
    const float* qr = q + ((size_t)t * n_head + h) * hdk;
    for (int i = threadIdx.x; i < hdk; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();
    int p = (int)pos[t];
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    float m = NEG_INF, l = 0.0f;
    float acc[ATT_MAXD / 32];
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) acc[i] = 0.0f;
    attend_chunks<H>(qs, kc, vc, g, n_head_kv, hdk, hdv, capacity, scale, softcap, p,
                     first + 32 * warp, 32 * W, acc, m, l);
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) {
        int d = lane + 32 * i;
        if (d < hdv) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = NEG_INF;
    for (int w = 0; w < W; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    float f[W];
    for (int w = 0; w < W; w++) {
        f[w] = sm[w] == NEG_INF ? 0.0f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    float inv = 1.0f / L;
    float* o = out + ((size_t)t * n_head + h) * hdv;
    for (int d = threadIdx.x; d < hdv; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < W; w++) v += sacc[w][d] * f[w];
        o[d] = v * inv;
    }
}

// Prefill: one warp per query row, ROWS_Q consecutive rows of one head per block. The warps of a
// block walk nearly the same keys in step (their positions differ by at most ROWS_Q - 1), so each
// K/V row is read from L2 once per block instead of once per row (the 4-warp kernel above, one
// row per block, read 2.1 GB of K/V per Llama-3-8B layer at 512 tokens). The per-warp loop is
// `attend_chunks`, as in `attention`.
#define ROWS_Q 4
template <bool H>
__device__ void attention_rows(const float* __restrict__ q, const void* __restrict__ kc,
                               const void* __restrict__ vc, const u32* __restrict__ pos,
                               float* __restrict__ out, int n_head, int n_head_kv, int hdk, int hdv,
                               int capacity, int window, float scale, float softcap, int n_tok) {
    __shared__ float qsa[ROWS_Q][ATT_MAXD];
    int h = blockIdx.x;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int t = blockIdx.y * ROWS_Q + warp;
    if (t >= n_tok) return;
    float* qs = qsa[warp];
    int g = h / (n_head / n_head_kv);
    const float* qr = q + ((size_t)t * n_head + h) * hdk;
    for (int i = lane; i < hdk; i += 32) qs[i] = qr[i];
    __syncwarp();
    int p = (int)pos[t];
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    float m = NEG_INF, l = 0.0f;
    float acc[ATT_MAXD / 32];
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) acc[i] = 0.0f;
    attend_chunks<H>(qs, kc, vc, g, n_head_kv, hdk, hdv, capacity, scale, softcap, p, first, 32,
                     acc, m, l);
    float inv = 1.0f / l;
    float* o = out + ((size_t)t * n_head + h) * hdv;
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) {
        int d = lane + 32 * i;
        if (d < hdv) o[d] = acc[i] * inv;
    }
}
extern "C" __launch_bounds__(32 * ROWS_Q) __global__ void attention_rows_f32(const float* q, const void* kc, const void* vc, const u32* pos, float* out, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap, int n_tok) {
    attention_rows<false>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale, softcap, n_tok);
}
extern "C" __launch_bounds__(32 * ROWS_Q) __global__ void attention_rows_f16(const float* q, const void* kc, const void* vc, const u32* pos, float* out, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap, int n_tok) {
    attention_rows<true>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale, softcap, n_tok);
}

#define ATTN(H, W, NAME)                                                                           \
    extern "C" __launch_bounds__(32 * W) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* out, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap) { \
        attention<H, W>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale, softcap); }
ATTN(false, ATT_WARPS, attention_f32)
ATTN(true, ATT_WARPS, attention_f16)
ATTN(false, 4, attention_f32_w4)
ATTN(true, 4, attention_f16_w4)

// ---- split-K ("flash-decoding") attention for a few query rows (decode) ----
//
// With one block per (head, token), a decode step over a small model uses a handful of SMs and
// each warp runs a long serial chain (a whole key's dot product, then 32 V rows one after the
// other). Here the keys of each (head, token) are cut into gridDim.z parts of whole 32-key
// chunks, and block (h, t, s) of SPLIT_WARPS = 4 warps runs part s chunk by chunk: 4 threads per
// key compute the scores (a quarter of the dot product each), warp 0 updates the online softmax
// (running max m, sum l) for the chunk, then each warp accumulates 8 of the chunk's V rows
// (lanes over the value dimension). The block writes its unnormalized partial result:
// part[((t * n_head + h) * S + s) * (hdv + 2) + ...] = (acc[0..hdv], m, l), acc relative to m;
// attention_combine merges the parts. Parts are cut on the device from the position, so a
// captured graph stays valid at every position. Needs hdk % 4 == 0.
#define SPLIT_WARPS 4

template <bool H>
__device__ void attention_part(const float* __restrict__ q, const void* __restrict__ kc,
                               const void* __restrict__ vc, const u32* __restrict__ pos,
                               float* __restrict__ part, int n_head, int n_head_kv, int hdk,
                               int hdv, int capacity, int window, float scale, float softcap) {
    __shared__ float qs[ATT_MAXD];
    __shared__ float sc[32];
    __shared__ int sslot[32];
    __shared__ float s_corr;
    __shared__ float sacc[SPLIT_WARPS][ATT_MAXD];
    int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int g = h / (n_head / n_head_kv);
    int p = (int)pos[t];
    const float* qr = q + ((size_t)t * n_head + h) * hdk;
    for (int i = tid; i < hdk; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    // Part s covers keys lo..=hi: whole chunks of 32 keys, split as evenly as possible.
    int n_chunks = (p - first + 1 + 31) / 32;
    int per = (n_chunks + S - 1) / S;
    int lo = first + 32 * per * s;
    int hi = min(p, lo + 32 * per - 1);
    // Running max and sum of the part, held (identically) by every lane of warp 0.
    float m = NEG_INF, l = 0.0f;
    float acc[ATT_MAXD / 32];
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) acc[i] = 0.0f;
    int quarter = hdk / 4;
    for (int j0 = lo; j0 <= hi; j0 += 32) {
        // 1. Scores: thread tid takes quarter tid % 4 of key j0 + tid / 4.
        int kj = tid >> 2, qq = tid & 3;
        int j = j0 + kj;
        float dot = 0.0f;
        int slot = 0;
        if (j <= hi) {
            slot = j % capacity;
            size_t ko = ((size_t)slot * n_head_kv + g) * hdk + (size_t)qq * quarter;
            dot = qk_dot<H>(qs + qq * quarter, kc, ko, quarter);
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        if (qq == 0) {
            float v = NEG_INF;
            if (j <= hi) {
                v = dot * scale;
                if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
            }
            sc[kj] = v;
            sslot[kj] = slot;
        }
        __syncthreads();
        // 2. Online softmax over the chunk (warp 0; lane 0's key j0 <= hi is real, so the new
        //    max is finite). sc becomes the chunk's weights exp(score - m).
        if (warp == 0) {
            float v = sc[lane];
            float mn = fmaxf(m, warp_max(v));
            float corr = expf(m - mn);
            float e = lane <= hi - j0 ? expf(v - mn) : 0.0f;
            l = l * corr + warp_sum(e);
            m = mn;
            sc[lane] = e;
            if (lane == 0) s_corr = corr;
        }
        __syncthreads();
        // 3. Warp w accumulates V rows 8w..8w+7 of the chunk.
        float corr = s_corr;
#pragma unroll
        for (int i = 0; i < ATT_MAXD / 32; i++) acc[i] *= corr;
        int cnt = min(32, hi - j0 + 1);
#pragma unroll
        for (int u = 0; u < 32 / SPLIT_WARPS; u++) {
            int kk = warp * (32 / SPLIT_WARPS) + u;
            if (kk < cnt) {
                float e = sc[kk];
                size_t vo = ((size_t)sslot[kk] * n_head_kv + g) * hdv;
#pragma unroll
                for (int i = 0; i < ATT_MAXD / 32; i++) {
                    int d = lane + 32 * i;
                    if (d < hdv) acc[i] += e * ld_kv<H>(vc, vo + d);
                }
            }
        }
        // sc and sslot are rewritten by the next chunk.
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) {
        int d = lane + 32 * i;
        if (d < hdv) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    float* o = part + (((size_t)t * n_head + h) * S + s) * (hdv + 2);
    for (int d = tid; d < hdv; d += blockDim.x) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < SPLIT_WARPS; w++) v += sacc[w][d];
        o[d] = v;
    }
    if (tid == 0) {
        o[hdv] = m;
        o[hdv + 1] = l;
    }
}

extern "C" __launch_bounds__(32 * SPLIT_WARPS) __global__ void attention_part_f32(
    const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head,
    int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap) {
    attention_part<false>(q, kc, vc, pos, part, n_head, n_head_kv, hdk, hdv, capacity, window,
                          scale, softcap);
}
extern "C" __launch_bounds__(32 * SPLIT_WARPS) __global__ void attention_part_f16(
    const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head,
    int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap) {
    attention_part<true>(q, kc, vc, pos, part, n_head, n_head_kv, hdk, hdv, capacity, window,
                         scale, softcap);
}

// ---- split-K decode attention, one block per KV group (VELA_CUDA_ATTN=gqa; not yet run on a
// GPU) ----
//
// Like attention_part, but block (g, t, s) handles all R = n_head / n_head_kv (2..GQA_MAX) query
// heads of KV group g, so each K/V row of the part is read once for the R heads instead of once
// per head. Scores: thread tid takes quarter tid % 4 of key j0 + tid / 4 and computes it for the R
// heads; online softmax: warp w updates heads w, w + 4; V: warp w accumulates 8 of the chunk's
// rows for the R heads. Writes the same partial layout as attention_part (per query head), so
// attention_combine merges it unchanged.
#define GQA_MAX 8
template <bool H>
__device__ void attention_part_g(const float* __restrict__ q, const void* __restrict__ kc,
                                 const void* __restrict__ vc, const u32* __restrict__ pos,
                                 float* __restrict__ part, int n_head, int n_head_kv, int hdk,
                                 int hdv, int capacity, int window, float scale, float softcap) {
    __shared__ float qs[GQA_MAX][ATT_MAXD];
    __shared__ float sc[GQA_MAX][32];
    __shared__ int sslot[32];
    __shared__ float sm[GQA_MAX], sl[GQA_MAX], scorr[GQA_MAX];
    __shared__ float sacc[SPLIT_WARPS][ATT_MAXD];
    int g = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int R = n_head / n_head_kv;
    for (int i = tid; i < R * hdk; i += blockDim.x)
        qs[i / hdk][i % hdk] = q[((size_t)t * n_head + g * R) * hdk + i];
    if (tid < GQA_MAX) { sm[tid] = NEG_INF; sl[tid] = 0.0f; scorr[tid] = 1.0f; }
    __syncthreads();
    int p = (int)pos[t];
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    int n_chunks = (p - first + 1 + 31) / 32;
    int per = (n_chunks + S - 1) / S;
    int lo = first + 32 * per * s;
    int hi = min(p, lo + 32 * per - 1);
    float acc[GQA_MAX][ATT_MAXD / 32];
#pragma unroll
    for (int r = 0; r < GQA_MAX; r++)
#pragma unroll
        for (int i = 0; i < ATT_MAXD / 32; i++) acc[r][i] = 0.0f;
    int quarter = hdk / 4;
    for (int j0 = lo; j0 <= hi; j0 += 32) {
        // 1. Scores of key j0 + tid / 4 for every head of the group.
        int kj = tid >> 2, qq = tid & 3;
        int j = j0 + kj;
        bool valid = j <= hi;
        int slot = valid ? j % capacity : 0;
        float dots[GQA_MAX];
#pragma unroll
        for (int r = 0; r < GQA_MAX; r++) dots[r] = 0.0f;
        if (valid) {
            size_t ko = ((size_t)slot * n_head_kv + g) * hdk + (size_t)qq * quarter;
            int base = qq * quarter;
            for (int d = 0; d < quarter; d++) {
                float k = ld_kv<H>(kc, ko + d);
#pragma unroll
                for (int r = 0; r < GQA_MAX; r++)
                    if (r < R) dots[r] += qs[r][base + d] * k;
            }
        }
#pragma unroll
        for (int r = 0; r < GQA_MAX; r++) {
            dots[r] += __shfl_xor_sync(0xffffffffu, dots[r], 1);
            dots[r] += __shfl_xor_sync(0xffffffffu, dots[r], 2);
        }
        if (qq == 0) {
#pragma unroll
            for (int r = 0; r < GQA_MAX; r++) {
                if (r < R) {
                    float v = NEG_INF;
                    if (valid) {
                        v = dots[r] * scale;
                        if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
                    }
                    sc[r][kj] = v;
                }
            }
            sslot[kj] = slot;
        }
        __syncthreads();
        // 2. Online softmax per head (warp w: heads w, w + SPLIT_WARPS). Lane 0's key is real,
        //    so the new max is finite.
        for (int r = warp; r < R; r += SPLIT_WARPS) {
            float v = sc[r][lane];
            float m = sm[r];
            float mn = fmaxf(m, warp_max(v));
            float corr = expf(m - mn);
            float e = lane <= hi - j0 ? expf(v - mn) : 0.0f;
            float l = sl[r] * corr + warp_sum(e);
            sc[r][lane] = e;
            __syncwarp();
            if (lane == 0) { sm[r] = mn; sl[r] = l; scorr[r] = corr; }
        }
        __syncthreads();
        // 3. Warp w accumulates V rows 8w..8w+7 of the chunk for every head.
#pragma unroll
        for (int r = 0; r < GQA_MAX; r++) {
            if (r < R) {
                float c = scorr[r];
#pragma unroll
                for (int i = 0; i < ATT_MAXD / 32; i++) acc[r][i] *= c;
            }
        }
        int cnt = min(32, hi - j0 + 1);
#pragma unroll
        for (int u = 0; u < 32 / SPLIT_WARPS; u++) {
            int kk = warp * (32 / SPLIT_WARPS) + u;
            if (kk < cnt) {
                size_t vo = ((size_t)sslot[kk] * n_head_kv + g) * hdv;
#pragma unroll
                for (int i = 0; i < ATT_MAXD / 32; i++) {
                    int d = lane + 32 * i;
                    if (d < hdv) {
                        float vv = ld_kv<H>(vc, vo + d);
#pragma unroll
                        for (int r = 0; r < GQA_MAX; r++)
                            if (r < R) acc[r][i] += sc[r][kk] * vv;
                    }
                }
            }
        }
        // sc, sslot and scorr are rewritten by the next chunk.
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < GQA_MAX; r++) {
        if (r < R) {
#pragma unroll
            for (int i = 0; i < ATT_MAXD / 32; i++) {
                int d = lane + 32 * i;
                if (d < hdv) sacc[warp][d] = acc[r][i];
            }
            __syncthreads();
            int h = g * R + r;
            float* o = part + (((size_t)t * n_head + h) * S + s) * (hdv + 2);
            for (int d = tid; d < hdv; d += blockDim.x) {
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < SPLIT_WARPS; w++) v += sacc[w][d];
                o[d] = v;
            }
            if (tid == 0) {
                o[hdv] = sm[r];
                o[hdv + 1] = sl[r];
            }
            __syncthreads();
        }
    }
}

extern "C" __launch_bounds__(32 * SPLIT_WARPS) __global__ void attention_part_g_f32(
    const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head,
    int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap) {
    attention_part_g<false>(q, kc, vc, pos, part, n_head, n_head_kv, hdk, hdv, capacity, window,
                            scale, softcap);
}
extern "C" __launch_bounds__(32 * SPLIT_WARPS) __global__ void attention_part_g_f16(
    const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head,
    int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap) {
    attention_part_g<true>(q, kc, vc, pos, part, n_head, n_head_kv, hdk, hdv, capacity, window,
                           scale, softcap);
}

// Merge the S parts of (head, token) = (blockIdx.x, blockIdx.y) into out[t][h][0..hdv]
// (S <= 32, blockDim = 4 * hdv rounded up to 32). The first warp loads every part's (m, l) at
// once and computes the weights exp(m_s - M) (0 for empty parts) and 1 / L; then thread
// (group gi, dimension d) sums parts gi, gi + 4, ... of dimension d (loads in flight together)
// and the four groups are added.
extern "C" __global__ void attention_combine(const float* __restrict__ part, float* __restrict__ out,
                                             int n_head, int hdv, int S) {
    __shared__ float wts[32];
    __shared__ float inv_l;
    __shared__ float red[4][ATT_MAXD];
    int h = blockIdx.x, t = blockIdx.y;
    const float* pr = part + ((size_t)t * n_head + h) * S * (hdv + 2);
    if (threadIdx.x < 32) {
        int s = threadIdx.x;
        float ms = s < S ? pr[(size_t)s * (hdv + 2) + hdv] : NEG_INF;
        float ls = s < S ? pr[(size_t)s * (hdv + 2) + hdv + 1] : 0.0f;
        float M = warp_max(ms);
        float w = ms == NEG_INF ? 0.0f : expf(ms - M);
        float L = warp_sum(ls * w);
        wts[s] = w;
        if (s == 0) inv_l = 1.0f / L;
    }
    __syncthreads();
    int hdv32 = (hdv + 31) & ~31;
    int d = threadIdx.x % hdv32, gi = threadIdx.x / hdv32;
    float v = 0.0f;
    if (d < hdv) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int s = gi + 4 * k;
            if (s < S) v += pr[(size_t)s * (hdv + 2) + d] * wts[s];
        }
    }
    red[gi][d] = v;
    __syncthreads();
    if (gi == 0 && d < hdv) {
        float* o = out + ((size_t)t * n_head + h) * hdv;
        o[d] = (red[0][d] + red[1][d] + red[2][d] + red[3][d]) * inv_l;
    }
}
