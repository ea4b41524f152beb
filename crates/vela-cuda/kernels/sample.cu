// Device top-k of logits rows for sampling (src/sample.rs): the k best (index, value) pairs of
// each row in the order of the CPU sampler's `top_k` (value descending in IEEE total order, lower
// index first on ties, NaN never selected) and the row's statistics, so only k pairs and a
// 24-byte header come back instead of the row.
//
// Block selection (topk_block, one block of up to 1024 threads over n elements): radix select on
// the order-preserving u32 key of each value, 3 passes of 11, 11 and 10 bits with a shared-memory
// histogram of the elements that match the prefix found so far; the last pass leaves the k-th key
// T and how many elements equal to T are needed. A gather pass takes every element with key > T
// and, of those equal to T, the lowest positions (ranked in position order by a block-wide ballot
// scan), then a bitonic sort in shared memory orders the pairs (key descending, position
// ascending).
//
// Short rows (one part, see src/sample.rs): `topk_rows`, one block per row, positions are the
// indices. Long rows, two phases so that the row is spread over many SMs:
// - `topk_part`, one block per (row, part) of `part` contiguous elements: the part's own top k
//   (n = min(k, its valid count) pairs, the k - n slots after them NaN), its valid count, largest
//   key and the f64 sum of exp(x - part max).
// - `topk_merge`, one block per row: block selection over the row's candidate list, the parts'
//   lists concatenated in part order. Equal values appear there in index order (within a part by
//   the sort, across parts because parts are in index order), so the position tie-break is the
//   index tie-break; every element of the row's top k is in its part's top k. Statistics: n_valid
//   = the sum, max = the largest, sum_exp = sum over parts of s_p * exp(m_p - max) in f64.
//
// Output record of row r at out + r * (6 + 2k) u32 words: [n = min(k, n_valid), n_valid,
// max bits, 0, sum_exp (f64, words 4-5), then n pairs (index, value bits)]. max is the largest
// non-NaN value (-inf if none) and sum_exp = sum over non-NaN x of exp((double)x - max) (0 if
// none), summed in f64 in a fixed order.

#define TOPK_MAX 1024
#define TOPK_THREADS 1024

__device__ __forceinline__ u32 topk_key(u32 b) { return (b & 0x80000000u) ? ~b : (b | 0x80000000u); }
__device__ __forceinline__ u32 topk_unkey(u32 k) { return (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k; }
__device__ __forceinline__ bool topk_nan(u32 b) { return (b & 0x7fffffffu) > 0x7f800000u; }
#define TOPK_NEG_INF_KEY 0x007fffffu  // topk_key(-inf): the smallest key of a non-NaN value

// Shared memory of one block selection.
struct TopkSmem {
    u32 hist[2048];
    u64 cand[TOPK_MAX];  // (key << 32) | ~position
    u32 info[8];         // 0: digit, 1: remaining, 2: next slot, 3: bin count, 4: max key, 5: n_valid
    u32 wcount[32];
};

// hist[bin] += 1 for the lanes with `on`, aggregated over the lanes of the warp that hit the same
// bin (fewer conflicting shared-memory atomics when most logits fall in a few bins). Every lane
// of the warp must call it (the loops below run whole warps in step).
__device__ __forceinline__ void topk_count(u32* hist, u32 bin, bool on) {
#if __CUDA_ARCH__ >= 700
    u32 peers = __match_any_sync(0xffffffffu, on ? bin : 0xffffffffu);
    if (on && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
#else
    if (on) atomicAdd(&hist[bin], 1u);
#endif
}

__device__ __forceinline__ u32 warp_sum_u(u32 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ u32 warp_max_u(u32 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Inclusive prefix sum over the lanes of a warp (lane 0 first).
__device__ __forceinline__ u32 warp_scan_u(u32 v) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

// Warp 0 only (all its lanes): the bin d, scanning from the top, at which the count of elements
// in bins > d is below rem and the count including d reaches it (1 <= rem <= the histogram
// total). Writes info[0] = d, info[1] = rem - (count in bins > d) and info[3] = count in bin d.
// nbins is 1024 or 2048: each lane sums nbins / 32 bins (lane 0 the top ones, read in a rotated
// order so that the lanes hit distinct banks), a warp scan finds the lane holding d, then the
// warp scans that lane's bins 32 at a time.
__device__ void topk_pick(const u32* hist, int nbins, u32 rem, u32* info) {
    const int lane = threadIdx.x & 31;
    const int per = nbins / 32;  // 32 or 64
    const int lo = nbins - (lane + 1) * per;
    u32 c = 0;
    for (int j = 0; j < per; j++) c += hist[lo + ((j + lane) & (per - 1))];
    u32 inc = warp_scan_u(c);
    u32 hit = __ballot_sync(0xffffffffu, inc - c < rem && rem <= inc);
    int src = __ffs(hit) - 1;  // exactly one lane: the counts are cumulative
    u32 acc = __shfl_sync(0xffffffffu, inc - c, src);
    const int top = nbins - src * per;  // that lane's bins are [top - per, top)
    for (int c0 = 0; c0 < per; c0 += 32) {
        int j = top - 1 - c0 - lane;  // descending over the lanes
        u32 h = hist[j];
        u32 in2 = warp_scan_u(h);
        u32 f = __ballot_sync(0xffffffffu, acc + in2 - h < rem && rem <= acc + in2);
        if (f) {
            if (lane == __ffs(f) - 1) {
                info[0] = (u32)j;
                info[1] = rem - (acc + in2 - h);
                info[3] = h;
            }
            break;
        }
        acc += __shfl_sync(0xffffffffu, in2, 31);
    }
}

// The whole block (every thread calls it; blockDim.x a multiple of 32): the kk = min(k, n_valid)
// best of the n values xr[0..n) (f32 bits), 1 <= k <= TOPK_MAX. Returns kk; then sm.cand[0..kk)
// holds them sorted (key descending, position ascending). Every thread gets n_valid (the non-NaN
// count), max_key (the largest key, 0 if none) and, with want_sum (uniform), sum = the f64 sum of
// exp(x - max) over the non-NaN x (0 if none; the same value in every thread).
__device__ u32 topk_block(TopkSmem& sm, const u32* __restrict__ xr, int n, u32 k, bool want_sum, u32& n_valid, u32& max_key, double& sum) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    u32* hist = sm.hist;
    u32* info = sm.info;
    u64* cand = sm.cand;

    // Pass 1: count, max and histogram of the top 11 bits.
    for (int i = tid; i < 2048; i += blockDim.x) hist[i] = 0;
    if (tid < 8) info[tid] = 0;
    __syncthreads();
    u32 nv = 0, mk = 0;
    for (int base = 0; base < n; base += blockDim.x) {
        int i = base + tid;
        u32 b = i < n ? __ldg(xr + i) : 0xffffffffu;  // out of range: a NaN
        bool ok = !topk_nan(b);
        u32 key = topk_key(b);
        nv += ok;
        mk = ok ? max(mk, key) : mk;
        topk_count(hist, key >> 21, ok);
    }
    nv = warp_sum_u(nv);
    mk = warp_max_u(mk);
    if (lane == 0) {
        atomicAdd(&info[5], nv);
        atomicMax(&info[4], mk);
    }
    __syncthreads();
    n_valid = info[5];
    max_key = info[4];
    sum = 0.0;
    const u32 kk = min(k, n_valid);
    if (kk == 0) return 0;  // uniform
    if (warp == 0) topk_pick(hist, 2048, kk, info);
    __syncthreads();
    u32 prefix = info[0] << 21;
    u32 rem = info[1];
    __syncthreads();

    // Pass 2: the next 11 bits among the elements matching the top digit; the normalizer.
    for (int i = tid; i < 2048; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const double md = (double)__uint_as_float(topk_unkey(max_key));
    double s = 0.0;
    for (int base = 0; base < n; base += blockDim.x) {
        int i = base + tid;
        u32 b = i < n ? __ldg(xr + i) : 0xffffffffu;
        bool ok = !topk_nan(b);
        if (want_sum && ok) s += exp((double)__uint_as_float(b) - md);
        u32 key = topk_key(b);
        topk_count(hist, (key >> 10) & 0x7ffu, ok && (key >> 21) == (prefix >> 21));
    }
    if (want_sum) sum = block_sum_d(s);
    __syncthreads();
    if (warp == 0) topk_pick(hist, 2048, rem, info);
    __syncthreads();
    prefix |= info[0] << 10;
    rem = info[1];
    __syncthreads();

    // Pass 3: the last 10 bits.
    for (int i = tid; i < 1024; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += blockDim.x) {
        int i = base + tid;
        u32 b = i < n ? __ldg(xr + i) : 0xffffffffu;
        u32 key = topk_key(b);
        topk_count(hist, key & 0x3ffu, !topk_nan(b) && (key >> 10) == (prefix >> 10));
    }
    __syncthreads();
    if (warp == 0) topk_pick(hist, 1024, rem, info);
    __syncthreads();
    const u32 thr = prefix | info[0];
    rem = info[1];  // elements equal to thr to take, lowest positions first
    const bool all_ties = rem == info[3];  // ... which may be all of them
    if (tid == 0) info[2] = 0;
    __syncthreads();

    // Gather: everything above thr (any order), the first rem elements equal to thr in position
    // order.
    if (all_ties) {
        for (int i = tid; i < n; i += blockDim.x) {
            u32 b = __ldg(xr + i);
            u32 key = topk_key(b);
            if (!topk_nan(b) && key >= thr) {
                u32 slot = atomicAdd(&info[2], 1u);
                cand[slot] = ((u64)key << 32) | (u64)(0xffffffffu - (u32)i);
            }
        }
    }
    u32 ties = 0;  // elements equal to thr in earlier chunks
    for (int base = 0; !all_ties && base < n; base += blockDim.x) {
        int i = base + tid;
        bool eq = false;
        u32 key = 0;
        if (i < n) {
            u32 b = __ldg(xr + i);
            if (!topk_nan(b)) {
                key = topk_key(b);
                if (key > thr) {
                    u32 slot = atomicAdd(&info[2], 1u);
                    cand[slot] = ((u64)key << 32) | (u64)(0xffffffffu - (u32)i);
                }
                eq = key == thr;
            }
        }
        u32 bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) sm.wcount[warp] = __popc(bal);
        __syncthreads();
        u32 before = 0, total = 0;
        for (int w = 0; w < nw; w++) {
            u32 c = sm.wcount[w];
            before += w < warp ? c : 0;
            total += c;
        }
        if (eq) {
            u32 rank = ties + before + __popc(bal & ((1u << lane) - 1u));
            if (rank < rem) {
                u32 slot = atomicAdd(&info[2], 1u);
                cand[slot] = ((u64)key << 32) | (u64)(0xffffffffu - (u32)i);
            }
        }
        ties += total;
        __syncthreads();
    }

    // Bitonic sort (descending) of the kk entries padded to a power of two with zeros, which
    // are below every valid key.
    u32 p2 = 1;
    while (p2 < kk) p2 <<= 1;
    for (u32 i = kk + tid; i < p2; i += blockDim.x) cand[i] = 0;
    __syncthreads();
    for (u32 size = 2; size <= p2; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = tid; i < p2; i += blockDim.x) {
                u32 j = i ^ stride;
                if (j > i) {
                    u64 a = cand[i], c = cand[j];
                    bool desc = (i & size) == 0;
                    if (desc ? (a < c) : (a > c)) {
                        cand[i] = c;
                        cand[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    return kk;
}

// Writes a row record from a block selection: index = idx[position] (idx null: the position).
__device__ void topk_write(const TopkSmem& sm, u32* __restrict__ o, u32 kk, u32 n_valid, u32 max_key, double sum, const u32* __restrict__ idx) {
    if (threadIdx.x == 0) {
        o[0] = kk;
        o[1] = n_valid;
        o[2] = n_valid ? topk_unkey(max_key) : 0xff800000u;  // -inf
        o[3] = 0;
        *(double*)(o + 4) = sum;
    }
    for (u32 i = threadIdx.x; i < kk; i += blockDim.x) {
        u64 e = sm.cand[i];
        u32 pos = 0xffffffffu - (u32)e;
        o[6 + 2 * i] = idx ? idx[pos] : pos;
        o[7 + 2 * i] = topk_unkey((u32)(e >> 32));
    }
}

// Grid (n_rows), TOPK_THREADS threads; 1 <= k <= TOPK_MAX. Rows of one part.
extern "C" __launch_bounds__(TOPK_THREADS) __global__ void topk_rows(const float* __restrict__ x, int width, int k, u32* __restrict__ out) {
    PDL_ENTRY();
    __shared__ TopkSmem sm;
    const u32* xr = (const u32*)x + (size_t)blockIdx.x * width;
    u32 n_valid, max_key;
    double sum;
    const u32 kk = topk_block(sm, xr, width, (u32)k, true, n_valid, max_key, sum);
    topk_write(sm, out + (size_t)blockIdx.x * (6 + 2 * (size_t)k), kk, n_valid, max_key, sum, nullptr);
}

// Phase 1. Grid (n_rows * parts), TOPK_THREADS threads, parts = ceil(width / part) (so every part
// starts inside the row), 1 <= k <= TOPK_MAX. Block b: part p = b % parts of row b / parts. Writes
// its candidates at (row * parts + p) * k in cval (value bits, NaN in unused slots) and cidx
// (row indices), and [n_valid, max key, sum (f64)] at stats + (row * parts + p) * 4.
extern "C" __launch_bounds__(TOPK_THREADS) __global__ void topk_part(const float* __restrict__ x, int width, int k, int part, int parts, u32* __restrict__ cval, u32* __restrict__ cidx, u32* __restrict__ stats) {
    PDL_ENTRY();
    __shared__ TopkSmem sm;
    const int p = blockIdx.x % parts, row = blockIdx.x / parts;
    const int start = p * part;
    const int n = min(part, width - start);
    const u32* xr = (const u32*)x + (size_t)row * width + start;
    u32 n_valid, max_key;
    double sum;
    const u32 kk = topk_block(sm, xr, n, (u32)k, true, n_valid, max_key, sum);
    const size_t c = ((size_t)row * parts + p) * k;
    for (u32 i = threadIdx.x; i < (u32)k; i += blockDim.x) {
        u32 v = 0xffffffffu, ix = 0;
        if (i < kk) {
            u64 e = sm.cand[i];
            v = topk_unkey((u32)(e >> 32));
            ix = (u32)start + (0xffffffffu - (u32)e);
        }
        cval[c + i] = v;
        cidx[c + i] = ix;
    }
    if (threadIdx.x == 0) {
        u32* st = stats + ((size_t)row * parts + p) * 4;
        st[0] = n_valid;
        st[1] = max_key;
        *(double*)(st + 2) = sum;
    }
}

// Phase 2. Grid (n_rows), TOPK_THREADS threads: merges the candidates and statistics of
// topk_part into the row records.
extern "C" __launch_bounds__(TOPK_THREADS) __global__ void topk_merge(const u32* __restrict__ cval, const u32* __restrict__ cidx, const u32* __restrict__ stats, int k, int parts, u32* __restrict__ out) {
    PDL_ENTRY();
    __shared__ TopkSmem sm;
    __shared__ u32 tot[2];  // n_valid, max key
    const int tid = threadIdx.x, row = blockIdx.x;
    const u32* sr = stats + (size_t)row * parts * 4;
    if (tid < 2) tot[tid] = 0;
    __syncthreads();
    u32 nv = 0, mk = 0;
    for (int p = tid; p < parts; p += blockDim.x) {
        nv += sr[4 * p];
        mk = max(mk, sr[4 * p + 1]);
    }
    nv = warp_sum_u(nv);
    mk = warp_max_u(mk);
    if ((tid & 31) == 0 && (nv | mk)) {
        atomicAdd(&tot[0], nv);
        atomicMax(&tot[1], mk);
    }
    __syncthreads();
    const u32 n_valid = tot[0], max_key = tot[1];
    // Part sums rescaled to the row max. A part at the row max contributes its sum as is (NaN
    // when the max is +-inf, like the direct sum); a part whose values are all -inf below a
    // larger max contributes 0 (its own sum is NaN), as each of its terms would.
    const double m = (double)__uint_as_float(topk_unkey(max_key));
    double t = 0.0;
    for (int p = tid; p < parts; p += blockDim.x) {
        const u32 nvp = sr[4 * p], mkp = sr[4 * p + 1];
        const double sp = *(const double*)(sr + 4 * p + 2);
        if (nvp == 0 || (mkp != max_key && mkp == TOPK_NEG_INF_KEY)) continue;
        t += mkp == max_key ? sp : sp * exp((double)__uint_as_float(topk_unkey(mkp)) - m);
    }
    const double sum = block_sum_d(t);
    u32 cn, cmk;
    double unused;
    const size_t c = (size_t)row * parts * k;
    const u32 kk = topk_block(sm, cval + c, parts * k, (u32)k, false, cn, cmk, unused);
    topk_write(sm, out + (size_t)row * (6 + 2 * (size_t)k), kk, n_valid, max_key, sum, cidx + c);
}
