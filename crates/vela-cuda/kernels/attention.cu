// KV-cache stores and causal attention over the cache rings (slot = position % capacity).
// Template parameter KT: the cache element type, 0 f32, 1 f16, 2 bf16 (kv2f / f2kv in common.cu).

template <int KT>
__device__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                         const u32* __restrict__ pos, void* kc, void* vc, int wk, int wv,
                         int capacity) {
    int t = blockIdx.x;
    size_t slot = pos[t] % (u32)capacity;
    for (int i = threadIdx.x; i < wk || i < wv; i += blockDim.x) {
        if (i < wk) {
            float x = k[(size_t)t * wk + i];
            if (KT != 0) ((u16*)kc)[slot * wk + i] = f2kv<KT>(x); else ((float*)kc)[slot * wk + i] = x;
        }
        if (i < wv) {
            float x = v[(size_t)t * wv + i];
            if (KT != 0) ((u16*)vc)[slot * wv + i] = f2kv<KT>(x); else ((float*)vc)[slot * wv + i] = x;
        }
    }
}
#define KV_STORE(KT, NAME)                                                                         \
    extern "C" __global__ void NAME(const float* k, const float* v, const u32* pos, void* kc, void* vc, int wk, int wv, int capacity) { PDL_ENTRY(); \
        kv_store<KT>(k, v, pos, kc, vc, wk, wv, capacity); }
KV_STORE(0, kv_store_f32)
KV_STORE(1, kv_store_f16)
KV_STORE(2, kv_store_bf16)

#define ATT_WARPS 32
#define ATT_MAXD 256
#define ATT_MAXD_BIG 512

template <int KT>
__device__ __forceinline__ float ld_kv(const void* p, size_t i) {
    return (KT != 0) ? kv2f<KT>(((const u16*)p)[i]) : ((const float*)p)[i];
}

// Elements off .. off + 7 of a cache (16-byte aligned: one 16-byte load for 16-bit elements, two
// for f32) as floats.
template <int KT>
__device__ __forceinline__ void kv8(const void* __restrict__ p, size_t off, float out[8]) {
    if (KT != 0) {
        uint4 u = *(const uint4*)((const u16*)p + off);
        u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int x = 0; x < 4; x++) {
            out[2 * x] = kv2f<KT>((u16)(w[x] & 0xffffu));
            out[2 * x + 1] = kv2f<KT>((u16)(w[x] >> 16));
        }
    } else {
        float4 u0 = *(const float4*)((const float*)p + off);
        float4 u1 = *(const float4*)((const float*)p + off + 4);
        out[0] = u0.x; out[1] = u0.y; out[2] = u0.z; out[3] = u0.w;
        out[4] = u1.x; out[5] = u1.y; out[6] = u1.z; out[7] = u1.w;
    }
}

// q . k for one key row of `hdk` elements starting at element `ko` (q in shared memory).
// 16-byte loads when the row allows it (8 halves or 4 floats at a time).
template <int KT>
__device__ __forceinline__ float qk_dot(const float* qs, const void* kc, size_t ko, int hdk) {
    float dot = 0.0f;
    if ((KT != 0) && (hdk & 7) == 0) {
        const uint4* kr = (const uint4*)((const u16*)kc + ko);
#pragma unroll 8
        for (int c = 0; c < hdk / 8; c++) {
            uint4 u = kr[c];
            u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                dot += qs[8 * c + 2 * e] * kv2f<KT>((u16)(w[e] & 0xffffu));
                dot += qs[8 * c + 2 * e + 1] * kv2f<KT>((u16)(w[e] >> 16));
            }
        }
    } else if (KT == 0 && (hdk & 3) == 0) {
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
        for (int d = 0; d < hdk; d++) dot += qs[d] * ld_kv<KT>(kc, ko + d);
    }
    return dot;
}

// One warp's share of a query row's keys: chunks of 32 consecutive keys starting at key j_begin,
// every j_step keys, up to position p. Every lane computes one key's whole score (no per-key
// reductions), the warp updates its online softmax (running max m, sum l) once per chunk, then
// accumulates the chunk's V rows with lanes over the value dimension (coalesced).
template <int KT, int D>
__device__ __forceinline__ void attend_chunks(const float* qs, const void* __restrict__ kc,
                                              const void* __restrict__ vc, int g, int n_head_kv,
                                              int hdk, int hdv, int capacity, float scale,
                                              float softcap, int p, int j_begin, int j_step,
                                              float acc[D / 32], float& m, float& l) {
    int lane = threadIdx.x & 31;
    for (int j0 = j_begin; j0 <= p; j0 += j_step) {
        int j = j0 + lane;
        float s = NEG_INF;
        if (j <= p) {
            size_t slot = (size_t)(j % capacity);
            s = qk_dot<KT>(qs, kc, (slot * n_head_kv + g) * hdk, hdk) * scale;
            if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
        }
        // Lane 0 always holds a real key, so mn is finite.
        float mn = fmaxf(m, warp_max(s));
        float corr = expf(m - mn);
        float e = j <= p ? expf(s - mn) : 0.0f;
        l = l * corr + warp_sum(e);
#pragma unroll
        for (int i = 0; i < D / 32; i++) acc[i] *= corr;
        int cnt = min(32, p - j0 + 1);
        // Unrolled so that several V rows are in flight at once (this loop is latency-bound).
#pragma unroll 8
        for (int u = 0; u < cnt; u++) {
            float eu = __shfl_sync(0xffffffffu, e, u);
            size_t vo = ((size_t)((j0 + u) % capacity) * n_head_kv + g) * hdv;
#pragma unroll
            for (int i = 0; i < D / 32; i++) {
                int d = lane + 32 * i;
                if (d < hdv) acc[i] += eu * ld_kv<KT>(vc, vo + d);
            }
        }
        m = mn;
    }
}

// One block of ATT_WARPS (32) warps per (head, token), so that a decode step over ~1000 keys has
// one chunk per warp and the per-chunk memory latency is paid about once (16 warps: SmolLM2
// decode -15 %, docs/perf-log.md). Each warp
// takes chunks of 32 consecutive keys (chunk c goes to warp c % ATT_WARPS; `attend_chunks`).
// The warps' partial results are merged at the end. Head dims <= D (D / 32 values per lane; D is
// ATT_MAXD = 256, or ATT_MAXD_BIG = 512 for the `_d512` 4-warp kernels, e.g. Gemma 4's full layers).
// W (warps per block) is ATT_WARPS for few query rows; prefill batches, which already have
// n_head * n_rows blocks, use W = 4 (8x fewer idle warps, 8x more resident blocks per SM).
template <int KT, int W, int D>
__device__ void attention(const float* __restrict__ q, const void* __restrict__ kc,
                          const void* __restrict__ vc, const u32* __restrict__ pos,
                          float* __restrict__ out, int n_head, int n_head_kv, int hdk, int hdv,
                          int capacity, int window, float scale, float softcap) {
    __shared__ float qs[D];
    __shared__ float sm[W], sl[W];
    __shared__ float sacc[W][D];
    int h = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int g = h / (n_head / n_head_kv);
    const float* qr = q + ((size_t)t * n_head + h) * hdk;
    for (int i = threadIdx.x; i < hdk; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();
    int p = (int)pos[t];
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    float m = NEG_INF, l = 0.0f;
    float acc[D / 32];
#pragma unroll
    for (int i = 0; i < D / 32; i++) acc[i] = 0.0f;
    attend_chunks<KT, D>(qs, kc, vc, g, n_head_kv, hdk, hdv, capacity, scale, softcap, p,
                     first + 32 * warp, 32 * W, acc, m, l);
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int i = 0; i < D / 32; i++) {
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

#define ATTN(KT, W, D, NAME)                                                                        \
    extern "C" __launch_bounds__(32 * W) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* out, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap, const unsigned long long* kvt) { KVT_ROW(blockIdx.y); PDL_ENTRY(); \
        attention<KT, W, D>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale, softcap); }
ATTN(0, ATT_WARPS, ATT_MAXD, attention_f32)
ATTN(1, ATT_WARPS, ATT_MAXD, attention_f16)
ATTN(2, ATT_WARPS, ATT_MAXD, attention_bf16)
ATTN(0, 4, ATT_MAXD, attention_f32_w4)
ATTN(1, 4, ATT_MAXD, attention_f16_w4)
ATTN(2, 4, ATT_MAXD, attention_bf16_w4)
ATTN(0, 4, ATT_MAXD_BIG, attention_f32_w4_d512)
ATTN(1, 4, ATT_MAXD_BIG, attention_f16_w4_d512)
ATTN(2, 4, ATT_MAXD_BIG, attention_bf16_w4_d512)

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

// Keys per chunk of the split-K parts (split_chunk in attn_parts.rs follows): 16 for head dim 256, else
// 32. At short contexts the parts' latency grows with their keys, most at head dim 256 (four
// keys in flight per round of attention_part2's V loop): Gemma 3 270M geometry decode +3.5 % with
// 16 (+4.5 % at 8K); 16 or 64 keys were slower for head dim 64 (docs/perf-log.md).
__device__ __forceinline__ int split_chunk(int hdk) { return hdk == 256 ? 16 : 32; }
// Part s of S of the keys a query at position p sees (window > 0: the last `window`): keys
// lo..=hi, whole chunks of `ch` keys split as evenly as possible (lo > hi: an empty part).
__device__ __forceinline__ void split_part_range(int p, int window, int s, int S, int ch, int& lo,
                                                 int& hi) {
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    int n_chunks = (p - first + ch) / ch;
    int per = (n_chunks + S - 1) / S;
    lo = first + ch * per * s;
    hi = min(p, lo + ch * per - 1);
}

template <int KT>
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
    int lo, hi;
    split_part_range(p, window, s, S, split_chunk(hdk), lo, hi);
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
            dot = qk_dot<KT>(qs + qq * quarter, kc, ko, quarter);
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
                    if (d < hdv) acc[i] += e * ld_kv<KT>(vc, vo + d);
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

#define PART(KT, NAME)                                                                             \
    extern "C" __launch_bounds__(32 * SPLIT_WARPS) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap, const unsigned long long* kvt) { KVT_ROW(blockIdx.y); PDL_ENTRY(); \
        attention_part<KT>(q, kc, vc, pos, part, n_head, n_head_kv, hdk, hdv, capacity, window, scale, softcap); }
PART(0, attention_part_f32)
PART(1, attention_part_f16)
PART(2, attention_part_bf16)

// Split-K part, second version (value dims whose 8-element pieces divide 128 threads; others
// take attention_part above): the same parts and the same partial-result layout, but without the per-chunk round trips. The
// part is taken in pieces of up to PART_PIECE keys (one piece unless the part is longer):
//   A. every key's score (4 threads per key, a quarter of the dot product each; the loop's loads
//      are independent, so several keys are in flight per thread) into shared memory;
//   B. the piece's max and sum of exp (block reductions), the running (m, l) and the
//      accumulators rescaled once per piece;
//   C. V: thread (group kg, column chunk dc) adds e * V[key][8 dc .. 8 dc + 7] for the keys
//      kg, kg + groups, ... with 16-byte loads (groups = blockDim / (hdv / 8) keys in flight per
//      round), the groups' sums merged once at the end.
// Needs hdk % 4 == 0, hdv % 8 == 0 and 128 % (hdv / 8) == 0 (the host checks).
#define PART_PIECE 1024
__device__ __forceinline__ float block_reduce_f(float v, bool is_max, float* red) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // red may still be read by the previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < nw; w++) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}
template <int KT, int D>
__device__ void attention_part2(const float* __restrict__ q, const void* __restrict__ kc,
                                const void* __restrict__ vc, const u32* __restrict__ pos,
                                float* __restrict__ part, int n_head, int n_head_kv, int hdk,
                                int hdv, int capacity, int window, float scale, float softcap) {
    __shared__ float qs[D];
    __shared__ float sw[PART_PIECE];
    __shared__ float red[SPLIT_WARPS];
    __shared__ float sacc[32 * SPLIT_WARPS * 8];
    int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    int tid = threadIdx.x;
    int g = h / (n_head / n_head_kv);
    int p = (int)pos[t];
    const float* qr = q + ((size_t)t * n_head + h) * hdk;
    for (int i = tid; i < hdk; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();
    int lo, hi;
    split_part_range(p, window, s, S, split_chunk(hdk), lo, hi);
    int quarter = hdk / 4;
    int kq = tid >> 2, qq = tid & 3;
    int dchunks = hdv / 8, groups = blockDim.x / dchunks;
    int kg = tid / dchunks, dc = tid % dchunks;
    float m = NEG_INF, l = 0.0f;
    float a8[8];
#pragma unroll
    for (int e = 0; e < 8; e++) a8[e] = 0.0f;
    for (int b0 = lo; b0 <= hi; b0 += PART_PIECE) {
        int n = min(PART_PIECE, hi - b0 + 1);
        // A. Scores (the trip count is the same for every lane: shuffles stay converged).
        int nr = (n + 31) & ~31;
#pragma unroll 4
        for (int j = kq; j < nr; j += 32) {
            float dot = 0.0f;
            if (j < n) {
                int slot = (b0 + j) % capacity;
                size_t ko = ((size_t)slot * n_head_kv + g) * hdk + (size_t)qq * quarter;
                dot = qk_dot<KT>(qs + qq * quarter, kc, ko, quarter);
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 1);
            dot += __shfl_xor_sync(0xffffffffu, dot, 2);
            if (qq == 0 && j < n) {
                float v = dot * scale;
                if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
                sw[j] = v;
            }
        }
        __syncthreads();
        // B. Softmax statistics of the piece, merged into the running (m, l).
        float mx = NEG_INF;
        for (int j = tid; j < n; j += blockDim.x) mx = fmaxf(mx, sw[j]);
        float mn = fmaxf(m, block_reduce_f(mx, true, red));
        float corr = expf(m - mn);
        float ls = 0.0f;
        for (int j = tid; j < n; j += blockDim.x) {
            float e = expf(sw[j] - mn);
            sw[j] = e;
            ls += e;
        }
        l = l * corr + block_reduce_f(ls, false, red);
        m = mn;
        __syncthreads();
        // C. Weighted V rows.
#pragma unroll
        for (int e = 0; e < 8; e++) a8[e] *= corr;
        if (kg < groups) {
#pragma unroll 4
            for (int j = kg; j < n; j += groups) {
                float e = sw[j];
                int slot = (b0 + j) % capacity;
                size_t vo = ((size_t)slot * n_head_kv + g) * hdv + (size_t)dc * 8;
                // (Loaded inline rather than through kv8: that moves the loads out of the read-only
                // path and changes this measured kernel's unrolling.)
                if (KT != 0) {
                    uint4 u = *(const uint4*)((const u16*)vc + vo);
                    u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        a8[2 * x] += e * kv2f<KT>((u16)(w[x] & 0xffffu));
                        a8[2 * x + 1] += e * kv2f<KT>((u16)(w[x] >> 16));
                    }
                } else {
                    float4 u0 = *(const float4*)((const float*)vc + vo);
                    float4 u1 = *(const float4*)((const float*)vc + vo + 4);
                    a8[0] += e * u0.x; a8[1] += e * u0.y; a8[2] += e * u0.z; a8[3] += e * u0.w;
                    a8[4] += e * u1.x; a8[5] += e * u1.y; a8[6] += e * u1.z; a8[7] += e * u1.w;
                }
            }
        }
        // sw is rewritten by the next piece.
        __syncthreads();
    }
    if (kg < groups) {
#pragma unroll
        for (int e = 0; e < 8; e++) sacc[kg * hdv + dc * 8 + e] = a8[e];
    }
    __syncthreads();
    float* o = part + (((size_t)t * n_head + h) * S + s) * (hdv + 2);
    for (int d = tid; d < hdv; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < groups; w++) v += sacc[w * hdv + d];
        o[d] = v;
    }
    if (tid == 0) {
        o[hdv] = m;
        o[hdv + 1] = l;
    }
}

// Before the wait of programmatic dependent launch: ask L2 for the K and V rows of keys lo..hi of
// KV head g (at most KV_PF_KEYS of them, one prefetch per 128-byte line), so that the loads
// after the wait find them there instead of in DRAM (a decode step streams several times L2's
// size of weights, so the previous step's keys are gone from it). Only keys below every query
// row's position: the previous kernel (RoPE + KV store) writes this step's keys, at those
// positions. A hint only (L2 is the point of coherence: a line fetched early cannot be stale),
// and every address stays inside the cache. esz: bytes per cache element. Decode +2 to +4 % on
// the small models' geometries, +1.7 % on Llama-3-8B; the same before flash_decode_*'s wait was
// slower, and one prefetch per 32-byte sector slower than per line (docs/perf-log.md).
// KV_PF(call): the prefetch call at a kernel's entry, before PDL_ENTRY() (sm_90+: before that,
// no wait to hide it under).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KV_PF(call) do {} while (0)
#else
#define KV_PF(call) call
#endif
#define KV_PF_KEYS 256
__device__ __forceinline__ int kv_pf_min_pos(const u32* __restrict__ pos) {
    int m = (int)pos[0];
    for (int t = 1; t < (int)gridDim.y; t++) m = min(m, (int)pos[t]);
    return m;
}
__device__ __forceinline__ void kv_prefetch_l2(const void* kc, const void* vc, int esz, int lo, int hi,
                                               int pmin, int g, int n_head_kv, int hdk, int hdv,
                                               int capacity) {
    hi = min(hi, min(pmin - 1, lo + KV_PF_KEYS - 1));
    constexpr int STEP = 128;
    int bk = hdk * esz, bv = hdv * esz;
    int rk = (bk + STEP - 1) / STEP, rv = (bv + STEP - 1) / STEP;
    int items = (hi - lo + 1) * (rk + rv);
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        int j = lo + i / (rk + rv), c = i % (rk + rv);
        size_t row = (size_t)(j % capacity) * n_head_kv + g;
        const char* a = c < rk ? (const char*)kc + row * bk + min(STEP * c, bk - 1)
                               : (const char*)vc + row * bv + min(STEP * (c - rk), bv - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
}
// attention_part2's keys, prefetched (kv_prefetch_l2) before its wait.
template <int KT>
__device__ __forceinline__ void part2_prefetch(const void* kc, const void* vc, const u32* pos, int n_head,
                                               int n_head_kv, int hdk, int hdv, int capacity, int window) {
    int lo, hi;
    split_part_range((int)pos[blockIdx.y], window, blockIdx.z, gridDim.z, split_chunk(hdk), lo, hi);
    kv_prefetch_l2(kc, vc, KT == 0 ? 4 : 2, lo, hi, kv_pf_min_pos(pos), blockIdx.x / (n_head / n_head_kv),
                   n_head_kv, hdk, hdv, capacity);
}

#define PART2(KT, D, NAME)                                                                         \
    extern "C" __launch_bounds__(32 * SPLIT_WARPS) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap, const unsigned long long* kvt) { KVT_ROW(blockIdx.y); KV_PF(part2_prefetch<KT>(kc, vc, pos, n_head, n_head_kv, hdk, hdv, capacity, window)); PDL_ENTRY(); \
        attention_part2<KT, D>(q, kc, vc, pos, part, n_head, n_head_kv, hdk, hdv, capacity, window, scale, softcap); }
PART2(0, ATT_MAXD, attention_part2_f32)
PART2(1, ATT_MAXD, attention_part2_f16)
PART2(2, ATT_MAXD, attention_part2_bf16)
PART2(0, ATT_MAXD_BIG, attention_part2_f32_d512)
PART2(1, ATT_MAXD_BIG, attention_part2_f16_d512)
PART2(2, ATT_MAXD_BIG, attention_part2_bf16_d512)

// ---- split-K decode attention parts, one warp each (head dims 64 and 128 of 16-bit caches, see
// warp_parts_run in attn.rs) ----
//
// Block (h, t, s) of ONE warp runs attention_part2's part s of the keys (same parts, same partial
// layout, merged by attention_combine), with no __syncthreads: the keys in pieces of 32, lane j
// taking key j of the piece whole (its D-element K row in 16-byte loads, the dot product against
// q in shared memory), the piece's softmax statistics by warp shuffles, then every key's V row
// read by the whole warp (lane l owns the D / 32 consecutive dimensions l D / 32 ..), its weight
// broadcast by a shuffle. attention_part2 spends ~7 block barriers and three block reductions
// per piece; at short contexts (a piece or two per part) those, not bytes, are its time
// (`q05`: 80.7 us per token, 3.4 us per layer). Needs a 16-bit cache and hdk == hdv == D.
// The warp parts' online-softmax step for one piece (lane score sc, valid lanes only): new
// running max m and sum l, acc rescaled; returns the lane's weight e. And the part's record.
template <int DL>
__device__ __forceinline__ float partw_softmax_step(float sc, bool valid, float& m, float& l, float (&acc)[DL]) {
    float mn = fmaxf(m, warp_max(sc));
    float corr = expf(m - mn);
    float e = valid ? expf(sc - mn) : 0.0f;
    l = l * corr + warp_sum(e);
    m = mn;
#pragma unroll
    for (int i = 0; i < DL; i++) acc[i] *= corr;
    return e;
}
template <int D>
__device__ __forceinline__ void partw_store(float* o, const float (&acc)[D / 32], float m, float l, int lane) {
#pragma unroll
    for (int i = 0; i < D / 32; i++) o[lane * (D / 32) + i] = acc[i];
    if (lane == 0) {
        o[D] = m;
        o[D + 1] = l;
    }
}
// The part with every load of a piece issued at once. A part runs as a lone warp on its SM, so
// nothing hides its latencies: reading q, then the K row in rounds of 8 loads, then each V row
// after a per-key `% capacity` put ~100 instructions between two V loads in the SASS. Here the
// ring slot of each key of the piece is computed once by its lane and broadcast by a shuffle,
// and the piece's K rows, V rows and q are all in flight together before the first use.
template <bool C, typename A, typename B> struct PickT { typedef A T; };
template <typename A, typename B> struct PickT<false, A, B> { typedef B T; };
template <int KT, int D>
__device__ void attention_partw_pre(const float* __restrict__ q, const void* __restrict__ kc,
                                    const void* __restrict__ vc, const u32* __restrict__ pos,
                                    float* __restrict__ part, int n_head, int n_head_kv,
                                    int capacity, int window, float scale, float softcap) {
    static_assert(D == 64 || D == 128, "attention_partw_pre: head dims 64 and 128");
    constexpr int DL = D / 32;  // dimensions per lane in the V sum
    typedef typename PickT<DL == 2, u32, uint2>::T VRow;
    __shared__ __align__(16) float qs[D];
    int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    int lane = threadIdx.x;
    int g = h / (n_head / n_head_kv);
    int p = (int)pos[t];
    int lo, hi;
    split_part_range(p, window, s, S, split_chunk(D), lo, hi);
    const float* qr = q + ((size_t)t * n_head + h) * D;
    float qv[DL];
#pragma unroll
    for (int i = 0; i < DL; i++) qv[i] = qr[lane + 32 * i];
    const u16* k16 = (const u16*)kc;
    const u16* v16 = (const u16*)vc;
    float m = NEG_INF, l = 0.0f, acc[DL];
#pragma unroll
    for (int i = 0; i < DL; i++) acc[i] = 0.0f;
    for (int b0 = lo; b0 <= hi; b0 += 32) {
        int last = min(31, hi - b0);
        bool valid = lane <= last;
        // This lane's key (keys past the piece's last: that last key again, weight 0 below).
        int slot = (b0 + min(lane, last)) % capacity;
        uint4 kr[D / 8];
        const uint4* krow = (const uint4*)(k16 + ((size_t)slot * n_head_kv + g) * D);
#pragma unroll
        for (int c = 0; c < D / 8; c++) kr[c] = krow[c];
        VRow vr[32];
#pragma unroll
        for (int k = 0; k < 32; k++) {
            int sk = __shfl_sync(0xffffffffu, slot, k);
            vr[k] = *(const VRow*)(v16 + ((size_t)sk * n_head_kv + g) * D + lane * DL);
        }
        if (b0 == lo) {
#pragma unroll
            for (int i = 0; i < DL; i++) qs[lane + 32 * i] = qv[i];
            __syncwarp();
        }
        float sc = NEG_INF;
        if (valid) {
            float d4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int c = 0; c < D / 8; c++) {
                u32 w[4] = {kr[c].x, kr[c].y, kr[c].z, kr[c].w};
#pragma unroll
                for (int x = 0; x < 8; x++)
                    d4[x / 2] += qs[8 * c + x] * kv2f<KT>((u16)(x % 2 ? w[x / 2] >> 16 : w[x / 2] & 0xffffu));
            }
            sc = ((d4[0] + d4[1]) + (d4[2] + d4[3])) * scale;
            if (softcap > 0.0f) sc = tanhf(sc / softcap) * softcap;
        }
        float e = partw_softmax_step<DL>(sc, valid, m, l, acc);
#pragma unroll
        for (int k = 0; k < 32; k++) {
            float ek = __shfl_sync(0xffffffffu, e, k);
            float vv[DL];
            if constexpr (DL == 2) {
                vv[0] = kv2f<KT>((u16)(vr[k] & 0xffffu));
                vv[1] = kv2f<KT>((u16)(vr[k] >> 16));
            } else {
                vv[0] = kv2f<KT>((u16)(vr[k].x & 0xffffu)); vv[1] = kv2f<KT>((u16)(vr[k].x >> 16));
                vv[2] = kv2f<KT>((u16)(vr[k].y & 0xffffu)); vv[3] = kv2f<KT>((u16)(vr[k].y >> 16));
            }
#pragma unroll
            for (int i = 0; i < DL; i++) acc[i] += ek * vv[i];
        }
    }
    partw_store<D>(part + (((size_t)t * n_head + h) * S + s) * (D + 2), acc, m, l, lane);
}
#define PARTW(KT, D, NAME)                                                                         \
    extern "C" __launch_bounds__(32) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head, int n_head_kv, int hdk, int hdv, int capacity, int window, float scale, float softcap, const unsigned long long* kvt) { KVT_ROW(blockIdx.y); KV_PF(part2_prefetch<KT>(kc, vc, pos, n_head, n_head_kv, hdk, hdv, capacity, window)); PDL_ENTRY(); \
        attention_partw_pre<KT, D>(q, kc, vc, pos, part, n_head, n_head_kv, capacity, window, scale, softcap); }
PARTW(1, 64, attention_partw_f16_d64)
PARTW(1, 128, attention_partw_f16_d128)
PARTW(2, 64, attention_partw_bf16_d64)
PARTW(2, 128, attention_partw_bf16_d128)

// Merge the S parts of (head, token) = (blockIdx.x, blockIdx.y) into out[t][h][0..hdv]
// (S <= 32, blockDim = G * hdv rounded up to 32 with G = 4 groups, or 2 for hdv > 256). The first
// warp loads every part's (m, l) at once and computes the weights exp(m_s - M) (0 for empty
// parts) and 1 / L; then thread (group gi, dimension d) sums parts gi, gi + G, ... of dimension
// d (loads in flight together) and the G groups are added in order. With aq != 0 (hdv % 32 == 0)
// the head's output is also quantized to Q8 blocks for the next product, exactly like
// quantize_q8 (the first group's warps hold 32 consecutive elements each).
#define COMBINE_MAX 128
#define COMBINE_PRE 8

// The weights of a split-K merge, computed by one warp: lane l takes parts l, l + 32, ... (< S <=
// COMBINE_MAX) of pr (stride hdv + 2: m at hdv, l at hdv + 1), writes w_s = exp(m_s - M) (0 for an
// empty part) to wts[s] and returns 1 / L, L = sum of l_s w_s (every lane).
__device__ __forceinline__ float part_weights(const float* __restrict__ pr, int hdv, int S, float* wts) {
    int l0 = threadIdx.x & 31;
    float ms[COMBINE_MAX / 32], ls[COMBINE_MAX / 32];
    float mx = NEG_INF;
#pragma unroll
    for (int k = 0; k < COMBINE_MAX / 32; k++) {
        int s = l0 + 32 * k;
        const float* ps = pr + (size_t)s * (hdv + 2) + hdv;
        ms[k] = s < S ? ps[0] : NEG_INF;
        ls[k] = s < S ? ps[1] : 0.0f;
        mx = fmaxf(mx, ms[k]);
    }
    float M = warp_max(mx);
    float lw = 0.0f;
#pragma unroll
    for (int k = 0; k < COMBINE_MAX / 32; k++) {
        float w = ms[k] == NEG_INF ? 0.0f : expf(ms[k] - M);
        lw += ls[k] * w;
        wts[l0 + 32 * k] = w;
    }
    return 1.0f / warp_sum(lw);
}

extern "C" __global__ void attention_combine(const float* __restrict__ part, float* __restrict__ out,
                                             int n_head, int hdv, int S, AQ8* __restrict__ aq) {
    PDL_ENTRY();
    __shared__ float wts[COMBINE_MAX];
    __shared__ float inv_l;
    __shared__ float red[4 * ATT_MAXD];
    int h = blockIdx.x, t = blockIdx.y;
    const float* pr = part + ((size_t)t * n_head + h) * S * (hdv + 2);
    int hdv32 = (hdv + 31) & ~31;
    int G = blockDim.x / hdv32;
    int d = threadIdx.x % hdv32, gi = threadIdx.x / hdv32;
    // The thread's first COMBINE_PRE values are loaded together with the weights' (m, l) rather
    // than after them (the split-K parts: S <= 32, four groups: all of them), one round trip
    // instead of two; the sums are the same. SmolLM2 / Gemma 3 geometries decode +1.7 % / +1 %
    // (docs/perf-log.md).
    float pre[COMBINE_PRE > 0 ? COMBINE_PRE : 1];
#pragma unroll
    for (int k = 0; k < COMBINE_PRE; k++) {
        int s = gi + k * G;
        pre[k] = d < hdv && s < S ? pr[(size_t)s * (hdv + 2) + d] : 0.0f;
    }
    if (threadIdx.x < 32) {
        float il = part_weights(pr, hdv, S, wts);
        if (threadIdx.x == 0) inv_l = il;
    }
    __syncthreads();
    float v = 0.0f;
    if (d < hdv) {
#pragma unroll
        for (int k = 0; k < COMBINE_PRE; k++) {
            int s = gi + k * G;
            if (s < S) v += pre[k] * wts[s];
        }
#pragma unroll 8
        for (int s = gi + COMBINE_PRE * G; s < S; s += G) v += pr[(size_t)s * (hdv + 2) + d] * wts[s];
    }
    red[gi * hdv32 + d] = v;
    __syncthreads();
    if (gi == 0 && d < hdv) {
        float* o = out + ((size_t)t * n_head + h) * hdv;
        float sum = red[d];
        for (int g2 = 1; g2 < G; g2++) sum += red[g2 * hdv32 + d];
        o[d] = sum * inv_l;
        if (aq) q8_block(sum * inv_l, aq + (((size_t)t * n_head + h) * hdv + d) / 32, d & 31);
    }
}
