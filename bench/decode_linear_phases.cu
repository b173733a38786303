// Where each link of a few-row decode step's chain of linear layers spends its time (driven by
// bench/decode_linear_phases.py, which writes decode_linear_stamped.cu: decode_linear.cu with a
// %globaltimer stamp per block at its entry, after the PDL wait, after x is staged, after the
// LayerNorm and at its end).
//
// The chain: NLLB-600M-size layers' six projections (qkv 1024 -> 3072 with LN, out 1024 -> 1024 +
// residual, cross_q with LN, cross_out + residual, fc1 1024 -> 4096 with LN and ReLU, fc2 4096 -> 1024
// + residual), 12 layers, each call reading the previous call's output, fp16, distinct weights (28 MB a
// layer), in one CUDA graph through launch_decode_linear (PDL as padfree launches it). The step's
// attention kernels are left out: the chain is the linear layers' part of a 1x4 step's critical path.
// Prints the graph's median time and, per projection (means over layers 2-12), in microseconds:
//   exposed   its last block's end minus the previous call's last end (what it adds to the chain)
//   release   its first block past the PDL wait minus the previous call's last end
//   spread    its last block past the wait minus its first
//   x_stage   staging the x rows (cp.async from L2), per-block median
//   ln        the LayerNorm over the staged rows, per-block median (0 where the call has none)
//   compute   the weights' wait, the dot products, the reduction and the store, per-block median
//   ahead     how long its first block was resident before the previous call's last end
#include "decode_linear_stamped.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace padfree {
// 1 to 8 rows only: the tensor-core kernel (9+ rows) is not part of this chain
bool decode_linear_mma_supported() { return false; }
cudaError_t launch_decode_linear_mma(const DecodeLinearArgs&, padfree_dtype, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace padfree

using namespace padfree;

#define CHECK(call)                                                                               \
    do {                                                                                          \
        const cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "decode_linear_phases: %s: %s\n", #call, cudaGetErrorString(err_)); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

// (a named namespace: nvcc's generated stubs cannot tell two anonymous ones apart in one file)
namespace phases {

// Small values from a hash of the index (the timings do not depend on them), or a constant.
__global__ void fill(__half* p, size_t n, float value, unsigned seed) {
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
        const unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
        p[i] = __float2half(value != 0.f ? value : ((h >> 8) % 1000) * 1e-5f - 0.005f);
    }
}

struct Projection {
    int in, out;
    bool layernorm, residual;
    DecodeActivation activation;
    const char* name;
};

constexpr Projection kLayer[6] = {{1024, 3072, true, false, DecodeActivation::kNone, "qkv"},
                                  {1024, 1024, false, true, DecodeActivation::kNone, "out"},
                                  {1024, 1024, true, false, DecodeActivation::kNone, "cross_q"},
                                  {1024, 1024, false, true, DecodeActivation::kNone, "cross_out"},
                                  {1024, 4096, true, false, DecodeActivation::kRelu, "fc1"},
                                  {4096, 1024, false, true, DecodeActivation::kNone, "fc2"}};
constexpr int kLayers = 12;
constexpr int kCalls = kLayers * 6;
constexpr long long kSlotBytes = 8LL * 4096 * 2;  // one call's output: up to 8 rows of 4096 halves

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace phases

using namespace phases;

int main(int argc, char** argv) {
    const int rows = argc > 1 ? std::atoi(argv[1]) : 4;
    if (rows < 1 || rows > kDecodeLinearMaxRows) {
        std::fprintf(stderr, "decode_linear_phases: rows must be in [1, %d]\n", kDecodeLinearMaxRows);
        return 2;
    }
    char* outs;
    __half *x0, *gamma, *beta, *residual;
    CHECK(cudaMalloc(&outs, kCalls * kSlotBytes));
    CHECK(cudaMalloc(&x0, kSlotBytes));
    CHECK(cudaMalloc(&residual, kSlotBytes));
    CHECK(cudaMalloc(&gamma, 4096 * 2));
    CHECK(cudaMalloc(&beta, 4096 * 2));
    fill<<<64, 256>>>(x0, kSlotBytes / 2, 0.f, 1);
    fill<<<64, 256>>>(residual, kSlotBytes / 2, 0.f, 3);
    fill<<<16, 256>>>(gamma, 4096, 1.f, 0);
    fill<<<16, 256>>>(beta, 4096, 0.f, 2);
    std::vector<__half*> weights(kCalls);
    for (int k = 0; k < kCalls; ++k) {
        const Projection& p = kLayer[k % 6];
        CHECK(cudaMalloc(&weights[k], static_cast<size_t>(p.in) * p.out * 2));
        fill<<<1024, 256>>>(weights[k], static_cast<size_t>(p.in) * p.out, 0.f, 10 + k);
    }
    CHECK(cudaDeviceSynchronize());
    const char* base = outs;
    const long long slot = kSlotBytes;
    CHECK(cudaMemcpyToSymbol(g_out_base, &base, sizeof(base)));
    CHECK(cudaMemcpyToSymbol(g_out_stride, &slot, sizeof(slot)));

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    std::vector<int> grids(kCalls);
    auto chain = [&]() -> cudaError_t {
        for (int k = 0; k < kCalls; ++k) {
            const Projection& p = kLayer[k % 6];
            DecodeLinearArgs a{};
            a.x = k == 0 ? static_cast<const void*>(x0) : outs + (k - 1) * kSlotBytes;
            a.weight = weights[k];
            a.residual = p.residual ? residual : nullptr;
            a.ln_gamma = p.layernorm ? gamma : nullptr;
            a.ln_beta = p.layernorm ? beta : nullptr;
            a.out = outs + k * kSlotBytes;
            a.rows = rows;
            a.in_features = p.in;
            a.out_features = p.out;
            a.eps = 1e-5f;
            a.activation = p.activation;
            if (const cudaError_t err = launch_decode_linear(a, PADFREE_FLOAT16, stream); err != cudaSuccess) return err;
        }
        return cudaSuccess;
    };
    CHECK(chain());  // shared-memory opt-ins before the capture
    CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(chain());
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    // each call's grid, from the captured kernel nodes (the stamps of blocks past it are not read)
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    std::vector<cudaGraphNode_t> node_list(nodes);
    CHECK(cudaGraphGetNodes(graph, node_list.data(), &nodes));
    int call = 0;
    for (cudaGraphNode_t node : node_list) {
        cudaGraphNodeType type;
        CHECK(cudaGraphNodeGetType(node, &type));
        if (type != cudaGraphNodeTypeKernel || call >= kCalls) continue;
        cudaKernelNodeParams params;
        CHECK(cudaGraphKernelNodeGetParams(node, &params));
        grids[call++] = static_cast<int>(params.gridDim.x);
    }
    if (call != kCalls) {
        std::fprintf(stderr, "decode_linear_phases: %d kernel nodes captured, expected %d\n", call, kCalls);
        return 1;
    }

    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<double> graph_us;
    for (int r = 0; r < 30; ++r) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        graph_us.push_back(ms * 1e3);
    }
    std::printf("graph_us %.1f\ncalls %d\nrows %d\n", median(graph_us), kCalls, rows);

    // the last replay's stamps
    static unsigned long long stamps[kMaxStampedCalls][kMaxStampedBlocks][kStamps];
    CHECK(cudaMemcpyFromSymbol(stamps, g_stamps, sizeof(stamps)));
    double sums[6][7] = {};
    int counted[6] = {};
    unsigned long long previous_end = 0;
    for (int k = 0; k < kCalls; ++k) {
        const int blocks = std::min(grids[k], kMaxStampedBlocks);
        unsigned long long first_entry = ~0ull, first_release = ~0ull, last_release = 0, end = 0;
        std::vector<double> x_stage, ln, compute;
        for (int b = 0; b < blocks; ++b) {
            const unsigned long long* t = stamps[k][b];
            first_entry = std::min(first_entry, t[0]);
            first_release = std::min(first_release, t[1]);
            last_release = std::max(last_release, t[1]);
            end = std::max(end, t[4]);
            x_stage.push_back((t[2] - t[1]) * 1e-3);
            ln.push_back((t[3] - t[2]) * 1e-3);
            compute.push_back((t[4] - t[3]) * 1e-3);
        }
        if (k >= 6) {  // layer 1's first call waits on nothing
            double* s = sums[k % 6];
            s[0] += (static_cast<double>(end) - static_cast<double>(previous_end)) * 1e-3;
            s[1] += (static_cast<double>(first_release) - static_cast<double>(previous_end)) * 1e-3;
            s[2] += (last_release - first_release) * 1e-3;
            s[3] += median(x_stage);
            s[4] += median(ln);
            s[5] += median(compute);
            s[6] += (static_cast<double>(previous_end) - static_cast<double>(first_entry)) * 1e-3;
            ++counted[k % 6];
        }
        previous_end = end;
    }
    for (int i = 0; i < 6; ++i) {
        std::printf("%s", kLayer[i].name);
        for (double s : sums[i]) std::printf(" %.3f", s / counted[i]);
        std::printf("\n");
    }
    return 0;
}
