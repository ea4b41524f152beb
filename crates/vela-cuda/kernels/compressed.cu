// DeepSeek V4's ops: mHC stream mixing, trailing interleaved rotation, the compressors' gated
// pooling, the Lightning indexer and attention with sinks over two row sets. The CPU backend
// (crates/vela-compute/src/cpu/compressed.rs) is the reference; these follow it step by step
// (the attention's and indexer's sums run in another order: results within rounding).

__device__ __forceinline__ float dsv4_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The combination matrix C (S x S) of one token: scaled logits plus bias, a softmax per row (+ eps),
// then `iters` Sinkhorn rounds (rows from the second on, then columns). SS > 0: S is SS and c a
// local array the compiler keeps in registers (the same operations in the same order as on the
// row in global memory, so the same bits).
template <int SS>
__device__ __forceinline__ void dsv4_mhc_comb(float* c, const float* __restrict__ b, float s2, int S,
                                              int iters, float eps) {
    if (SS > 0) S = SS;
#pragma unroll
    for (int j = 0; j < S; j++) {
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < S; k++) {
            float v = c[j * S + k] * s2 + b[j * S + k];
            c[j * S + k] = v;
            m = fmaxf(m, v);
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < S; k++) {
            float e = expf(c[j * S + k] - m);
            c[j * S + k] = e;
            sum += e;
        }
#pragma unroll
        for (int k = 0; k < S; k++) c[j * S + k] = c[j * S + k] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
#pragma unroll
            for (int j = 0; j < S; j++) {
                float sum = 0.0f;
#pragma unroll
                for (int k = 0; k < S; k++) sum += c[j * S + k];
#pragma unroll
                for (int k = 0; k < S; k++) c[j * S + k] /= sum + eps;
            }
#pragma unroll
        for (int k = 0; k < S; k++) {
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < S; j++) sum += c[j * S + k];
#pragma unroll
            for (int j = 0; j < S; j++) c[j * S + k] /= sum + eps;
        }
    }
}

// One thread per token: the row of mix becomes [pre | post | C] (head: [pre]). Four streams (the
// released models) work in registers; other counts on the row in place.
extern "C" __global__ void dsv4_mhc_weights(float* mix, const float* __restrict__ base, float s0,
                                            float s1, float s2, int n, int S, int iters, float eps,
                                            int head) {
    PDL_ENTRY();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int stride = head ? S : (2 + S) * S;
    float* row = mix + (size_t)t * stride;
    for (int i = 0; i < S; i++) row[i] = dsv4_sigmoid(row[i] * s0 + base[i]) + eps;
    if (head) return;
    for (int i = S; i < 2 * S; i++) row[i] = 2.0f * dsv4_sigmoid(row[i] * s1 + base[i]);
    float* c = row + 2 * S;
    if (S == 4) {
        float r[16];
#pragma unroll
        for (int i = 0; i < 16; i++) r[i] = c[i];
        dsv4_mhc_comb<4>(r, base + 2 * S, s2, S, iters, eps);
#pragma unroll
        for (int i = 0; i < 16; i++) c[i] = r[i];
    } else {
        dsv4_mhc_comb<0>(c, base + 2 * S, s2, S, iters, eps);
    }
}

// out[t, i] = sum_s w[t*stride + s] * x[t, s, i].
extern "C" __global__ void dsv4_mhc_collapse(const float* __restrict__ x, const float* __restrict__ w,
                                             int stride, int S, int width, long long total,
                                             float* __restrict__ out) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    long long t = e / width, i = e % width;
    const float* xt = x + t * S * width + i;
    const float* wt = w + t * stride;
    float acc = 0.0f;
    for (int s = 0; s < S; s++) acc = __fadd_rn(acc, __fmul_rn(wt[s], xt[(size_t)s * width]));
    out[e] = acc;
}

// x[t, k, i] = post[t, k] * y[t, i] + sum_j C[t, j, k] * x[t, j, i] (one thread per (t, i)).
#define DSV4_MAX_STREAMS 16
extern "C" __global__ void dsv4_mhc_expand(float* x, const float* __restrict__ w,
                                           const float* __restrict__ y, int S, int width,
                                           long long total) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    long long t = e / width, i = e % width;
    float* xt = x + t * S * width + i;
    const float* wt = w + t * (2 + S) * S;
    const float *post = wt + S, *c = wt + 2 * S;
    float col[DSV4_MAX_STREAMS];
    for (int j = 0; j < S; j++) col[j] = xt[(size_t)j * width];
    float yi = y[t * width + i];
    for (int k = 0; k < S; k++) {
        float acc = 0.0f;
        for (int j = 0; j < S; j++) acc = __fadd_rn(acc, __fmul_rn(c[j * S + k], col[j]));
        xt[(size_t)k * width] = __fadd_rn(__fmul_rn(post[k], yi), acc);
    }
}

// One thread per (row, head, pair) of the trailing 2*npairs channels.
extern "C" __global__ void dsv4_rope_trailing(float* x, const u32* __restrict__ pos,
                                              const float* __restrict__ inv, int n_head, int hd,
                                              int npairs, float sign, long long total) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    int i = (int)(e % npairs);
    long long th = e / npairs;
    long long t = th / n_head;
    float a = __fmul_rn((float)pos[t], inv[i]);
    float c = cosf(a), s = sign * sinf(a);
    float* v = x + th * hd + hd - 2 * npairs + 2 * i;
    float x0 = v[0], x1 = v[1];
    v[0] = x0 * c - x1 * s;
    v[1] = x1 * c + x0 * s;
}

// Channel c of window w's pooled row: softmax over the window's slots of logit + ape, times
// the values.
__device__ __forceinline__ float compress_window(const float* __restrict__ raw, int raw_slots,
                                                 int raw_width, int d,
                                                 const float* __restrict__ ape, int m,
                                                 int overlap, int w, int c) {
    int half = overlap ? 2 * d : d;
    // Slot j of 2m (overlap; the first m are the previous window's) or of m.
    int n_slots = overlap ? 2 * m : m, j0 = (overlap && w == 0) ? m : 0;
    float mx = NEG_INF;
    for (int j = j0; j < n_slots; j++) {
        long long p; int vc, ac;
        if (overlap) {
            bool prev = j < m;
            int jj = prev ? j : j - m;
            p = prev ? (long long)(w - 1) * m + jj : (long long)w * m + jj;
            vc = prev ? c : d + c;
            ac = jj * 2 * d + vc;
        } else {
            p = (long long)w * m + j;
            vc = c;
            ac = j * d + c;
        }
        const float* r = raw + (p % raw_slots) * raw_width;
        mx = fmaxf(mx, r[half + vc] + ape[ac]);
    }
    float sum = 0.0f, acc = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        acc = 0.0f;
        for (int j = j0; j < n_slots; j++) {
            long long p; int vc, ac;
            if (overlap) {
                bool prev = j < m;
                int jj = prev ? j : j - m;
                p = prev ? (long long)(w - 1) * m + jj : (long long)w * m + jj;
                vc = prev ? c : d + c;
                ac = jj * 2 * d + vc;
            } else {
                p = (long long)w * m + j;
                vc = c;
                ac = j * d + c;
            }
            const float* r = raw + (p % raw_slots) * raw_width;
            float ex = expf(r[half + vc] + ape[ac] - mx);
            if (pass == 0) sum += ex;
            else acc += ex / sum * r[vc];
        }
    }
    return acc;
}

// One thread per (window, channel) of windows first .. first + n_windows - 1.
extern "C" __global__ void dsv4_compress_pool(const float* __restrict__ raw, int raw_slots,
                                              int raw_width, int d, const float* __restrict__ ape,
                                              int m, int overlap, int first, int n_windows,
                                              float* __restrict__ out) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n_windows * d) return;
    int c = (int)(e % d), w = first + (int)(e / d);
    out[(size_t)(e / d) * d + c] =
        compress_window(raw, raw_slots, raw_width, d, ape, m, overlap, w, c);
}

// One thread per (row, channel) of the n rows at pos: a row whose position p completes its
// window (p + 1 divisible by m) pools window p / m into that row of `rows`; the others do
// nothing, so the launch is the same at every position of a decode.
extern "C" __global__ void dsv4_compress_pool_at(const float* __restrict__ raw, int raw_slots,
                                                 int raw_width, int d,
                                                 const float* __restrict__ ape, int m,
                                                 int overlap, const u32* __restrict__ pos, int n,
                                                 float* __restrict__ rows) {
    PDL_ENTRY();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * d) return;
    int c = (int)(e % d);
    int p = (int)pos[e / d];
    if ((p + 1) % m != 0) return;
    int w = p / m;
    rows[(size_t)w * d + c] = compress_window(raw, raw_slots, raw_width, d, ape, m, overlap, w, c);
}

// Blocks of (query, LSC_PER_BLOCK entries): the scores of the visible entries into scores row
// t, a warp per entry (per head: a lane-strided dot, warp_sum, accumulated over the heads in
// order), so a decode step spreads a long context over the whole GPU.
#define LSC_PER_BLOCK 64
extern "C" __global__ void dsv4_lightning_scores(const float* __restrict__ q, const float* __restrict__ w,
                                                 const float* __restrict__ keys,
                                                 const u32* __restrict__ pos, int nh, int di,
                                                 int ratio, float scale, int stride,
                                                 float* __restrict__ scores) {
    PDL_ENTRY();
    int t = blockIdx.x;
    int nv = ((int)pos[t] + 1) / ratio;
    int b0 = blockIdx.y * LSC_PER_BLOCK, b1 = min(nv, b0 + LSC_PER_BLOCK);
    const float* qt = q + (size_t)t * nh * di;
    const float* wt = w + (size_t)t * nh;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    for (int b = b0 + warp; b < b1; b += nw) {
        const float* kb = keys + (size_t)b * di;
        float s = 0.0f;
        for (int h = 0; h < nh; h++) {
            float dot = 0.0f;
            for (int i = lane; i < di; i += 32) dot += qt[h * di + i] * kb[i];
            dot = warp_sum(dot);
            s += fmaxf(dot, 0.0f) * scale * wt[h];
        }
        if (lane == 0) scores[(size_t)t * stride + b] = isnan(s) ? NEG_INF : s;
    }
}

// A score as an unsigned key of the same order (-0 and +0 equal, as the comparison has them).
__device__ __forceinline__ u32 lsel_key(float s) {
    if (s == 0.0f) s = 0.0f;
    u32 b = __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum of v over the block (a multiple of 32 threads, at most 1024; every thread
// calls it); the block's total into *total.
__device__ int lsel_scan(int v, int* sh, int* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int wv = lane < nw ? sh[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, wv, o);
            if (lane >= o) wv += y;
        }
        sh[lane] = wv;
    }
    __syncthreads();
    int before = (warp > 0 ? sh[warp - 1] : 0) + x - v;
    *total = sh[nw - 1];
    __syncthreads();
    return before;
}

// One block per query: the top_k entries by score (the lower entry first among equal scores),
// in ascending order. The k-th largest key by a 4-pass radix select (8 bits a pass, a shared
// histogram of the keys that match the bits fixed so far), then the entries above it and the
// first ones equal to it, compacted in index order by block scans: O(entries) per query. With
// `expand` the row lists positions: the `ratio` of each kept entry, then the open entry's tail.
extern "C" __global__ void dsv4_lightning_select(const float* __restrict__ scores,
                                                 const u32* __restrict__ pos, int ratio, int top_k,
                                                 int stride, int expand, u32* sel, u32* counts) {
    PDL_ENTRY();
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_mask;
    __shared__ int s_need;
    __shared__ int scan_sh[32];
    int t = blockIdx.x;
    int nv = ((int)pos[t] + 1) / ratio;
    int width = expand ? top_k * ratio + ratio - 1 : top_k;
    u32* row = sel + (size_t)t * width;
    if (nv <= top_k) {
        int all = expand ? (int)pos[t] + 1 : nv;
        for (int x = threadIdx.x; x < all; x += blockDim.x) row[x] = (u32)x;
        if (threadIdx.x == 0) counts[t] = (u32)all;
        return;
    }
    const float* s = scores + (size_t)t * stride;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_need = top_k;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        u32 prefix = s_prefix, mask = s_mask;
        for (int b = threadIdx.x; b < nv; b += blockDim.x) {
            u32 key = lsel_key(s[b]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The bin holding the need-th largest of the matching keys.
            int need = s_need, bin = 255;
            for (; bin > 0; bin--) {
                int c = (int)hist[bin];
                if (c >= need) break;
                need -= c;
            }
            s_need = need;
            s_prefix = prefix | ((u32)bin << shift);
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    u32 kth = s_prefix;
    int need = s_need;  // entries equal to the k-th key to keep: the lowest indices
    int base_eq = 0, base_out = 0;
    for (int c0 = 0; c0 < nv; c0 += blockDim.x) {
        int b = c0 + (int)threadIdx.x;
        u32 key = b < nv ? lsel_key(s[b]) : 0u;
        int eq = b < nv && key == kth;
        int tot;
        int eq_before = lsel_scan(eq, scan_sh, &tot);
        int keep = b < nv && (key > kth || (eq && base_eq + eq_before < need));
        base_eq += tot;
        int out_before = lsel_scan(keep, scan_sh, &tot);
        if (keep && expand)
            for (int u = 0; u < ratio; u++) row[(base_out + out_before) * ratio + u] = (u32)(b * ratio + u);
        else if (keep)
            row[base_out + out_before] = (u32)b;
        base_out += tot;
    }
    if (!expand) {
        if (threadIdx.x == 0) counts[t] = (u32)base_out;
        return;
    }
    int open = nv * ratio, n = base_out * ratio;
    for (int x = open + (int)threadIdx.x; x <= (int)pos[t]; x += blockDim.x) row[n + x - open] = (u32)x;
    if (threadIdx.x == 0) counts[t] = (u32)(n + (int)pos[t] + 1 - open);
}

// One block per (query, head): online softmax (with the sink) over the selected rows of two
// sets, in tiles of DSV4_TILE rows; threads over the head's channels for the weighted sum.
#define DSV4_TILE 256
extern "C" __global__ void dsv4_attention_sink(const float* __restrict__ q,
                                               const float* __restrict__ ra, const u32* __restrict__ sa,
                                               const u32* __restrict__ ca, int wa,
                                               const float* __restrict__ rb, const u32* __restrict__ sb,
                                               const u32* __restrict__ cb, int wb,
                                               const float* __restrict__ sinks, int nh, int hd,
                                               float scale, float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float p[DSV4_TILE];
    __shared__ float tile_max;
    int t = blockIdx.x, h = blockIdx.y;
    int na = (int)ca[t], nb = (int)cb[t], total = na + nb;
    const float* qh = q + ((size_t)t * nh + h) * hd;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    float run_max = sinks[h];
    double run_sum = 1.0;  // exp(sink - run_max)
    // Each thread owns channels threadIdx.x, + blockDim.x, ... (hd <= 4 * blockDim.x).
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int base = 0; base < total; base += DSV4_TILE) {
        int nt = min(DSV4_TILE, total - base);
        for (int j = warp; j < nt; j += nw) {
            int g = base + j;
            const float* r = g < na ? ra + (size_t)sa[(size_t)t * wa + g] * hd
                                    : rb + (size_t)sb[(size_t)t * wb + g - na] * hd;
            float dot = 0.0f;
            for (int i = lane; i < hd; i += 32) dot += qh[i] * r[i];
            dot = warp_sum(dot);
            if (lane == 0) p[j] = dot * scale;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float m = run_max;
            for (int j = 0; j < nt; j++) m = fmaxf(m, p[j]);
            tile_max = m;
        }
        __syncthreads();
        float m = tile_max;
        float corr = expf(run_max - m);
        for (int c = 0; c < 4; c++) acc[c] *= corr;
        double tsum = 0.0;
        for (int j = 0; j < nt; j++) tsum += (double)expf(p[j] - m);
        run_sum = run_sum * (double)corr + tsum;
        run_max = m;
        for (int j = 0; j < nt; j++) {
            int g = base + j;
            const float* r = g < na ? ra + (size_t)sa[(size_t)t * wa + g] * hd
                                    : rb + (size_t)sb[(size_t)t * wb + g - na] * hd;
            float e = expf(p[j] - m);
            for (int c = 0; c < 4; c++) {
                int i = threadIdx.x + c * blockDim.x;
                if (i < hd) acc[c] += e * r[i];
            }
        }
        __syncthreads();
    }
    float z = (float)run_sum;
    float* o = out + ((size_t)t * nh + h) * hd;
    for (int c = 0; c < 4; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i < hd) o[i] = acc[c] / z;
    }
}

// dsv4_attention_sink in parts and head groups (what few queries need: decode, verification).
// Grid (parts, head groups, queries), 256 threads. Part p of query t covers its rows
// p*ATTN_PART.. (the a rows, then the b rows); the gs heads of group hg (hg*gs..) share each row
// read (K = V, one row for every head). One warp per row (coalesced, every head's dot), then per
// head the part's max m and sum l of exp(s - m), and acc = sum exp(s - m) row (threads over the
// head dim). part_acc is [q, nh, parts, hd], part_ml [q, nh, parts, 2]; dsv4_attn_sink_combine
// adds the sink. Limits: hd a multiple of 32 up to ATTN_MAX_HD, gs <= ATTN_MAX_G, gs*hd <= 4096
// (attn_part_rows, common.cu).
extern "C" __global__ void dsv4_attn_sink_part(const float* __restrict__ q,
                                               const float* __restrict__ ra, const u32* __restrict__ sa,
                                               const u32* __restrict__ ca, int wa,
                                               const float* __restrict__ rb, const u32* __restrict__ sb,
                                               const u32* __restrict__ cb, int wb, int nh, int hd,
                                               float scale, int parts, int gs,
                                               float* __restrict__ part_acc,
                                               float* __restrict__ part_ml) {
    PDL_ENTRY();
    __shared__ float qs[4096];
    __shared__ float ps[ATTN_MAX_G * ATTN_PART];
    __shared__ const float* rows[ATTN_PART];
    int p = blockIdx.x, hg = blockIdx.y, t = blockIdx.z;
    int h0 = hg * gs, G = min(gs, nh - h0);
    int na = (int)ca[t], total = na + (int)cb[t];
    int j0 = p * ATTN_PART;
    if (j0 >= total) return;
    int m = min(ATTN_PART, total - j0);
    const float* qt = q + ((size_t)t * nh + (size_t)h0) * hd;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = qt[i];
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        int g = j0 + j;
        rows[j] = g < na ? ra + (size_t)sa[(size_t)t * wa + g] * hd
                         : rb + (size_t)sb[(size_t)t * wb + g - na] * hd;
    }
    __syncthreads();
    size_t base = ((size_t)t * nh + (size_t)h0) * parts + p;
    attn_part_rows(qs, rows, rows, m, G, hd, scale, parts, base, ps, part_acc, part_ml);
}

// Grid (heads, queries), threads over the head dim: the parts of dsv4_attn_sink_part merged with
// the sink (which takes probability but adds no value): max over the sink and the parts, each
// part rescaled by exp(m_p - max), the denominator summed in f64 as the CPU's.
extern "C" __global__ void dsv4_attn_sink_combine(const float* __restrict__ part_acc,
                                                  const float* __restrict__ part_ml,
                                                  const u32* __restrict__ ca,
                                                  const u32* __restrict__ cb,
                                                  const float* __restrict__ sinks, int nh, int hd,
                                                  int parts, float* __restrict__ out) {
    PDL_ENTRY();
    int h = blockIdx.x, t = blockIdx.y;
    int np = min(parts, ((int)ca[t] + (int)cb[t] + ATTN_PART - 1) / ATTN_PART);
    size_t base = ((size_t)t * nh + h) * parts;
    float mx = sinks[h];
    for (int p = 0; p < np; p++) mx = fmaxf(mx, part_ml[(base + p) * 2]);
    double l = (double)expf(sinks[h] - mx);
    for (int p = 0; p < np; p++)
        l += (double)(part_ml[(base + p) * 2 + 1] * expf(part_ml[(base + p) * 2] - mx));
    float z = (float)l;
    float* o = out + ((size_t)t * nh + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < np; p++)
            acc += part_acc[(base + p) * hd + d] * expf(part_ml[(base + p) * 2] - mx);
        o[d] = acc / z;
    }
}

// gate = silu(min(gate, L)) * clamp(up, -L, L).
extern "C" __global__ void dsv4_act_mul_silu_limit(float* g, const float* __restrict__ u, long long n,
                                                   float limit) {
    PDL_ENTRY();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = fminf(g[i], limit);
    g[i] = x / (1.0f + expf(-x)) * fminf(fmaxf(u[i], -limit), limit);
}
