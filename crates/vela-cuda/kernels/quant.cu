// Activation quantization, quantized matrix products and embedding-row dequantization.
//
// Numerics follow the CPU backend (crates/vela-compute/src/cpu/matmul): activations are first
// quantized to the weight type's dot type (Q8 blocks of 32 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K
// blocks of 256 for k-quants) with the same rounding, so every block dot is an exact integer sum
// (dp4a) and only the f32 accumulation order differs from the CPU.
//
// Type ids are GGML's: F32=0 F16=1 Q4_0=2 Q4_1=3 Q5_0=6 Q5_1=7 Q8_0=8 Q4_K=12 Q5_K=13 Q6_K=14.

#define WARPS 4

// (AQ8 / AQ8K and q8_block / q8k_block are in common.cu.)
extern "C" __global__ void quantize_q8(const float* __restrict__ x, AQ8* __restrict__ out, int n_blocks) {
    PDL_ENTRY();
    int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;
    q8_block(x[(size_t)blk * 32 + lane], out + blk, lane);
}

extern "C" __global__ void quantize_q8k(const float* __restrict__ x, AQ8K* __restrict__ out, int n_blocks) {
    PDL_ENTRY();
    int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;
    const float* xb = x + (size_t)blk * 256 + lane * 8;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = xb[i];
    q8k_block(v, out + blk, lane);
}

// Programmatic dependent launch in the pre-norm kernels: they start with NORM_ENTRY() and every
// thread reaches NORM_RESUME() once; norm_quant_regs loads its norm weights (constants) before
// it, so their DRAM round trip runs under the previous kernel's tail and only x (just written,
// in L2) is read after the wait (like the matvecs' MV_ENTRY / MV_RESUME). Gemma 3 geometry (post
// norms: two weight vectors) decode +2 % against waiting at entry (docs/perf-log.md).
#define NORM_ENTRY() do {} while (0)
#define NORM_RESUME() pdl_resume()

// Pre-norm block input in one pass (one block per row): optionally x += res, then
// h = x / rms(x) * w exactly like rms_norm, and h quantized for the matmuls (Q8 blocks of 32 when
// K = 0, Q8_K blocks of 256 when K = 1) exactly like quantize_q8 / quantize_q8k. (A variant that
// kept the row in registers with fully unrolled predicated loops was slower: 11 vs 5.6 us.)
template <int K>
__device__ void norm_quant(float* __restrict__ x, const float* __restrict__ res,
                           const float* __restrict__ w, float* __restrict__ h, u8* __restrict__ act,
                           int width, float eps) {
    NORM_RESUME();
    float* xr = x + (size_t)blockIdx.x * width;
    float* hr = h + (size_t)blockIdx.x * width;
    double s = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = xr[i];
        if (res) {
            v += res[(size_t)blockIdx.x * width + i];
            xr[i] = v;
        }
        s += (double)(v * v);
    }
    // block_sum_d's barriers also make this block's writes of xr visible to all its threads.
    float mean = (float)(block_sum_d(s) / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    if constexpr (K == 0) {
        AQ8* o = (AQ8*)act + (size_t)blockIdx.x * (width / 32);
        for (int blk = warp; blk < width / 32; blk += nw) {
            int i = blk * 32 + lane;
            float v = (xr[i] * scale) * w[i];
            hr[i] = v;
            q8_block(v, o + blk, lane);
        }
    } else {
        AQ8K* o = (AQ8K*)act + (size_t)blockIdx.x * (width / 256);
        for (int blk = warp; blk < width / 256; blk += nw) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                int i = blk * 256 + lane * 8 + e;
                v[e] = (xr[i] * scale) * w[i];
                hr[i] = v[e];
            }
            q8k_block(v, o + blk, lane);
        }
    }
}

// The extern wrappers of norm_quant and norm_quant_regs (below): K = 0 Q8, 1 Q8_K.
#define NORM_Q(FN, K, NAME)                                                                          \
    extern "C" __global__ void NAME(float* x, const float* res, const float* w, float* h, u8* act, int width, float eps) { NORM_ENTRY(); \
        FN<K>(x, res, w, h, act, width, eps); }
NORM_Q(norm_quant, 0, norm_q8)
NORM_Q(norm_quant, 1, norm_q8k)

// Q8 blocks of 32 from 8 elements per lane, lanes 4g..4g+3 holding block g of the warp (sub =
// lane & 3; inactive lanes hold zeros in whole groups and write nothing); o: the lane's block.
// (norm_q8_regs.)
__device__ __forceinline__ void q8_lanes8(const float (&hv)[8], AQ8* __restrict__ o, int sub,
                                          bool on) {
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(hv[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q[8], sum = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        q[e] = __float2int_rn(hv[e] * id);
        sum += q[e];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (on) {
        o->qs[2 * sub] = (q[0] & 255) | ((q[1] & 255) << 8) | ((q[2] & 255) << 16) | ((u32)(q[3] & 255) << 24);
        o->qs[2 * sub + 1] = (q[4] & 255) | ((q[5] & 255) << 8) | ((q[6] & 255) << 16) | ((u32)(q[7] & 255) << 24);
        if (sub == 0) {
            o->d = round_f16(d);
            o->s = round_f16(d * (float)sum);
            o->sum = sum;
            o->pad = 0;
        }
    }
}

// The same with the row in registers (the default for width <= 8192): thread t holds elements
// 8t..8t+7 (blockDim = width / 8 rounded up to a warp; all pointers 16-byte aligned), so x, res
// and w are read with 16-byte loads in one round trip, nothing is re-read, and the quantization
// runs on the registers: a Q8 block of 32 is 4 lanes (K = 0), a Q8_K block of 256 one warp
// (K = 1, lane l holding elements 8l..8l+7 as q8k_block expects). The single-block loop version
// above took ~8 us per call on Llama-3-8B decode (ncu, H200), two calls per layer.
// POST (`norm_q8*_post_regs`, res required): res is first RMS-normalized with pw like rms_norm
// (Gemma's post-attention and post-FFN norms; res itself is left as it was), so
// x = (x + rms_norm(res) * pw) * xs: one launch fewer per norm (two with Gemma 4's layer scalar). The products are rounded as rms_norm
// stores them (no contraction into the add); the sum of squares is added in this kernel's order
// (double, like rms_norm's, so a different order changes the float mean only when the double sums
// round differently: bit-equal in `mix::post_norm_matmul_equals_unfused` and in sampled output).
// Gemma 3 270M geometry decode 1,594 tok/s against 1,510 with the sum emulating rms_norm's order
// through shared memory and 1,395 without the fold (docs/perf-log.md).
template <int K, bool POST = false>
__device__ void norm_quant_regs(float* __restrict__ x, const float* __restrict__ res,
                                const float* __restrict__ w, float* __restrict__ h,
                                u8* __restrict__ act, int width, float eps,
                                const float* __restrict__ pw = nullptr, float xs = 1.0f) {
    int t = threadIdx.x;
    bool on = 8 * t < width;  // width is a multiple of 32: all 8 elements are in the row
    float* xr = x + (size_t)blockIdx.x * width;
    float v[8], wv[8], pv[8];
    double s = 0.0;
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = wv[e] = pv[e] = 0.0f;
    // The norm weights before the wait (constants).
    if (on) {
        float4 w0 = ((const float4*)w)[2 * t], w1 = ((const float4*)w)[2 * t + 1];
        wv[0] = w0.x; wv[1] = w0.y; wv[2] = w0.z; wv[3] = w0.w;
        wv[4] = w1.x; wv[5] = w1.y; wv[6] = w1.z; wv[7] = w1.w;
        if (POST) {
            float4 p0 = ((const float4*)pw)[2 * t], p1 = ((const float4*)pw)[2 * t + 1];
            pv[0] = p0.x; pv[1] = p0.y; pv[2] = p0.z; pv[3] = p0.w;
            pv[4] = p1.x; pv[5] = p1.y; pv[6] = p1.z; pv[7] = p1.w;
        }
    }
    NORM_RESUME();
    if (on) {
        float4 x0 = ((const float4*)xr)[2 * t], x1 = ((const float4*)xr)[2 * t + 1];
        v[0] = x0.x; v[1] = x0.y; v[2] = x0.z; v[3] = x0.w;
        v[4] = x1.x; v[5] = x1.y; v[6] = x1.z; v[7] = x1.w;
        if (res && !POST) {
            const float4* rr = (const float4*)(res + (size_t)blockIdx.x * width);
            float4 r0 = rr[2 * t], r1 = rr[2 * t + 1];
            v[0] += r0.x; v[1] += r0.y; v[2] += r0.z; v[3] += r0.w;
            v[4] += r1.x; v[5] += r1.y; v[6] += r1.z; v[7] += r1.w;
            ((float4*)xr)[2 * t] = make_float4(v[0], v[1], v[2], v[3]);
            ((float4*)xr)[2 * t + 1] = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
    if constexpr (POST) {
        const float* rrow = res + (size_t)blockIdx.x * width;
        float r[8];
        double sr = 0.0;
#pragma unroll
        for (int e = 0; e < 8; e++) r[e] = 0.0f;
        if (on) {
            float4 r0 = ((const float4*)rrow)[2 * t], r1 = ((const float4*)rrow)[2 * t + 1];
            r[0] = r0.x; r[1] = r0.y; r[2] = r0.z; r[3] = r0.w;
            r[4] = r1.x; r[5] = r1.y; r[6] = r1.z; r[7] = r1.w;
#pragma unroll
            for (int e = 0; e < 8; e++) sr += (double)(r[e] * r[e]);
        }
        float rmean = (float)(block_sum_d(sr) / (double)width);
        // (block_sum_d's shared slots are used again below.)
        __syncthreads();
        float rscale = 1.0f / sqrtf(rmean + eps);
        if (on) {
            // Rounded products, as rms_norm stores them (no contraction into the add); then
            // x *= xs as `scale` does (Gemma 4's layer scalar; exact when xs is 1).
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = __fmul_rn(__fadd_rn(v[e], __fmul_rn(__fmul_rn(r[e], rscale), pv[e])), xs);
            ((float4*)xr)[2 * t] = make_float4(v[0], v[1], v[2], v[3]);
            ((float4*)xr)[2 * t + 1] = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
    if (on) {
#pragma unroll
        for (int e = 0; e < 8; e++) s += (double)(v[e] * v[e]);
    }
    float mean = (float)(block_sum_d(s) / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    float hv[8];
#pragma unroll
    for (int e = 0; e < 8; e++) hv[e] = (v[e] * scale) * wv[e];
    if (on) {
        float4* hr = (float4*)(h + (size_t)blockIdx.x * width);
        hr[2 * t] = make_float4(hv[0], hv[1], hv[2], hv[3]);
        hr[2 * t + 1] = make_float4(hv[4], hv[5], hv[6], hv[7]);
    }
    int lane = t & 31;
    if constexpr (K == 0) {
        q8_lanes8(hv, (AQ8*)act + (size_t)blockIdx.x * (width / 32) + t / 4, t & 3, on);
    } else {
        // width is a multiple of 256: every warp is whole and holds one Q8_K block.
        if (on) q8k_block(hv, (AQ8K*)act + (size_t)blockIdx.x * (width / 256) + t / 32, lane);
    }
}

NORM_Q(norm_quant_regs, 0, norm_q8_regs)
NORM_Q(norm_quant_regs, 1, norm_q8k_regs)
#define NORM_Q_POST(K, NAME)                                                                        \
    extern "C" __global__ void NAME(float* x, const float* res, const float* pw, const float* w, float* h, u8* act, int width, float eps, float xs) { NORM_ENTRY(); \
        norm_quant_regs<K, true>(x, res, w, h, act, width, eps, pw, xs); }
NORM_Q_POST(0, norm_q8_post_regs)
NORM_Q_POST(1, norm_q8k_post_regs)

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
// Q4_0 with split rows ("q4_0s", type 102): Q4_0 weights whose rows have a multiple of 8 blocks
// are repacked at upload (repack_q4_0): a row of nb blocks holds the nb 16-byte quant arrays,
// then the nb f16 scales. Same size as the GGUF row (18 nb bytes, so 16-byte aligned rows), and
// a block's quants are one aligned 16-byte load (see mvs in matvec.cu).
template <> struct B32<102> { enum { BYTES = 18, OFF = 8, MIN = 0 }; };

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

// Block b of a row of nb blocks: decode32 on GGUF's layout, or the split-row Q4_0 layout.
template <int T>
__device__ __forceinline__ void decode32_at(const u8* row, int nb, int b, int w[8], float& d,
                                            float& m) {
    if constexpr (T == 102) {
        uint4 u = ((const uint4*)row)[b];
        d = ldh(row + 16 * (size_t)nb + 2 * b);
        m = 0.0f;
        u32 q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[k] = (int)(q[k] & 0x0F0F0F0Fu);
            w[4 + k] = (int)((q[k] >> 4) & 0x0F0F0F0Fu);
        }
    } else {
        decode32<T>(row + (size_t)b * B32<T>::BYTES, w, d, m);
    }
}

// Repack GGUF Q4_0 rows of nb blocks (nb a multiple of 8) into split rows (type 102 above):
// one thread per block.
extern "C" __global__ void repack_q4_0(const u8* __restrict__ src, u8* __restrict__ dst, int rows,
                                       int nb) {
    PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nb) return;
    size_t r = i / nb;
    int b = (int)(i % nb);
    const u16* s = (const u16*)(src + i * 18);
    u8* row = dst + r * nb * 18;
    u32 q[4];
#pragma unroll
    for (int k = 0; k < 4; k++) q[k] = (u32)s[1 + 2 * k] | ((u32)s[2 + 2 * k] << 16);
    *(uint4*)(row + 16 * (size_t)b) = make_uint4(q[0], q[1], q[2], q[3]);
    *(u16*)(row + 16 * (size_t)nb + 2 * b) = s[0];
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
        decode32_at<T>(wr, nb, b, w, d, m);
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
// Q4_K and Q6_K in split rows ("q4_ks" / "q6_ks", types 112 / 114), repacked at upload
// (repack_q4_k / repack_q6_k) so that the 4-bit part of each 32-element sub-block is one
// aligned 16-byte word laid out like Q4_0's (byte m: element m in the low nibble, m + 16 in
// the high one). A row of nb blocks holds, in order:
//   Q4_K: the 8 nb 16-byte sub-block words, then the nb 16-byte headers (d, dmin, scales[12]);
//   Q6_K: the 8 nb 16-byte low-bit words, the 8 nb 8-byte high-bit words (word h, h = m / 16:
//         bits 2k..2k+1 of byte i hold the high 2 bits of element 16h + 4k + i), the nb 16-byte
//         scale arrays, then the nb f16 scales d.
// The same size as GGUF's row, except that Q6_K rows are padded to a multiple of 16 bytes
// (210 nb is one only when nb is a multiple of 8; Qwen2.5-0.5B's 4,864-wide ffn_down has 19
// blocks per row), so that every row starts 16-byte aligned: row_stride.
template <> struct BK<112> { enum { BYTES = 144 }; };
template <> struct BK<114> { enum { BYTES = 210 }; };
// Bytes from one row of nb blocks of type T to the next, as uploaded (the host's row_bytes).
template <int T>
__device__ __forceinline__ size_t row_stride(int nb) {
    size_t b = (size_t)nb * BK<T>::BYTES;
    return T == 114 ? (b + 15) & ~(size_t)15 : b;
}
template <int T>
__device__ constexpr bool is_kquant() {
    return T == 12 || T == 13 || T == 14 || T == 112 || T == 114;
}

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

// Sub-block j of block b of a row of nb k-quant blocks, like decodek: GGUF's layout (decodek,
// or with V decodek_v, the matvec's variant with 16-byte loads) or split rows (types 112/114).
template <int T, bool V = false>
__device__ __forceinline__ void decodek_at(const u8* row, int nb, int b, int j, int w[8],
                                           int sc[2], int mn[2], float& d, float& dmin);

// Element m (0..31) of GGUF sub-block j of the k-quant block at b: the low 4 bits, and for Q6_K
// the high 2 bits.
template <int T>
__device__ __forceinline__ void kq_elem(const u8* b, int j, int m, int& lo, int& hi) {
    if (T == 14) {
        int nn = j / 4, s = j % 4;
        lo = (b[64 * nn + 32 * (s & 1) + m] >> ((s >> 1) * 4)) & 15;
        hi = (b[128 + 32 * nn + m] >> (2 * s)) & 3;
    } else {
        lo = (b[16 + 32 * (j / 2) + m] >> ((j & 1) * 4)) & 15;
        hi = 0;
    }
}

// Repack GGUF Q4_K (T = 12) or Q6_K (T = 14) rows of nb blocks into split rows (see BK<112>):
// one thread per sub-block.
template <int T>
__device__ void repack_k(const u8* __restrict__ src, u8* __restrict__ dst, int rows, int nb) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nb * 8) return;
    size_t r = i / ((size_t)nb * 8);
    int b = (int)(i / 8 % nb), j = (int)(i % 8);
    const u8* blk = src + (i / 8) * BK<T>::BYTES;
    u8* row = dst + r * row_stride<T == 14 ? 114 : 112>(nb);
    u32 lo[4] = {0, 0, 0, 0}, hw[2] = {0, 0};
#pragma unroll 4
    for (int m = 0; m < 32; m++) {
        int l, h;
        kq_elem<T>(blk, j, m, l, h);
        lo[(m % 16) / 4] |= (u32)l << (8 * (m % 4) + 4 * (m / 16));
        hw[m / 16] |= (u32)h << (8 * (m % 4) + 2 * ((m % 16) / 4));
    }
    *(uint4*)(row + 16 * (8 * (size_t)b + j)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    if (T == 14) {
        *(uint2*)(row + 128 * (size_t)nb + 8 * (8 * (size_t)b + j)) = make_uint2(hw[0], hw[1]);
        if (j == 0) {
            for (int k = 0; k < 16; k++) row[192 * (size_t)nb + 16 * (size_t)b + k] = blk[192 + k];
            *(u16*)(row + 208 * (size_t)nb + 2 * (size_t)b) = *(const u16*)(blk + 208);
        }
    } else if (j == 0) {
        *(uint4*)(row + 128 * (size_t)nb + 16 * (size_t)b) = *(const uint4*)blk;
    }
}
extern "C" __global__ void repack_q4_k(const u8* src, u8* dst, int rows, int nb) { PDL_ENTRY(); repack_k<12>(src, dst, rows, nb); }
extern "C" __global__ void repack_q6_k(const u8* src, u8* dst, int rows, int nb) { PDL_ENTRY(); repack_k<14>(src, dst, rows, nb); }

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
    const u8* wr = W + (size_t)r * row_stride<T>(nb);
    for (int it = lane; it < nb * 8; it += 32) {
        int b = it >> 3, j = it & 7;
        int w[8], sc[2], mn[2];
        float d, dmin;
        decodek_at<T>(wr, nb, b, j, w, sc, mn, d, dmin);
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

// One block per output row (256 threads) of a one-token float product with few rows (mHC's 24
// mixes of 4 x 4096 streams, MLA's latent projection, the low-rank gates): the rows spread over
// the SMs instead of one warp per row on a few of them. Each thread sums its columns, then the
// warps' sums in order.
template <int T>
__device__ void mmf_row(const u8* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y,
                        int cols) {
    __shared__ float part[32];
    int r = blockIdx.x;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float wv = T == 0 ? ((const float*)W)[(size_t)r * cols + c]
                          : h2f(((const u16*)W)[(size_t)r * cols + c]);
        float xv = X[c];
        if (T == 1) xv = round_f16(xv);
        acc = fmaf(wv, xv, acc);
    }
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w];
        Y[r] = s;
    }
}

#define MM32(T, NAME)                                                                              \
    extern "C" __global__ void NAME##_t8(const u8* W, const AQ8* X, float* Y, int rows, int nb, int n) { PDL_ENTRY(); mm32<T, 8>(W, X, Y, rows, nb, n); }
#define MMK(T, NAME)                                                                               \
    extern "C" __global__ void NAME##_t8(const u8* W, const AQ8K* X, float* Y, int rows, int nb, int n) { PDL_ENTRY(); mmk<T, 8>(W, X, Y, rows, nb, n); }
#define MMF(T, NAME)                                                                               \
    extern "C" __global__ void NAME##_t1(const u8* W, const float* X, float* Y, int rows, int nb, int n) { PDL_ENTRY(); mmf<T, 1>(W, X, Y, rows, nb, n); } \
    extern "C" __global__ void NAME##_b1(const u8* W, const float* X, float* Y, int rows, int nb, int n) { PDL_ENTRY(); mmf_row<T>(W, X, Y, nb); } \
    extern "C" __global__ void NAME##_t8(const u8* W, const float* X, float* Y, int rows, int nb, int n) { PDL_ENTRY(); mmf<T, 8>(W, X, Y, rows, nb, n); }

MM32(2, mm_q4_0)
MM32(102, mm_q4_0s)
MM32(3, mm_q4_1)
MM32(6, mm_q5_0)
MM32(7, mm_q5_1)
MM32(8, mm_q8_0)
MMK(13, mm_q5_k)
MMK(112, mm_q4_ks)
MMK(114, mm_q6_ks)
MMF(0, mm_f32)
MMF(1, mm_f16)

// ---- embedding rows: dequantize element i of a row ----
// The quant of element m of sub-block j of block b of a split-row k-quant row (types 112 / 114,
// nb blocks): its 4 low bits, and for Q6_K its 2 high bits (shared by deq and deqx).
template <int T>
__device__ __forceinline__ int ks_elem_q(const u8* row, int nb, int b, int j, int m) {
    int q = (row[16 * (8 * (size_t)b + j) + m % 16] >> (4 * (m / 16))) & 15;
    if (T == 114)
        q |= ((row[128 * (size_t)nb + 8 * (8 * (size_t)b + j) + 4 * (m / 16) + m % 4] >> (2 * ((m % 16) / 4))) & 3) << 4;
    return q;
}

template <int T>
__device__ float deq(const u8* row, int cols, int i) {
    if constexpr (T == 0) {
        return ((const float*)row)[i];
    } else if constexpr (T == 1) {
        return h2f(((const u16*)row)[i]);
    } else if constexpr (T == 102) {
        int b = i / 32, e = i % 32;
        const u8* qs = row + 16 * (size_t)b;
        int q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
        return (float)(q - 8) * ldh(row + 16 * (size_t)(cols / 32) + 2 * b);
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
    } else if constexpr (T == 112 || T == 114) {
        int nb = cols / 256, b = i / 256, e = i % 256, j = e / 32, m = e % 32;
        int q = ks_elem_q<T>(row, nb, b, j, m);
        if (T == 114) {
            float d = ldh(row + 208 * (size_t)nb + 2 * b);
            return d * (float)((const i8*)(row + 192 * (size_t)nb + 16 * (size_t)b))[e / 16] * (float)(q - 32);
        }
        const u8* h = row + 128 * (size_t)nb + 16 * (size_t)b;
        int sc, mn;
        scale_min_k4(j, h + 4, sc, mn);
        return ldh(h) * (float)sc * (float)q - ldh(h + 2) * (float)mn;
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
        float v = deq<T>(row, cols, i);
        out[(size_t)t * cols + i] = scale != 1.0f ? v * scale : v;
    }
}

#define GR(T, NAME)                                                                                \
    extern "C" __global__ void NAME(const u8* W, const u32* ids, int cols, long long rb, float scale, float* out) { PDL_ENTRY(); get_rows<T>(W, ids, cols, rb, scale, out); }
GR(0, get_rows_f32)
GR(1, get_rows_f16)
GR(2, get_rows_q4_0)
GR(102, get_rows_q4_0s)
GR(3, get_rows_q4_1)
GR(6, get_rows_q5_0)
GR(7, get_rows_q5_1)
GR(8, get_rows_q8_0)
GR(13, get_rows_q5_k)
GR(112, get_rows_q4_ks)
GR(114, get_rows_q6_ks)

// ---- prefill on tensor cores: f16 tiles for cuBLAS (see src/cublas.rs) ----
//
// out[r][c] = f16(deq(W[r], c)) for `rows` rows of `cols` (a multiple of 8) elements: one
// thread per 8 consecutive elements, one 16-byte store.
template <int T>
__device__ void deqh(const u8* __restrict__ W, uint4* __restrict__ out, int rows, int cols,
                     long long rb) {
    long long n8 = (long long)rows * (cols / 8);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
         i += (long long)gridDim.x * blockDim.x) {
        int r = (int)(i / (cols / 8)), c0 = (int)(i % (cols / 8)) * 8;
        const u8* row = W + (size_t)r * rb;
        u32 h[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            h[k] = (u32)f2h(deq<T>(row, cols, c0 + 2 * k)) | ((u32)f2h(deq<T>(row, cols, c0 + 2 * k + 1)) << 16);
        out[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
}
// Block-wise (deqhb_*, whenever the rows are whole 32-element blocks; deqh_* above for float
// rows that are not): out[r][c] = f16(W[r][c]) for `rows` rows of `cols` elements (a multiple of 32): one thread per
// 32-element (sub-)block, decoded once (decode32 / decodek, the matvec decoders) and written as
// four 16-byte stores. (Decoding each element separately ran at 0.84 TB/s on a 4096x4096 Q4_0
// weight.) Float weights (T 0/1) go element by element.
template <int T>
__device__ void deqhb(const u8* __restrict__ W, uint4* __restrict__ out, int rows, int cols,
                     long long rb) {
    int nsb = cols / 32;
    long long n = (long long)rows * nsb;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        int r = (int)(i / nsb), c = (int)(i % nsb);
        const u8* row = W + (size_t)r * rb;
        float v[32];
        if constexpr (T <= 1) {
#pragma unroll
            for (int e = 0; e < 32; e++) v[e] = deq<T>(row, cols, 32 * c + e);
        } else if constexpr (is_kquant<T>()) {
            int w[8], sc[2], mn[2];
            float d, dmin;
            decodek_at<T>(row, nsb / 8, c / 8, c % 8, w, sc, mn, d, dmin);
#pragma unroll
            for (int e = 0; e < 32; e++) {
                int h = e / 16, q = (w[e / 4] >> (8 * (e % 4))) & 0xff;
                if (T == 14 || T == 114) {
                    v[e] = d * (float)sc[h] * (float)(q - 32);  // as deq<14>
                } else {
                    float d1 = d * (float)sc[h], m1 = dmin * (float)mn[h];
                    v[e] = d1 * (float)q - m1;
                }
            }
        } else {
            int w[8];
            float d, m;
            decode32_at<T>(row, nsb, c, w, d, m);
#pragma unroll
            for (int e = 0; e < 32; e++) {
                int q = (w[e / 4] >> (8 * (e % 4))) & 0xff;
                if (T == 8) q = (int)(signed char)q;
                v[e] = (float)(q - B32<T>::OFF) * d;
                if (B32<T>::MIN) v[e] += m;
            }
        }
        uint4* o = out + ((size_t)r * cols + 32 * (size_t)c) / 8;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 h[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                h[e] = (u32)f2h(v[8 * k + 2 * e]) | ((u32)f2h(v[8 * k + 2 * e + 1]) << 16);
            o[k] = make_uint4(h[0], h[1], h[2], h[3]);
        }
    }
}
#define DEQH(T, NAME)                                                                              \
    extern "C" __global__ void NAME(const u8* W, uint4* out, int rows, int cols, long long rb) { PDL_ENTRY(); deqh<T>(W, out, rows, cols, rb); }
DEQH(0, deqh_f32)
DEQH(1, deqh_f16)
DEQH(2, deqh_q4_0)
DEQH(102, deqh_q4_0s)
DEQH(3, deqh_q4_1)
DEQH(6, deqh_q5_0)
DEQH(7, deqh_q5_1)
DEQH(8, deqh_q8_0)
DEQH(13, deqh_q5_k)
DEQH(112, deqh_q4_ks)
DEQH(114, deqh_q6_ks)
#define DEQHB(T, NAME)                                                                             \
    extern "C" __global__ void NAME(const u8* W, uint4* out, int rows, int cols, long long rb) { PDL_ENTRY(); deqhb<T>(W, out, rows, cols, rb); }
DEQHB(0, deqhb_f32)
DEQHB(1, deqhb_f16)
DEQHB(2, deqhb_q4_0)
DEQHB(102, deqhb_q4_0s)
DEQHB(3, deqhb_q4_1)
DEQHB(6, deqhb_q5_0)
DEQHB(7, deqhb_q5_1)
DEQHB(8, deqhb_q8_0)
DEQHB(13, deqhb_q5_k)
DEQHB(112, deqhb_q4_ks)
DEQHB(114, deqhb_q6_ks)

// out[i] = f16(x[i]) for n elements (n a multiple of 2).
extern "C" __global__ void to_f16(const float2* __restrict__ x, u32* __restrict__ out, long long n2) {
    PDL_ENTRY();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n2;
         i += (long long)gridDim.x * blockDim.x) {
        float2 v = x[i];
        out[i] = (u32)f2h(v.x) | ((u32)f2h(v.y) << 16);
    }
}

// ---- exact mode (VELA_MATMUL=f32): f32 weights, f32 activations, f64 sums ----
//
// Element i of a weight row with exactly the operation order of the CPU reference dequantizers
// (vela_formats::quant::dequantize, = llama.cpp dequantize_row_*). The explicit _rn intrinsics
// keep NVRTC from contracting a*b+c into an FMA, so the values are bit-identical to the CPU's.
template <int T>
__device__ __forceinline__ float deqx(const u8* row, int cols, int i) {
    if constexpr (T == 0) {
        return ((const float*)row)[i];
    } else if constexpr (T == 1) {
        return h2f(((const u16*)row)[i]);
    } else if constexpr (T == 102) {
        int b = i / 32, e = i % 32;
        const u8* qs = row + 16 * (size_t)b;
        int q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
        return __fmul_rn(ldh(row + 16 * (size_t)(cols / 32) + 2 * b), (float)(q - 8));
    } else if constexpr (T == 2 || T == 3 || T == 6 || T == 7 || T == 8) {
        const u8* b = row + (size_t)(i / 32) * B32<T>::BYTES;
        int e = i % 32;
        float d = ldh(b);
        if (T == 8) return __fmul_rn(d, (float)((const i8*)(b + 2))[e]);
        const u8* qs = b + (T == 2 ? 2 : T == 3 ? 4 : T == 6 ? 6 : 8);
        int q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
        if (T == 6 || T == 7) q |= ((ld32(b + (T == 6 ? 2 : 4)) >> e) & 1) << 4;
        if (T == 2) return __fmul_rn(d, (float)(q - 8));
        if (T == 6) return __fmul_rn(d, (float)(q - 16));
        return __fadd_rn(__fmul_rn(d, (float)q), ldh(b + 2));
    } else if constexpr (T == 112 || T == 114) {
        int nb = cols / 256, b = i / 256, e = i % 256, j = e / 32, m = e % 32;
        int q = ks_elem_q<T>(row, nb, b, j, m);
        if (T == 114) {
            float d = ldh(row + 208 * (size_t)nb + 2 * b);
            return __fmul_rn(__fmul_rn(d, (float)((const i8*)(row + 192 * (size_t)nb + 16 * (size_t)b))[e / 16]), (float)(q - 32));
        }
        const u8* h = row + 128 * (size_t)nb + 16 * (size_t)b;
        int sc, mn;
        scale_min_k4(j, h + 4, sc, mn);
        float d1 = __fmul_rn(ldh(h), (float)sc);
        float m1 = __fmul_rn(ldh(h + 2), (float)mn);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    } else if constexpr (T == 14) {
        const u8* b = row + (size_t)(i / 256) * BK<T>::BYTES;
        int e = i % 256;
        int nn = e / 128, rr = e % 128, s = rr / 32, l = rr % 32;
        const u8* ql = b + 64 * nn + l + 32 * (s & 1);
        int q = ((*ql >> ((s >> 1) * 4)) & 15) | (((b[128 + 32 * nn + l] >> (2 * s)) & 3) << 4);
        float d = ldh(b + 208);
        return __fmul_rn(__fmul_rn(d, (float)((const i8*)(b + 192))[e / 16]), (float)(q - 32));
    } else {
        const u8* b = row + (size_t)(i / 256) * BK<T>::BYTES;
        int e = i % 256;
        int j = e / 32, l = e % 32, sc, m;
        scale_min_k4(j, b + 4, sc, m);
        const u8* qs = b + (T == 12 ? 16 : 48) + 32 * (j / 2);
        int q = (qs[l] >> ((j & 1) * 4)) & 15;
        if (T == 13) q |= ((b[16 + l] >> j) & 1) << 4;
        float d1 = __fmul_rn(ldh(b), (float)sc);
        float m1 = __fmul_rn(ldh(b + 2), (float)m);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

// y[t*rows + r] = sum_c W[r][c] * x[t][c]: one warp per row, 8 tokens per warp, every product
// exact in f64 (two f32 factors), summed in f64 and rounded once.
template <int T>
__device__ void mmx(const u8* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y,
                    int rows, int cols, long long rb, int n) {
    int r = blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * 8;
    if (r >= rows) return;
    int nt = min(8, n - t0);
    double acc[8];
#pragma unroll
    for (int t = 0; t < 8; t++) acc[t] = 0.0;
    const u8* row = W + (size_t)r * rb;
    for (int c = lane; c < cols; c += 32) {
        double w = (double)deqx<T>(row, cols, c);
#pragma unroll
        for (int t = 0; t < 8; t++)
            if (t < nt) acc[t] += w * (double)X[(size_t)(t0 + t) * cols + c];
    }
#pragma unroll
    for (int t = 0; t < 8; t++) {
        double s = warp_sum_d(acc[t]);
        if (lane == 0 && t < nt) Y[(size_t)(t0 + t) * rows + r] = (float)s;
    }
}

#define MMX(T, NAME)                                                                               \
    extern "C" __global__ void NAME(const u8* W, const float* X, float* Y, int rows, int cols, long long rb, int n) { PDL_ENTRY(); mmx<T>(W, X, Y, rows, cols, rb, n); }
MMX(0, mmx_f32)
MMX(1, mmx_f16)
MMX(2, mmx_q4_0)
MMX(102, mmx_q4_0s)
MMX(3, mmx_q4_1)
MMX(6, mmx_q5_0)
MMX(7, mmx_q5_1)
MMX(8, mmx_q8_0)
MMX(13, mmx_q5_k)
MMX(112, mmx_q4_ks)
MMX(114, mmx_q6_ks)


// Gated activation fused with the quantization of its result for the down projection:
// g = act(g) * u (stored, like act_mul), then Q8 (K = 0: one warp per 32-element block) or Q8_K
// (K = 1: one warp per 256-element block) blocks like quantize_q8 / quantize_q8k. G = 1: GELU
// (tanh), else SiLU. n_blocks counts blocks over all rows.
// Four floats by one coherent 16-byte load (p 16-byte aligned), kept where it is written.
__device__ __forceinline__ void ldv4f(const float* p, float* v) {
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                 : "l"(p));
}
template <int K, int G>
__device__ void act_quant(float* __restrict__ g, const float* __restrict__ u, u8* __restrict__ act,
                          int n_blocks) {
    int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;
    if (K == 0) {
        size_t i = (size_t)blk * 32 + lane;
        // Both loads before the division's slow-path branch (ptxas sank u's below it: two
        // dependent L2 round trips; SiLU only, as below): SmolLM2 geometry decode +1.3 %
        // (docs/perf-log.md).
        float gi, ui;
        if (G == 0) {
            asm volatile("ld.global.f32 %0, [%1];" : "=f"(gi) : "l"(g + i));
            asm volatile("ld.global.f32 %0, [%1];" : "=f"(ui) : "l"(u + i));
        } else {
            gi = g[i];
            ui = u[i];
        }
        float v = G ? act_gelu_mul(gi, ui) : act_silu_mul(gi, ui);
        g[i] = v;
        q8_block(v, (AQ8*)act + blk, lane);
    } else {
        // SiLU: all 16 loads first. With each element's store between them and the division's
        // slow path (a branch), ptxas issued them one pair at a time: eight dependent L2 round
        // trips on the decode's critical path: Llama-3-8B Q4_K_M decode +1.2 % (docs/perf-log.md).
        // Not GELU (ptxas already grouped its loads in two batches; Gemma 3 270M was slower with
        // the loads first). The arithmetic is the same either way.
        float v[8];
        size_t i0 = (size_t)blk * 256 + lane * 8;
        if (G == 0 && ((size_t)g | (size_t)u) % 16 == 0) {
            float gv[8], uv[8];
            // Volatile asm, so that the compiler does not sink them to their uses again.
            ldv4f(g + i0, gv); ldv4f(g + i0 + 4, gv + 4);
            ldv4f(u + i0, uv); ldv4f(u + i0 + 4, uv + 4);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = act_silu_mul(gv[e], uv[e]);
#pragma unroll
            for (int e = 0; e < 8; e++) g[i0 + e] = v[e];
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[e] = G ? act_gelu_mul(g[i0 + e], u[i0 + e]) : act_silu_mul(g[i0 + e], u[i0 + e]);
                g[i0 + e] = v[e];
            }
        }
        q8k_block(v, (AQ8K*)act + blk, lane);
    }
}
extern "C" __global__ void act_q8_silu(float* g, const float* u, u8* act, int nb) { PDL_ENTRY(); act_quant<0, 0>(g, u, act, nb); }
extern "C" __global__ void act_q8_gelu(float* g, const float* u, u8* act, int nb) { PDL_ENTRY(); act_quant<0, 1>(g, u, act, nb); }
extern "C" __global__ void act_q8k_silu(float* g, const float* u, u8* act, int nb) { PDL_ENTRY(); act_quant<1, 0>(g, u, act, nb); }
extern "C" __global__ void act_q8k_gelu(float* g, const float* u, u8* act, int nb) { PDL_ENTRY(); act_quant<1, 1>(g, u, act, nb); }
