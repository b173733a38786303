// How fast one CTA, and a grid of them, can stream global memory into shared memory by the copy engine,
// against plain loads: the rates a weight-streaming kernel (the decode step's linear layers, its LM head)
// is built on (bench/copy_rates.py builds and runs this; docs/KERNELS.md reads the numbers). Each grid
// reads a 512 MB buffer once (each CTA its contiguous share), one thread of a CTA issuing its copies into
// a ring of `slots` shared-memory slots, a slot reissued as soon as its copy has landed (nothing else
// consumes it). Cases, each printed as "name GB/s":
//   bulk_<size>k_x<slots>_c<ctas>   1D cp.async.bulk copies of <size> KB, <slots> (2-16) in flight a CTA,
//                                    <ctas> CTAs an SM (one SM's CTAs share its copy engine)
//   tma_8k_x<slots>_c<ctas>          2D tensor copies of 64 x 64 fp16 boxes (128-byte swizzle: wgmma's
//                                    operand layout; each box 64 rows of 128 bytes, rows 2 KB apart)
//   loads_u<unroll>_c<ctas>          16-byte loads by 256 threads, <unroll> in flight a thread
//   one_bulk_<size>k                 a single CTA on the whole GPU, one copy in flight: one request's rate
// Best of REPS timed runs (CUDA events). Needs compute capability 9.0 (sm_90a). The barriers, the tensor
// copies and the tensor map are the kernels' own (ptx/tma_ptx.cuh: built with plugins/kernels and
// plugins/capi on the include path, sync_costs.build_and_run).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "attention/attention_ptx.cuh"
#include "ptx/tma_ptx.cuh"

static constexpr const char* kBenchName = "copy_rates";  // CHECK's messages
#include "bench_timing.cuh"

namespace {

using namespace padfree::attention_detail;

constexpr size_t kBytes = size_t(512) << 20;
constexpr int kReps = 5;

// copy i of this CTA into slot i % slots: (bulk) bytes [i * size, (i + 1) * size) of its share; (tma) box
// i of its rows, 16 boxes across a 1024-wide row band of 64 rows
template <bool kTma>
__global__ void ring_kernel(const char* src, const __grid_constant__ CUtensorMap map, size_t share, int size,
                            int slots, unsigned long long* sink) {
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u, bars = base + slots * size;  // the swizzle's atoms
    const int copies = static_cast<int>(share / size);
    if (threadIdx.x != 0) return;
    for (int s = 0; s < slots; ++s) mbarrier_init(bars + 8 * s, 1);
    fence_mbarrier_init();
    const char* mine = src + blockIdx.x * share;
    const int row0 = static_cast<int>(blockIdx.x * (share / 2048));  // tma: this CTA's rows of 1024 fp16
    for (int i = 0; i < copies; ++i) {
        const int s = i % slots;
        const uint32_t bar = bars + 8 * s, dst = base + s * size;
        if (i >= slots) mbarrier_wait(bar, ((i / slots) - 1) & 1);
        mbarrier_expect_bytes(bar, size);
        if constexpr (kTma) {
            tma_load_2d(dst, &map, (i % 16) * 64, row0 + (i / 16) * 64, bar);
        } else {
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(dst), "l"(mine + static_cast<size_t>(i) * size), "r"(size), "r"(bar) : "memory");
        }
    }
    for (int i = copies > slots ? copies - slots : 0; i < copies; ++i) mbarrier_wait(bars + 8 * (i % slots), (i / slots) & 1);
    if (copies < 0) *sink = 0;  // never: keeps the parameter
}

template <int kUnroll>
__global__ void loads_kernel(const uint4* src, size_t n, unsigned long long* sink) {
    uint32_t acc = 0;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kUnroll;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; i < n; i += stride) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = i + u * blockDim.x < n ? __ldcs(src + i + u * blockDim.x) : uint4{};
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}


}  // namespace

int main() {
    int device = 0, sms = 0, optin = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    char* src;
    unsigned long long* sink;
    CHECK(cudaMalloc(&src, kBytes));
    CHECK(cudaMalloc(&sink, 8));
    CHECK(cudaMemset(src, 1, kBytes));
    CUtensorMap map{};  // the buffer as [kBytes / 2048, 1024] fp16 rows in 64 x 64 boxes, wgmma's swizzle
    if (!padfree::tensor_map_2d(&map, src, kBytes / 2048, 1024, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B, PADFREE_FLOAT16)) {
        std::fprintf(stderr, "copy_rates: the driver cannot make the tensor map (cuTensorMapEncodeTiled)\n");
        return 1;
    }
    CHECK(cudaFuncSetAttribute(ring_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    CHECK(cudaFuncSetAttribute(ring_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    auto ring = [&](bool tma, int size, int slots, int ctas_per_sm, int grid, const char* name) {
        const size_t smem = 1024 + static_cast<size_t>(slots) * size + 8 * slots;
        if (smem * ctas_per_sm > static_cast<size_t>(optin) + 1024 * (ctas_per_sm - 1) || smem > static_cast<size_t>(optin))
            return 0;
        // each CTA's share: whole copies (tma: whole 64-row bands of 16 boxes)
        const size_t unit = tma ? size_t(64) * 2048 : static_cast<size_t>(size);
        const size_t share = kBytes / grid / unit * unit;
        float ms;
        auto launch = [&] {
            if (tma) ring_kernel<true><<<grid, 32, smem>>>(src, map, share, size, slots, sink);
            else ring_kernel<false><<<grid, 32, smem>>>(src, map, share, size, slots, sink);
            return cudaGetLastError();
        };
        if (best_ms(0, 1, kReps, launch, &ms)) return 1;
        std::printf("%s %.1f\n", name, static_cast<double>(share) * grid / (ms * 1e-3) / 1e9);
        return 0;
    };
    char name[64];
    for (int ctas : {1, 2, 4}) {
        for (int size_k : {2, 8, 32}) {
            for (int slots : {2, 4, 8, 16}) {
                std::snprintf(name, sizeof(name), "bulk_%dk_x%d_c%d", size_k, slots, ctas);
                if (ring(false, size_k * 1024, slots, ctas, sms * ctas, name)) return 1;
            }
        }
        for (int slots : {4, 8, 16}) {
            std::snprintf(name, sizeof(name), "tma_8k_x%d_c%d", slots, ctas);
            if (ring(true, 8192, slots, ctas, sms * ctas, name)) return 1;
        }
    }
    for (int size_k : {8, 72}) {
        std::snprintf(name, sizeof(name), "one_bulk_%dk", size_k);
        // one CTA, one copy in flight, over 64 MB (the whole 512 MB would take long at one request's rate)
        const size_t share = (size_t(64) << 20) / (size_k * 1024) * (size_k * 1024);
        float ms;
        auto launch = [&] {
            ring_kernel<false><<<1, 32, 1024 + size_k * 1024 + 8>>>(src, map, share, size_k * 1024, 1, sink);
            return cudaGetLastError();
        };
        if (best_ms(0, 1, kReps, launch, &ms)) return 1;
        std::printf("%s %.2f\n", name, static_cast<double>(share) / (ms * 1e-3) / 1e9);
    }
    for (int ctas : {1, 4}) {
        float ms;
        auto launch4 = [&] { loads_kernel<4><<<sms * ctas, 256>>>(reinterpret_cast<const uint4*>(src), kBytes / 16, sink);
                             return cudaGetLastError(); };
        auto launch8 = [&] { loads_kernel<8><<<sms * ctas, 256>>>(reinterpret_cast<const uint4*>(src), kBytes / 16, sink);
                             return cudaGetLastError(); };
        if (best_ms(0, 1, kReps, launch4, &ms)) return 1;
        std::printf("loads_u4_c%d %.1f\n", ctas, kBytes / (ms * 1e-3) / 1e9);
        if (best_ms(0, 1, kReps, launch8, &ms)) return 1;
        std::printf("loads_u8_c%d %.1f\n", ctas, kBytes / (ms * 1e-3) / 1e9);
    }
    std::printf("sms %d\n", sms);
    CHECK(cudaDeviceSynchronize());
    return 0;
}
