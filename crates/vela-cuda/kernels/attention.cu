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

// One block of ATT_WARPS (32) warps per (head, token), so that a decode step over ~1000 keys has
// one chunk per warp and the per-chunk memory latency is paid about once (16 warps: 305 instead
// of 357 tok/s SmolLM2 decode on the H200, but 18.1k instead of 14.5k tok/s prefill). Each warp
// takes chunks of 32 consecutive keys (chunk c goes to warp c % ATT_WARPS): every lane computes
// one key's full score (no per-key reductions), the warp updates its online softmax (running
// max m, sum l) once per chunk, then accumulates the chunk's V rows with lanes split over the
// value dimension (coalesced). The warps' partial results are merged at the end. Head dims <= 256
// (8 values per lane).
template <bool H>
__device__ void attention(const float* __restrict__ q, const void* __restrict__ kc,
                          const void* __restrict__ vc, const u32* __restrict__ pos,
                          float* __restrict__ out, int n_head, int n_head_kv, int hdk, int hdv,
                          int capacity, int window, float scale, float softcap) {
    __shared__ float qs[ATT_MAXD];
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAXD];
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
    for (int j0 = first + 32 * warp; j0 <= p; j0 += 32 * ATT_WARPS) {
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
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAXD / 32; i++) {
        int d = lane + 32 * i;
        if (d < hdv) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    float f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == NEG_INF ? 0.0f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    float inv = 1.0f / L;
    float* o = out + ((size_t)t * n_head + h) * hdv;
    for (int d = threadIdx.x; d < hdv; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) v += sacc[w][d] * f[w];
        o[d] = v * inv;
    }
}

extern "C" __launch_bounds__(32 * ATT_WARPS) __global__ void attention_f32(const float* q, const void* kc, const void* vc,
                                         const u32* pos, float* out, int n_head, int n_head_kv,
                                         int hdk, int hdv, int capacity, int window, float scale,
                                         float softcap) {
    attention<false>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale,
                     softcap);
}
extern "C" __launch_bounds__(32 * ATT_WARPS) __global__ void attention_f16(const float* q, const void* kc, const void* vc,
                                         const u32* pos, float* out, int n_head, int n_head_kv,
                                         int hdk, int hdv, int capacity, int window, float scale,
                                         float softcap) {
    attention<true>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale,
                    softcap);
}
