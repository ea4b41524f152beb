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
