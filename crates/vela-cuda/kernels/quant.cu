// Activation quantization, quantized matrix products and embedding-row dequantization.
//
// Numerics follow the CPU backend (crates/vela-compute/src/cpu/matmul): activations are first
// quantized to the weight type's dot type (Q8 blocks of 32 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K
// blocks of 256 for k-quants) with the same rounding, so every block dot is an exact integer sum
// (dp4a) and only the f32 accumulation order differs from the CPU.
//
// Type ids are GGML's: F32=0 F16=1 Q4_0=2 Q4_1=3 Q5_0=6 Q5_1=7 Q8_0=8 Q4_K=12 Q5_K=13 Q6_K=14.

#define WARPS 4

// 32-element activation block (content of ggml block_q8_1 plus the exact quant sum).
struct AQ8 {
    float d;   // scale, rounded through f16
    float s;   // f16(d * sum)
    int sum;   // exact sum of qs
    int pad;
    int qs[8]; // 32 int8 quants
};

// 256-element activation block (ggml block_q8_K).
struct AQ8K {
    float d;
    int pad[3];
    short bsums[16]; // sum of each group of 16 quants
    int qs[64];      // 256 int8 quants
};

// One warp per 32-element block: d = amax/127, multiplier 127/amax, round half to even.
extern "C" __global__ void quantize_q8(const float* __restrict__ x, AQ8* __restrict__ out, int n_blocks) {
    int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;
    float v = x[(size_t)blk * 32 + lane];
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = __float2int_rn(v * id);
    int sum = warp_sum_i(q);
    AQ8* o = out + blk;
    ((i8*)o->qs)[lane] = (i8)q;
    if (lane == 0) {
        o->d = round_f16(d);
        o->s = round_f16(d * (float)sum);
        o->sum = sum;
        o->pad = 0;
    }
}

// One warp per 256-element block, exactly ggml's quantize_row_q8_K_ref: the scale comes from the
// signed value of largest magnitude (first one on ties), iscale = -127/max.
extern "C" __global__ void quantize_q8k(const float* __restrict__ x, AQ8K* __restrict__ out, int n_blocks) {
    int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;
    const float* xb = x + (size_t)blk * 256 + lane * 8;
    float v[8];
    float amax = 0.0f, mx = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
        if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); mx = v[i]; idx = lane * 8 + i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        float m2 = __shfl_xor_sync(0xffffffffu, mx, o);
        int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) { amax = a2; mx = m2; idx = i2; }
    }
    AQ8K* o = out + blk;
    int q[8];
    int s = 0;
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = 0;
    } else {
        float iscale = -127.0f / mx;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            q[i] = min(__float2int_rn(iscale * v[i]), 127);
            s += q[i];
        }
        if (lane == 0) o->d = 1.0f / iscale;
    }
    if (amax == 0.0f && lane == 0) o->d = 0.0f;
    int pair = s + __shfl_xor_sync(0xffffffffu, s, 1);
    if ((lane & 1) == 0) o->bsums[lane / 2] = (short)pair;
    o->qs[lane * 2] = (q[0] & 255) | ((q[1] & 255) << 8) | ((q[2] & 255) << 16) | ((u32)(q[3] & 255) << 24);
    o->qs[lane * 2 + 1] = (q[4] & 255) | ((q[5] & 255) << 8) | ((q[6] & 255) << 16) | ((u32)(q[7] & 255) << 24);
}

// ---- 32-element weight blocks ----

// Spread the low 4 bits of x into bit 4 of each of the 4 bytes.
__device__ __forceinline__ int spread4(u32 x) {
    return (int)(((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25));
}

template <int T> struct B32;
template <> struct B32<2> { enum { BYTES = 18, OFF = 8, MIN = 0 }; };
template <> struct B32<3> { enum { BYTES = 20, OFF = 0, MIN = 1 }; };
template <> struct B32<6> { enum { BYTES = 22, OFF = 16, MIN = 0 }; };
template <> struct B32<7> { enum { BYTES = 24, OFF = 0, MIN = 1 }; };
template <> struct B32<8> { enum { BYTES = 34, OFF = 0, MIN = 0 }; };

// Unpack one block into 8 words of 4 quant bytes (element order) plus (d, m).
template <int T>
__device__ __forceinline__ void decode32(const u8* b, int w[8], float& d, float& m) {
    d = ldh(b);
    m = 0.0f;
    if (T == 8) {
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = (int)ld32(b + 2 + 4 * k);
        return;
    }
    const u8* qs = b + (T == 2 ? 2 : T == 3 ? 4 : T == 6 ? 6 : 8);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 u = ld32(qs + 4 * k);
        w[k] = (int)(u & 0x0F0F0F0Fu);
        w[4 + k] = (int)((u >> 4) & 0x0F0F0F0Fu);
    }
    if (T == 3 || T == 7) m = ldh(b + 2);
    if (T == 6 || T == 7) {
        u32 qh = ld32(b + (T == 6 ? 2 : 4));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[k] |= spread4(qh >> (4 * k));
            w[4 + k] |= spread4(qh >> (16 + 4 * k));
        }
    }
}

// y[t*rows + r] = W[r] . x[t]: one warp per weight row, TT tokens per warp (the weights are
// decoded once per TT tokens), lanes stride over the row's blocks.
template <int T, int TT>
__device__ void mm32(const u8* __restrict__ W, const AQ8* __restrict__ X, float* __restrict__ Y,
                     int rows, int nb, int n) {
    int r = blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * TT;
    if (r >= rows) return;
    int nt = min(TT, n - t0);
    float acc[TT], accm[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) { acc[t] = 0.0f; accm[t] = 0.0f; }
    const u8* wr = W + (size_t)r * nb * B32<T>::BYTES;
    for (int b = lane; b < nb; b += 32) {
        int w[8];
        float d, m;
        decode32<T>(wr + (size_t)b * B32<T>::BYTES, w, d, m);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t < nt) {
                const AQ8* a = X + (size_t)(t0 + t) * nb + b;
                int isum = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) isum = dp4a(w[k], a->qs[k], isum);
                isum -= B32<T>::OFF * a->sum;
                acc[t] += (float)isum * (d * a->d);
                if (B32<T>::MIN) accm[t] += m * a->s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float s = warp_sum(acc[t]);
        float sm = warp_sum(accm[t]);
        if (lane == 0 && t < nt) Y[(size_t)(t0 + t) * rows + r] = s + sm;
    }
}

// ---- k-quant weight blocks (256 elements), processed per 32-element sub-block ----

__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int T> struct BK;
template <> struct BK<12> { enum { BYTES = 144 }; };
template <> struct BK<13> { enum { BYTES = 176 }; };
template <> struct BK<14> { enum { BYTES = 210 }; };

// Sub-block j (elements 32j..32j+31) of a k-quant block: 8 words of unsigned quants, the scales
// and mins of its two groups of 16 and (d, dmin), so that W = d*sc*q - dmin*mn.
template <int T>
__device__ __forceinline__ void decodek(const u8* b, int j, int w[8], int sc[2], int mn[2],
                                        float& d, float& dmin) {
    if (T == 14) {
        const u8* ql = b;
        const u8* qh = b + 128;
        const i8* scales = (const i8*)(b + 192);
        d = ldh(b + 208);
        dmin = 32.0f * d;
        int nn = j / 4, s = j % 4;
        const u8* qlp = ql + 64 * nn + 32 * (s & 1);
        const u8* qhp = qh + 32 * nn;
        int ns = (s >> 1) * 4, hs = 2 * s;
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = (int)(((ld32(qlp + 4 * k) >> ns) & 0x0F0F0F0Fu) |
                         (((ld32(qhp + 4 * k) >> hs) & 0x03030303u) << 4));
        sc[0] = scales[2 * j];
        sc[1] = scales[2 * j + 1];
        mn[0] = sc[0];
        mn[1] = sc[1];
        return;
    }
    d = ldh(b);
    dmin = ldh(b + 2);
    int s, m;
    scale_min_k4(j, b + 4, s, m);
    sc[0] = sc[1] = s;
    mn[0] = mn[1] = m;
    const u8* qs = b + (T == 12 ? 16 : 48) + 32 * (j / 2);
    int sh = (j & 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 v = (ld32(qs + 4 * k) >> sh) & 0x0F0F0F0Fu;
        if (T == 13) v |= ((ld32(b + 16 + 4 * k) >> j) & 0x01010101u) << 4;
        w[k] = (int)v;
    }
}

template <int T, int TT>
__device__ void mmk(const u8* __restrict__ W, const AQ8K* __restrict__ X, float* __restrict__ Y,
                    int rows, int nb, int n) {
    int r = blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * TT;
    if (r >= rows) return;
    int nt = min(TT, n - t0);
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    const u8* wr = W + (size_t)r * nb * BK<T>::BYTES;
    for (int it = lane; it < nb * 8; it += 32) {
        int b = it >> 3, j = it & 7;
        int w[8], sc[2], mn[2];
        float d, dmin;
        decodek<T>(wr + (size_t)b * BK<T>::BYTES, j, w, sc, mn, d, dmin);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t < nt) {
                const AQ8K* a = X + (size_t)(t0 + t) * nb + b;
                int i0 = 0, i1 = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) i0 = dp4a(w[k], a->qs[8 * j + k], i0);
#pragma unroll
                for (int k = 4; k < 8; k++) i1 = dp4a(w[k], a->qs[8 * j + k], i1);
                int isum = sc[0] * i0 + sc[1] * i1;
                int corr = mn[0] * a->bsums[2 * j] + mn[1] * a->bsums[2 * j + 1];
                acc[t] += (a->d * d) * (float)isum - (a->d * dmin) * (float)corr;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) Y[(size_t)(t0 + t) * rows + r] = s;
    }
}

// ---- float weights (F32, F16; F16 rounds the activations to f16 like ggml's vec_dot_type) ----
template <int T, int TT>
__device__ void mmf(const u8* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y,
                    int rows, int cols, int n) {
    int r = blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * TT;
    if (r >= rows) return;
    int nt = min(TT, n - t0);
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        float wv = T == 0 ? ((const float*)W)[(size_t)r * cols + c]
                          : h2f(((const u16*)W)[(size_t)r * cols + c]);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t < nt) {
                float xv = X[(size_t)(t0 + t) * cols + c];
                if (T == 1) xv = round_f16(xv);
                acc[t] = fmaf(wv, xv, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) Y[(size_t)(t0 + t) * rows + r] = s;
    }
}

#define MM32(T, NAME)                                                                              \
    extern "C" __global__ void NAME##_t1(const u8* W, const AQ8* X, float* Y, int rows, int nb, int n) { mm32<T, 1>(W, X, Y, rows, nb, n); } \
    extern "C" __global__ void NAME##_t8(const u8* W, const AQ8* X, float* Y, int rows, int nb, int n) { mm32<T, 8>(W, X, Y, rows, nb, n); }
#define MMK(T, NAME)                                                                               \
    extern "C" __global__ void NAME##_t1(const u8* W, const AQ8K* X, float* Y, int rows, int nb, int n) { mmk<T, 1>(W, X, Y, rows, nb, n); } \
    extern "C" __global__ void NAME##_t8(const u8* W, const AQ8K* X, float* Y, int rows, int nb, int n) { mmk<T, 8>(W, X, Y, rows, nb, n); }
#define MMF(T, NAME)                                                                               \
    extern "C" __global__ void NAME##_t1(const u8* W, const float* X, float* Y, int rows, int nb, int n) { mmf<T, 1>(W, X, Y, rows, nb, n); } \
    extern "C" __global__ void NAME##_t8(const u8* W, const float* X, float* Y, int rows, int nb, int n) { mmf<T, 8>(W, X, Y, rows, nb, n); }

MM32(2, mm_q4_0)
MM32(3, mm_q4_1)
MM32(6, mm_q5_0)
MM32(7, mm_q5_1)
MM32(8, mm_q8_0)
MMK(12, mm_q4_k)
MMK(13, mm_q5_k)
MMK(14, mm_q6_k)
MMF(0, mm_f32)
MMF(1, mm_f16)

// ---- embedding rows: dequantize element i of a row ----
template <int T>
__device__ float deq(const u8* row, int i) {
    if constexpr (T == 0) {
        return ((const float*)row)[i];
    } else if constexpr (T == 1) {
        return h2f(((const u16*)row)[i]);
    } else if constexpr (T == 2 || T == 3 || T == 6 || T == 7 || T == 8) {
        const u8* b = row + (size_t)(i / 32) * B32<T>::BYTES;
        int e = i % 32;
        float d = ldh(b);
        if (T == 8) return (float)((const i8*)(b + 2))[e] * d;
        const u8* qs = b + (T == 2 ? 2 : T == 3 ? 4 : T == 6 ? 6 : 8);
        int q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
        if (T == 6 || T == 7) q |= ((ld32(b + (T == 6 ? 2 : 4)) >> e) & 1) << 4;
        if (T == 2) return (float)(q - 8) * d;
        if (T == 6) return (float)(q - 16) * d;
        return (float)q * d + ldh(b + 2);
    } else if constexpr (T == 14) {
        const u8* b = row + (size_t)(i / 256) * BK<T>::BYTES;
        int e = i % 256;
        int nn = e / 128, rr = e % 128, s = rr / 32, l = rr % 32;
        const u8* ql = b + 64 * nn + l + 32 * (s & 1);
        int q = ((*ql >> ((s >> 1) * 4)) & 15) | (((b[128 + 32 * nn + l] >> (2 * s)) & 3) << 4);
        float d = ldh(b + 208);
        return d * (float)((const i8*)(b + 192))[e / 16] * (float)(q - 32);
    } else {
        const u8* b = row + (size_t)(i / 256) * BK<T>::BYTES;
        int e = i % 256;
        int j = e / 32, l = e % 32, sc, m;
        scale_min_k4(j, b + 4, sc, m);
        const u8* qs = b + (T == 12 ? 16 : 48) + 32 * (j / 2);
        int q = (qs[l] >> ((j & 1) * 4)) & 15;
        if (T == 13) q |= ((b[16 + l] >> j) & 1) << 4;
        return ldh(b) * (float)sc * (float)q - ldh(b + 2) * (float)m;
    }
}

template <int T>
__device__ void get_rows(const u8* W, const u32* ids, int cols, long long row_bytes, float scale,
                         float* out) {
    int t = blockIdx.x;
    const u8* row = W + (size_t)ids[t] * row_bytes;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = deq<T>(row, i);
        out[(size_t)t * cols + i] = scale != 1.0f ? v * scale : v;
    }
}

#define GR(T, NAME)                                                                                \
    extern "C" __global__ void NAME(const u8* W, const u32* ids, int cols, long long rb, float scale, float* out) { get_rows<T>(W, ids, cols, rb, scale, out); }
GR(0, get_rows_f32)
GR(1, get_rows_f16)
GR(2, get_rows_q4_0)
GR(3, get_rows_q4_1)
GR(6, get_rows_q5_0)
GR(7, get_rows_q5_1)
GR(8, get_rows_q8_0)
GR(12, get_rows_q4_k)
GR(13, get_rows_q5_k)
GR(14, get_rows_q6_k)
