// Q4_0 decode products in two weight layouts, as a chain of the Llama-3-8B decode step's products
// (docs/cuda.md, twenty-first slice; a standalone probe, not vela's kernels):
//   split: vela's split rows (per row nb x 16 quant bytes, then nb x 2 scale bytes) read by a port
//          of vela's `mvs` (two rows per warp, lane l takes blocks l, l + 32, ..., 4 blocks per
//          round, the single-weight products with a second round in flight);
//   tiled: 32-row tiles, the 16 quant bytes of rows 32G .. 32G + 31 of block b contiguous
//          ([G][b][lane], 512 bytes; scales likewise [G][b][lane], 64 bytes): lane l owns row
//          32G + l, so a warp's loads sweep one contiguous stream like a pure read, the
//          activation block is one warp-uniform (broadcast) load, and no shuffles are needed;
//          a block's NW warps split the row's blocks and add their sums in shared memory;
//   read:  pure-read kernels of the same bytes (chain_bw.cu's ceiling).
// Every kernel issues its first weight loads, then waits on the previous kernel (PDL) as vela's
// matvecs do (behind a branch, pdl_if; the activations here are read with .nc loads, which ptxas
// may move above such a wait, harmless only because nothing here ever writes X after its fill);
// the products are launched back to back in a captured graph (32 layers x Q/K/V 6144 rows, o
// 4096, gate+up 28672, down 4096 x 14336). Each layout's result is checked against a
// plain reference kernel.   nvcc -O3 -arch=sm_90 mv_layout.cu -o mv_layout && ./mv_layout
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

struct AQ8 { float d; float s; int sum; int pad; signed char qs[32]; };

__device__ __forceinline__ int dp4a(int a, int b, int c) { int r; asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c)); return r; }
__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ void pdl() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
}
// The wait behind a branch on a kernel argument (> 0 wherever it is used): with an unconditional
// wait, ptxas 12.9 schedules griddepcontrol.wait above the loads issued before it (calls 3-4 ran
// the split-row port, the tiles and `rd` that way: every load after the wait).
__device__ __forceinline__ void pdl_if(bool c) {
    if (c) pdl();
}
__device__ __forceinline__ u32 hash(u32 x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x; }
__device__ __forceinline__ int blockdot(uint4 q, const int (&a)[8]) {
    u32 w4[4] = {q.x, q.y, q.z, q.w};
    int isum = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        isum = dp4a((int)(w4[k] & 0x0F0F0F0Fu), a[k], isum);
        isum = dp4a((int)((w4[k] >> 4) & 0x0F0F0F0Fu), a[4 + k], isum);
    }
    return isum;
}
__device__ __forceinline__ void load_aq8(const AQ8* a, float& d, int& sum, int (&qs)[8]) {
    float4 h = *(const float4*)a;
    int4 q0 = ((const int4*)a)[1], q1 = ((const int4*)a)[2];
    d = h.x; sum = __float_as_int(h.z);
    qs[0] = q0.x; qs[1] = q0.y; qs[2] = q0.z; qs[3] = q0.w; qs[4] = q1.x; qs[5] = q1.y; qs[6] = q1.z; qs[7] = q1.w;
}

// Random split-row weights (rows x nb blocks) and activations.
__global__ void fill_split(u8* W, int rows, int nb, u32 seed) {
    size_t n = (size_t)rows * nb;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / nb, b = i % nb;
        u8* row = W + r * nb * 18;
        u32* q = (u32*)(row + 16 * b);
        for (int k = 0; k < 4; k++) q[k] = hash((u32)(i * 4 + k) ^ seed);
        float d = ((int)(hash((u32)i * 7u + seed) % 2001u) - 1000) * 2e-5f;
        ((__half*)(row + 16 * (size_t)nb))[b] = __float2half(d);
    }
}
__global__ void fill_x(AQ8* X, int nb, u32 seed) {
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += gridDim.x * blockDim.x) {
        int s = 0;
        for (int k = 0; k < 32; k++) { int v = (int)(hash(b * 32 + k + seed) % 255u) - 127; X[b].qs[k] = (signed char)v; s += v; }
        X[b].d = __half2float(__float2half(0.001f + (hash(b + seed * 3) % 1000u) * 1e-5f));
        X[b].sum = s; X[b].s = 0.0f; X[b].pad = 0;
    }
}
// split rows -> 32-row tiles ([G][b][lane] quants, then [G][b][lane] scales).
__global__ void repack_tiled(const u8* S, uint4* Q, u16* D, int rows, int nb) {
    size_t n = (size_t)rows * nb;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / nb, b = i % nb, G = r / 32, l = r % 32;
        const u8* row = S + r * nb * 18;
        size_t o = (G * nb + b) * 32 + l;
        Q[o] = ((const uint4*)row)[b];
        D[o] = ((const u16*)(row + 16 * (size_t)nb))[b];
    }
}
__global__ void ref(const u8* S, const AQ8* X, float* Y, int rows, int nb) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const u8* row = S + (size_t)r * nb * 18;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        int a[8], sum; float ad;
        load_aq8(X + b, ad, sum, a);
        int isum = blockdot(((const uint4*)row)[b], a) - 8 * sum;
        acc += (float)isum * (h2f(((const u16*)(row + 16 * (size_t)nb))[b]) * ad);
    }
    Y[r] = acc;
}

// Weight loads: plain ld.global.nc (L = 0, as vela), or not allocating in L1 (L = 1), so the
// activation blocks (read from L1 by every warp) are not evicted by the weight stream.
template <int L>
__device__ __forceinline__ uint4 ldw(const uint4* p) {
    if constexpr (L == 1) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
        return v;
    } else {
        return __ldg(p);
    }
}
template <int L>
__device__ __forceinline__ u16 ldd(const u16* p) {
    if constexpr (L == 1) {
        u16 v;
        asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
        return v;
    } else {
        return __ldg(p);
    }
}

// Port of vela's mvs<R, false, DB> without the K split: WB warps per block, R rows per warp, U
// blocks per lane and row per round (vela: R = 2, U = 4, WB = 4; DB in the single-weight
// products).
// MINB: __launch_bounds__'s minimum resident blocks per SM (a register cap: 4 warps per block and
// MINB = 5 allow at most 102 registers per thread, 6 at most 85).
template <bool DB, int R = 2, int U = 4, int L = 0, int WB = 4, int MINB = 1>
__global__ void __launch_bounds__(WB * 32, MINB) mvs(const u8* __restrict__ W, const AQ8* __restrict__ X, float* __restrict__ Y, int rows, int nb) {
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * WB + threadIdx.x / 32) * R;
    const uint4* wq[R]; const u16* wd[R];
    for (int q = 0; q < R; q++) {
        const u8* wr = W + (size_t)min(r0 + q, rows - 1) * nb * 18;
        wq[q] = (const uint4*)wr; wd[q] = (const u16*)(wr + 16 * (size_t)nb);
    }
    int hi = r0 < rows ? nb : 0;
    uint4 qv[U][R]; u16 dv[U][R];
    auto ld = [&](uint4 (&qq)[U][R], u16 (&dd)[U][R], int b0) {
#pragma unroll
        for (int u = 0; u < U; u++) { int b = b0 + 32 * u; if (b < hi) {
#pragma unroll
            for (int q = 0; q < R; q++) { qq[u][q] = ldw<L>(wq[q] + b); dd[u][q] = ldd<L>(wd[q] + b); } } }
    };
    ld(qv, dv, lane);
    pdl_if(nb > 0);
    float acc[R];
#pragma unroll
    for (int q = 0; q < R; q++) acc[q] = 0.0f;
    for (int b0 = lane; b0 < hi; b0 += 32 * U) {
        uint4 nq[U][R]; u16 nd[U][R];
        if (DB) ld(nq, nd, b0 + 32 * U);
#pragma unroll
        for (int u = 0; u < U; u++) { int b = b0 + 32 * u; if (b < hi) {
            int a[8], sum; float ad;
            load_aq8(X + b, ad, sum, a);
#pragma unroll
            for (int q = 0; q < R; q++) acc[q] += (float)(blockdot(qv[u][q], a) - 8 * sum) * (h2f(dv[u][q]) * ad);
        } }
        if (DB) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int q = 0; q < R; q++) { qv[u][q] = nq[u][q]; dv[u][q] = nd[u][q]; }
        } else ld(qv, dv, b0 + 32 * U);
    }
#pragma unroll
    for (int q = 0; q < R; q++) {
        float s = acc[q];
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && r0 + q < rows) Y[r0 + q] = s;
    }
}

// Tiled: block G = rows 32G .. 32G + 31; warp w takes blocks [w per, (w + 1) per) of the row,
// U per round (DB: the next round's loads issued before the current round is computed).
template <int NW, int U, bool DB>
__global__ void __launch_bounds__(NW * 32) mvt(const uint4* __restrict__ Q, const u16* __restrict__ D, const AQ8* __restrict__ X, float* __restrict__ Y, int nb) {
    __shared__ float red[NW][32];
    int G = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int per = (nb + NW - 1) / NW, lo = warp * per, hi = min(nb, lo + per);
    const uint4* q = Q + (size_t)G * nb * 32 + lane;
    const u16* d = D + (size_t)G * nb * 32 + lane;
    uint4 qv[U]; u16 dv[U];
    auto ld = [&](uint4 (&qq)[U], u16 (&dd)[U], int b0) {
#pragma unroll
        for (int u = 0; u < U; u++) { int b = b0 + u; if (b < hi) { qq[u] = q[(size_t)b * 32]; dd[u] = d[(size_t)b * 32]; } }
    };
    ld(qv, dv, lo);
    pdl_if(nb > 0);
    float acc = 0.0f;
    for (int b0 = lo; b0 < hi; b0 += U) {
        uint4 nq[U]; u16 nd[U];
        if (DB) ld(nq, nd, b0 + U);
#pragma unroll
        for (int u = 0; u < U; u++) { int b = b0 + u; if (b < hi) {
            int a[8], sum; float ad;
            load_aq8(X + b, ad, sum, a);
            acc += (float)(blockdot(qv[u], a) - 8 * sum) * (h2f(dv[u]) * ad);
        } }
        if (DB) {
#pragma unroll
            for (int u = 0; u < U; u++) { qv[u] = nq[u]; dv[u] = nd[u]; }
        } else ld(qv, dv, b0 + U);
    }
    red[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) s += red[w][lane];
        Y[G * 32 + lane] = s;
    }
}

__global__ void __launch_bounds__(256) rd(const uint4* __restrict__ p, size_t n, float* out) {
    size_t st = (size_t)gridDim.x * blockDim.x, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    u32 s = 0;
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = i + u * st < n ? __ldg(p + i + u * st) : make_uint4(0, 0, 0, 0);
    pdl_if(n > 0);
    for (;;) {
#pragma unroll
        for (int u = 0; u < 8; u++) s ^= v[u].x + v[u].y + v[u].z + v[u].w;
        i += st * 8;
        if (i >= n) break;
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = i + u * st < n ? __ldg(p + i + u * st) : make_uint4(0, 0, 0, 0);
    }
    if (s == 0x12345678u) *out = 1.0f;
}

// chain_bw.cu's read kernel (mode 1: wait + trigger after the first round), for comparison.
template <int U>
__global__ void __launch_bounds__(256) rd2(const uint4* __restrict__ p, size_t n, unsigned* out, int mode) {
    size_t st = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned s = 0;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = i + u * st < n ? __ldg(p + i + u * st) : make_uint4(0, 0, 0, 0);
    if (mode == 1) pdl();
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) s ^= v[u].x + v[u].y + v[u].z + v[u].w;
        i += st * U;
        if (i >= n) break;
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = i + u * st < n ? __ldg(p + i + u * st) : make_uint4(0, 0, 0, 0);
    }
    if (s == 0x12345678u) *out = s;
}

struct Mat { int rows, nb; u8* S; uint4* Q; u16* D; AQ8* X; float* Y; };

template <typename K, typename... A>
static int launch(cudaStream_t s, K k, int grid, int threads, A... a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid); cfg.blockDim = dim3(threads); cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, a...));
    return 0;
}

// Variant v of one product: 0 read, 1 split (mvs, DB for single-weight products), 2.. tiled.
static int product(cudaStream_t s, int v, const Mat& m, bool single, int sms) {
    int rows = m.rows, nb = m.nb;
    switch (v) {
    case 0: return launch(s, rd, sms * 4, 256, (const uint4*)m.S, (size_t)rows * nb * 18 / 16, m.Y);
    case 1: return single ? launch(s, mvs<true>, (rows + 7) / 8, 128, (const u8*)m.S, (const AQ8*)m.X, m.Y, rows, nb)
                          : launch(s, mvs<false>, (rows + 7) / 8, 128, (const u8*)m.S, (const AQ8*)m.X, m.Y, rows, nb);
    case 2: return launch(s, mvt<8, 8, false>, rows / 32, 256, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb);
    case 3: return launch(s, mvt<8, 4, true>, rows / 32, 256, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb);
    case 4: return launch(s, mvt<16, 4, true>, rows / 32, 512, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb);
    case 5: return launch(s, mvt<16, 8, false>, rows / 32, 512, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb);
    case 6: return launch(s, mvt<4, 8, true>, rows / 32, 128, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb);
    // Warps per row following the row count: 16 for the 4,096-row products, 8 above.
    case 7: return rows <= 8192 ? launch(s, mvt<16, 4, true>, rows / 32, 512, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb)
                                : launch(s, mvt<8, 4, true>, rows / 32, 256, (const uint4*)m.Q, (const u16*)m.D, (const AQ8*)m.X, m.Y, nb);
    case 8: return launch(s, rd2<8>, sms * 4, 256, (const uint4*)m.S, (size_t)rows * nb * 18 / 16, (unsigned*)m.Y, 1);
#define MVS(DB, R, U, L, WB) launch(s, mvs<DB, R, U, L, WB>, (rows + WB * R - 1) / (WB * R), WB * 32, (const u8*)m.S, (const AQ8*)m.X, m.Y, rows, nb)
    case 9: return single ? MVS(true, 2, 4, 1, 4) : MVS(false, 2, 4, 1, 4);
    case 10: return MVS(false, 2, 8, 0, 4);
    case 11: return MVS(true, 1, 4, 0, 4);
    case 12: return single ? MVS(true, 2, 4, 0, 8) : MVS(false, 2, 4, 0, 8);
    // Half a row's blocks per lane in each of two rounds (128 blocks: 2 per round; 448: 7).
    case 13: return nb == 448 ? MVS(true, 2, 7, 0, 4) : MVS(true, 2, 2, 0, 4);
    case 14: return single ? MVS(true, 2, 4, 0, 2) : MVS(false, 2, 4, 0, 2);
#define MVSB(DB, R, U, L, WB, MINB) launch(s, mvs<DB, R, U, L, WB, MINB>, (rows + WB * R - 1) / (WB * R), WB * 32, (const u8*)m.S, (const AQ8*)m.X, m.Y, rows, nb)
    // Prepared after session 20's last device call, not yet run: the no-L1 split rows with four
    // rows per warp (each activation block loaded once for four rows), and with the register caps
    // of 5 and 6 blocks per SM (the single products' 116 registers allow 4).
    case 15: return single ? MVSB(true, 4, 2, 1, 4, 1) : MVSB(false, 4, 2, 1, 4, 1);
    case 16: return single ? MVSB(true, 2, 4, 1, 4, 5) : MVSB(false, 2, 4, 1, 4, 5);
    case 17: return single ? MVSB(true, 2, 4, 1, 4, 6) : MVSB(false, 2, 4, 1, 4, 6);
    }
    return 1;
}
static const char* NAMES[] = {"pure read", "split rows (vela mvs port)", "tiled NW8 U8", "tiled NW8 U4 DB",
                              "tiled NW16 U4 DB", "tiled NW16 U8", "tiled NW4 U8 DB", "tiled NW16/8 U4 DB", "pure read (chain_bw's kernel)",
                              "split rows, weights not in L1", "split rows R2 U8", "split rows R1 U4 DB",
                              "split rows, 8 warps per block", "split rows, 2 rounds of half a row",
                              "split rows, 2 warps per block", "no-L1 split rows, 4 rows per warp",
                              "no-L1 split rows, at most 102 registers", "no-L1 split rows, at most 85 registers"};
#define NV 18

// Arguments: [sep|arena|async] [variants]: how each product's split-row weights are allocated
// (sep: one cudaMalloc each; arena: carved from one cudaMalloc, contiguous in launch order;
// async: one cudaMallocAsync each, the stream-ordered pool vela's uploads use through cudarc), and
// how many of the variants run (2: the pure read and the split rows only; the tiles' buffers are
// then not allocated).
int main(int argc, char** argv) {
    const char* alloc = argc > 1 ? argv[1] : "sep";
    int nv = argc > 2 ? atoi(argv[2]) : NV;
    // Third argument: the variants to run, comma-separated (default 0 .. nv - 1, with nv = 2 the
    // pure read, split rows and chain_bw's read); a fourth argument "ncu": launch each of them once
    // on the first layer's down and gate/up products and exit (for a profiler).
    std::vector<int> vl;
    if (argc > 3) {
        for (const char* p = argv[3]; *p;) {
            vl.push_back(atoi(p));
            while (*p && *p != ',') p++;
            if (*p) p++;
        }
    } else {
        for (int v = 0; v < nv; v++) vl.push_back(v);
        if (nv == 2) vl.push_back(8);
    }
    bool ncu = argc > 4 && !strcmp(argv[4], "ncu");
    bool tiles = false;
    for (int v : vl) tiles |= v >= 2 && v <= 7;
    if (tiles && nv <= 2) nv = NV;
    bool arena = !strcmp(alloc, "arena"), async = !strcmp(alloc, "async");
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int L = 32;
    int shapes[4][2] = {{6144, 128}, {4096, 128}, {28672, 128}, {4096, 448}};  // rows, blocks
    bool singles[4] = {false, true, false, true};
    const char* pn[4] = {"qkv", "o", "gate+up", "down"};
    AQ8 *X128, *X448;
    CK(cudaMalloc(&X128, 128 * sizeof(AQ8)));
    CK(cudaMalloc(&X448, 448 * sizeof(AQ8)));
    fill_x<<<4, 128>>>(X128, 128, 11);
    fill_x<<<4, 128>>>(X448, 448, 12);
    std::vector<Mat> mats;
    double bytes = 0;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    u8* pool = nullptr;
    size_t pool_off = 0;
    if (arena) {
        size_t tot = 0;
        for (int p = 0; p < 4; p++) tot += ((size_t)shapes[p][0] * shapes[p][1] * 18 + 64 + 4095) / 4096 * 4096;
        CK(cudaMalloc(&pool, tot * L));
    }
    for (int l = 0; l < L; l++)
        for (int p = 0; p < 4; p++) {
            Mat m;
            m.rows = shapes[p][0]; m.nb = shapes[p][1];
            size_t n = (size_t)m.rows * m.nb;
            if (arena) {
                m.S = pool + pool_off;
                pool_off += (n * 18 + 64 + 4095) / 4096 * 4096;
            } else if (async) {
                CK(cudaMallocAsync((void**)&m.S, n * 18 + 64, s));
                CK(cudaStreamSynchronize(s));
            } else {
                CK(cudaMalloc(&m.S, n * 18 + 64));
            }
            m.Q = nullptr;
            m.D = nullptr;
            if (nv > 2) {
                CK(cudaMalloc(&m.Q, n * 16));
                CK(cudaMalloc(&m.D, n * 2));
            }
            CK(cudaMalloc(&m.Y, m.rows * sizeof(float)));
            m.X = m.nb == 128 ? X128 : X448;
            fill_split<<<sms * 8, 256>>>(m.S, m.rows, m.nb, 1000u * l + p);
            if (nv > 2) repack_tiled<<<sms * 8, 256>>>(m.S, m.Q, m.D, m.rows, m.nb);
            bytes += n * 18.0;
            mats.push_back(m);
        }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    printf("ALLOC | %s | variants %d |\n", alloc, nv);
    // Correctness: every variant against the reference, on one layer's four products.
    float* yr;
    CK(cudaMalloc(&yr, 28672 * sizeof(float)));
    for (int p = 0; p < 4; p++) {
        const Mat& m = mats[p];
        std::vector<float> a(m.rows), b(m.rows);
        ref<<<(m.rows + 127) / 128, 128, 0, s>>>(m.S, m.X, yr, m.rows, m.nb);
        CK(cudaMemcpyAsync(a.data(), yr, m.rows * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        for (int v : vl) {
            if (v == 0 || v == 8) continue;
            CK(cudaMemsetAsync(m.Y, 0xff, m.rows * 4, s));
            if (product(s, v, m, singles[p], sms)) return 1;
            CK(cudaMemcpyAsync(b.data(), m.Y, m.rows * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            double err = 0, mag = 0;
            for (int r = 0; r < m.rows; r++) { err = std::max(err, (double)fabsf(a[r] - b[r])); mag = std::max(mag, (double)fabsf(a[r])); }
            printf("CHECK | %s | %s | max abs err %.3g (max |y| %.3g) | %s |\n", pn[p], NAMES[v], err, mag,
                   err <= 1e-4 * mag + 1e-6 ? "ok" : "FAIL");
        }
    }
    if (ncu) {
        for (int v : vl)
            for (int p : {3, 2})
                if (product(s, v, mats[p], singles[p], sms)) return 1;
        CK(cudaStreamSynchronize(s));
        printf("ncu launches done\n");
        return 0;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Chains: the whole step's products (all four per layer), then each product kind alone (32
    // launches of it, one per layer).
    for (int only = -1; only < 4; only++) {
        double by = 0;
        for (int l = 0; l < L; l++)
            for (int p = 0; p < 4; p++)
                if (only < 0 || p == only) by += (double)mats[l * 4 + p].rows * mats[l * 4 + p].nb * 18;
        for (int rep = 0; rep < 2; rep++)
            for (int v : vl) {
                cudaGraph_t gr;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
                for (int l = 0; l < L; l++)
                    for (int p = 0; p < 4; p++)
                        if (only < 0 || p == only)
                            if (product(s, v, mats[l * 4 + p], singles[p], sms)) return 1;
                CK(cudaStreamEndCapture(s, &gr));
                CK(cudaGraphInstantiate(&ge, gr, 0));
                std::vector<float> ms;
                for (int r = 0; r < 23; r++) {
                    CK(cudaEventRecord(e0, s));
                    CK(cudaGraphLaunch(ge, s));
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    float t;
                    CK(cudaEventElapsedTime(&t, e0, e1));
                    if (r >= 3) ms.push_back(t);
                }
                std::sort(ms.begin(), ms.end());
                printf("CHAIN | %s | %s | %.1f us (min %.1f, max %.1f) | %.0f GB/s |\n", only < 0 ? "all products x32" : pn[only],
                       NAMES[v], ms[10] * 1e3, ms[0] * 1e3, ms[19] * 1e3, by / (ms[10] * 1e-3) / 1e9);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(gr));
            }
    }
    printf("bytes per step (products) %.1f MB\n", bytes / 1e6);
    return 0;
}
