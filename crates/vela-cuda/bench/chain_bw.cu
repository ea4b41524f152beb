// The read ceiling of a kernel-per-product decode step (docs/cuda.md, twenty-first slice): one
// decode step's weight bytes read by one pure-read kernel per product (Q/K/V, o, gate/up, down
// per layer, then the LM head), with the byte counts of the real geometries, launched back to
// back in a captured CUDA graph exactly as the decode step launches its products. No product
// computes anything, so this is an upper bound for any design that reads each product's weights
// in its own kernel: the step's products can stream no faster than this chain of reads.
//   nvcc -O3 -arch=sm_90 chain_bw.cu -o chain_bw && ./chain_bw [random]
// Modes: no PDL; PDL with the wait after each thread's first round of loads (what vela's
// matvecs do, MV_RESUME); PDL with the wait at entry. Also the same bytes read by ONE kernel
// (the plain roofline's denominator). Median of 20 graph replays after 3 warm-ups; each replay
// reads every byte from HBM (4.4 GB for the 8B, far more than the 50 MB L2, and replay k + 1
// starts with the first layer, long evicted).
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

__device__ __forceinline__ unsigned hash32(unsigned x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x; }
// random = 0: a regular pattern; 1: high-entropy (hashed) data, like quantized weights.
__global__ void fill(uint4* p, size_t n, int random) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = hash32((unsigned)i ^ (unsigned)(i >> 32) * 0x9e3779b9u);
        p[i] = random ? make_uint4(h, hash32(h + 1), hash32(h + 2), hash32(h + 3))
                      : make_uint4((unsigned)i, 0x9e3779b9u, (unsigned)(i >> 7) + 1u, 77u);
    }
}

// Mode 0: no PDL. 1: the first round of U 16-byte loads per thread, then wait + trigger. 2: wait +
// trigger at entry.
template <int U>
__global__ void __launch_bounds__(256) rd(const uint4* __restrict__ p, size_t n, unsigned* out, int mode) {
    if (mode == 2) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" :::);
    }
    size_t st = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned s = 0;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = i + u * st < n ? __ldg(p + i + u * st) : make_uint4(0, 0, 0, 0);
    if (mode == 1) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" :::);
    }
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) s ^= v[u].x + v[u].y + v[u].z + v[u].w;
        i += st * U;
        if (i >= n) break;
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = i + u * st < n ? __ldg(p + i + u * st) : make_uint4(0, 0, 0, 0);
    }
    if (s == 0x12345678u) *out = s;  // practically never true; keeps the loads alive
}

struct Geo {
    const char* name;
    int layers;
    std::vector<size_t> per_layer;  // bytes of each product of a layer, in launch order
    size_t head;                    // the LM head's bytes
};

static size_t total(const Geo& g) {
    size_t t = g.head;
    for (size_t b : g.per_layer) t += b * g.layers;
    return t;
}

template <int U>
static int launch(cudaStream_t s, const uint4* p, size_t n16, unsigned* out, int mode, int blocks) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = mode ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, rd<U>, p, n16, out, mode));
    return 0;
}

// Argument: "random" fills the weights with high-entropy data (default: a regular pattern).
int main(int argc, char** argv) {
    int random = argc > 1 && argv[1][0] == 'r';
    printf("DATA | %s |\n", random ? "random (hashed)" : "regular pattern");
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // Llama-3-8B Q4_0 (vela synth): Q/K/V 6144 x 4096, o 4096 x 4096, gate + up 2 x 14336 x 4096
    // (18 bytes per 32 weights), down 4096 x 14336; LM head 128256 x 4096 Q6_K (210 per 256).
    // Qwen2.5-0.5B Q4_K_M (approximate type mix: Q4_K, V and half the down products Q6_K, LM head
    // Q8_0 151936 x 896).
    std::vector<Geo> geos = {
        {"llama3-8b q4_0", 32, {14155776, 9437184, 66060288, 33030144}, 430940160},
        {"qwen2.5-0.5b q4_k_m", 24, {610176, 451584, 4902912, 3013248}, 144643072},
    };
    size_t maxb = 0;
    for (auto& g : geos) maxb = std::max(maxb, total(g) + 4096 * (g.per_layer.size() * g.layers + 1));
    uint4* buf;
    unsigned* out;
    CK(cudaMalloc(&buf, maxb));
    CK(cudaMalloc(&out, 4));
    fill<<<sms * 8, 256>>>(buf, maxb / 16, random);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (auto& g : geos) {
        double bytes = (double)total(g);
        // (label, mode, blocks per SM, U; one = the whole step in one kernel)
        // what: 0 the whole step, 1 the layers only (no LM head), 2 the gate/up products only.
        struct V { const char* label; int mode, bps, u; bool one; int what = 0; };
        std::vector<V> vs = {
            {"one kernel, 16 blocks/SM, U 4", 0, 16, 4, true},
            {"one kernel, 8 blocks/SM, U 8", 0, 8, 8, true},
            {"chain, no PDL, 8 blocks/SM, U 4", 0, 8, 4, false},
            {"chain, PDL wait after 1st loads, 8 blocks/SM, U 4", 1, 8, 4, false},
            {"chain, PDL wait after 1st loads, 4 blocks/SM, U 4", 1, 4, 4, false},
            {"chain, PDL wait after 1st loads, 4 blocks/SM, U 8", 1, 4, 8, false},
            {"chain, PDL wait after 1st loads, 2 blocks/SM, U 8", 1, 2, 8, false},
            {"chain, PDL wait at entry, 4 blocks/SM, U 4", 2, 4, 4, false},
            {"layers only: chain, PDL wait after 1st loads, 4 blocks/SM, U 8", 1, 4, 8, false, 1},
            {"gate/up only: chain, PDL wait after 1st loads, 4 blocks/SM, U 8", 1, 4, 8, false, 2},
        };
        for (auto& v : vs) {
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            int blocks = sms * v.bps;
            if (v.one) {
                int rc = v.u == 8 ? launch<8>(s, buf, (size_t)(bytes / 16), out, 0, blocks)
                                  : launch<4>(s, buf, (size_t)(bytes / 16), out, 0, blocks);
                if (rc) return rc;
            } else {
                size_t off = 0;  // in 16-byte units, each product 4 KiB aligned
                auto one = [&](size_t b) {
                    size_t n16 = b / 16;
                    int rc = v.u == 8 ? launch<8>(s, buf + off, n16, out, v.mode, blocks)
                                      : launch<4>(s, buf + off, n16, out, v.mode, blocks);
                    off += (n16 + 255) / 256 * 256;
                    return rc;
                };
                for (int l = 0; l < g.layers; l++)
                    for (size_t k = 0; k < g.per_layer.size(); k++)
                        if (v.what != 2 || k == 2)
                            if (one(g.per_layer[k])) return 1;
                if (v.what == 0 && one(g.head)) return 1;
            }
            CK(cudaStreamEndCapture(s, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            std::vector<float> ms;
            for (int r = 0; r < 23; r++) {
                CK(cudaEventRecord(e0, s));
                CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                if (r >= 3) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            double rb = bytes;
            if (v.what) {
                rb = 0;
                for (size_t k = 0; k < g.per_layer.size(); k++)
                    if (v.what == 1 || k == 2) rb += (double)g.per_layer[k] * g.layers;
            }
            printf("CHAIN | %s | %s | %.1f us per step (min %.1f, max %.1f) | %.0f GB/s | %.1f MB |\n", g.name,
                   v.label, ms[10] * 1e3, ms[0] * 1e3, ms[19] * 1e3, rb / (ms[10] * 1e-3) / 1e9, rb / 1e6);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(gr));
        }
    }
    return 0;
}
