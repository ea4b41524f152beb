// Device memory bandwidth ceiling for the decode roofline (docs/cuda.md), built and run on the
// GPU machine by scripts/gpu-check.sh:  nvcc -O3 -arch=sm_90 bandwidth.cu -o bw && ./bw
// Prints GB/s for a read-only kernel (sum of 16-byte loads), a copy kernel (read + write counted)
// and cudaMemcpy device-to-device (read + write counted), median of 20 timed runs, 4 GiB buffers
// of a regular non-zero pattern; then the read and copy kernels again on high-entropy (hashed)
// data, which is what quantized weights look like to the memory system.
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

__global__ void fill(float4* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_float4(i * 1e-9f, 1.0f, -2.0f, (float)(i & 255));
}
// High-entropy data (like quantized weights): a hash of the index in every word.
__device__ __forceinline__ unsigned hash32(unsigned x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x; }
__global__ void fill_random(uint4* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = hash32((unsigned)i ^ (unsigned)(i >> 32) * 0x9e3779b9u);
        p[i] = make_uint4(h, hash32(h + 1), hash32(h + 2), hash32(h + 3));
    }
}
__global__ void readk(const float4* __restrict__ p, size_t n, float* out) {
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldg(p + i);
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 12345.678f) *out = s;  // practically never true; keeps the loads alive
}
__global__ void copyk(const float4* __restrict__ a, float4* __restrict__ b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[i];
}

int main() {
    size_t bytes = 4ull << 30, n = bytes / 16;
    float4 *a, *b; float* o;
    CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes)); CK(cudaMalloc(&o, 4));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    fill<<<sms * 8, 256>>>(a, n); fill<<<sms * 8, 256>>>(b, n);
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    const char* names[5] = {"read kernel (bytes read)", "copy kernel (read+write)", "cudaMemcpy D2D (read+write)",
                            "read kernel, random data (bytes read)", "copy kernel, random data (read+write)"};
    for (int k = 0; k < 5; k++) {
        if (k == 3) {  // the same kernels on high-entropy data (quantized weights look like this)
            fill_random<<<sms * 8, 256>>>((uint4*)a, n); fill_random<<<sms * 8, 256>>>((uint4*)b, n);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        }
        std::vector<float> ms;
        for (int r = 0; r < 23; r++) {
            cudaEventRecord(e0);
            if (k == 0 || k == 3) readk<<<sms * 16, 512>>>(a, n, o);
            else if (k == 1 || k == 4) copyk<<<sms * 16, 512>>>(a, b, n);
            else cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
            cudaEventRecord(e1);
            CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
            float t; cudaEventElapsedTime(&t, e0, e1);
            if (r >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        double moved = (k == 0 || k == 3 ? 1.0 : 2.0) * bytes;
        printf("BANDWIDTH | %s | %.0f GB/s | median %.3f ms over 20 |\n", names[k], moved / (ms[10] * 1e-3) / 1e9, ms[10]);
    }
    return 0;
}
