// One-token (decode) quantized matvecs. Part of the "quant" group: NVRTC compiles this file
// after quant.cu (see GROUPS in src/kernels.rs), whose types and block decoders it uses.

// ---- decode matvec (one token) ----
//
// Same work split and the same per-lane accumulation order as mm32/mmk (one warp per row, lane l
// takes blocks l, l + 32, ...). Activation blocks are read with 16-byte loads into registers.
// 32-element formats: weights staged through shared memory with 16-byte loads (see mv32).
// k-quants: each lane issues the loads of MVU_K sub-blocks before using any of them, Q4_K/Q5_K
// weights (16-byte aligned blocks of 144/176 bytes) with 16-byte loads.
#define MVU_K 4

// Programmatic dependent launch in the matvecs: the kernels start with MV_ENTRY() instead of
// PDL_ENTRY(), and each product issues the loads of its first weights (constant data, never
// written by the previous kernel) before MV_RESUME() waits for the previous kernel and lets the
// next one start: a block made resident while the previous kernel still runs (its tail) already
// has weight bytes in flight. Every thread of every block reaches MV_RESUME() exactly once,
// before it reads the activations or writes anything. (The weights' upload synchronizes the
// stream after its repack kernel, so no kernel that writes weights can precede a matvec.)
// Llama-3-8B Q4_0 decode +7 % against waiting at the kernel's entry (docs/perf-log.md).
#define MV_ENTRY() do {} while (0)
#define MV_RESUME() pdl_resume()
// The products that issue weight loads before the wait call MV_RESUME() behind a branch on the
// row's block count (`if (mv_guard(nb))`, nb > 0 in every launch, so every thread still waits).
// With the wait unconditional, ptxas may schedule it above those loads: ptxas 12.9 and the H200's
// NVRTC 13.0 did so in mv_q4_ks, and with the no-allocate weight loads (below) in mv_q4_0s_r2 /
// _x3_r2 and mv_mix32_x3 as well (SASS: the wait first, every load after it).
// Behind the branch the weight loads stay first, but ptxas then treated the activation loads
// (ld.global.nc, read-only, which it takes as invariant) as free to move above the wait: in
// mv_q8_0_r2n they were, a race with the kernel that writes them (run-to-run differences of the
// Qwen2.5-0.5B geometry's greedy output). So the guarded products read their activations with
// coherent loads (lda16 / lda4), which may not pass the wait's acquire.
// `scripts/sass-check.sh` fails if a decode matvec issues any load but a weight load (LDG.E.NA)
// before its wait.
__device__ __forceinline__ bool mv_guard(int nb) {
    return nb > 0;
}
// Activation loads of the guarded products (coherent ld.global, allocating in L1).
__device__ __forceinline__ int4 lda16(const void* p) {
    int4 v;
    asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ int lda4(const void* p) {
    int v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// Weight loads of the decode matvecs (mvs, mvks, mv32 and the products built on them; ks_load also
// serves the split-row k-quant prefill kernels through decodek_at, which read each weight once
// too). Each weight byte is read once per token, so the loads do not allocate in L1
// (ld.global.nc.L1::no_allocate): the stream would otherwise evict the activation blocks that
// every warp of the SM re-reads from L1 (an L2 round trip each time). Decode +1.4 % (Llama-3-8B
// Q4_0) to +2.3 % (Qwen2.5-0.5B) on the H200 (docs/perf-log.md).
__device__ __forceinline__ uint4 ldw16(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldw8(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ u16 ldw2(const u16* p) {
    u16 v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
// Sub-blocks in flight per lane and row with two rows per warp.
#define MVU_K_R2 2

__device__ __forceinline__ void load_aq8(const AQ8* a, float& d, float& s, int& sum, int qs[8]) {
    int4 h = lda16(a);
    int4 q0 = lda16((const int4*)a + 1), q1 = lda16((const int4*)a + 2);
    d = __int_as_float(h.x);
    s = __int_as_float(h.y);
    sum = h.z;
    qs[0] = q0.x; qs[1] = q0.y; qs[2] = q0.z; qs[3] = q0.w;
    qs[4] = q1.x; qs[5] = q1.y; qs[6] = q1.z; qs[7] = q1.w;
}

// One warp per row. GGUF's 32-element blocks (18-34 bytes) are only 2-byte aligned, so reading
// them in place costs one 2-byte load per 2 bytes (an ncu profile showed such a kernel
// issue-bound at ~1 TB/s with 23 % occupancy). Here the warp copies 64 blocks of its row at a
// time into shared memory with 16-byte loads (all in flight before the first use; the row start
// is rounded down to 16 bytes and up to 15 bytes past its end are read, hence WEIGHT_PAD on the
// host), then lane l decodes blocks l and l + 32 from shared memory. Per lane the blocks are
// accumulated in the order l, l + 32, l + 64, ... exactly like mm32.
//
// K split (`split` warps per row; the host always passes 1, MV_SPLIT in matmul.rs): warp w of
// the block takes row blk * (WARPS / split) + w / split and the part w % split of its blocks
// (parts are whole multiples of 8 blocks, so each starts 16-byte aligned relative to the row's
// rounded-down start); the parts' sums are added in part order through shared memory. Splitting
// and 128-block segments were slower on Llama-3-8B Q4_0 decode (docs/perf-log.md).
// Rows and K part of this warp of block blk (R rows per warp, `split` warps per row): the first
// row r0, the part and its range lo..hi of the row's n units (blocks or sub-blocks; parts
// rounded up to multiples of ALIGN units).
template <int ALIGN>
__device__ __forceinline__ void mv_part(int blk, int R, int split, int n, int& r0, int& part,
                                        int& lo, int& hi) {
    int warp = threadIdx.x / 32;
    r0 = (blk * (WARPS / split) + warp / split) * R;
    part = warp % split;
    int per = ((n + split - 1) / split + ALIGN - 1) / ALIGN * ALIGN;
    lo = part * per;
    hi = min(n, lo + per);
}

// Y[r0 + q] = the warp's sum of acc[q] (plus that of accm[q] when M: s + sm, as in mm32); with a
// K split, the parts' sums of each row added in part order through shared memory.
// BIAS: Y[r] = the sum + B[r] (the bias of Q/K/V products, added where the row is written: the
// same float addition as a separate add_bias).
template <int R, bool M, bool BIAS = false>
__device__ __forceinline__ void mv_store(const float (&acc)[R], const float (&accm)[R], float* Y,
                                         int r0, int rows, int part, int split,
                                         const float* B = nullptr) {
    __shared__ float red[WARPS][R][M ? 2 : 1];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (split == 1) {
#pragma unroll
        for (int q = 0; q < R; q++) {
            float s = warp_sum(acc[q]);
            if (M) s = s + warp_sum(accm[q]);
            if (lane == 0 && r0 + q < rows) Y[r0 + q] = BIAS ? s + B[r0 + q] : s;
        }
        return;
    }
#pragma unroll
    for (int q = 0; q < R; q++) {
        float s = warp_sum(acc[q]);
        float sm = M ? warp_sum(accm[q]) : 0.0f;
        if (lane == 0) {
            red[warp][q][0] = s;
            if (M) red[warp][q][M ? 1 : 0] = sm;  // (index 0 when !M: compiled, never run)
        }
    }
    __syncthreads();
    if (part == 0 && lane == 0) {
#pragma unroll
        for (int q = 0; q < R; q++) {
            if (r0 + q >= rows) continue;
            float a = 0.0f, b = 0.0f;
            for (int p = 0; p < split; p++) {
                a += red[warp + p][q][0];
                if (M) b += red[warp + p][q][M ? 1 : 0];
            }
            float y = M ? a + b : a;
            Y[r0 + q] = BIAS ? y + B[r0 + q] : y;
        }
    }
}

#define MV_SEG 64
// R rows per warp: warp w of block blk takes rows R * (blk * (WARPS / split) + w / split) ..
// + R - 1 (with a K split, part w % split of their blocks) and loads each activation block once for its R rows (an ncu profile of the R = 1
// kernel on Llama-3-8B decode showed the L1/TEX pipe at 74-83 % with DRAM at 41-50 %: per
// 18-byte Q4_0 block a lane read 48 bytes of activations). Each row's blocks are accumulated in
// the same order as with R = 1, so the results are identical.
// Segment b0's weights of the warp's R rows (16-byte loads from the rounded-down row starts, see
// mv32) into registers.
template <int T, int R, int N16>
__device__ __forceinline__ void mv32_load(uint4 tmp[R][(N16 + 31) / 32], const uint4* const base[R],
                                          const int skew[R], int b0, int hi, int lane, int r0,
                                          int rows) {
    constexpr int BYTES = B32<T>::BYTES;
    int nblk = min(MV_SEG, hi - b0);
#pragma unroll
    for (int q = 0; q < R; q++) {
        int n16 = (skew[q] + nblk * BYTES + 15) / 16;
        // b0 is a multiple of 8 blocks, 8 * BYTES a multiple of 16.
        const uint4* src = base[q] + (size_t)b0 * BYTES / 16;
#pragma unroll
        for (int k = 0; k < (N16 + 31) / 32; k++) {
            int i = lane + 32 * k;
            if (i < n16 && r0 + q < rows) tmp[q][k] = ldw16(src + i);
        }
    }
}

template <int T, int R, bool BIAS = false>
__device__ __forceinline__ void mv32(const u8* __restrict__ W, const AQ8* __restrict__ X,
                                     float* __restrict__ Y, int rows, int nb, int blk, int split,
                                     const float* B = nullptr) {
    constexpr int BYTES = B32<T>::BYTES;
    constexpr int N16 = (MV_SEG * BYTES + 15) / 16 + 1;
    __shared__ uint4 stage[WARPS][R][N16];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int r0, part, lo, hi;
    mv_part<8>(blk, R, split, nb, r0, part, lo, hi);
    float acc[R], accm[R];
    int skew[R];
    const uint4* base[R];
#pragma unroll
    for (int q = 0; q < R; q++) {
        acc[q] = accm[q] = 0.0f;
        const u8* wr = W + (size_t)min(r0 + q, rows - 1) * nb * BYTES;
        skew[q] = (int)((size_t)wr & 15);
        base[q] = (const uint4*)(wr - skew[q]);
    }
    // tmp holds the next segment's weights: with the software pipeline (default) the loads of
    // segment i + 1 are issued before segment i is computed, so a warp always has a segment in
    // flight (MV_NOPIPE: load, then compute, one segment at a time).
    uint4 tmp[R][(N16 + 31) / 32];
    if (r0 < rows) mv32_load<T, R, N16>(tmp, base, skew, lo, hi, lane, r0, rows);
    if (mv_guard(nb)) MV_RESUME();
    if (r0 < rows) {
        for (int b0 = lo; b0 < hi; b0 += MV_SEG) {
            int nblk = min(MV_SEG, hi - b0);
#pragma unroll
            for (int q = 0; q < R; q++) {
                int n16 = (skew[q] + nblk * BYTES + 15) / 16;
#pragma unroll
                for (int k = 0; k < (N16 + 31) / 32; k++) {
                    int i = lane + 32 * k;
                    if (i < n16 && r0 + q < rows) stage[warp][q][i] = tmp[q][k];
                }
            }
            __syncwarp();
            if (b0 + MV_SEG < hi) mv32_load<T, R, N16>(tmp, base, skew, b0 + MV_SEG, hi, lane, r0, rows);
#pragma unroll
            for (int u = 0; u < MV_SEG / 32; u++) {
                int lb = lane + 32 * u;
                if (lb < nblk) {
                    int aq[8], asum;
                    float ad, as;
                    load_aq8(X + b0 + lb, ad, as, asum, aq);
#pragma unroll
                    for (int q = 0; q < R; q++) {
                        if (r0 + q < rows) {
                            int w[8];
                            float d, m;
                            decode32<T>((const u8*)stage[warp][q] + skew[q] + lb * BYTES, w, d, m);
                            int isum = 0;
#pragma unroll
                            for (int k = 0; k < 8; k++) isum = dp4a(w[k], aq[k], isum);
                            isum -= B32<T>::OFF * asum;
                            acc[q] += (float)isum * (d * ad);
                            if (B32<T>::MIN) accm[q] += m * as;
                        }
                    }
                }
            }
            // The next segment overwrites the stage.
            __syncwarp();
        }
    }
    mv_store<R, true, BIAS>(acc, accm, Y, r0, rows, part, split, B);
}

// Narrow rows (a whole row in one MV_SEG segment: nb <= 64, e.g. the Q8_0 LM heads of
// SmolLM2 (18 blocks), Gemma 3 270M (20) and Qwen2.5-0.5B (28)): mv32 gives each warp one
// group of R rows, so a warp lives for one round trip and its block for little more. Here each
// warp takes G consecutive groups of R rows and loads group g + 1's weights (into tmp) before it
// computes group g from the stage, so a load is always in flight; the lane's activation blocks
// are loaded once for all groups. Per row the same lanes, blocks and order as mv32, so the
// results equal mv32's (`mv_*_r2`).
template <int T, int R, int G>
__device__ __forceinline__ void mv32_narrow(const u8* __restrict__ W, const AQ8* __restrict__ X,
                                            float* __restrict__ Y, int rows, int nb, int blk) {
    constexpr int BYTES = B32<T>::BYTES;
    constexpr int N16 = (MV_SEG * BYTES + 15) / 16 + 1;
    __shared__ uint4 stage[WARPS][R][N16];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int g0 = (blk * WARPS + warp) * G;
    int skew[R];
    const uint4* base[R];
    auto rows_of = [&](int g) {
#pragma unroll
        for (int q = 0; q < R; q++) {
            const u8* wr = W + (size_t)min((g0 + g) * R + q, rows - 1) * nb * BYTES;
            skew[q] = (int)((size_t)wr & 15);
            base[q] = (const uint4*)(wr - skew[q]);
        }
    };
    uint4 tmp[R][(N16 + 31) / 32];
    rows_of(0);
    if (g0 * R < rows) mv32_load<T, R, N16>(tmp, base, skew, 0, nb, lane, g0 * R, rows);
    if (mv_guard(nb)) MV_RESUME();
    int aq[2][8], asum[2];
    float ad[2], as[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int lb = lane + 32 * u;
        if (lb < nb) load_aq8(X + lb, ad[u], as[u], asum[u], aq[u]);
    }
    for (int g = 0; g < G; g++) {
        int r0 = (g0 + g) * R;
        if (r0 >= rows) break;
        int sk[R];
#pragma unroll
        for (int q = 0; q < R; q++) {
            sk[q] = skew[q];
            int n16 = (skew[q] + nb * BYTES + 15) / 16;
#pragma unroll
            for (int k = 0; k < (N16 + 31) / 32; k++) {
                int i = lane + 32 * k;
                if (i < n16 && r0 + q < rows) stage[warp][q][i] = tmp[q][k];
            }
        }
        __syncwarp();
        if (g + 1 < G && r0 + R < rows) {
            rows_of(g + 1);
            mv32_load<T, R, N16>(tmp, base, skew, 0, nb, lane, r0 + R, rows);
        }
        float acc[R], accm[R];
#pragma unroll
        for (int q = 0; q < R; q++) acc[q] = accm[q] = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int lb = lane + 32 * u;
            if (lb < nb) {
#pragma unroll
                for (int q = 0; q < R; q++) {
                    if (r0 + q < rows) {
                        int w[8];
                        float d, m;
                        decode32<T>((const u8*)stage[warp][q] + sk[q] + lb * BYTES, w, d, m);
                        int isum = 0;
#pragma unroll
                        for (int k = 0; k < 8; k++) isum = dp4a(w[k], aq[u][k], isum);
                        isum -= B32<T>::OFF * asum[u];
                        acc[q] += (float)isum * (d * ad[u]);
                        if (B32<T>::MIN) accm[q] += m * as[u];
                    }
                }
            }
        }
        mv_store<R, true>(acc, accm, Y, r0, rows, 0, 1);
        // The next group overwrites the stage.
        __syncwarp();
    }
}
// (2 and 8 groups measured the same as 4 on the H200, docs/perf-log.md.)
#define MV32_NARROW_G 4

// Split-row Q4_0 (type 102, see decode32_at in quant.cu): no staging. Lane l takes blocks l,
// l + 32, ... of the warp's R rows (rows and K split as in mv32), issuing the 16-byte quant and
// 2-byte scale loads of MVS_U blocks per row before using any of them; every warp-wide quant load
// reads 512 contiguous bytes. Per lane the blocks are accumulated in the order l, l + 32, ... like
// mm32. (8 blocks in flight were no faster on Llama-3-8B Q4_0 decode, docs/perf-log.md.)
#define MVS_U 4
// One round of mvs's weight loads: blocks b0, b0 + 32, ... (MVS_U of them, those < hi) of the R
// rows.
template <int R>
__device__ __forceinline__ void mvs_load(uint4 (&qv)[MVS_U][R], u16 (&dv)[MVS_U][R],
                                         const uint4* const (&wq)[R], const u16* const (&wd)[R],
                                         int b0, int hi) {
#pragma unroll
    for (int u = 0; u < MVS_U; u++) {
        int b = b0 + 32 * u;
        if (b < hi) {
#pragma unroll
            for (int q = 0; q < R; q++) {
                qv[u][q] = ldw16(wq[q] + b);
                dv[u][q] = ldw2(wd[q] + b);
            }
        }
    }
}
// The quant and scale arrays of the warp's R split rows (rows past the end point at the last
// row; the callers skip them).
template <int R>
__device__ __forceinline__ void mvs_rows(const u8* W, int rows, int nb, int r0,
                                         const uint4* (&wq)[R], const u16* (&wd)[R]) {
#pragma unroll
    for (int q = 0; q < R; q++) {
        const u8* wr = W + (size_t)min(r0 + q, rows - 1) * nb * 18;
        wq[q] = (const uint4*)wr;
        wd[q] = (const u16*)(wr + 16 * (size_t)nb);
    }
}
// DB (the single-weight two-row launches `*_r2`: the 8B's o and down products): the next round's
// loads are issued before the current round is computed, into a second register set, so two
// rounds are in flight per lane (same arithmetic and order; 116 instead of 72 registers).
// Llama-3-8B Q4_0 decode +2 %; in the Q/K/V and gate/up launches too (x3, 120 registers) it was
// slower, so those keep one round (docs/perf-log.md).
template <int R, bool BIAS = false, bool DB = false>
__device__ __forceinline__ void mvs(const u8* __restrict__ W, const AQ8* __restrict__ X,
                                    float* __restrict__ Y, int rows, int nb, int blk, int split,
                                    const float* B = nullptr) {
    int lane = threadIdx.x & 31;
    int r0, part, lo, hi;
    mv_part<1>(blk, R, split, nb, r0, part, lo, hi);
    float acc[R];
#pragma unroll
    for (int q = 0; q < R; q++) acc[q] = 0.0f;
    const uint4* wq[R];
    const u16* wd[R];
    mvs_rows<R>(W, rows, nb, r0, wq, wd);
    if (r0 >= rows) hi = lo;
    // The loads of each round are issued at the end of the previous one (the first round's
    // before MV_RESUME).
    uint4 qv[MVS_U][R];
    u16 dv[MVS_U][R];
    mvs_load<R>(qv, dv, wq, wd, lo + lane, hi);
    if (mv_guard(nb)) MV_RESUME();
    for (int b0 = lo + lane; b0 < hi; b0 += 32 * MVS_U) {
        uint4 nq[MVS_U][R];
        u16 nd[MVS_U][R];
        if constexpr (DB) mvs_load<R>(nq, nd, wq, wd, b0 + 32 * MVS_U, hi);
#pragma unroll
        for (int u = 0; u < MVS_U; u++) {
            int b = b0 + 32 * u;
            if (b < hi) {
                int aq[8], asum;
                float ad, as;
                load_aq8(X + b, ad, as, asum, aq);
#pragma unroll
                for (int q = 0; q < R; q++) {
                    u32 w4[4] = {qv[u][q].x, qv[u][q].y, qv[u][q].z, qv[u][q].w};
                    int isum = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        isum = dp4a((int)(w4[k] & 0x0F0F0F0Fu), aq[k], isum);
                        isum = dp4a((int)((w4[k] >> 4) & 0x0F0F0F0Fu), aq[4 + k], isum);
                    }
                    isum -= 8 * asum;
                    acc[q] += (float)isum * (h2f(dv[u][q]) * ad);
                }
            }
        }
        if constexpr (DB) {
#pragma unroll
            for (int u = 0; u < MVS_U; u++)
#pragma unroll
                for (int q = 0; q < R; q++) {
                    qv[u][q] = nq[u][q];
                    dv[u][q] = nd[u][q];
                }
        } else {
            mvs_load<R>(qv, dv, wq, wd, b0 + 32 * MVS_U, hi);
        }
    }
    mv_store<R, false, BIAS>(acc, acc, Y, r0, rows, part, split, B);
}

// scale_min_k4 on the 12 scale bytes held in three words (selects instead of a local array
// indexed by the lane's sub-block).
__device__ __forceinline__ int byte12(u32 a, u32 b, u32 c, int i) {
    u32 w = i < 4 ? a : (i < 8 ? b : c);
    return (int)((w >> (8 * (i & 3))) & 0xffu);
}
__device__ __forceinline__ void scale_min_k4_w(int j, u32 a, u32 b, u32 c, int& sc, int& m) {
    if (j < 4) {
        sc = byte12(a, b, c, j) & 63;
        m = byte12(a, b, c, j + 4) & 63;
    } else {
        sc = (byte12(a, b, c, j + 4) & 0xF) | ((byte12(a, b, c, j - 4) >> 6) << 4);
        m = (byte12(a, b, c, j + 4) >> 4) | ((byte12(a, b, c, j) >> 6) << 4);
    }
}

// Bytes p..p+3 of two consecutive aligned words lo, hi, where p = word start + sh / 8.
__device__ __forceinline__ u32 funnel(u32 lo, u32 hi, u32 sh) {
    u32 r;
    asm("shf.r.clamp.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sh));
    return r;
}

// Sub-block j of a Q4_K/Q5_K block with 16-byte loads (the block must be 16-byte aligned).
// Q6_K blocks (210 bytes) are only 2-byte aligned: its 32 bytes of low and high quant bits are
// read as 9 aligned words each and shifted into place (instead of 16 two-byte loads each), the
// two scales as one 2-byte load. Same outputs as decodek.
template <int T>
__device__ __forceinline__ void decodek_v(const u8* b, int j, int w[8], int sc[2], int mn[2],
                                          float& d, float& dmin) {
    if (T == 14) {
        int nn = j / 4, s = j % 4;
        u32 sh = (u32)((size_t)b & 2) * 8;
        const u32* ql = (const u32*)((size_t)(b + 64 * nn + 32 * (s & 1)) & ~(size_t)3);
        const u32* qh = (const u32*)((size_t)(b + 128 + 32 * nn) & ~(size_t)3);
        u32 la[9], ha[9];
#pragma unroll
        for (int k = 0; k < 9; k++) {
            la[k] = ql[k];
            ha[k] = qh[k];
        }
        u32 sv = *(const u16*)(b + 192 + 2 * j);
        d = ldh(b + 208);
        dmin = 32.0f * d;
        int ns = (s >> 1) * 4, hs = 2 * s;
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = (int)(((funnel(la[k], la[k + 1], sh) >> ns) & 0x0F0F0F0Fu) |
                         (((funnel(ha[k], ha[k + 1], sh) >> hs) & 0x03030303u) << 4));
        sc[0] = (int)(i8)(sv & 0xffu);
        sc[1] = (int)(i8)(sv >> 8);
        mn[0] = sc[0];
        mn[1] = sc[1];
        return;
    }
    uint4 hd = *(const uint4*)b;  // d, dmin, scales[12]
    d = h2f((u16)(hd.x & 0xffffu));
    dmin = h2f((u16)(hd.x >> 16));
    int s, m;
    scale_min_k4_w(j, hd.y, hd.z, hd.w, s, m);
    sc[0] = sc[1] = s;
    mn[0] = mn[1] = m;
    const uint4* q4 = (const uint4*)(b + (T == 12 ? 16 : 48) + 32 * (j / 2));
    uint4 qa = q4[0], qb = q4[1];
    u32 qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    u32 hv[8];
    if (T == 13) {
        const uint4* h4 = (const uint4*)(b + 16);
        uint4 ha = h4[0], hb = h4[1];
        hv[0] = ha.x; hv[1] = ha.y; hv[2] = ha.z; hv[3] = ha.w;
        hv[4] = hb.x; hv[5] = hb.y; hv[6] = hb.z; hv[7] = hb.w;
    }
    int sh = (j & 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 v = (qv[k] >> sh) & 0x0F0F0F0Fu;
        if (T == 13) v |= ((hv[k] >> j) & 0x01010101u) << 4;
        w[k] = (int)v;
    }
}

// Split-row k-quants (types 112/114, see BK<112> in quant.cu): the raw words of sub-block j of
// block b (returned: the 4-bit word; hd: Q4_K the block header, Q6_K x, y the high-bit words,
// z the sub-block's two scales, w the block's d), and their decoding (as decodek).
template <int T>
__device__ __forceinline__ uint4 ks_load(const u8* row, int nb, int b, int j, uint4& hd) {
    size_t it = 8 * (size_t)b + j;
    if constexpr (T == 114) {
        uint2 h = ldw8((const uint2*)(row + 128 * (size_t)nb) + it);
        hd = make_uint4(h.x, h.y, ldw2((const u16*)(row + 192 * (size_t)nb + 2 * it)),
                        ldw2((const u16*)(row + 208 * (size_t)nb + 2 * (size_t)b)));
    } else {
        hd = ldw16((const uint4*)(row + 128 * (size_t)nb) + b);
    }
    return ldw16((const uint4*)row + it);
}
template <int T>
__device__ __forceinline__ void decode_ks(uint4 q, uint4 hd, int j, int w[8], int sc[2], int mn[2],
                                          float& d, float& dmin) {
    u32 qv[4] = {q.x, q.y, q.z, q.w};
    u32 hv[2] = {0, 0};
    if constexpr (T == 114) {
        hv[0] = hd.x;
        hv[1] = hd.y;
        d = h2f((u16)hd.w);
        dmin = 32.0f * d;
        sc[0] = (int)(i8)(hd.z & 0xffu);
        sc[1] = (int)(i8)((hd.z >> 8) & 0xffu);
        mn[0] = sc[0];
        mn[1] = sc[1];
    } else {
        d = h2f((u16)(hd.x & 0xffffu));
        dmin = h2f((u16)(hd.x >> 16));
        int s, m;
        scale_min_k4_w(j, hd.y, hd.z, hd.w, s, m);
        sc[0] = sc[1] = s;
        mn[0] = mn[1] = m;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        w[k] = (int)((qv[k] & 0x0F0F0F0Fu) | (((hv[0] >> (2 * k)) & 0x03030303u) << 4));
        w[4 + k] = (int)(((qv[k] >> 4) & 0x0F0F0F0Fu) | (((hv[1] >> (2 * k)) & 0x03030303u) << 4));
    }
}

// (Declared in quant.cu.) Split rows: one aligned 16-byte load of the sub-block's low bits (512
// contiguous bytes per warp-wide load in the matvec), the block's header / scales.
template <int T, bool V>
__device__ __forceinline__ void decodek_at(const u8* row, int nb, int b, int j, int w[8],
                                           int sc[2], int mn[2], float& d, float& dmin) {
    if constexpr (T == 112 || T == 114) {
        uint4 hd;
        uint4 q = ks_load<T>(row, nb, b, j, hd);
        decode_ks<T>(q, hd, j, w, sc, mn, d, dmin);
    } else if constexpr (V) {
        decodek_v<T>(row + (size_t)b * BK<T>::BYTES, j, w, sc, mn, d, dmin);
    } else {
        decodek<T>(row + (size_t)b * BK<T>::BYTES, j, w, sc, mn, d, dmin);
    }
}

// K split as in mv32: warp w takes row blk * (WARPS / split) + w / split and the part
// w % split of its nb * 8 sub-blocks. R rows per warp as in mv32.
template <int T, int MVU, int R, bool BIAS = false>
__device__ __forceinline__ void mvk(const u8* __restrict__ W, const AQ8K* __restrict__ X,
                                    float* __restrict__ Y, int rows, int nb, int blk, int split,
                                    const float* B = nullptr) {
    int lane = threadIdx.x & 31;
    int r0, part, lo, hi;
    mv_part<1>(blk, R, split, nb * 8, r0, part, lo, hi);
    float acc[R];
    const u8* wr[R];
#pragma unroll
    for (int q = 0; q < R; q++) {
        acc[q] = 0.0f;
        wr[q] = W + (size_t)min(r0 + q, rows - 1) * row_stride<T>(nb);
    }
    if (r0 >= rows) hi = lo;
    // (Loads weights and activations in the same round: no weight loads before the wait.)
    MV_RESUME();
    for (int it0 = lo + lane; it0 < hi; it0 += 32 * MVU) {
        int w[MVU][R][8], sc[MVU][R][2], mn[MVU][R][2], aq[MVU][8], bs[MVU];
        float d[MVU][R], dmin[MVU][R], ad[MVU];
#pragma unroll
        for (int u = 0; u < MVU; u++) {
            int it = it0 + 32 * u;
            if (it < hi) {
                int b = it >> 3, j = it & 7;
#pragma unroll
                for (int q = 0; q < R; q++)
                    decodek_at<T, true>(wr[q], nb, b, j, w[u][q], sc[u][q], mn[u][q], d[u][q], dmin[u][q]);
                const AQ8K* a = X + b;
                ad[u] = a->d;
                bs[u] = *(const int*)(a->bsums + 2 * j);
                int4 q0 = ((const int4*)(a->qs + 8 * j))[0], q1 = ((const int4*)(a->qs + 8 * j))[1];
                aq[u][0] = q0.x; aq[u][1] = q0.y; aq[u][2] = q0.z; aq[u][3] = q0.w;
                aq[u][4] = q1.x; aq[u][5] = q1.y; aq[u][6] = q1.z; aq[u][7] = q1.w;
            }
        }
#pragma unroll
        for (int u = 0; u < MVU; u++) {
            if (it0 + 32 * u < hi) {
                int b0s = (int)(short)(bs[u] & 0xffff), b1s = bs[u] >> 16;
#pragma unroll
                for (int q = 0; q < R; q++) {
                    int i0 = 0, i1 = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) i0 = dp4a(w[u][q][k], aq[u][k], i0);
#pragma unroll
                    for (int k = 4; k < 8; k++) i1 = dp4a(w[u][q][k], aq[u][k], i1);
                    int isum = sc[u][q][0] * i0 + sc[u][q][1] * i1;
                    int corr = mn[u][q][0] * b0s + mn[u][q][1] * b1s;
                    acc[q] += (ad[u] * d[u][q]) * (float)isum - (ad[u] * dmin[u][q]) * (float)corr;
                }
            }
        }
    }
    mv_store<R, false, BIAS>(acc, acc, Y, r0, rows, part, split, B);
}

// Split-row k-quant matvec (types 112/114): like mvk (the same work split, per-lane order and
// arithmetic, so the same results), but it holds the raw words of MVKS_U sub-blocks per row in
// flight and decodes each one when it is used (mvk decodes at load time: 185 registers with 4
// sub-blocks per row in flight; Llama-3-8B Q4_K_M decode 402 tok/s against 308 with mvk,
// docs/perf-log.md). Sub-blocks per row in flight: 4 with one row per warp, 2 with two (4 at two
// rows: 388 tok/s).
#define MVKS_U(R) ((R) > 1 ? 2 : 4)
// One round of mvks's loads: sub-blocks it0, it0 + 32, ... (those < hi) of the R rows.
template <int T, int R>
__device__ __forceinline__ void mvks_load(uint4 (&qv)[MVKS_U(R)][R], uint4 (&hd)[MVKS_U(R)][R],
                                          const u8* const (&wr)[R], int nb, int it0, int hi) {
#pragma unroll
    for (int u = 0; u < MVKS_U(R); u++) {
        int it = it0 + 32 * u;
        if (it < hi) {
#pragma unroll
            for (int q = 0; q < R; q++) qv[u][q] = ks_load<T>(wr[q], nb, it >> 3, it & 7, hd[u][q]);
        }
    }
}
// (Two rounds in flight, as mvs with DB, were slower on Llama-3-8B Q4_K_M, docs/perf-log.md.)
template <int T, int R, bool BIAS = false>
__device__ __forceinline__ void mvks(const u8* __restrict__ W, const AQ8K* __restrict__ X,
                                     float* __restrict__ Y, int rows, int nb, int blk, int split,
                                     const float* B = nullptr) {
    int lane = threadIdx.x & 31;
    int r0, part, lo, hi;
    mv_part<1>(blk, R, split, nb * 8, r0, part, lo, hi);
    float acc[R];
    const u8* wr[R];
#pragma unroll
    for (int q = 0; q < R; q++) {
        acc[q] = 0.0f;
        wr[q] = W + (size_t)min(r0 + q, rows - 1) * row_stride<T>(nb);
    }
    if (r0 >= rows) hi = lo;
    // As in mvs: each round's loads at the end of the previous one (the first before MV_RESUME).
    uint4 qv[MVKS_U(R)][R], hd[MVKS_U(R)][R];
    mvks_load<T, R>(qv, hd, wr, nb, lo + lane, hi);
    if (mv_guard(nb)) MV_RESUME();
    for (int it0 = lo + lane; it0 < hi; it0 += 32 * MVKS_U(R)) {
        // With one row per warp (products under MV_ROWS2_MIN rows: latency-bound), the round's
        // activation blocks are all loaded first: in one loop with the products, each
        // sub-block's loads came after the previous one's arithmetic (a branch per sub-block),
        // MVKS_U dependent L1/L2 round trips per round: Qwen2.5-0.5B decode +1.8 %. Not with two
        // rows: 86-94 registers instead of 72-79 (a block fewer per SM), Llama-3-8B Q4_K_M -2 %
        // (docs/perf-log.md). The arithmetic is the same either way.
        constexpr bool HOIST = R == 1;
        int4 aq0[MVKS_U(R)], aq1[MVKS_U(R)];
        int abs_[MVKS_U(R)], ad_[MVKS_U(R)];
        if constexpr (HOIST) {
#pragma unroll
            for (int u = 0; u < MVKS_U(R); u++) {
                int it = it0 + 32 * u;
                if (it < hi) {
                    const AQ8K* a = X + (it >> 3);
                    ad_[u] = lda4(&a->d);
                    abs_[u] = lda4(a->bsums + 2 * (it & 7));
                    aq0[u] = lda16(a->qs + 8 * (it & 7));
                    aq1[u] = lda16(a->qs + 8 * (it & 7) + 4);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < MVKS_U(R); u++) {
            int it = it0 + 32 * u;
            if (it < hi) {
                int b = it >> 3, j = it & 7;
                float ad;
                int bs;
                int4 q0, q1;
                if constexpr (HOIST) {
                    ad = __int_as_float(ad_[u]);
                    bs = abs_[u];
                    q0 = aq0[u];
                    q1 = aq1[u];
                } else {
                    const AQ8K* a = X + b;
                    ad = __int_as_float(lda4(&a->d));
                    bs = lda4(a->bsums + 2 * j);
                    q0 = lda16(a->qs + 8 * j);
                    q1 = lda16(a->qs + 8 * j + 4);
                }
                int aq[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
                int b0s = (int)(short)(bs & 0xffff), b1s = bs >> 16;
#pragma unroll
                for (int q = 0; q < R; q++) {
                    int w[8], sc[2], mn[2];
                    float d, dmin;
                    decode_ks<T>(qv[u][q], hd[u][q], j, w, sc, mn, d, dmin);
                    int i0 = 0, i1 = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) i0 = dp4a(w[k], aq[k], i0);
#pragma unroll
                    for (int k = 4; k < 8; k++) i1 = dp4a(w[k], aq[k], i1);
                    int isum = sc[0] * i0 + sc[1] * i1;
                    int corr = mn[0] * b0s + mn[1] * b1s;
                    acc[q] += (ad * d) * (float)isum - (ad * dmin) * (float)corr;
                }
            }
        }
        mvks_load<T, R>(qv, hd, wr, nb, it0 + 32 * MVKS_U(R), hi);
    }
    mv_store<R, false, BIAS>(acc, acc, Y, r0, rows, part, split, B);
}

// One k-quant product: split rows through mvks (unless MVKS_OFF), else mvk.
template <int T, int MVU, int R, bool BIAS = false>
__device__ __forceinline__ void mvk1(const u8* W, const AQ8K* X, float* Y, int rows, int nb,
                                     int blk, int split, const float* B = nullptr) {
    if constexpr (T == 112 || T == 114) {
        mvks<T, R, BIAS>(W, X, Y, rows, nb, blk, split, B);
        return;
    }
    mvk<T, MVU, R, BIAS>(W, X, Y, rows, nb, blk, split, B);
}

// One product of a 32-element type: split-row Q4_0 (mvs) or GGUF's layout (mv32).
template <int T, int R, bool BIAS = false, bool DB = false>
__device__ __forceinline__ void mv1(const u8* W, const AQ8* X, float* Y, int rows, int nb, int blk,
                                    int split, const float* B = nullptr) {
    if constexpr (T == 102) mvs<R, BIAS, DB>(W, X, Y, rows, nb, blk, split, B);
    else mv32<T, R, BIAS>(W, X, Y, rows, nb, blk, split, B);
}

// Up to three one-token products of the same type sharing the activations (Q/K/V, gate/up) in
// one launch: the first ceil(r0 / rows per block) blocks compute W0, the next ceil(r1 / ...) W1,
// the rest W2 (r2 may be 0). R rows per warp as in mv32/mvk.
template <int T, typename A, int R>
__device__ __forceinline__ void mv3(const u8* W0, const u8* W1, const u8* W2, const A* X,
                                    float* Y0, float* Y1, float* Y2, int r0, int r1, int r2,
                                    int nb, int split) {
    int rpb = WARPS * R / split;
    int b0 = (r0 + rpb - 1) / rpb, b1 = (r1 + rpb - 1) / rpb;
    int bi = blockIdx.x;
    const u8* W = W0;
    float* Y = Y0;
    int rows = r0;
    if (bi >= b0 + b1) {
        W = W2; Y = Y2; rows = r2; bi -= b0 + b1;
    } else if (bi >= b0) {
        W = W1; Y = Y1; rows = r1; bi -= b0;
    }
    if constexpr (is_kquant<T>()) mvk1<T, (R > 1 ? MVU_K_R2 : MVU_K), R>(W, X, Y, rows, nb, bi, split);
    else mv1<T, R>(W, X, Y, rows, nb, bi, split);
}

#define MV32(T, NAME)                                                                              \
    extern "C" __global__ void NAME(const u8* W, const AQ8* X, float* Y, int rows, int nb, int split) { MV_ENTRY(); mv1<T, 1>(W, X, Y, rows, nb, blockIdx.x, split); } \
    extern "C" __global__ void NAME##_x3(const u8* W0, const u8* W1, const u8* W2, const AQ8* X, float* Y0, float* Y1, float* Y2, int r0, int r1, int r2, int nb, int split) { MV_ENTRY(); mv3<T, AQ8, 1>(W0, W1, W2, X, Y0, Y1, Y2, r0, r1, r2, nb, split); } \
    extern "C" __global__ void NAME##_r2(const u8* W, const AQ8* X, float* Y, int rows, int nb, int split) { MV_ENTRY(); mv1<T, 2, false, true>(W, X, Y, rows, nb, blockIdx.x, split); } \
    extern "C" __global__ void NAME##_x3_r2(const u8* W0, const u8* W1, const u8* W2, const AQ8* X, float* Y0, float* Y1, float* Y2, int r0, int r1, int r2, int nb, int split) { MV_ENTRY(); mv3<T, AQ8, 2>(W0, W1, W2, X, Y0, Y1, Y2, r0, r1, r2, nb, split); }
#define MVK(T, NAME)                                                                               \
    extern "C" __global__ void NAME(const u8* W, const AQ8K* X, float* Y, int rows, int nb, int split) { MV_ENTRY(); mvk1<T, MVU_K, 1>(W, X, Y, rows, nb, blockIdx.x, split); } \
    extern "C" __global__ void NAME##_x3(const u8* W0, const u8* W1, const u8* W2, const AQ8K* X, float* Y0, float* Y1, float* Y2, int r0, int r1, int r2, int nb, int split) { MV_ENTRY(); mv3<T, AQ8K, 1>(W0, W1, W2, X, Y0, Y1, Y2, r0, r1, r2, nb, split); } \
    extern "C" __global__ void NAME##_r2(const u8* W, const AQ8K* X, float* Y, int rows, int nb, int split) { MV_ENTRY(); mvk1<T, MVU_K_R2, 2>(W, X, Y, rows, nb, blockIdx.x, split); } \
    extern "C" __global__ void NAME##_x3_r2(const u8* W0, const u8* W1, const u8* W2, const AQ8K* X, float* Y0, float* Y1, float* Y2, int r0, int r1, int r2, int nb, int split) { MV_ENTRY(); mv3<T, AQ8K, 2>(W0, W1, W2, X, Y0, Y1, Y2, r0, r1, r2, nb, split); }
MV32(2, mv_q4_0)
MV32(102, mv_q4_0s)
MV32(3, mv_q4_1)
MV32(6, mv_q5_0)
MV32(7, mv_q5_1)
MV32(8, mv_q8_0)
// Narrow Q8_0 rows (at most 64 blocks: the small models' LM heads), two rows per warp,
// MV32_NARROW_G groups per warp (matmul.rs). Decode +5 % on the Gemma 3 270M geometry, +2.5 % on
// Qwen2.5-0.5B against mv_q8_0_r2 (docs/perf-log.md).
extern "C" __global__ void mv_q8_0_r2n(const u8* W, const AQ8* X, float* Y, int rows, int nb, int split) { MV_ENTRY(); mv32_narrow<8, 2, MV32_NARROW_G>(W, X, Y, rows, nb, blockIdx.x); }
MVK(13, mv_q5_k)
MVK(112, mv_q4_ks)
MVK(114, mv_q6_ks)

// ---- two or three one-token products of different weight types in one launch ----
//
// Like mv3, but each matrix has its own type code (t0..t2, one activation kind per kernel: Q8
// for the 32-element types, Q8_K for the k-quants) and, in the `b` kernels, its own bias added
// where the row is written (mv_store's BIAS). The common case: llama.cpp's _M mixtures give
// attn_v more bits than attn_q / attn_k (Qwen2.5-0.5B Q4_K_M: Q5_0, Q5_0, Q8_0; Llama Q4_K_M:
// Q4_K, Q4_K, Q6_K in a third of the layers), which mv3 cannot take, and Qwen2 adds three biases:
// six launches per layer become one. One row per warp (the stage buffers of the 32-element
// instances all live in one kernel). Host: `try_mv3` in matmul.rs. Type codes as B32 / BK: 102,
// 2, 6, 8 (Q8 activations) and the split-row
// k-quants 112, 114 (Q8_K; the others would triple the registers); the host passes only these,
// so every block reaches MV_RESUME through exactly one product.
template <int R, bool BIAS>
__device__ __forceinline__ void mv_mix1(int T, const u8* W, const AQ8* X, float* Y, int rows,
                                        int nb, int blk, int split, const float* B) {
    switch (T) {
    case 102: mvs<R, BIAS>(W, X, Y, rows, nb, blk, split, B); break;
    case 2: mv32<2, R, BIAS>(W, X, Y, rows, nb, blk, split, B); break;
    case 6: mv32<6, R, BIAS>(W, X, Y, rows, nb, blk, split, B); break;
    default: mv32<8, R, BIAS>(W, X, Y, rows, nb, blk, split, B); break;
    }
}
template <int R, bool BIAS>
__device__ __forceinline__ void mv_mix1(int T, const u8* W, const AQ8K* X, float* Y, int rows,
                                        int nb, int blk, int split, const float* B) {
    if (T == 112) mvk1<112, MVU_K, R, BIAS>(W, X, Y, rows, nb, blk, split, B);
    else mvk1<114, MVU_K, R, BIAS>(W, X, Y, rows, nb, blk, split, B);
}
template <typename A, bool BIAS>
__device__ __forceinline__ void mv_mix3(const u8* W0, const u8* W1, const u8* W2, const A* X,
                                        float* Y0, float* Y1, float* Y2, int r0, int r1, int r2,
                                        int nb, int split, int t0, int t1, int t2, const float* B0,
                                        const float* B1, const float* B2) {
    int rpb = WARPS / split;
    int b0 = (r0 + rpb - 1) / rpb, b1 = (r1 + rpb - 1) / rpb;
    int bi = blockIdx.x;
    const u8* W = W0;
    float* Y = Y0;
    const float* B = B0;
    int rows = r0, T = t0;
    if (bi >= b0 + b1) {
        W = W2; Y = Y2; B = B2; rows = r2; T = t2; bi -= b0 + b1;
    } else if (bi >= b0) {
        W = W1; Y = Y1; B = B1; rows = r1; T = t1; bi -= b0;
    }
    mv_mix1<1, BIAS>(T, W, X, Y, rows, nb, bi, split, B);
}
#define MV_MIX(A, NAME)                                                                            \
    extern "C" __global__ void NAME##_x3(const u8* W0, const u8* W1, const u8* W2, const A* X, float* Y0, float* Y1, float* Y2, int r0, int r1, int r2, int nb, int split, int t0, int t1, int t2, const float* B0, const float* B1, const float* B2) { MV_ENTRY(); mv_mix3<A, false>(W0, W1, W2, X, Y0, Y1, Y2, r0, r1, r2, nb, split, t0, t1, t2, B0, B1, B2); } \
    extern "C" __global__ void NAME##_x3b(const u8* W0, const u8* W1, const u8* W2, const A* X, float* Y0, float* Y1, float* Y2, int r0, int r1, int r2, int nb, int split, int t0, int t1, int t2, const float* B0, const float* B1, const float* B2) { MV_ENTRY(); mv_mix3<A, true>(W0, W1, W2, X, Y0, Y1, Y2, r0, r1, r2, nb, split, t0, t1, t2, B0, B1, B2); }
MV_MIX(AQ8, mv_mix32)
MV_MIX(AQ8K, mv_mixk)
