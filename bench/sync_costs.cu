// What one synchronization between dependent phases of GPU work costs, in microseconds: the ways a
// decode step's chain of small operations can pass data from one phase to the next (bench/sync_costs.py
// builds and runs this; docs/GENERATION.md reads the numbers).
//   boundary_pdl_us / boundary_us  a dependent kernel after another (each reads what the previous one
//                                  wrote: one round trip), 100 of them in a CUDA graph, with and without
//                                  programmatic dependent launch (PDL)
//   cluster_barrier_us             barrier.cluster (cooperative_groups cluster.sync) in a grid of 8-block
//                                  clusters, each barrier followed by a read of another block's shared memory
//   grid_barrier_us                cooperative_groups grid.sync() in a cooperative grid of one block per SM,
//                                  each barrier followed by a read of another block's global-memory write
// Each is the best of REPS timed runs (CUDA events), per synchronization. Prints "name value" lines.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>

static constexpr const char* kBenchName = "sync_costs";  // CHECK's messages
#include "bench_timing.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 128;
constexpr int kChain = 100;
constexpr int kIters = 1000;
constexpr int kReps = 20;

__global__ void chain_kernel(const float* in, float* out, int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // a no-op when launched without PDL
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < n ? in[i] : 0.f;
    asm volatile("griddepcontrol.launch_dependents;");
    if (i < n) out[i] = v + 1.f;
}

__global__ void __cluster_dims__(8, 1, 1) cluster_kernel(float* out, int iters) {
    __shared__ float buf[kThreads];
    cg::cluster_group cluster = cg::this_cluster();
    float acc = 0.f;
    for (int it = 0; it < iters; ++it) {
        buf[threadIdx.x] = acc + threadIdx.x;
        cluster.sync();
        acc += cluster.map_shared_rank(buf, (cluster.block_rank() + 1) % 8)[threadIdx.x];
        cluster.sync();  // the peer has read buf before it is written again
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

__global__ void grid_kernel(float* slots, float* out, int iters) {
    cg::grid_group grid = cg::this_grid();
    float acc = 0.f;
    for (int it = 0; it < iters; ++it) {
        float* slot = slots + (it % 2) * gridDim.x * blockDim.x;  // alternate: no second barrier needed
        slot[blockIdx.x * blockDim.x + threadIdx.x] = acc + threadIdx.x;
        grid.sync();
        acc += slot[((blockIdx.x + 1) % gridDim.x) * blockDim.x + threadIdx.x];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

}  // namespace

int main() {
    int device = 0, sms = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int blocks = sms, n = blocks * kThreads;
    float *a, *b, *slots;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    CHECK(cudaMalloc(&b, n * sizeof(float)));
    CHECK(cudaMalloc(&slots, 2 * n * sizeof(float)));
    CHECK(cudaMemset(a, 0, n * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    for (int pdl = 0; pdl < 2; ++pdl) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = blocks;
        cfg.blockDim = kThreads;
        cfg.stream = s;
        cfg.attrs = &attr;
        cfg.numAttrs = pdl;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int k = 0; k < kChain; ++k)
            CHECK(cudaLaunchKernelEx(&cfg, chain_kernel, static_cast<const float*>(k % 2 ? b : a), k % 2 ? a : b, n));
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        float ms;
        if (best_ms(s, 3, kReps, [&] { return cudaGraphLaunch(exec, s); }, &ms)) return 1;
        std::printf("%s %.3f\n", pdl ? "boundary_pdl_us" : "boundary_us", ms * 1e3f / kChain);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
    }

    // per barrier: (kIters + 1 iterations - 1 iteration) / (2 kIters barriers), the launch subtracted
    const int cluster_blocks = blocks / 8 * 8;
    float one, many;
    if (best_ms(s, 3, kReps, [&] { cluster_kernel<<<cluster_blocks, kThreads, 0, s>>>(b, 1); return cudaGetLastError(); }, &one) ||
        best_ms(s, 3, kReps, [&] { cluster_kernel<<<cluster_blocks, kThreads, 0, s>>>(b, kIters + 1); return cudaGetLastError(); },
                &many))
        return 1;
    std::printf("cluster_barrier_us %.3f\n", (many - one) * 1e3f / (2 * kIters));

    auto grid_launch = [&](int iters) {
        void* args[] = {&slots, &b, &iters};
        return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(grid_kernel), dim3(blocks), dim3(kThreads), args, 0, s);
    };
    if (best_ms(s, 3, kReps, [&] { return grid_launch(1); }, &one) || best_ms(s, 3, kReps, [&] { return grid_launch(kIters + 1); }, &many))
        return 1;
    std::printf("grid_barrier_us %.3f\n", (many - one) * 1e3f / kIters);
    std::printf("sms %d\n", sms);
    CHECK(cudaDeviceSynchronize());
    return 0;
}
