// Device memory bandwidth ceiling for the decode roofline (docs/cuda.md), built and run on the
// GPU machine by scripts/gpu-check.sh:  nvcc -O3 -arch=sm_90 bandwidth.cu -o bw && ./bw
// Prints GB/s for a read-only kernel (sum of 16-byte loads), a copy kernel (read + write counted)
// and cudaMemcpy device-to-device (read + write counted), median of 20 timed runs, 4 GiB buffers
// of random-ish (non-zero) data.
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

__global__ void fill(float4* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_float4(i * 1e-9f, 1.0f, -2.0f, (float)(i & 255));
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
    const char* names[3] = {"read kernel (bytes read)", "copy kernel (read+write)", "cudaMemcpy D2D (read+write)"};
    for (int k = 0; k < 3; k++) {
        std::vector<float> ms;
        for (int r = 0; r < 23; r++) {
            cudaEventRecord(e0);
            if (k == 0) readk<<<sms * 16, 512>>>(a, n, o);
            else if (k == 1) copyk<<<sms * 16, 512>>>(a, b, n);
            else cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
            cudaEventRecord(e1);
            CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
            float t; cudaEventElapsedTime(&t, e0, e1);
            if (r >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        double moved = (k == 0 ? 1.0 : 2.0) * bytes;
        printf("BANDWIDTH | %s | %.0f GB/s | median %.3f ms over 20 |\n", names[k], moved / (ms[10] * 1e-3) / 1e9, ms[10]);
    }
    return 0;
}
