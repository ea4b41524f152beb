// Norms, RoPE and element-wise ops on f32 activations (row-major [n_tokens, width]).

// RMSNorm of one row per block (blockDim.x = 256): the sum of squares is accumulated in double
// like the CPU backend; out may alias x.
extern "C" __global__ void rms_norm(const float* x, const float* __restrict__ w, float* out,
                                    int width, float eps) {
    __shared__ double part[256];
    const float* xr = x + (size_t)blockIdx.x * width;
    float* yr = out + (size_t)blockIdx.x * width;
    double s = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = xr[i];
        s += (double)(v * v);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    float mean = (float)(part[0] / (double)width);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
}

// RoPE: block per token, thread per (head, pair). The angle of pair i is built like the CPU's
// table: theta = pos, multiplied i times by theta_scale in f32 (theta_scale is computed on the
// host so both backends use the same value). ff (may be null) holds per-pair divisors.
extern "C" __global__ void rope(float* x, const u32* __restrict__ pos, int n_head, int head_dim,
                                int n_rot, float theta_scale, float freq_scale,
                                const float* __restrict__ ff, int neox) {
    int t = blockIdx.x;
    int half_rot = n_rot / 2;
    for (int k = threadIdx.x; k < n_head * half_rot; k += blockDim.x) {
        int h = k / half_rot, i = k % half_rot;
        float theta = (float)pos[t];
        for (int j = 0; j < i; j++) theta *= theta_scale;
        float f = ff ? ff[i] : 1.0f;
        float a = freq_scale * (theta / f);
        float c = cosf(a), s = sinf(a);
        float* hx = x + ((size_t)t * n_head + h) * head_dim;
        int ia = neox ? i : 2 * i;
        int ib = neox ? i + half_rot : 2 * i + 1;
        float x0 = hx[ia], x1 = hx[ib];
        hx[ia] = x0 * c - x1 * s;
        hx[ib] = x0 * s + x1 * c;
    }
}

extern "C" __global__ void add(float* x, const float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void add_bias(float* x, const float* __restrict__ b, int width, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % width];
}

extern "C" __global__ void scale(float* x, float s, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void act_mul_silu(float* g, const float* __restrict__ u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

extern "C" __global__ void act_mul_gelu(float* g, const float* __restrict__ u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float k0 = 0.7978846f, k1 = 0.044715f;
        float v = g[i];
        g[i] = 0.5f * v * (1.0f + tanhf(k0 * v * (1.0f + k1 * v * v))) * u[i];
    }
}

extern "C" __global__ void softcap(float* x, float cap, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}
