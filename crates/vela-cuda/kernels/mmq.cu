// Several-token products of split-row Q4_0 weights on the tensor cores (the decode rows of a
// batched step: 2-64 tokens). Part of the "quant" group, after matvec.cu (ldw16, lda16, mv_guard,
// MV_RESUME).
//
// mma.sync m16n8k32 (s8 x s8 -> s32), one Q4_0 block per k step: A holds 16 rows' nibbles (0..15;
// the -8 comes back through each activation block's exact quant sum), B the Q8 quants of 8
// tokens. Per (row, token) each block's integer dot is scaled like the one-token matvec's:
// (isum - 8 sum) * (dw * da), added in f32.
//
// Fragments (PTX ISA, mma.m16n8k32 .s8; g = lane / 4, c = lane % 4): A a0/a2 row g, a1/a3 row
// g + 8, a0/a1 k = 4c..4c+3, a2/a3 k = 16 + 4c..; B b0 k = 4c.., b1 k = 16 + 4c.. of token g;
// C c0/c1 row g, c2/c3 row g + 8, tokens 2c and 2c + 1. Quant word c of a Q4_0 block holds
// elements 4c..4c+3 in its low nibbles and 16 + 4c.. in its high ones: a0 = word & 0x0F0F0F0F,
// a2 = (word >> 4) & 0x0F0F0F0F.
//
// Memory: what made a first tensor-core version (4-byte weight loads, activations read from the
// AQ8 rows: 8 tokens' blocks in 8 cache lines per load) no faster than the dp4a kernel was the
// L1 traffic, not the arithmetic (docs/perf-log.md). Here
// - the activations are first put in fragment order (`act_mma`): per (block, 8-token tile) the
//   32 lanes' B words as 256 contiguous bytes, then the 8 tokens' (d, 8 * sum) as 64 bytes;
// - each lane loads whole 16-byte quant blocks: the 4 lanes of a quad read 4 consecutive blocks
//   (64 contiguous bytes) of their row and swap words among themselves (`quad_transpose`) so that
//   each holds word c of the 4 blocks; the 4 scales of the row come in one 8-byte load.

// Activations in fragment order. XQ[(b * n_tiles + tile) * 32 + lane] = {word c, word 4 + c} of
// token 8 tile + g's block b; XH[(b * n_tiles + tile) * 8 + j] = {d, 8 * sum as int bits} of token
// 8 tile + j. Tokens past n_tok (up to 8 n_tiles, a multiple of the product's tiles per grid
// row) are zeros. One warp per (block, tile): act_mma_put with the X rows of the lane's token g
// (row_g) and, for lanes 0-7, of token `lane` (row_h); -1 for none (zeros).
__device__ __forceinline__ void act_mma_put(const AQ8* __restrict__ X, uint2* __restrict__ XQ,
                                            float2* __restrict__ XH, int nb, int b, size_t w,
                                            int lane, int row_g, int row_h) {
    int c = lane & 3;
    uint2 q = make_uint2(0u, 0u);
    if (row_g >= 0) {
        const AQ8* a = X + (size_t)row_g * nb + b;
        q = make_uint2((u32)a->qs[c], (u32)a->qs[4 + c]);
    }
    XQ[w * 32 + lane] = q;
    if (lane < 8) {
        float2 h = make_float2(0.0f, 0.0f);
        if (row_h >= 0) {
            const AQ8* a = X + (size_t)row_h * nb + b;
            h = make_float2(a->d, __int_as_float(8 * a->sum));
        }
        XH[w * 8 + lane] = h;
    }
}
extern "C" __global__ void act_mma(const AQ8* __restrict__ X, uint2* __restrict__ XQ,
                                   float2* __restrict__ XH, int nb, int n_tok, int n_tiles) {
    PDL_ENTRY();
    int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (w >= nb * n_tiles) return;
    int b = w / n_tiles, tile = w % n_tiles;
    int tg = 8 * tile + (lane >> 2), th = 8 * tile + lane;
    act_mma_put(X, XQ, XH, nb, b, w, lane, tg < n_tok ? tg : -1, th < n_tok ? th : -1);
}

// The same for the grouped expert products (experts_group, experts.cu): tile gi * nt + t holds
// slots 8 t.. of group gi (its activation rows: the slot's own with per_slot, else its token's).
// Tiles of groups past the group count are left as they are: no product block reads them.
extern "C" __global__ void act_mma_e(const AQ8* __restrict__ X, uint2* __restrict__ XQ,
                                     float2* __restrict__ XH, int nb, int n_tiles, int nt,
                                     const u32* __restrict__ grp, int n_slots, int k,
                                     int per_slot) {
    PDL_ENTRY();
    int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (w >= nb * n_tiles) return;
    int b = w / n_tiles, tile = w % n_tiles;
    int gi = tile / nt, t = tile % nt;
    if (gi >= (int)grp[0]) return;
    const u32* perm = grp + 4;
    const u32* gr = perm + n_slots + 3 * gi;
    int first = (int)gr[1], cnt = (int)gr[2];
    int jg = 8 * t + (lane >> 2), jh = 8 * t + lane;
    int sg = jg < cnt ? (int)perm[first + jg] : -1;
    int sh = lane < 8 && jh < cnt ? (int)perm[first + jh] : -1;
    if (!per_slot) {
        sg = sg >= 0 ? sg / k : -1;
        sh = sh >= 0 ? sh / k : -1;
    }
    act_mma_put(X, XQ, XH, nb, b, w, lane, sg, sh);
}

__device__ __forceinline__ void mma_s8(int (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Coherent 8-byte activation load (see lda16 in matvec.cu).
__device__ __forceinline__ uint2 lda8(const void* p) {
    uint2 v;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// Lane c of each quad holds the four words of block c (of 4 consecutive blocks); afterwards v[j]
// is word c of block j (a 4 x 4 transpose in two exchanges of two words).
__device__ __forceinline__ void quad_transpose(u32 (&v)[4], int c) {
    bool h2 = c & 2, h1 = c & 1;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        u32 r = __shfl_xor_sync(0xffffffffu, h2 ? v[i] : v[i + 2], 2);
        if (h2) v[i] = r;
        else v[i + 2] = r;
    }
#pragma unroll
    for (int i = 0; i < 4; i += 2) {
        u32 r = __shfl_xor_sync(0xffffffffu, h1 ? v[i] : v[i + 1], 1);
        if (h1) v[i] = r;
        else v[i + 1] = r;
    }
}

// One chunk (4 consecutive blocks) of the lane's two rows g and g + 8: block 4k + c's quants and
// the row's 4 scales.
struct MmqChunk {
    uint4 q[2];
    uint2 d[2];
};
__device__ __forceinline__ void mmq_load(MmqChunk& w, const uint4* const (&wq)[2],
                                         const u16* const (&wd)[2], int k, int c) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        w.q[h] = ldw16(wq[h] + 4 * k + c);
        w.d[h] = ldw8((const uint2*)(wd[h] + 4 * k));
    }
}

#define MMQ_WARPS 4

// Where a block's results go: column j (0..8 NT - 1) of its tiles is a token's or slot's row of
// Y (nullptr: none).
struct MmqTokens {  // tokens 8 tile0 + j, below n_tok
    float* Y;
    int rows, tile0, n_tok;
    __device__ float* col(int j) const {
        int tok = 8 * tile0 + j;
        return tok < n_tok ? Y + (size_t)tok * rows : nullptr;
    }
};
struct MmqSlots {  // a group's slots (shared memory; -1 past its count)
    float* Y;
    int rows;
    const int* slot;
    __device__ float* col(int j) const {
        return slot[j] >= 0 ? Y + (size_t)slot[j] * rows : nullptr;
    }
};

// The warps' sums of a block's 16 rows x NT tiles, added in warp order through shared memory and
// stored by warp 0.
template <int NT, class Out>
__device__ __forceinline__ void mmq_store(const float (&acc)[NT][4], int r0, int rows, Out out) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int g = lane >> 2, c = lane & 3;
    __shared__ float red[MMQ_WARPS][NT * 4][32];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][t * 4 + i][lane] = acc[t][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float v = red[0][t * 4 + i][lane];
#pragma unroll
                for (int x = 1; x < MMQ_WARPS; x++) v += red[x][t * 4 + i][lane];
                int row = r0 + g + (i >= 2 ? 8 : 0);
                float* y = out.col(8 * t + 2 * c + (i & 1));
                if (row < rows && y) y[row] = v;
            }
        }
    }
}

// A block of MMQ_WARPS warps takes 16 rows and NT tiles of 8 tokens (grid y: the next 8 * NT
// tokens; n_tiles, the tiles in fragment order, is a multiple of NT, so every tile exists and
// the loads of a block's tiles are issued together); warp w takes the chunks w, w + MMQ_WARPS,
// ..., loading the next chunk's weights before computing the current one. This warp's sums of
// rows r0.. (of `rows`, W's first) and tiles tile0..: `acc`. With RESUME (the dense products,
// MV_ENTRY) the first weights are requested before the wait for the previous kernel.
template <int NT, bool RESUME>
__device__ __forceinline__ void mmq_q4_0s(const u8* __restrict__ W, const uint2* __restrict__ XQ,
                                          const float2* __restrict__ XH, int rows, int nb,
                                          int n_tiles, int r0, int tile0, float (&acc)[NT][4]) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int g = lane >> 2, c = lane & 3;
    const uint4* wq[2];
    const u16* wd[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u8* wr = W + (size_t)min(r0 + g + 8 * h, rows - 1) * nb * 18;
        wq[h] = (const uint4*)wr;
        wd[h] = (const u16*)(wr + 16 * (size_t)nb);
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    int n_chunk = nb / 4;  // nb is a multiple of 8 (split rows)
    int k = warp;
    MmqChunk w;
    if (k < n_chunk) mmq_load(w, wq, wd, k, c);
    if (RESUME && mv_guard(nb)) MV_RESUME();
    for (; k < n_chunk; k += MMQ_WARPS) {
        MmqChunk cur = w;
        if (k + MMQ_WARPS < n_chunk) mmq_load(w, wq, wd, k + MMQ_WARPS, c);
        u32 qa[4] = {cur.q[0].x, cur.q[0].y, cur.q[0].z, cur.q[0].w};
        u32 qb[4] = {cur.q[1].x, cur.q[1].y, cur.q[1].z, cur.q[1].w};
        quad_transpose(qa, c);
        quad_transpose(qb, c);
        // This chunk's activation fragments: tiles tile0.. of blocks 4k..4k+3.
        const uint2* xq = XQ + ((size_t)4 * k * n_tiles + tile0) * 32 + lane;
        const float2* xh = XH + ((size_t)4 * k * n_tiles + tile0) * 8 + 2 * c;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 a0 = qa[j] & 0x0F0F0F0Fu, a2 = (qa[j] >> 4) & 0x0F0F0F0Fu;
            u32 a1 = qb[j] & 0x0F0F0F0Fu, a3 = (qb[j] >> 4) & 0x0F0F0F0Fu;
            u32 sa = j < 2 ? cur.d[0].x : cur.d[0].y, sb = j < 2 ? cur.d[1].x : cur.d[1].y;
            float dw0 = h2f((u16)(sa >> (16 * (j & 1)))), dw1 = h2f((u16)(sb >> (16 * (j & 1))));
            uint2 bq[NT];
            int4 hd[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                bq[t] = lda8(xq + (size_t)(j * n_tiles + t) * 32);
                hd[t] = lda16(xh + (size_t)(j * n_tiles + t) * 8);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float da0 = __int_as_float(hd[t].x), da1 = __int_as_float(hd[t].z);
                int ci[4] = {0, 0, 0, 0};
                mma_s8(ci, a0, a1, a2, a3, bq[t].x, bq[t].y);
                acc[t][0] += (float)(ci[0] - hd[t].y) * (dw0 * da0);
                acc[t][1] += (float)(ci[1] - hd[t].w) * (dw0 * da1);
                acc[t][2] += (float)(ci[2] - hd[t].y) * (dw1 * da0);
                acc[t][3] += (float)(ci[3] - hd[t].w) * (dw1 * da1);
            }
        }
    }
}
template <int NT>
__device__ __forceinline__ void mmq_q4_0s_tok(const u8* __restrict__ W,
                                              const uint2* __restrict__ XQ,
                                              const float2* __restrict__ XH, float* __restrict__ Y,
                                              int rows, int nb, int n_tok, int n_tiles) {
    int r0 = blockIdx.x * 16, tile0 = blockIdx.y * NT;
    float acc[NT][4];
    mmq_q4_0s<NT, true>(W, XQ, XH, rows, nb, n_tiles, r0, tile0, acc);
    mmq_store<NT>(acc, r0, rows, MmqTokens{Y, rows, tile0, n_tok});
}
#define MMQ_KERNEL(NT, NAME) \
    extern "C" __global__ void NAME(const u8* W, const uint2* XQ, const float2* XH, float* Y, int rows, int nb, int n_tok, int n_tiles) { MV_ENTRY(); mmq_q4_0s_tok<NT>(W, XQ, XH, Y, rows, nb, n_tok, n_tiles); }
MMQ_KERNEL(1, mmq_q4_0s_1)
MMQ_KERNEL(2, mmq_q4_0s_2)
MMQ_KERNEL(4, mmq_q4_0s_4)
MMQ_KERNEL(8, mmq_q4_0s_8)

// The grouped expert products of split-row Q4_0 weights (experts_group's groups of at most
// 8 NT slots of one expert, act_mma_e's tiles): block (x, y) takes rows 16 x.. of group y's
// expert for its slots, as mmq_q4_0s_tok for tokens (so a slot's result does not depend on the
// group it falls in). Groups of ids past the tensor write zero rows. The group is read first, so
// the wait for the previous kernel comes first too (PDL_ENTRY).
template <int NT>
__device__ __forceinline__ void mmqe_q4_0s(const u8* __restrict__ W, const u32* __restrict__ grp,
                                           const uint2* __restrict__ XQ,
                                           const float2* __restrict__ XH, float* __restrict__ Y,
                                           int rows, int nb, int n_exp, int n_tiles, int n_slots) {
    int gi = blockIdx.y;
    if (gi >= (int)grp[0]) return;
    const u32* perm = grp + 4;
    const u32* gr = perm + n_slots + 3 * gi;
    u32 e = gr[0];
    int first = (int)gr[1], cnt = (int)gr[2];
    __shared__ int slot[8 * NT];
    for (int j = threadIdx.x; j < 8 * NT; j += blockDim.x) slot[j] = j < cnt ? (int)perm[first + j] : -1;
    __syncthreads();
    int r0 = blockIdx.x * 16;
    if (e >= (u32)n_exp) {
        for (int i = threadIdx.x; i < 16 * cnt; i += blockDim.x) {
            int r = r0 + i % 16;
            if (r < rows) Y[(size_t)slot[i / 16] * rows + r] = 0.0f;
        }
        return;
    }
    float acc[NT][4];
    mmq_q4_0s<NT, false>(W + (size_t)e * rows * nb * 18, XQ, XH, rows, nb, n_tiles, r0, gi * NT,
                         acc);
    mmq_store<NT>(acc, r0, rows, MmqSlots{Y, rows, slot});
}
#define MMQE_KERNEL(NT, NAME) \
    extern "C" __global__ void NAME(const u8* W, const u32* grp, const uint2* XQ, const float2* XH, float* Y, int rows, int nb, int n_exp, int n_tiles, int n_slots) { PDL_ENTRY(); mmqe_q4_0s<NT>(W, grp, XQ, XH, Y, rows, nb, n_exp, n_tiles, n_slots); }
MMQE_KERNEL(1, mmqe_q4_0s_1)
MMQE_KERNEL(2, mmqe_q4_0s_2)
MMQE_KERNEL(4, mmqe_q4_0s_4)
MMQE_KERNEL(8, mmqe_q4_0s_8)

// ---- split-row Q6_K (type 114, the 8B's LM head) on the tensor cores ----
//
// mma.sync m16n8k16 (s8 x s8 -> s32), one group of 16 elements (one scale) per k step: A holds
// 16 rows' q - 32 (-32..31, so no correction term), B the Q8_K quants of 8 tokens. Per (row,
// token) the groups' integer dots times their scales are summed in int32 over a chunk (4
// sub-blocks, half a block; |sum| < 2^27), then scaled by dw * da and added in f32.
// Fragments (mma.m16n8k16 .s8): A a0 row g, a1 row g + 8, k = 4c..4c+3; B b0 k = 4c.. of token
// g; C as m16n8k32. Element 4c + i of a sub-block's first group: low nibble of byte 4c + i of its
// 16-byte low word (word c), high 2 bits at bits 2c..2c+1 of byte i of high word 0; of its second
// group (elements 16 + 4c + i): the high nibbles of word c and high word 1 (see repack_k).

// Q8_K activations in fragment order: XQ[((b * 16 + q) * n_tiles + tile) * 32 + lane] = quants
// 16 q + 4c..+3 of token 8 tile + g's block b; XD[(b * n_tiles + tile) * 8 + j] = d of token
// 8 tile + j. Zeros past n_tok. One warp per (block, group, tile).
extern "C" __global__ void act_mma_k(const AQ8K* __restrict__ X, u32* __restrict__ XQ,
                                     float* __restrict__ XD, int nb, int n_tok, int n_tiles) {
    PDL_ENTRY();
    int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (w >= nb * 16 * n_tiles) return;
    int tile = w % n_tiles, bq = w / n_tiles, b = bq / 16, q = bq % 16;
    int tok = 8 * tile + (lane >> 2), c = lane & 3;
    XQ[(size_t)w * 32 + lane] = tok < n_tok ? (u32)X[(size_t)tok * nb + b].qs[4 * q + c] : 0u;
    if (q == 0 && lane < 8) {
        int t = 8 * tile + lane;
        XD[((size_t)b * n_tiles + tile) * 8 + lane] = t < n_tok ? X[(size_t)t * nb + b].d : 0.0f;
    }
}

__device__ __forceinline__ void mma_s8_k16(int (&c)[4], u32 a0, u32 a1, u32 b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// Four 6-bit quants (low nibbles lo, high 2 bits hi, both in place per byte) minus 32 as int8:
// (128 + q - 32) never borrows across bytes, and flipping bit 7 gives q - 32 in two's complement.
__device__ __forceinline__ u32 q6_s8(u32 lo, u32 hi) {
    return ((lo | hi | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// One chunk (4 sub-blocks, half a block) of the lane's rows g and g + 8: sub-block 4k + c's low
// word, the 4 sub-blocks' high words (32 bytes), their 8 group scales and the block's d.
struct MmqChunkK {
    uint4 l[2];
    uint4 h[2][2];
    uint2 s[2];
    u16 d[2];
};
__device__ __forceinline__ void mmq_load_k(MmqChunkK& w, const u8* const (&wr)[2], int nb, int k,
                                           int c) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        w.l[h] = ldw16((const uint4*)wr[h] + 4 * k + c);
        const uint4* hp = (const uint4*)(wr[h] + 128 * (size_t)nb) + 2 * k;
        w.h[h][0] = ldw16(hp);
        w.h[h][1] = ldw16(hp + 1);
        w.s[h] = ldw8((const uint2*)(wr[h] + 192 * (size_t)nb) + k);
        w.d[h] = ldw2((const u16*)(wr[h] + 208 * (size_t)nb) + (k >> 1));
    }
}

template <int NT>
__device__ __forceinline__ void mmq_q6_ks(const u8* __restrict__ W, const u32* __restrict__ XQ,
                                          const float* __restrict__ XD, float* __restrict__ Y,
                                          int rows, int nb, int n_tok, int n_tiles) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int g = lane >> 2, c = lane & 3;
    int r0 = blockIdx.x * 16;
    int tile0 = blockIdx.y * NT;
    size_t stride = ((size_t)nb * 210 + 15) & ~(size_t)15;
    const u8* wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) wr[h] = W + (size_t)min(r0 + g + 8 * h, rows - 1) * stride;
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    int n_chunk = 2 * nb;
    int k = warp;
    MmqChunkK w;
    if (k < n_chunk) mmq_load_k(w, wr, nb, k, c);
    if (mv_guard(nb)) MV_RESUME();
    for (; k < n_chunk; k += MMQ_WARPS) {
        MmqChunkK cur = w;
        if (k + MMQ_WARPS < n_chunk) mmq_load_k(w, wr, nb, k + MMQ_WARPS, c);
        u32 la[4] = {cur.l[0].x, cur.l[0].y, cur.l[0].z, cur.l[0].w};
        u32 lb[4] = {cur.l[1].x, cur.l[1].y, cur.l[1].z, cur.l[1].w};
        quad_transpose(la, c);
        quad_transpose(lb, c);
        // Group gi = 2 j + half of this chunk: fragments at XQ + (gi * n_tiles + t) * 32.
        const u32* xq = XQ + (((size_t)(k >> 1) * 16 + 8 * (k & 1)) * n_tiles + tile0) * 32 + lane;
        int iacc[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) iacc[t][i] = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            // Sub-block j's high words: bytes 8 j.. of the chunk's 32.
            uint4 ha = cur.h[0][j >> 1], hb = cur.h[1][j >> 1];
            u32 ha0 = (j & 1) ? ha.z : ha.x, ha1 = (j & 1) ? ha.w : ha.y;
            u32 hb0 = (j & 1) ? hb.z : hb.x, hb1 = (j & 1) ? hb.w : hb.y;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int gi = 2 * j + half;
                u32 lo_a = (half ? la[j] >> 4 : la[j]) & 0x0F0F0F0Fu;
                u32 lo_b = (half ? lb[j] >> 4 : lb[j]) & 0x0F0F0F0Fu;
                u32 hi_a = (((half ? ha1 : ha0) >> (2 * c)) & 0x03030303u) << 4;
                u32 hi_b = (((half ? hb1 : hb0) >> (2 * c)) & 0x03030303u) << 4;
                u32 a0 = q6_s8(lo_a, hi_a), a1 = q6_s8(lo_b, hi_b);
                u32 sw_a = gi < 4 ? cur.s[0].x : cur.s[0].y, sw_b = gi < 4 ? cur.s[1].x : cur.s[1].y;
                int sc_a = (int)(signed char)(sw_a >> (8 * (gi & 3)));
                int sc_b = (int)(signed char)(sw_b >> (8 * (gi & 3)));
                u32 bq[NT];
#pragma unroll
                for (int t = 0; t < NT; t++) bq[t] = (u32)lda4(xq + (size_t)(gi * n_tiles + t) * 32);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int ci[4] = {0, 0, 0, 0};
                    mma_s8_k16(ci, a0, a1, bq[t]);
                    iacc[t][0] += sc_a * ci[0];
                    iacc[t][1] += sc_a * ci[1];
                    iacc[t][2] += sc_b * ci[2];
                    iacc[t][3] += sc_b * ci[3];
                }
            }
        }
        float dw0 = h2f(cur.d[0]), dw1 = h2f(cur.d[1]);
        const float* xd = XD + ((size_t)(k >> 1) * n_tiles + tile0) * 8 + 2 * c;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            uint2 dv = lda8(xd + 8 * t);
            float da0 = __int_as_float(dv.x), da1 = __int_as_float(dv.y);
            acc[t][0] += (float)iacc[t][0] * (dw0 * da0);
            acc[t][1] += (float)iacc[t][1] * (dw0 * da1);
            acc[t][2] += (float)iacc[t][2] * (dw1 * da0);
            acc[t][3] += (float)iacc[t][3] * (dw1 * da1);
        }
    }
    mmq_store<NT>(acc, r0, rows, MmqTokens{Y, rows, tile0, n_tok});
}
#define MMQ_KERNEL_K(NT, NAME) \
    extern "C" __global__ void NAME(const u8* W, const u32* XQ, const float* XD, float* Y, int rows, int nb, int n_tok, int n_tiles) { MV_ENTRY(); mmq_q6_ks<NT>(W, XQ, XD, Y, rows, nb, n_tok, n_tiles); }
MMQ_KERNEL_K(1, mmq_q6_ks_1)
MMQ_KERNEL_K(2, mmq_q6_ks_2)
MMQ_KERNEL_K(4, mmq_q6_ks_4)
