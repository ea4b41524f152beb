// Expert-indexed products (llama.cpp's mul_mat_id; Backend::matmul_experts): W is a 3-D expert
// tensor [E, rows, cols] held as E * rows weight rows in the layout of the ordinary products.
// Slot s (token s / k, slot s % k) multiplies expert ids[s], read on the device (no host
// sync), with activation row s (per_slot) or s / k: one warp per (weight row, slot), the block
// dots of mm32 / mmk / mmf (quant.cu) for one token. An expert id >= n_exp gives 0.

template <int T>
__device__ void mme32(const u8* __restrict__ W, const u32* __restrict__ ids,
                      const AQ8* __restrict__ X, float* __restrict__ Y, int rows, int nb,
                      int n_exp, int k, int per_slot) {
    int r = blockIdx.y * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int s = blockIdx.x;
    if (r >= rows) return;
    u32 e = ids[s];
    if (e >= (u32)n_exp) {
        if (lane == 0) Y[(size_t)s * rows + r] = 0.0f;
        return;
    }
    const u8* wr = W + ((size_t)e * rows + r) * nb * B32<T>::BYTES;
    const AQ8* xr = X + (size_t)(per_slot ? s : s / k) * nb;
    float acc = 0.0f, accm = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        int w[8];
        float d, m;
        decode32_at<T>(wr, nb, b, w, d, m);
        const AQ8* a = xr + b;
        int isum = 0;
#pragma unroll
        for (int q = 0; q < 8; q++) isum = dp4a(w[q], a->qs[q], isum);
        isum -= B32<T>::OFF * a->sum;
        acc += (float)isum * (d * a->d);
        if (B32<T>::MIN) accm += m * a->s;
    }
    float sum = warp_sum(acc), sm = warp_sum(accm);
    if (lane == 0) Y[(size_t)s * rows + r] = sum + sm;
}

template <int T>
__device__ void mmek(const u8* __restrict__ W, const u32* __restrict__ ids,
                     const AQ8K* __restrict__ X, float* __restrict__ Y, int rows, int nb,
                     int n_exp, int k, int per_slot) {
    int r = blockIdx.y * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int s = blockIdx.x;
    if (r >= rows) return;
    u32 e = ids[s];
    if (e >= (u32)n_exp) {
        if (lane == 0) Y[(size_t)s * rows + r] = 0.0f;
        return;
    }
    const u8* wr = W + ((size_t)e * rows + r) * row_stride<T>(nb);
    const AQ8K* xr = X + (size_t)(per_slot ? s : s / k) * nb;
    float acc = 0.0f;
    for (int it = lane; it < nb * 8; it += 32) {
        int b = it >> 3, j = it & 7;
        int w[8], sc[2], mn[2];
        float d, dmin;
        decodek_at<T>(wr, nb, b, j, w, sc, mn, d, dmin);
        const AQ8K* a = xr + b;
        int i0 = 0, i1 = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) i0 = dp4a(w[q], a->qs[8 * j + q], i0);
#pragma unroll
        for (int q = 4; q < 8; q++) i1 = dp4a(w[q], a->qs[8 * j + q], i1);
        int isum = sc[0] * i0 + sc[1] * i1;
        int corr = mn[0] * a->bsums[2 * j] + mn[1] * a->bsums[2 * j + 1];
        acc += (a->d * d) * (float)isum - (a->d * dmin) * (float)corr;
    }
    float sum = warp_sum(acc);
    if (lane == 0) Y[(size_t)s * rows + r] = sum;
}

// Float weights (F32, F16; F16 rounds the activations to f16 like mmf).
template <int T>
__device__ void mmef(const u8* __restrict__ W, const u32* __restrict__ ids,
                     const float* __restrict__ X, float* __restrict__ Y, int rows, int cols,
                     int n_exp, int k, int per_slot) {
    int r = blockIdx.y * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int s = blockIdx.x;
    if (r >= rows) return;
    u32 e = ids[s];
    if (e >= (u32)n_exp) {
        if (lane == 0) Y[(size_t)s * rows + r] = 0.0f;
        return;
    }
    size_t wr = ((size_t)e * rows + r) * cols;
    const float* xr = X + (size_t)(per_slot ? s : s / k) * cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        float wv = T == 0 ? ((const float*)W)[wr + c] : h2f(((const u16*)W)[wr + c]);
        float xv = xr[c];
        if (T == 1) xv = round_f16(xv);
        acc = fmaf(wv, xv, acc);
    }
    float sum = warp_sum(acc);
    if (lane == 0) Y[(size_t)s * rows + r] = sum;
}

#define MME32(T, NAME)                                                                             \
    extern "C" __global__ void NAME(const u8* W, const u32* ids, const AQ8* X, float* Y, int rows, int nb, int n_exp, int k, int per_slot) { PDL_ENTRY(); mme32<T>(W, ids, X, Y, rows, nb, n_exp, k, per_slot); }
#define MMEK(T, NAME)                                                                              \
    extern "C" __global__ void NAME(const u8* W, const u32* ids, const AQ8K* X, float* Y, int rows, int nb, int n_exp, int k, int per_slot) { PDL_ENTRY(); mmek<T>(W, ids, X, Y, rows, nb, n_exp, k, per_slot); }
#define MMEF(T, NAME)                                                                              \
    extern "C" __global__ void NAME(const u8* W, const u32* ids, const float* X, float* Y, int rows, int nb, int n_exp, int k, int per_slot) { PDL_ENTRY(); mmef<T>(W, ids, X, Y, rows, nb, n_exp, k, per_slot); }

MME32(2, mme_q4_0)
MME32(102, mme_q4_0s)
MME32(3, mme_q4_1)
MME32(6, mme_q5_0)
MME32(7, mme_q5_1)
MME32(8, mme_q8_0)
MMEK(13, mme_q5_k)
MMEK(112, mme_q4_ks)
MMEK(114, mme_q6_ks)
MMEF(0, mme_f32)
MMEF(1, mme_f16)

// Grouped products for batches (many slots per expert): experts_group sorts the slots by expert
// into `grp` ([0] the group count; from [4] the slot permutation, expert by expert with invalid
// ids last as expert n_exp; then per group (expert, first, count) of at most gs slots of one
// expert: MEG here, 8 NT for the tensor-core products mmqe_q4_0s_NT of mmq.cu), and mmeg32 /
// mmegk run one warp per (weight row, group): each weight block is decoded once for the group's
// slots. Each slot's sum runs in the same order as mme32 / mmek (lane-strided blocks, then the
// warp sum), so the results are the per-slot kernels' bits; only the order in which the slots
// are listed (atomics) varies, which changes no value.
#define MEG 8
// Experts the grouping holds (Backend::matmul_experts's callers route over at most 1024, kit.cu).
#define MEG_MAX_EXPERTS 1024

extern "C" __global__ void experts_group(const u32* __restrict__ ids, int n_slots, int n_exp,
                                         int gs, u32* __restrict__ grp) {
    PDL_ENTRY();
    __shared__ int cnt[MEG_MAX_EXPERTS + 1], start[MEG_MAX_EXPERTS + 1],
        fill[MEG_MAX_EXPERTS + 1], gstart[MEG_MAX_EXPERTS + 1];
    for (int e = threadIdx.x; e <= n_exp; e += blockDim.x) cnt[e] = fill[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) atomicAdd(&cnt[min(ids[s], (u32)n_exp)], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0, g = 0;
        for (int e = 0; e <= n_exp; e++) {
            start[e] = run;
            gstart[e] = g;
            run += cnt[e];
            g += (cnt[e] + gs - 1) / gs;
        }
        grp[0] = g;
    }
    __syncthreads();
    u32* perm = grp + 4;
    u32* groups = perm + n_slots;
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        int e = min(ids[s], (u32)n_exp);
        perm[start[e] + atomicAdd(&fill[e], 1)] = s;
    }
    for (int e = threadIdx.x; e <= n_exp; e += blockDim.x) {
        for (int j = 0; j * gs < cnt[e]; j++) {
            u32* g = groups + 3 * (gstart[e] + j);
            g[0] = e;
            g[1] = start[e] + j * gs;
            g[2] = min(gs, cnt[e] - j * gs);
        }
    }
}

// The group of this block (false: none, or its rows are zeros written here) and its slots.
__device__ __forceinline__ bool meg_group(const u32* __restrict__ grp, int n_slots, int n_exp,
                                         int r, int rows, float* __restrict__ Y, u32& e,
                                         int& cnt, int* slot) {
    if ((int)blockIdx.x >= (int)grp[0] || r >= rows) return false;
    const u32* perm = grp + 4;
    const u32* g = perm + n_slots + 3 * blockIdx.x;
    e = g[0];
    int first = g[1];
    cnt = g[2];
#pragma unroll
    for (int j = 0; j < MEG; j++) slot[j] = perm[first + (j < cnt ? j : 0)];
    if (e >= (u32)n_exp) {
        if ((threadIdx.x & 31) == 0)
            for (int j = 0; j < cnt; j++) Y[(size_t)slot[j] * rows + r] = 0.0f;
        return false;
    }
    return true;
}

template <int T>
__device__ void mmeg32(const u8* __restrict__ W, const u32* __restrict__ grp,
                       const AQ8* __restrict__ X, float* __restrict__ Y, int rows, int nb,
                       int n_exp, int k, int per_slot, int n_slots) {
    int r = blockIdx.y * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    u32 e;
    int cnt, slot[MEG];
    if (!meg_group(grp, n_slots, n_exp, r, rows, Y, e, cnt, slot)) return;
    const u8* wr = W + ((size_t)e * rows + r) * nb * B32<T>::BYTES;
    const AQ8* xr[MEG];
#pragma unroll
    for (int j = 0; j < MEG; j++) xr[j] = X + (size_t)(per_slot ? slot[j] : slot[j] / k) * nb;
    float acc[MEG], accm[MEG];
#pragma unroll
    for (int j = 0; j < MEG; j++) acc[j] = accm[j] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        int w[8];
        float d, m;
        decode32_at<T>(wr, nb, b, w, d, m);
#pragma unroll
        for (int j = 0; j < MEG; j++) {
            if (j < cnt) {
                const AQ8* a = xr[j] + b;
                int isum = 0;
#pragma unroll
                for (int q = 0; q < 8; q++) isum = dp4a(w[q], a->qs[q], isum);
                isum -= B32<T>::OFF * a->sum;
                acc[j] += (float)isum * (d * a->d);
                if (B32<T>::MIN) accm[j] += m * a->s;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MEG; j++) {
        if (j < cnt) {
            float sum = warp_sum(acc[j]), sm = warp_sum(accm[j]);
            if (lane == 0) Y[(size_t)slot[j] * rows + r] = sum + sm;
        }
    }
}

template <int T>
__device__ void mmegk(const u8* __restrict__ W, const u32* __restrict__ grp,
                      const AQ8K* __restrict__ X, float* __restrict__ Y, int rows, int nb,
                      int n_exp, int k, int per_slot, int n_slots) {
    int r = blockIdx.y * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    u32 e;
    int cnt, slot[MEG];
    if (!meg_group(grp, n_slots, n_exp, r, rows, Y, e, cnt, slot)) return;
    const u8* wr = W + ((size_t)e * rows + r) * row_stride<T>(nb);
    const AQ8K* xr[MEG];
#pragma unroll
    for (int j = 0; j < MEG; j++) xr[j] = X + (size_t)(per_slot ? slot[j] : slot[j] / k) * nb;
    float acc[MEG];
#pragma unroll
    for (int j = 0; j < MEG; j++) acc[j] = 0.0f;
    for (int it = lane; it < nb * 8; it += 32) {
        int b = it >> 3, jj = it & 7;
        int w[8], sc[2], mn[2];
        float d, dmin;
        decodek_at<T>(wr, nb, b, jj, w, sc, mn, d, dmin);
#pragma unroll
        for (int j = 0; j < MEG; j++) {
            if (j < cnt) {
                const AQ8K* a = xr[j] + b;
                int i0 = 0, i1 = 0;
#pragma unroll
                for (int q = 0; q < 4; q++) i0 = dp4a(w[q], a->qs[8 * jj + q], i0);
#pragma unroll
                for (int q = 4; q < 8; q++) i1 = dp4a(w[q], a->qs[8 * jj + q], i1);
                int isum = sc[0] * i0 + sc[1] * i1;
                int corr = mn[0] * a->bsums[2 * jj] + mn[1] * a->bsums[2 * jj + 1];
                acc[j] += (a->d * d) * (float)isum - (a->d * dmin) * (float)corr;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MEG; j++) {
        if (j < cnt) {
            float sum = warp_sum(acc[j]);
            if (lane == 0) Y[(size_t)slot[j] * rows + r] = sum;
        }
    }
}

#define MMEG32(T, NAME)                                                                            \
    extern "C" __global__ void NAME(const u8* W, const u32* grp, const AQ8* X, float* Y, int rows, int nb, int n_exp, int k, int per_slot, int n_slots) { PDL_ENTRY(); mmeg32<T>(W, grp, X, Y, rows, nb, n_exp, k, per_slot, n_slots); }
#define MMEGK(T, NAME)                                                                             \
    extern "C" __global__ void NAME(const u8* W, const u32* grp, const AQ8K* X, float* Y, int rows, int nb, int n_exp, int k, int per_slot, int n_slots) { PDL_ENTRY(); mmegk<T>(W, grp, X, Y, rows, nb, n_exp, k, per_slot, n_slots); }

MMEG32(2, mmeg_q4_0)
MMEG32(102, mmeg_q4_0s)
MMEG32(3, mmeg_q4_1)
MMEG32(6, mmeg_q5_0)
MMEG32(7, mmeg_q5_1)
MMEG32(8, mmeg_q8_0)
MMEGK(13, mmeg_q5_k)
MMEGK(112, mmeg_q4_ks)
MMEGK(114, mmeg_q6_ks)

// Exact mode (VELA_MATMUL=f32), as mmx (quant.cu) for the ordinary product: the expert's weight
// row dequantized with the CPU reference's operation order (deqx), f32 activations, every
// product exact in f64, summed in f64 and rounded once; one warp per (weight row, slot). rb is
// the bytes of one weight row.
template <int T>
__device__ void mmex(const u8* __restrict__ W, const u32* __restrict__ ids,
                     const float* __restrict__ X, float* __restrict__ Y, int rows, int cols,
                     long long rb, int n_exp, int k, int per_slot) {
    int r = blockIdx.y * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    int s = blockIdx.x;
    if (r >= rows) return;
    u32 e = ids[s];
    if (e >= (u32)n_exp) {
        if (lane == 0) Y[(size_t)s * rows + r] = 0.0f;
        return;
    }
    const u8* wr = W + ((size_t)e * rows + r) * rb;
    const float* xr = X + (size_t)(per_slot ? s : s / k) * cols;
    double acc = 0.0;
    for (int c = lane; c < cols; c += 32) acc += (double)deqx<T>(wr, cols, c) * (double)xr[c];
    double sum = warp_sum_d(acc);
    if (lane == 0) Y[(size_t)s * rows + r] = (float)sum;
}

#define MMEX(T, NAME)                                                                              \
    extern "C" __global__ void NAME(const u8* W, const u32* ids, const float* X, float* Y, int rows, int cols, long long rb, int n_exp, int k, int per_slot) { PDL_ENTRY(); mmex<T>(W, ids, X, Y, rows, cols, rb, n_exp, k, per_slot); }

MMEX(0, mmex_f32)
MMEX(1, mmex_f16)
MMEX(2, mmex_q4_0)
MMEX(102, mmex_q4_0s)
MMEX(3, mmex_q4_1)
MMEX(6, mmex_q5_0)
MMEX(7, mmex_q5_1)
MMEX(8, mmex_q8_0)
MMEX(13, mmex_q5_k)
MMEX(112, mmex_q4_ks)
MMEX(114, mmex_q6_ks)
