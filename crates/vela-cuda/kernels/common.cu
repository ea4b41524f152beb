// Shared prelude of every vela kernel group (prepended to each group's source before NVRTC).
// No system or CUDA headers: NVRTC provides the built-in intrinsics used here.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;
typedef short i16;
typedef unsigned long long u64;

// IEEE half <-> f32 through PTX conversions (round to nearest even, like the CPU backend).
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float round_f16(float f) { return h2f(f2h(f)); }

// bf16 <-> f32: widening is exact (the high half of the f32); narrowing rounds to nearest even
// and keeps NaN a quiet NaN, like the CPU backend (half::bf16::from_f32).
__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float((u32)h << 16); }
__device__ __forceinline__ u16 f2bf(float f) {
    u32 b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x0040u);
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// A 16-bit KV-cache element of type KT (1 f16, 2 bf16; see attention.cu) to f32 and back.
template <int KT>
__device__ __forceinline__ float kv2f(u16 h) { return KT == 2 ? bf2f(h) : h2f(h); }
template <int KT>
__device__ __forceinline__ u16 f2kv(float f) { return KT == 2 ? f2bf(f) : f2h(f); }

// Signed 4-way byte dot product with accumulate.
__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block of one double per thread (blockDim.x a multiple of 32, at most 1024);
// every thread gets the total. Contains two __syncthreads.
__device__ __forceinline__ double block_sum_d(double s) {
    __shared__ double part[32];
    s = warp_sum_d(s);
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        double t = lane < (int)(blockDim.x / 32) ? part[lane] : 0.0;
        t = warp_sum_d(t);
        if (lane == 0) part[0] = t;
    }
    __syncthreads();
    return part[0];
}
__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Little-endian loads from 2-byte aligned addresses (GGUF blocks are only 2-byte aligned).
__device__ __forceinline__ u32 ld32(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}
__device__ __forceinline__ float ldh(const u8* p) { return h2f(*(const u16*)p); }

#define NEG_INF __int_as_float(0xff800000)

// Maximum over the whole block of one float per thread (blockDim.x a multiple of 32, at most
// 1024; NaN ignored like fmaxf); every thread gets it. Contains two __syncthreads.
__device__ __forceinline__ float block_max(float m) {
    __shared__ float part[32];
    m = warp_max(m);
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = m;
    __syncthreads();
    if (warp == 0) {
        float t = lane < (int)(blockDim.x / 32) ? part[lane] : NEG_INF;
        t = warp_max(t);
        if (lane == 0) part[0] = t;
    }
    __syncthreads();
    return part[0];
}

// Gated activations of act_mul (element-wise) and act_q8* (fused with the quantization): the same
// expressions in both, so both give the same values.
__device__ __forceinline__ float act_silu_mul(float v, float u) { return v / (1.0f + expf(-v)) * u; }
__device__ __forceinline__ float act_gelu_mul(float v, float u) {
    const float k0 = 0.7978846f, k1 = 0.044715f;
    return 0.5f * v * (1.0f + tanhf(k0 * v * (1.0f + k1 * v * v))) * u;
}

// Programmatic dependent launch (sm_90+, see `Device::launch_now` in device.rs). With PDL on, a kernel's
// blocks may start while the previous kernel of the stream is still running: every kernel calls
// pdl_wait() before it reads anything the previous kernel writes or writes anything it reads
// (griddepcontrol.wait returns once the previous grid has completed and its memory is visible;
// without PDL it returns at once), then pdl_trigger() lets the next kernel's blocks start.
// Every block of every kernel waits (a block that skipped the wait could let its grid complete
// before the previous one); `kernels::tests::every_kernel_waits` checks the sources.
// (Triggering before the wait, so the next kernel launches while this one waits, was slower:
// Llama-3-8B Q4_0 decode -4 %, docs/perf-log.md.)
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_resume() {
    pdl_wait();
    pdl_trigger();
}
#define PDL_ENTRY() \
    do { \
        pdl_wait(); \
        pdl_trigger(); \
    } while (0)

// ---- activation blocks of the quantized products (quant.cu) and their quantizers, shared with
// the decode attention, which quantizes its output for the next product (flash.cu) ----

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

// One warp per 32-element block (lane i holds element i): d = amax/127, multiplier 127/amax,
// round half to even.
__device__ __forceinline__ void q8_block(float v, AQ8* __restrict__ o, int lane) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = __float2int_rn(v * id);
    int sum = warp_sum_i(q);
    ((i8*)o->qs)[lane] = (i8)q;
    if (lane == 0) {
        o->d = round_f16(d);
        o->s = round_f16(d * (float)sum);
        o->sum = sum;
        o->pad = 0;
    }
}

// One warp per 256-element block (lane l holds elements 8l..8l+7), exactly ggml's
// quantize_row_q8_K_ref: the scale comes from the signed value of largest magnitude (first one
// on ties), iscale = -127/max.
__device__ __forceinline__ void q8k_block(const float v[8], AQ8K* __restrict__ o, int lane) {
    float amax = 0.0f, mx = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); mx = v[i]; idx = lane * 8 + i; }
    }
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) {
        float a2 = __shfl_xor_sync(0xffffffffu, amax, sh);
        float m2 = __shfl_xor_sync(0xffffffffu, mx, sh);
        int i2 = __shfl_xor_sync(0xffffffffu, idx, sh);
        if (a2 > amax || (a2 == amax && i2 < idx)) { amax = a2; mx = m2; idx = i2; }
    }
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

// ---- attention over one part of a selection (GLM's sparse attention, DeepSeek V4's sink
// attention): a block of 256 threads, the G query heads of a group sharing each row read ----
#define ATTN_PART 64    // rows per part
#define ATTN_MAX_G 16   // query heads per group
#define ATTN_MAX_HD 512 // head dim (a multiple of 32)
// Rows krows[j] / vrows[j] (j < m <= ATTN_PART; in shared memory, loaded by the caller, who
// synchronised after) against the G heads' queries qs ([G, hd] in shared memory; G*hd <= 4096):
// one warp per row (coalesced, every head's dot) into ps ([ATTN_MAX_G, ATTN_PART], shared), then
// per head the part's max m and sum l of exp(s - m) into part_ml[(base + g*parts)*2 ..+2], and
// acc = sum exp(s - m) v (threads over the head dim) into part_acc[(base + g*parts)*hd + d].
__device__ __forceinline__ void attn_part_rows(const float* qs, const float* const* krows,
                                               const float* const* vrows, int m, int G, int hd,
                                               float scale, int parts, size_t base, float* ps,
                                               float* __restrict__ part_acc,
                                               float* __restrict__ part_ml) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per = hd >> 5;
    for (int j = warp; j < m; j += nw) {
        const float* kr = krows[j];
        float kv[ATTN_MAX_HD / 32];
#pragma unroll
        for (int i = 0; i < ATTN_MAX_HD / 32; i++) kv[i] = i < per ? kr[lane + 32 * i] : 0.0f;
        for (int g = 0; g < G; g++) {
            const float* qg = qs + g * hd;
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < ATTN_MAX_HD / 32; i++)
                if (i < per) d += qg[lane + 32 * i] * kv[i];
            d = warp_sum(d);
            if (lane == 0) ps[g * ATTN_PART + j] = d * scale;
        }
    }
    __syncthreads();
    for (int g = warp; g < G; g += nw) {
        float* pg = ps + g * ATTN_PART;
        float a = lane < m ? pg[lane] : NEG_INF, b = lane + 32 < m ? pg[lane + 32] : NEG_INF;
        float mx = warp_max(fmaxf(a, b));
        float ea = lane < m ? expf(a - mx) : 0.0f, eb = lane + 32 < m ? expf(b - mx) : 0.0f;
        if (lane < m) pg[lane] = ea;
        if (lane + 32 < m) pg[lane + 32] = eb;
        float l = warp_sum(ea + eb);
        if (lane == 0) {
            size_t o = (base + (size_t)g * parts) * 2;
            part_ml[o] = mx;
            part_ml[o + 1] = l;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc[ATTN_MAX_G];
#pragma unroll
        for (int g = 0; g < ATTN_MAX_G; g++) acc[g] = 0.0f;
        for (int j = 0; j < m; j++) {
            float x = vrows[j][d];
#pragma unroll
            for (int g = 0; g < ATTN_MAX_G; g++)
                if (g < G) acc[g] += ps[g * ATTN_PART + j] * x;
        }
#pragma unroll
        for (int g = 0; g < ATTN_MAX_G; g++)
            if (g < G) part_acc[(base + (size_t)g * parts) * hd + d] = acc[g];
    }
}

// A batched step over several sequences' caches (CudaBackend::rope_store_attend_batch): `kvt`, where
// not null, holds for each query row `row` the K and V cache bases of that row's sequence, which
// replace the kernel's `kc` and `vc`. Before anything reads them (and before PDL_ENTRY: the table
// is uploaded before the step's kernels).
#define KVT_ROW(row)                                                                               \
    do {                                                                                           \
        if (kvt) {                                                                                 \
            kc = (decltype(kc))kvt[2 * (size_t)(row)];                                             \
            vc = (decltype(vc))kvt[2 * (size_t)(row) + 1];                                         \
        }                                                                                          \
    } while (0)
