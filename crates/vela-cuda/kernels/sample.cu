// Device top-k of logits rows for sampling (src/sample.rs): one block of TOPK_THREADS threads
// per row selects the k best (index, value) pairs in the order of the CPU sampler's `top_k`
// (value descending in IEEE total order, lower index first on ties, NaN never selected) and the
// row's statistics, so only k pairs and a 24-byte header come back instead of the row.
//
// Selection: radix select on the order-preserving u32 key of each value, 3 passes of 11, 11 and
// 10 bits with a shared-memory histogram of the elements that match the prefix found so far;
// the last pass leaves the k-th key T and how many elements equal to T are needed. A gather pass
// takes every element with key > T and, of those equal to T, the lowest indices (ranked in index
// order by a block-wide ballot scan), then a bitonic sort in shared memory orders the k pairs.
//
// Output record of row r at out + r * (6 + 2k) u32 words: [n = min(k, n_valid), n_valid,
// max bits, 0, sum_exp (f64, words 4-5), then n pairs (index, value bits)]. max is the largest
// non-NaN value (-inf if none) and sum_exp = sum over non-NaN x of exp((double)x - max), summed
// in f64 (per thread, then a fixed-order block reduction).

#define TOPK_MAX 1024
#define TOPK_THREADS 1024

__device__ __forceinline__ u32 topk_key(u32 b) { return (b & 0x80000000u) ? ~b : (b | 0x80000000u); }
__device__ __forceinline__ u32 topk_unkey(u32 k) { return (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k; }
__device__ __forceinline__ bool topk_nan(u32 b) { return (b & 0x7fffffffu) > 0x7f800000u; }

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

// Warp 0 only: the bin d, scanning from the top, at which the count of elements in bins > d is
// below rem and the count including d reaches it (the histogram total is at least rem). Writes
// info[0] = d, info[1] = rem - (count in bins > d) and info[3] = count in bin d.
__device__ void topk_pick(const u32* hist, int nbins, u32 rem, u32* info) {
    int lane = threadIdx.x & 31;
    int per = nbins / 32;
    int hi = nbins - lane * per;  // lane 0 owns the top bins
    u32 c = 0;
    for (int j = hi - per; j < hi; j++) c += hist[j];
    u32 inc = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += t;
    }
    u32 acc = inc - c;
    if (acc < rem && rem <= inc) {
        for (int j = hi - 1; j >= hi - per; j--) {
            u32 h = hist[j];
            if (acc + h >= rem) {
                info[0] = (u32)j;
                info[1] = rem - acc;
                info[3] = h;
                break;
            }
            acc += h;
        }
    }
}

// Grid (n_rows), TOPK_THREADS threads; 1 <= k <= TOPK_MAX.
extern "C" __launch_bounds__(TOPK_THREADS) __global__ void topk_rows(const float* __restrict__ x, int width, int k, u32* __restrict__ out) {
    __shared__ u32 hist[2048];
    __shared__ u64 cand[TOPK_MAX];
    __shared__ u32 info[8];  // 0: digit, 1: remaining, 2: next slot, 3: bin count, 4: max key, 5: n_valid
    __shared__ u32 wcount[32];
    const u32* xr = (const u32*)x + (size_t)blockIdx.x * width;
    u32* o = out + (size_t)blockIdx.x * (6 + 2 * (size_t)k);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;

    // Pass 1: count, max and histogram of the top 11 bits.
    for (int i = tid; i < 2048; i += blockDim.x) hist[i] = 0;
    if (tid < 8) info[tid] = 0;
    __syncthreads();
    u32 nv = 0, mk = 0;
    for (int base = 0; base < width; base += blockDim.x) {
        int i = base + tid;
        u32 b = i < width ? xr[i] : 0xffffffffu;  // out of range: a NaN
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
    const u32 n_valid = info[5];
    const u32 kk = min((u32)k, n_valid);
    // Valid keys are >= 0x007fffff (-inf), so a max key of 0 means no valid element.
    const float maxf = n_valid ? __uint_as_float(topk_unkey(info[4])) : __uint_as_float(0xff800000u);
    if (kk == 0) {
        if (tid == 0) {
            o[0] = 0;
            o[1] = n_valid;
            o[2] = __float_as_uint(maxf);
            o[3] = 0;
            *(double*)(o + 4) = 0.0;
        }
        return;
    }
    if (warp == 0) topk_pick(hist, 2048, kk, info);
    __syncthreads();
    u32 prefix = info[0] << 21;
    u32 rem = info[1];
    __syncthreads();

    // Pass 2: the next 11 bits among the elements matching the top digit; the normalizer.
    for (int i = tid; i < 2048; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const double md = (double)maxf;
    double s = 0.0;
    for (int base = 0; base < width; base += blockDim.x) {
        int i = base + tid;
        u32 b = i < width ? xr[i] : 0xffffffffu;
        bool ok = !topk_nan(b);
        if (ok) s += exp((double)__uint_as_float(b) - md);
        u32 key = topk_key(b);
        topk_count(hist, (key >> 10) & 0x7ffu, ok && (key >> 21) == (prefix >> 21));
    }
    s = block_sum_d(s);
    __syncthreads();
    if (warp == 0) topk_pick(hist, 2048, rem, info);
    __syncthreads();
    prefix |= info[0] << 10;
    rem = info[1];
    __syncthreads();

    // Pass 3: the last 10 bits.
    for (int i = tid; i < 1024; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < width; base += blockDim.x) {
        int i = base + tid;
        u32 b = i < width ? xr[i] : 0xffffffffu;
        u32 key = topk_key(b);
        topk_count(hist, key & 0x3ffu, !topk_nan(b) && (key >> 10) == (prefix >> 10));
    }
    __syncthreads();
    if (warp == 0) topk_pick(hist, 1024, rem, info);
    __syncthreads();
    const u32 thr = prefix | info[0];
    rem = info[1];  // elements equal to thr to take, lowest indices first
    const bool all_ties = rem == info[3];  // ... which may be all of them
    if (tid == 0) info[2] = 0;
    __syncthreads();

    // Gather: everything above thr (any order), the first rem elements equal to thr in index order.
    if (all_ties) {
        for (int i = tid; i < width; i += blockDim.x) {
            u32 b = xr[i];
            u32 key = topk_key(b);
            if (!topk_nan(b) && key >= thr) {
                u32 slot = atomicAdd(&info[2], 1u);
                cand[slot] = ((u64)key << 32) | (u64)(0xffffffffu - (u32)i);
            }
        }
    }
    u32 ties = 0;  // elements equal to thr in earlier chunks
    for (int base = 0; !all_ties && base < width; base += blockDim.x) {
        int i = base + tid;
        bool eq = false;
        u32 key = 0;
        if (i < width) {
            u32 b = xr[i];
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
        if (lane == 0) wcount[warp] = __popc(bal);
        __syncthreads();
        u32 before = 0, total = 0;
        for (int w = 0; w < nw; w++) {
            u32 c = wcount[w];
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

    if (tid == 0) {
        o[0] = kk;
        o[1] = n_valid;
        o[2] = __float_as_uint(maxf);
        o[3] = 0;
        *(double*)(o + 4) = s;
    }
    for (u32 i = tid; i < kk; i += blockDim.x) {
        u64 e = cand[i];
        o[6 + 2 * i] = 0xffffffffu - (u32)e;
        o[7 + 2 * i] = topk_unkey((u32)(e >> 32));
    }
}
