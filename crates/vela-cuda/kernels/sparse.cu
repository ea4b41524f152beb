// Block-sparse attention, the fast forms (recurrent.cu holds the reference ones, still used in
// exact mode and outside these kernels' shape limits; crates/vela-cuda/src/sparse.rs picks).
// The selection is exact in both forms: the scores are summed in the reference's order, and the
// top-k keeps the reference's order (higher score first, the lower block among equal scores,
// NaN lowest). Attention splits the selection into parts of SPARSE_PART positions (partial
// max, sum and weighted V per part, then a combine), so one query's result does not depend on
// the batch it is in.

#define SPARSE_TILE 32  // key blocks per block of sparse_scores_t
#define SPARSE_PART ATTN_PART     // selected positions per part of sparse_attn_part
#define SPARSE_MAX_G ATTN_MAX_G   // query heads per K/V head in sparse_attn_part
#define SPARSE_MAX_HD ATTN_MAX_HD

// Grid (tiles, queries), 128 threads: the scores of SPARSE_TILE complete blocks of query t, as
// sparse_index_scores computes them (serial f32 dot per head, relu-summed over the heads in
// order), with the tile's keys staged in shared memory (coalesced reads). Queries whose blocks
// all fit the budget need no scores (everything is selected) and return at once.
// Limits: nh*di <= 1024, di <= 256, nh <= 32.
extern "C" __global__ void sparse_scores_t(const float* __restrict__ q,
                                           const float* __restrict__ keys,
                                           const u32* __restrict__ positions, int nh, int di,
                                           int c, int max_blocks, int stride,
                                           float* __restrict__ scores) {
    PDL_ENTRY();
    __shared__ float qs[1024];
    __shared__ float ks[SPARSE_TILE * 257];
    __shared__ float dots[32 * SPARSE_TILE];
    int t = blockIdx.y;
    int nb = ((int)positions[t] + 1) / c;
    int b0 = blockIdx.x * SPARSE_TILE;
    if (nb <= max_blocks || b0 >= nb) return;
    int rows = min(SPARSE_TILE, nb - b0);
    const float* qt = q + (size_t)t * nh * di;
    for (int i = threadIdx.x; i < nh * di; i += blockDim.x) qs[i] = qt[i];
    for (int i = threadIdx.x; i < rows * di; i += blockDim.x)
        ks[(i / di) * (di + 1) + i % di] = keys[(size_t)b0 * di + i];
    __syncthreads();
    for (int pr = threadIdx.x; pr < SPARSE_TILE * nh; pr += blockDim.x) {
        int r = pr % SPARSE_TILE, h = pr / SPARSE_TILE;
        if (r >= rows) continue;
        const float* kr = ks + r * (di + 1);
        const float* qh = qs + h * di;
        float dot = 0.0f;
        for (int i = 0; i < di; i++) dot = __fadd_rn(dot, __fmul_rn(qh[i], kr[i]));
        dots[h * SPARSE_TILE + r] = dot;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        float scale = 1.0f / sqrtf((float)di);
        float s = 0.0f;
        for (int h = 0; h < nh; h++) s = __fadd_rn(s, fmaxf(dots[h * SPARSE_TILE + threadIdx.x], 0.0f));
        scores[(size_t)t * stride + b0 + threadIdx.x] = s * scale;
    }
}

// A score as an unsigned key in the reference's order: NaN ranks as -inf, then IEEE total
// order (-0 below +0, as f32::total_cmp).
__device__ __forceinline__ u32 sparse_key(float f) {
    if (isnan(f)) f = NEG_INF;
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of a 0/1 flag over the block (blockDim.x a multiple of 32, at most
// 1024), in thread order; *total gets the block's count. `tmp`: 33 shared ints. Contains two
// __syncthreads (callers sync before reusing tmp).
__device__ __forceinline__ int block_scan_flag(int f, int* tmp, int* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u32 bal = __ballot_sync(0xffffffffu, f);
    int before = __popc(bal & ((1u << lane) - 1u));
    if (lane == 0) tmp[warp] = __popc(bal);
    __syncthreads();
    if (warp == 0) {
        int v = lane < nw ? tmp[lane] : 0;
        int inc = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        if (lane < nw) tmp[lane] = inc - v;
        if (lane == 31) tmp[32] = inc;
    }
    __syncthreads();
    *total = tmp[32];
    return tmp[warp] + before;
}

// One block per query (1024 threads): the selection of sparse_index_select in O(blocks). A
// radix select (4 passes of 8 bits, from the top) finds the key T of the max_blocks-th best
// block; every block above T is kept, and of the blocks equal to T the lowest ones up to the
// budget; then the kept blocks' positions in ascending order and the open block's tail.
extern "C" __global__ void sparse_topk(const float* __restrict__ scores,
                                       const u32* __restrict__ positions, int c, int max_blocks,
                                       int stride, int width, u32* sel, u32* counts) {
    PDL_ENTRY();
    __shared__ int hist[256];
    __shared__ int tmp[33];
    __shared__ u32 sh_prefix;
    __shared__ int sh_want;
    int t = blockIdx.x;
    int pos = (int)positions[t];
    int nb = (pos + 1) / c;
    u32* row = sel + (size_t)t * width;
    if (nb <= max_blocks) {
        for (int x = threadIdx.x; x <= pos; x += blockDim.x) row[x] = (u32)x;
        if (threadIdx.x == 0) counts[t] = (u32)(pos + 1);
        return;
    }
    const float* s = scores + (size_t)t * stride;
    u32 prefix = 0, mask = 0;
    int want = max_blocks; // how many of the blocks matching prefix still to take, from the top
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int b = threadIdx.x; b < nb; b += blockDim.x) {
            u32 k = sparse_key(s[b]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l holds digits 255-8l down to 248-8l; counts from the top digit down.
            int lane = threadIdx.x, local = 0;
            for (int j = 0; j < 8; j++) local += hist[255 - 8 * lane - j];
            int inc = local;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += y;
            }
            int above = inc - local; // blocks in higher digits than this lane's
            if (above < want && inc >= want) {
                int cum = above;
                for (int j = 0; j < 8; j++) {
                    int d = 255 - 8 * lane - j;
                    if (cum + hist[d] >= want) {
                        sh_prefix = prefix | ((u32)d << shift);
                        sh_want = want - cum;
                        break;
                    }
                    cum += hist[d];
                }
            }
        }
        __syncthreads();
        prefix = sh_prefix;
        want = sh_want;
        mask |= 255u << shift;
    }
    // prefix = T; want = how many blocks equal to T are kept (the lowest ones).
    int eq_before = 0, kept_before = 0;
    for (int b0 = 0; b0 < nb; b0 += blockDim.x) {
        int b = b0 + threadIdx.x;
        u32 k = b < nb ? sparse_key(s[b]) : 0u;
        int eq = b < nb && k == prefix, total;
        int eq_rank = eq_before + block_scan_flag(eq, tmp, &total);
        eq_before += total;
        __syncthreads();
        int keep = b < nb && (k > prefix || (eq && eq_rank < want));
        int r = kept_before + block_scan_flag(keep, tmp, &total);
        kept_before += total;
        __syncthreads();
        if (keep)
            for (int j = 0; j < c; j++) row[r * c + j] = (u32)(b * c + j);
    }
    int n = max_blocks * c;
    for (int x = nb * c + threadIdx.x; x <= pos; x += blockDim.x) row[n + x - nb * c] = (u32)x;
    if (threadIdx.x == 0) counts[t] = (u32)(n + pos + 1 - nb * c);
}

// Grid (parts, K/V heads x head groups, queries), 256 threads: attention of group hg (query
// heads hg*gs.. of the G = nh/nkv heads that share K/V head kh, at most gs of them) over part p
// of query t's selection (positions p*SPARSE_PART.. of it). One warp per selected key (coalesced
// K row, every head's dot), then per head the part's max m and sum l of exp(s - m), and
// acc = sum exp(s - m) V (threads over the head dim). part_acc is [q, nh, parts, hd], part_ml
// [q, nh, parts, 2]. Many heads on one K/V head (MLA's 64 on one latent row) take several
// groups, each reading the part's rows again (from L2). Limits: gs <= SPARSE_MAX_G, hd a
// multiple of 32 up to SPARSE_MAX_HD, gs*hd <= 4096.
extern "C" __global__ void sparse_attn_part(const float* __restrict__ q,
                                            const float* __restrict__ k,
                                            const float* __restrict__ v,
                                            const u32* __restrict__ sel,
                                            const u32* __restrict__ counts, int width, int nh,
                                            int nkv, int hd, float scale, int parts, int gs,
                                            float* __restrict__ part_acc,
                                            float* __restrict__ part_ml) {
    PDL_ENTRY();
    __shared__ float qs[4096];
    __shared__ float ps[SPARSE_MAX_G * SPARSE_PART];
    __shared__ const float* krows[SPARSE_PART];
    __shared__ const float* vrows[SPARSE_PART];
    int groups = (nh / nkv + gs - 1) / gs;
    int p = blockIdx.x, kh = blockIdx.y / groups, hg = blockIdx.y % groups, t = blockIdx.z;
    int h0 = kh * (nh / nkv) + hg * gs, G = min(gs, nh / nkv - hg * gs), kvw = nkv * hd;
    int n = (int)counts[t];
    int j0 = p * SPARSE_PART;
    if (j0 >= n) return;
    int m = min(SPARSE_PART, n - j0);
    const float* qt = q + ((size_t)t * nh + (size_t)h0) * hd;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = qt[i];
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        size_t r = (size_t)sel[(size_t)t * width + j0 + j] * kvw + (size_t)kh * hd;
        krows[j] = k + r;
        vrows[j] = v + r;
    }
    __syncthreads();
    size_t base = ((size_t)t * nh + (size_t)h0) * parts + p;
    attn_part_rows(qs, krows, vrows, m, G, hd, scale, parts, base, ps, part_acc, part_ml);
}

// Grid (heads, queries), 128 threads over the head dim: the parts of sparse_attn_part merged
// (max over the parts, each rescaled by exp(m_p - max)) and normalised.
extern "C" __global__ void sparse_attn_combine(const float* __restrict__ part_acc,
                                               const float* __restrict__ part_ml,
                                               const u32* __restrict__ counts, int nh, int hd,
                                               int parts, float* __restrict__ out) {
    PDL_ENTRY();
    int h = blockIdx.x, t = blockIdx.y;
    int np = min(parts, ((int)counts[t] + SPARSE_PART - 1) / SPARSE_PART);
    size_t base = ((size_t)t * nh + h) * parts;
    float mx = NEG_INF;
    for (int p = 0; p < np; p++) mx = fmaxf(mx, part_ml[(base + p) * 2]);
    float l = 0.0f;
    for (int p = 0; p < np; p++) l += part_ml[(base + p) * 2 + 1] * expf(part_ml[(base + p) * 2] - mx);
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* o = out + ((size_t)t * nh + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < np; p++)
            acc += part_acc[(base + p) * hd + d] * expf(part_ml[(base + p) * 2] - mx);
        o[d] = acc * inv;
    }
}

// ---- what a QSA layer stores, at positions read on the device (a decode step's `io` slot) ----

// Grid (rows), threads over the width: row i of src into row positions[i] of dst (with ring > 0:
// row positions[i] % ring).
extern "C" __global__ void store_rows_at(const float* __restrict__ src, float* __restrict__ dst,
                                         int width, const u32* __restrict__ positions,
                                         int ring) {
    PDL_ENTRY();
    int i = blockIdx.x;
    u32 p = positions[i];
    size_t r = ring > 0 ? p % (u32)ring : p;
    for (int c = threadIdx.x; c < width; c += blockDim.x)
        dst[r * width + c] = src[(size_t)i * width + c];
}

// Grid (rows), threads over the width: row i of out = the mean of the raw rows (ring of `slots`)
// of the last complete block at positions[i] (block 0 when none is: the row is then not
// stored), summed in order then divided as rec_mean_streams; pool_pos[i] = its first position
// (the RoPE position of the pooled key).
extern "C" __global__ void sparse_pool_mean(const float* __restrict__ raw, int slots, int width,
                                            int block, const u32* __restrict__ positions,
                                            float* __restrict__ out, u32* __restrict__ pool_pos) {
    PDL_ENTRY();
    int i = blockIdx.x;
    int b = max(((int)positions[i] + 1) / block - 1, 0);
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        float acc = raw[(size_t)((b * block) % slots) * width + c];
        for (int j = 1; j < block; j++)
            acc = __fadd_rn(acc, raw[(size_t)((b * block + j) % slots) * width + c]);
        out[(size_t)i * width + c] = __fdiv_rn(acc, (float)block);
    }
    if (threadIdx.x == 0) pool_pos[i] = (u32)(b * block);
}

// Grid (rows): row i of pooled into row positions[i] / block of rows when positions[i]
// completes its block.
extern "C" __global__ void sparse_pool_store(const float* __restrict__ pooled,
                                             const u32* __restrict__ positions, int width,
                                             int block, float* __restrict__ rows) {
    PDL_ENTRY();
    int i = blockIdx.x;
    u32 p = positions[i];
    if ((p + 1) % (u32)block != 0) return;
    size_t b = p / (u32)block;
    for (int c = threadIdx.x; c < width; c += blockDim.x)
        rows[b * width + c] = pooled[(size_t)i * width + c];
}
