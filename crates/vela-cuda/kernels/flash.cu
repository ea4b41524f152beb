// Tensor-core ("flash") causal attention for prefill batches. Part of the "attention" group:
// NVRTC compiles this file after attention.cu (see GROUPS in src/kernels.rs).
//
// Block (h, tile) of FA_WARPS = 4 warps takes query rows 64 * tile .. + 63 of head h; warp w
// owns rows 16w .. 16w + 15. The Q tile is rounded to the cache element type (f16 or bf16) and
// held as mma A fragments in registers. The keys the tile's rows can see are walked in tiles of
// BK keys (64; 32 for D = 256, whose 64 + 128 + 16 registers of Q, O and S fragments per thread
// leave ptxas ~40 bytes of spills): the K and V rows of the tile are copied from the cache ring (slot = key % capacity)
// to shared memory, then per warp S = Q K^T (mma.sync m16n8k16, f32 accumulation), scale,
// softcap, the causal / sliding-window mask per (row, key), an online softmax in f32 (running max
// per row, partial sums per thread), P rounded to the element type and O += P V (again
// m16n8k16; P's accumulator fragments are reused as A fragments). Rows are divided by their sum
// at the end. Needs sm_80+, hdk == hdv == D (64, 128 or 256), positions increasing along the batch
// (so a tile's keys are those of its first row's window .. its last row's position); the host
// (attn.rs) checks all that, else the other prefill kernels run. Not used in exact mode (Q and
// P are rounded to 16 bits).
#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)

// Two f32 -> one 32-bit register of two 16-bit elements of type KT (1 f16, 2 bf16), the first
// in the low half; round to nearest even.
template <int KT>
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    u32 r;
    if (KT == 2) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void ldsm_x4(u32 r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(u32 r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a * b for one m16n8k16 tile (A row-major 16x16, B column-major 16x8, f32 accumulators).
template <int KT>
__device__ __forceinline__ void mma16816(float c[4], const u32 a[4], u32 b0, u32 b1) {
    if (KT == 2)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A score: scaled, then soft-capped when softcap > 0.
__device__ __forceinline__ float fa_score(float s, float scale, float softcap) {
    float v = s * scale;
    if (softcap > 0.0f) v = tanhf(v / softcap) * softcap;
    return v;
}

// Online softmax step of a warp's 16 rows over NT tiles of 8 keys (s: masked scores, -inf for
// masked keys; rows gid (elements 0, 1) and gid + 8 (2, 3) of the mma accumulator layout; xa, xb:
// the thread's maxima of its two rows, taken while masking): the row maxima over the 4 lanes of
// a row, s replaced by exp(s - max), the running maxima ma/mb and
// per-thread partial sums la/lb updated, and the NO output tiles o rescaled. A row with no key so
// far keeps max -inf and uses 0 as the reference (all its weights 0).
// Row sums of an accumulator's two rows over the 4 lanes (tig) that hold them.
__device__ __forceinline__ void quad_sums(float& la, float& lb) {
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
}

template <int NT, int NO>
__device__ __forceinline__ void fa_softmax(float s[NT][4], float xa, float xb, float& ma,
                                           float& mb, float& la, float& lb, float o[NO][4]) {
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
    float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    float ref_a = na == NEG_INF ? 0.0f : na, ref_b = nb == NEG_INF ? 0.0f : nb;
    float ca = expf(ma - ref_a), cb = expf(mb - ref_b);
    ma = na;
    mb = nb;
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        s[n][0] = expf(s[n][0] - ref_a);
        s[n][1] = expf(s[n][1] - ref_a);
        s[n][2] = expf(s[n][2] - ref_b);
        s[n][3] = expf(s[n][3] - ref_b);
        sa += s[n][0] + s[n][1];
        sb += s[n][2] + s[n][3];
    }
    la = la * ca + sa;
    lb = lb * cb + sb;
#pragma unroll
    for (int n = 0; n < NO; n++) {
        o[n][0] *= ca;
        o[n][1] *= ca;
        o[n][2] *= cb;
        o[n][3] *= cb;
    }
}

// O += P V for 16 keys: p0, p1 are P's accumulator tiles of keys k0 .. k0 + 7 and k0 + 8 ..
// k0 + 15 (reused as the A fragment), V rows k0 .. k0 + 15 of the shared tile vs (row stride
// D + 8) read as B fragments with ldmatrix.trans.
template <int KT, int D>
__device__ __forceinline__ void fa_pv(const float p0[4], const float p1[4], const u16* vs, int k0,
                                      float o[D / 8][4]) {
    constexpr int LD = D + 8;
    int lane = threadIdx.x & 31;
    u32 a[4] = {fa_pack<KT>(p0[0], p0[1]), fa_pack<KT>(p0[2], p0[3]), fa_pack<KT>(p1[0], p1[1]),
                fa_pack<KT>(p1[2], p1[3])};
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
        u32 b[4];
        ldsm_x4_t(b, &vs[(k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * n + 8 * (lane >> 4)]);
        mma16816<KT>(o[n], a, b[0], b[1]);
        mma16816<KT>(o[n + 1], a, b[2], b[3]);
    }
}

template <int KT, int D, int BK>
__device__ void flash_prefill(const float* __restrict__ q, const void* __restrict__ kc,
                              const void* __restrict__ vc, const u32* __restrict__ pos,
                              float* __restrict__ out, int n_tok, int n_head, int n_head_kv,
                              int capacity, int window, float scale, float softcap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int LD = D + 8;  // shared row stride in elements: 16-byte rows, no bank conflicts
    static_assert(2 * BK >= FA_ROWS, "the Q tile is staged in the K and V buffers");
    __shared__ __align__(16) u16 kvs[2 * BK * LD];
    u16* ks = kvs;
    u16* vs = kvs + BK * LD;
    int h = blockIdx.x;
    // The last tiles (most keys) first.
    int t0 = (gridDim.y - 1 - blockIdx.y) * FA_ROWS;
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int gid = lane >> 2, tig = lane & 3;
    int g = h / (n_head / n_head_kv);
    int p_lo = (int)pos[t0], p_hi = (int)pos[min(t0 + FA_ROWS, n_tok) - 1];
    int ra = t0 + 16 * warp + gid, rb = ra + 8;
    int pa = ra < n_tok ? (int)pos[ra] : -1, pb = rb < n_tok ? (int)pos[rb] : -1;

    // Q tile -> shared (element type KT) -> A fragments.
    for (int i = tid; i < FA_ROWS * D / 4; i += blockDim.x) {
        int r = i / (D / 4), c = 4 * (i % (D / 4)), t = t0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < n_tok) v = *(const float4*)(q + ((size_t)t * n_head + h) * D + c);
        *(uint2*)&ks[r * LD + c] = make_uint2(fa_pack<KT>(v.x, v.y), fa_pack<KT>(v.z, v.w));
    }
    __syncthreads();
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        ldsm_x4(qf[kk], &ks[(16 * warp + (lane & 15)) * LD + 16 * kk + 8 * (lane >> 4)]);

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;
    int kmin = window > 0 ? max(0, p_lo + 1 - window) : 0;
    for (int j0 = kmin; j0 <= p_hi; j0 += BK) {
        // Every warp is done with the previous tile (and with the Q tile in ks).
        __syncthreads();
        for (int i = tid; i < BK * D / 8; i += blockDim.x) {
            int r = i / (D / 8), c = 8 * (i % (D / 8)), j = j0 + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (j <= p_hi) {
                size_t off = ((size_t)(j % capacity) * n_head_kv + g) * D + c;
                kv = *(const uint4*)((const u16*)kc + off);
                vv = *(const uint4*)((const u16*)vc + off);
            }
            *(uint4*)&ks[r * LD + c] = kv;
            *(uint4*)&vs[r * LD + c] = vv;
        }
        __syncthreads();
        // S = Q K^T: BK / 8 tiles of 16 rows x 8 keys.
        float s[BK / 8][4];
#pragma unroll
        for (int n = 0; n < BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int n = 0; n < BK / 8; n += 2) {
                u32 b[4];
                ldsm_x4(b, &ks[(8 * n + (lane & 7) + 8 * (lane >> 4)) * LD + 16 * kk + 8 * ((lane >> 3) & 1)]);
                mma16816<KT>(s[n], qf[kk], b[0], b[1]);
                mma16816<KT>(s[n + 1], qf[kk], b[2], b[3]);
            }
        }
        // Scale, softcap, mask; the thread's row maxima.
        float xa = NEG_INF, xb = NEG_INF;
#pragma unroll
        for (int n = 0; n < BK / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = j0 + 8 * n + 2 * tig + (e & 1);
                int p = e < 2 ? pa : pb;
                float v = fa_score(s[n][e], scale, softcap);
                bool ok = j <= p && (window <= 0 || j > p - window);
                v = ok ? v : NEG_INF;
                s[n][e] = v;
                if (e < 2) xa = fmaxf(xa, v); else xb = fmaxf(xb, v);
            }
        }
        fa_softmax<BK / 8, D / 8>(s, xa, xb, ma, mb, la, lb, o);
        // O += P V: P's accumulator tiles 2c, 2c + 1 are the A fragment of keys 16c .. 16c + 15.
#pragma unroll
        for (int c = 0; c < BK / 16; c++) fa_pv<KT, D>(s[2 * c], s[2 * c + 1], vs, 16 * c, o);
    }
    quad_sums(la, lb);
    float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        int d = 8 * n + 2 * tig;
        if (ra < n_tok) *(float2*)(out + ((size_t)ra * n_head + h) * D + d) = make_float2(o[n][0] * ia, o[n][1] * ia);
        if (rb < n_tok) *(float2*)(out + ((size_t)rb * n_head + h) * D + d) = make_float2(o[n][2] * ib, o[n][3] * ib);
    }
#endif
}

#define FLASH(KT, D, BK, NAME)                                                                     \
    extern "C" __launch_bounds__(32 * FA_WARPS) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* out, int n_tok, int n_head, int n_head_kv, int capacity, int window, float scale, float softcap) { PDL_ENTRY(); \
        flash_prefill<KT, D, BK>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, capacity, window, scale, softcap); }
FLASH(1, 64, 64, flash_f16_d64)
FLASH(1, 128, 64, flash_f16_d128)
FLASH(1, 256, 32, flash_f16_d256)
FLASH(2, 64, 64, flash_bf16_d64)
FLASH(2, 128, 64, flash_bf16_d128)
FLASH(2, 256, 32, flash_bf16_d256)

// ---- tensor-core split-K decode attention (f16/bf16 caches outside exact mode, from
// FLASH_DECODE_MIN_KEYS keys, see attention_impl in attn.rs) ----
//
// Grid (n_head_kv, n_tok, S), FA_WARPS warps per block. The keys a token at position p sees are
// cut into tiles of FD_KEYS = 64 and into S_eff <= min(S, target) parts of `per` whole tiles,
// chosen on the device from p (fd_parts), so a captured graph replays at any position and short
// contexts run few blocks; blocks s >= S_eff exit at once. Block (g, t, s) runs part s for the
// G = n_head / n_head_kv query heads of KV head g at once: the G query rows (padded to 16) are the
// M rows of mma.sync m16n8k16, so every K and V row is read once per KV head. The part's tiles
// stream through FD_STAGES shared buffers (cp.async, the next tile's copies in flight while the
// current one is used; zero-filled past the part's end; the Q rows are converted while the first
// tile arrives); warp w takes keys 16w .. 16w + 15 of each tile: S = Q K^T (2 mma n-tiles),
// scale, softcap, an online softmax per row over its keys, O += P V. The four warps' (m, l, O)
// are merged through shared memory in warp order and the block writes the G rows' unnormalized
// partials in attention_part2's layout, and attention_combine merges them in a launch of its own
// (and quantizes for a Q8 product). Merging in the block that finishes last was the kernel's tail
// at 8K keys: Llama-3-8B Q4_0 decode at depth 8,192 407 tok/s with the separate combine against
// 382 (docs/perf-log.md). Shared memory is dynamic (dyn_smem in
// src/kernels.rs). Needs sm_80+, an f16/bf16 cache, hdk == hdv == D (64, 128, 256; 512 has its
// own kernel below), G <= 16, S <= 128 (the host checks). Q and P are rounded to the cache type (as in flash_prefill); not
// used in exact mode.
#define FD_KEYS 64
#define FD_STAGES 2
#define FD_MAX_PARTS 128  // (= COMBINE_MAX: attention_combine merges them)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The parts of a token at position p: keys first..p in tiles of FD_KEYS, `per` (at least
// min_tiles) tiles per part; returns the number of non-empty parts S_eff <= min(S, target).
__device__ __forceinline__ int fd_parts(int p, int window, int S, int target, int min_tiles,
                                        int& first, int& per) {
    first = window > 0 ? max(0, p + 1 - window) : 0;
    int n_tiles = (p - first + FD_KEYS) / FD_KEYS;
    int most = max(1, min(S, target));
    per = max((n_tiles + most - 1) / most, min_tiles);
    return (n_tiles + per - 1) / per;
}

// 16-byte piece i of a tile of keys j0 .. j0 + FD_KEYS - 1 of KV head g: its place in the tile
// (row stride D + 8) and in the cache; false past hi (the copy then zero-fills).
template <int D>
__device__ __forceinline__ bool fd_piece(int i, int j0, int hi, int g, int n_head_kv,
                                         int capacity, int& at, size_t& off) {
    int r = i / (D / 8), c = 8 * (i % (D / 8)), j = j0 + r;
    bool ok = j <= hi;
    at = r * (D + 8) + c;
    off = ok ? ((size_t)(j % capacity) * n_head_kv + g) * D + c : 0;
    return ok;
}

// Pieces of a K (or V) tile per thread.
template <int D>
constexpr int fd_per() {
    static_assert((FD_KEYS * D / 8) % (32 * FA_WARPS) == 0, "tile pieces divide over the block");
    return FD_KEYS * D / 8 / (32 * FA_WARPS);
}

// Copy keys j0 .. j0 + FD_KEYS - 1 (those <= hi) of KV head g into the K and V tiles ks, vs
// (one commit group).
template <int D>
__device__ __forceinline__ void fd_issue(u16* ks, u16* vs, const u16* kc, const u16* vc, int j0,
                                         int hi, int g, int n_head_kv, int capacity) {
#pragma unroll
    for (int k = 0; k < fd_per<D>(); k++) {
        int at;
        size_t off;
        bool ok = fd_piece<D>(threadIdx.x + k * 32 * FA_WARPS, j0, hi, g, n_head_kv, capacity, at, off);
        cp_async16(&ks[at], kc + off, ok);
        cp_async16(&vs[at], vc + off, ok);
    }
    cp_async_commit();
}

// The same for one cache tensor into tile dst (its own commit group).
template <int D>
__device__ __forceinline__ void fd_issue_one(u16* dst, const u16* src, int j0, int hi, int g,
                                             int n_head_kv, int capacity) {
#pragma unroll 8
    for (int k = 0; k < fd_per<D>(); k++) {
        int at;
        size_t off;
        bool ok = fd_piece<D>(threadIdx.x + k * 32 * FA_WARPS, j0, hi, g, n_head_kv, capacity, at, off);
        cp_async16(&dst[at], src + off, ok);
    }
    cp_async_commit();
}

// Keys lo..=hi of part s of S of token t (KV head g, G query heads); false for a part past the
// position's non-empty ones, whose record it writes empty (no keys, weight 0): attention_combine
// merges all S parts in a launch of its own.
template <int D>
__device__ __forceinline__ bool fd_part_keys(const u32* __restrict__ pos, float* __restrict__ part, int n_head, int G,
                                             int g, int t, int s, int S, int window, int target,
                                             int min_tiles, int& lo, int& hi) {
    int p = (int)pos[t];
    int first, per;
    if (s >= fd_parts(p, window, S, target, min_tiles, first, per)) {
        for (int i = threadIdx.x; i < G * (D + 2); i += blockDim.x) {
            int r = i / (D + 2), d = i % (D + 2);
            part[(((size_t)t * n_head + g * G + r) * S + s) * (D + 2) + d] = d == D ? NEG_INF : 0.0f;
        }
        return false;
    }
    lo = first + FD_KEYS * per * s;
    hi = min(p, lo + FD_KEYS * per - 1);
    return true;
}

// The G query rows of KV head g's group (rows G..15 zero) into qsm (row stride D + 8), rounded
// to the cache type.
template <int KT, int D>
__device__ __forceinline__ void fd_load_q(u16* __restrict__ qsm, const float* __restrict__ q, int t, int n_head, int g,
                                          int G) {
    for (int i = threadIdx.x; i < 16 * D / 4; i += blockDim.x) {
        int r = i / (D / 4), c = 4 * (i % (D / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < G) v = *(const float4*)(q + ((size_t)t * n_head + g * G + r) * D + c);
        *(uint2*)&qsm[r * (D + 8) + c] = make_uint2(fa_pack<KT>(v.x, v.y), fa_pack<KT>(v.z, v.w));
    }
}

// One tile's scores for the warp's 16 keys (16 warp .. + 15, two n-tiles of 8) against the 16 Q
// rows: S = Q K^T (Q's A fragments from qf with QREG, else from qsm; K from ks; the k loop
// unrolled UNR times), scaled and soft-capped, keys past hi masked to -inf, and each thread's
// maxima of its two rows (xa, xb; not yet reduced over the quad).
template <int KT, int D, bool QREG, int UNR, int NQ>
__device__ __forceinline__ void fd_scores(float (&sc)[2][4], float& xa, float& xb,
                                          const u32 (&qf)[NQ][4], const u16* qsm, const u16* ks,
                                          int lane, int warp, int tig, int j0, int hi, float scale,
                                          float softcap) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int n = 0; n < 2; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll UNR
    for (int kk = 0; kk < D / 16; kk++) {
        u32 b[4], qa[4];
        if constexpr (QREG) {
            qa[0] = qf[kk][0]; qa[1] = qf[kk][1]; qa[2] = qf[kk][2]; qa[3] = qf[kk][3];
        } else {
            ldsm_x4(qa, &qsm[(lane & 15) * LD + 16 * kk + 8 * (lane >> 4)]);
        }
        ldsm_x4(b, &ks[(16 * warp + (lane & 7) + 8 * (lane >> 4)) * LD + 16 * kk + 8 * ((lane >> 3) & 1)]);
        mma16816<KT>(sc[0], qa, b[0], b[1]);
        mma16816<KT>(sc[1], qa, b[2], b[3]);
    }
    xa = NEG_INF;
    xb = NEG_INF;
#pragma unroll
    for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = j0 + 16 * warp + 8 * n + 2 * tig + (e & 1);
            float v = fa_score(sc[n][e], scale, softcap);
            v = j <= hi ? v : NEG_INF;
            sc[n][e] = v;
            if (e < 2) xa = fmaxf(xa, v); else xb = fmaxf(xb, v);
        }
    }
}

template <int KT, int D>
__device__ void flash_decode(const float* __restrict__ q, const void* __restrict__ kc,
                             const void* __restrict__ vc, const u32* __restrict__ pos,
                             float* __restrict__ part, int n_head, int n_head_kv, int capacity,
                             int window, float scale, float softcap, int target, int min_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int LD = D + 8;
    constexpr int TILE = FD_KEYS * LD;  // elements of one K (or V) tile
    static_assert(FD_STAGES * 2 * TILE * 2 >= 16 * D * 4, "the warps' merge buffer fits in the tiles");
    extern __shared__ __align__(16) u16 fd_smem[];
    u16* qsm = fd_smem;           // [16][LD] Q rows
    u16* stg = fd_smem + 16 * LD; // stage i: K tile at stg + 2 i TILE, V tile after it
    __shared__ float wm[FA_WARPS][16], wl[FA_WARPS][16];
    int g = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int gid = lane >> 2, tig = lane & 3;
    int G = n_head / n_head_kv;
    int lo, hi;
    if (!fd_part_keys<D>(pos, part, n_head, G, g, t, s, S, window, target, min_tiles, lo, hi))
        return;
    int n_tiles = (hi - lo + FD_KEYS) / FD_KEYS;
    const u16* kc16 = (const u16*)kc;
    const u16* vc16 = (const u16*)vc;
    fd_issue<D>(stg, stg + TILE, kc16, vc16, lo, hi, g, n_head_kv, capacity);
    // Q rows -> shared -> A fragments.
    fd_load_q<KT, D>(qsm, q, t, n_head, g, G);
    __syncthreads();
    // Q's A fragments in registers up to D = 128; at 256 (O alone takes 128 registers) they are
    // read from shared memory at each step (255 registers and 176 bytes of spills otherwise).
    constexpr bool QREG = D <= 128;
    u32 qf[QREG ? D / 16 : 1][4];
    if constexpr (QREG) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            ldsm_x4(qf[kk], &qsm[(lane & 15) * LD + 16 * kk + 8 * (lane >> 4)]);
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;
    for (int it = 0; it < n_tiles; it++) {
        // Tile it + 1 into the other stage (free: the previous iteration ended with a barrier).
        if (FD_STAGES > 1 && it + 1 < n_tiles) {
            u16* nk = stg + 2 * ((it + 1) % FD_STAGES) * TILE;
            fd_issue<D>(nk, nk + TILE, kc16, vc16, lo + (it + 1) * FD_KEYS, hi, g, n_head_kv, capacity);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const u16* ks = stg + 2 * (it % FD_STAGES) * TILE;
        const u16* vs = ks + TILE;
        int j0 = lo + it * FD_KEYS;
        // S = Q K^T for keys 16 warp .. + 15 of the tile (two n-tiles of 8 keys).
        float sc[2][4], xa, xb;
        fd_scores<KT, D, QREG, D / 16>(sc, xa, xb, qf, qsm, ks, lane, warp, tig, j0, hi, scale, softcap);
        // (A warp whose keys of this tile are all past the part's end keeps max -inf.)
        fa_softmax<2, D / 8>(sc, xa, xb, ma, mb, la, lb, o);
        fa_pv<KT, D>(sc[0], sc[1], vs, 16 * warp, o);
        __syncthreads();  // every warp is done with this stage before it is refilled
        if (FD_STAGES == 1 && it + 1 < n_tiles)
            fd_issue<D>(stg, stg + TILE, kc16, vc16, lo + (it + 1) * FD_KEYS, hi, g, n_head_kv, capacity);
    }
    // Merge the warps: row maxima and sums, then O in warp order through shared memory.
    quad_sums(la, lb);
    if (tig == 0) {
        wm[warp][gid] = ma;
        wm[warp][gid + 8] = mb;
        wl[warp][gid] = la;
        wl[warp][gid + 8] = lb;
    }
    __syncthreads();
    float Ma = NEG_INF, Mb = NEG_INF;
#pragma unroll
    for (int w = 0; w < FA_WARPS; w++) {
        Ma = fmaxf(Ma, wm[w][gid]);
        Mb = fmaxf(Mb, wm[w][gid + 8]);
    }
    float fa = ma == NEG_INF ? 0.0f : expf(ma - Ma), fb = mb == NEG_INF ? 0.0f : expf(mb - Mb);
    float* ob = (float*)stg;  // [16][D]
    for (int w = 0; w < FA_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                int d = 8 * n + 2 * tig;
                float2 va = make_float2(o[n][0] * fa, o[n][1] * fa);
                float2 vb = make_float2(o[n][2] * fb, o[n][3] * fb);
                if (w > 0) {
                    float2 pa = *(float2*)&ob[gid * D + d], pb = *(float2*)&ob[(gid + 8) * D + d];
                    va.x += pa.x; va.y += pa.y; vb.x += pb.x; vb.y += pb.y;
                }
                *(float2*)&ob[gid * D + d] = va;
                *(float2*)&ob[(gid + 8) * D + d] = vb;
            }
        }
        __syncthreads();
    }
    for (int i = tid; i < G * D; i += blockDim.x) {
        int r = i / D, d = i % D;
        float* po = part + (((size_t)t * n_head + g * G + r) * S + s) * (D + 2);
        po[d] = ob[r * D + d];
        if (d == 0) {
            float M = NEG_INF, L = 0.0f;
            for (int w = 0; w < FA_WARPS; w++) M = fmaxf(M, wm[w][r]);
            for (int w = 0; w < FA_WARPS; w++)
                L += wm[w][r] == NEG_INF ? 0.0f : wl[w][r] * expf(wm[w][r] - M);
            po[D] = M;
            po[D + 1] = L;
        }
    }
#endif
}

#define FLASH_DECODE(KT, D, NAME)                                                                  \
    extern "C" __launch_bounds__(32 * FA_WARPS) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head, int n_head_kv, int capacity, int window, float scale, float softcap, int target, int min_tiles, const unsigned long long* kvt) { KVT_ROW(blockIdx.y); PDL_ENTRY(); \
        flash_decode<KT, D>(q, kc, vc, pos, part, n_head, n_head_kv, capacity, window, scale, softcap, target, min_tiles); }
FLASH_DECODE(1, 64, flash_decode_f16_d64)
FLASH_DECODE(1, 128, flash_decode_f16_d128)
FLASH_DECODE(2, 64, flash_decode_bf16_d64)
FLASH_DECODE(2, 128, flash_decode_bf16_d128)
// Head dim 256 (Gemma 3 and Gemma 4's sliding layers, from FLASH_DECODE_MIN_KEYS keys; Gemma 3
// 270M decode at 8K +12 %, docs/perf-log.md): the same kernel, Q fragments from shared
// memory (O takes 128 registers); 140 KB of dynamic shared memory with two stages (one block
// per SM).
FLASH_DECODE(1, 256, flash_decode_f16_d256)
FLASH_DECODE(2, 256, flash_decode_bf16_d256)

// ---- tensor-core decode attention for head dim 512 (Gemma 4's full layers) ----
//
// flash_decode holds a warp's O for all D columns in registers (D / 2 floats per thread), which
// does not fit at D = 512. Here the block shares one online softmax: per 64-key tile, warp w
// computes S for keys 16w .. 16w + 15 over all of D (Q fragments read from shared memory per
// 16-column step), the row maxima go through shared memory so that every warp takes the same
// running maximum, P (rounded to the cache type) goes to shared memory, and warp w accumulates
// O's columns 128w .. 128w + 127 for all 64 keys (64 floats per thread). One K/V stage: the next
// tile's K is issued once every warp has its S, its V once P V is done. Same part records as
// flash_decode (merged by attention_combine); same launch (grid KV heads x tokens x parts).
// Dynamic shared memory: Q 16 x 520, K and V 64 x 520, P 16 x 72 elements (152,064 bytes).
// Gemma 4 12B decode at 8K +13 % against the split-K parts (docs/perf-log.md).
#define FD5_D 512
#define FD5_LD (FD5_D + 8)
#define FD5_PLD (FD_KEYS + 8)

template <int KT>
__device__ void flash_decode_d512(const float* __restrict__ q, const void* __restrict__ kc,
                                  const void* __restrict__ vc, const u32* __restrict__ pos,
                                  float* __restrict__ part, int n_head, int n_head_kv,
                                  int capacity, int window, float scale, float softcap,
                                  int target, int min_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int D = FD5_D, LD = FD5_LD;
    extern __shared__ __align__(16) u16 fd_smem[];
    u16* qsm = fd_smem;             // [16][LD]
    u16* ks = qsm + 16 * LD;        // [FD_KEYS][LD]
    u16* vs = ks + FD_KEYS * LD;    // [FD_KEYS][LD]
    u16* ps = vs + FD_KEYS * LD;    // [16][FD5_PLD]
    __shared__ float rmax[FA_WARPS][16], rsum[FA_WARPS][16];
    int g = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int gid = lane >> 2, tig = lane & 3;
    int G = n_head / n_head_kv;
    int lo, hi;
    if (!fd_part_keys<D>(pos, part, n_head, G, g, t, s, S, window, target, min_tiles, lo, hi))
        return;
    int n_tiles = (hi - lo + FD_KEYS) / FD_KEYS;
    const u16* kc16 = (const u16*)kc;
    const u16* vc16 = (const u16*)vc;
    fd_issue<D>(ks, vs, kc16, vc16, lo, hi, g, n_head_kv, capacity);
    fd_load_q<KT, D>(qsm, q, t, n_head, g, G);
    // O columns 128 warp .. + 127: 16 n-tiles of 8.
    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;
    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<0>();
        __syncthreads();
        int j0 = lo + it * FD_KEYS;
        float sc[2][4], xa, xb;
        const u32 nq[1][4] = {};
        fd_scores<KT, D, false, 4>(sc, xa, xb, nq, qsm, ks, lane, warp, tig, j0, hi, scale, softcap);
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
        if (tig == 0) {
            rmax[warp][gid] = xa;
            rmax[warp][gid + 8] = xb;
        }
        __syncthreads();  // every warp has its S and its maxima: the K tile is free
        if (it + 1 < n_tiles) fd_issue_one<D>(ks, kc16, j0 + FD_KEYS, hi, g, n_head_kv, capacity);
        float ta = NEG_INF, tb = NEG_INF;
#pragma unroll
        for (int w = 0; w < FA_WARPS; w++) {
            ta = fmaxf(ta, rmax[w][gid]);
            tb = fmaxf(tb, rmax[w][gid + 8]);
        }
        // As fa_softmax, with the block's maxima: the same in every warp.
        float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
        float ref_a = na == NEG_INF ? 0.0f : na, ref_b = nb == NEG_INF ? 0.0f : nb;
        float ca = expf(ma - ref_a), cb = expf(mb - ref_b);
        ma = na;
        mb = nb;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; n++) {
            sc[n][0] = expf(sc[n][0] - ref_a);
            sc[n][1] = expf(sc[n][1] - ref_a);
            sc[n][2] = expf(sc[n][2] - ref_b);
            sc[n][3] = expf(sc[n][3] - ref_b);
            sa += sc[n][0] + sc[n][1];
            sb += sc[n][2] + sc[n][3];
            int c = 16 * warp + 8 * n + 2 * tig;
            *(u32*)&ps[gid * FD5_PLD + c] = fa_pack<KT>(sc[n][0], sc[n][1]);
            *(u32*)&ps[(gid + 8) * FD5_PLD + c] = fa_pack<KT>(sc[n][2], sc[n][3]);
        }
        la = la * ca + sa;
        lb = lb * cb + sb;
#pragma unroll
        for (int n = 0; n < 16; n++) {
            o[n][0] *= ca;
            o[n][1] *= ca;
            o[n][2] *= cb;
            o[n][3] *= cb;
        }
        __syncthreads();  // P complete
#pragma unroll
        for (int c = 0; c < FD_KEYS / 16; c++) {
            u32 a[4];
            ldsm_x4(a, &ps[(lane & 15) * FD5_PLD + 16 * c + 8 * (lane >> 4)]);
#pragma unroll
            for (int n = 0; n < 16; n += 2) {
                u32 b[4];
                ldsm_x4_t(b, &vs[(16 * c + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 128 * warp + 8 * n + 8 * (lane >> 4)]);
                mma16816<KT>(o[n], a, b[0], b[1]);
                mma16816<KT>(o[n + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with V and P
        if (it + 1 < n_tiles) fd_issue_one<D>(vs, vc16, j0 + FD_KEYS, hi, g, n_head_kv, capacity);
    }
    quad_sums(la, lb);
    if (tig == 0) {
        rsum[warp][gid] = la;
        rsum[warp][gid + 8] = lb;
    }
    __syncthreads();
    // Records: O's columns of this warp (unnormalized, weights exp(s - M)), then M and the sum.
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = gid + 8 * h;
        if (r >= G) continue;
        float* po = part + (((size_t)t * n_head + g * G + r) * S + s) * (D + 2);
#pragma unroll
        for (int n = 0; n < 16; n++)
            *(float2*)&po[128 * warp + 8 * n + 2 * tig] = make_float2(o[n][2 * h], o[n][2 * h + 1]);
        if (warp == 0 && tig == 0) {
            float L = 0.0f;
            for (int w = 0; w < FA_WARPS; w++) L += rsum[w][r];
            po[D] = h == 0 ? ma : mb;
            po[D + 1] = L;
        }
    }
#endif
}

#define FLASH_DECODE_D512(KT, NAME)                                                                \
    extern "C" __launch_bounds__(32 * FA_WARPS) __global__ void NAME(const float* q, const void* kc, const void* vc, const u32* pos, float* part, int n_head, int n_head_kv, int capacity, int window, float scale, float softcap, int target, int min_tiles, const unsigned long long* kvt) { KVT_ROW(blockIdx.y); PDL_ENTRY(); \
        flash_decode_d512<KT>(q, kc, vc, pos, part, n_head, n_head_kv, capacity, window, scale, softcap, target, min_tiles); }
FLASH_DECODE_D512(1, flash_decode_f16_d512)
FLASH_DECODE_D512(2, flash_decode_bf16_d512)

// ---- prefill attention through cuBLAS for head dims the flash kernel cannot hold (512) ----
// Row softmax between the two batched products of `attention_gemm` (src/attn_gemm.rs): row
// r = j * n_tok + t of S holds query row t's kmax f32 scores against key slots 0 .. kmax - 1 (no
// ring wrap: the host checks that every position is below the capacity). Keys above pos[t] or
// before its window get weight 0; the others exp(score - max) / sum, as f16 (the flash kernel also
// rounds P to 16 bits before P V). Scores are scaled and soft-capped like fa_score.
extern "C" __global__ void attn_softmax_f16(const float* __restrict__ S, u16* __restrict__ P,
                                            const u32* __restrict__ pos, int n_tok, int kmax,
                                            int window, float scale, float softcap) {
    PDL_ENTRY();
    __shared__ float red[32];
    int r = blockIdx.x, t = r % n_tok;
    int p = (int)pos[t];
    int lo = window > 0 ? max(0, p - window + 1) : 0;
    int hi = min(p, kmax - 1);
    const float* s = S + (size_t)r * kmax;
    u16* o = P + (size_t)r * kmax;
    float m = NEG_INF;
    for (int k = lo + threadIdx.x; k <= hi; k += blockDim.x) m = fmaxf(m, fa_score(s[k], scale, softcap));
    m = block_reduce_f(m, true, red);
    float sum = 0.0f;
    for (int k = lo + threadIdx.x; k <= hi; k += blockDim.x) sum += expf(fa_score(s[k], scale, softcap) - m);
    sum = block_reduce_f(sum, false, red);
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int k = threadIdx.x; k < kmax; k += blockDim.x) {
        float w = (k >= lo && k <= hi) ? expf(fa_score(s[k], scale, softcap) - m) * inv : 0.0f;
        o[k] = f2h(w);
    }
}
