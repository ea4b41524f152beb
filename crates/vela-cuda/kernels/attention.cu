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

#define ATT_WARPS 4
#define ATT_MAXD 256

template <bool H>
__device__ __forceinline__ float ld_kv(const void* p, size_t i) {
    return H ? h2f(((const u16*)p)[i]) : ((const float*)p)[i];
}

// One block per (head, token); each warp walks every ATT_WARPS-th key of the window with an
// online softmax (running max m, running sum l, running weighted V sum), then the warps' partial
// results are merged. head dims <= 256 (8 values per lane).
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
    for (int j = first + warp; j <= p; j += ATT_WARPS) {
        size_t slot = (size_t)(j % capacity);
        size_t ko = (slot * n_head_kv + g) * hdk;
        float dot = 0.0f;
        for (int d = lane; d < hdk; d += 32) dot += qs[d] * ld_kv<H>(kc, ko + d);
        float s = warp_sum(dot) * scale;
        if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn);
        float e = expf(s - mn);
        l = l * corr + e;
        size_t vo = (slot * n_head_kv + g) * hdv;
#pragma unroll
        for (int i = 0; i < ATT_MAXD / 32; i++) {
            int d = lane + 32 * i;
            if (d < hdv) acc[i] = acc[i] * corr + e * ld_kv<H>(vc, vo + d);
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

extern "C" __global__ void attention_f32(const float* q, const void* kc, const void* vc,
                                         const u32* pos, float* out, int n_head, int n_head_kv,
                                         int hdk, int hdv, int capacity, int window, float scale,
                                         float softcap) {
    attention<false>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale,
                     softcap);
}
extern "C" __global__ void attention_f16(const float* q, const void* kc, const void* vc,
                                         const u32* pos, float* out, int n_head, int n_head_kv,
                                         int hdk, int hdv, int capacity, int window, float scale,
                                         float softcap) {
    attention<true>(q, kc, vc, pos, out, n_head, n_head_kv, hdk, hdv, capacity, window, scale,
                    softcap);
}
