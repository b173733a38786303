// Graph surgery, and the probe's delayed copy; in kernels/graphs/ beside graph_guard.cu, the other CUDA-graph
// helper.
#include "graph_edges.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstring>

#include "common.cuh"
#include "driver_entry.h"

namespace padfree {
namespace {

struct Edge {
    cudaGraphNode_t from, to;
    cudaGraphEdgeData data;
};

cudaError_t edges_of(cudaGraph_t graph, std::vector<Edge>* out) {
    size_t count = 0;
    cudaError_t err = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count);
    if (err != cudaSuccess) return err;
    std::vector<cudaGraphNode_t> from(count), to(count);
    std::vector<cudaGraphEdgeData> data(count);
    if (count > 0 && (err = cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count)) != cudaSuccess)
        return err;
    out->clear();
    for (size_t i = 0; i < count; ++i) out->push_back({from[i], to[i], data[i]});
    return cudaSuccess;
}

// The driver's view of kernel nodes: the runtime cannot describe a node whose kernel another library
// launched through the driver (cuBLASLt's), so the two driver calls needed are looked up once,
// without linking libcuda (padfree links only the runtime).
struct DriverCalls {
    PFN_cuGraphKernelNodeGetParams_v12000 node_params =
        driver_entry<PFN_cuGraphKernelNodeGetParams_v12000>("cuGraphKernelNodeGetParams", 12000);
    PFN_cuFuncGetName_v12030 function_name = driver_entry<PFN_cuFuncGetName_v12030>("cuFuncGetName", 12030);
};

const DriverCalls& driver() {
    static const DriverCalls calls;
    return calls;
}

// The function a kernel node runs, or null for other nodes (or where the driver cannot say).
CUfunction kernel_function(cudaGraphNode_t node) {
    cudaGraphNodeType type;
    if (driver().node_params == nullptr || cudaGraphNodeGetType(node, &type) != cudaSuccess ||
        type != cudaGraphNodeTypeKernel)
        return nullptr;
    CUDA_KERNEL_NODE_PARAMS_v2 params{};
    if (driver().node_params(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS) return nullptr;
    return params.func;
}

// padfree's own kernels: their names are in its namespace.
bool is_padfree_kernel(CUfunction function) {
    const char* name = nullptr;
    if (function == nullptr || driver().function_name == nullptr || driver().function_name(&name, function) != CUDA_SUCCESS ||
        name == nullptr)
        return false;
    return std::strncmp(name, "_ZN7padfree", 11) == 0;
}

bool full_edge(const cudaGraphEdgeData& data) { return data.type == cudaGraphDependencyTypeDefault; }

// Calls visit(edge, consumer function) for each full edge from a padfree kernel into another kernel.
template <class Visit>
cudaError_t for_each_candidate(cudaGraph_t graph, Visit visit) {
    std::vector<Edge> edges;
    const cudaError_t err = edges_of(graph, &edges);
    if (err != cudaSuccess) return err;
    for (const Edge& e : edges) {
        if (!full_edge(e.data)) continue;
        const CUfunction consumer = kernel_function(e.to);
        if (consumer == nullptr || is_padfree_kernel(consumer) || !is_padfree_kernel(kernel_function(e.from)))
            continue;
        const cudaError_t visit_err = visit(e, consumer);
        if (visit_err != cudaSuccess) return visit_err;
    }
    return cudaSuccess;
}

// Whether node is a memset of zeros inside one slot_bytes slot of [lo, hi).
bool zeroes_inside_one_slot(cudaGraphNode_t node, uintptr_t lo, uintptr_t hi, size_t slot_bytes) {
    cudaGraphNodeType type;
    cudaMemsetParams params{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeMemset ||
        cudaGraphMemsetNodeGetParams(node, &params) != cudaSuccess)
        return false;
    const uintptr_t start = reinterpret_cast<uintptr_t>(params.dst);
    const size_t length = static_cast<size_t>(params.elementSize) * params.width;
    if (params.value != 0 || params.height != 1 || length == 0 || start < lo || start >= hi || length > hi - start)
        return false;
    const uintptr_t slot_end = lo + ((start - lo) / slot_bytes + 1) * slot_bytes;
    return length <= slot_end - start;
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Lets its dependents launch at once, then spins (each CTA) for *spin_ns before it copies: a
// dependent that does not wait on it reads dst before the copy lands.
__global__ void delayed_copy_kernel(const uint4* src, uint4* dst, int64_t count, const int64_t* spin_ns) {
    allow_consumers();
    wait_on_producer();
    if (threadIdx.x == 0) {
        const uint64_t start = global_ns();
        const int64_t wanted = *spin_ns;
        const uint64_t spin = wanted > 0 ? static_cast<uint64_t>(wanted) : 0;
        while (global_ns() - start < spin) {
        }
    }
    __syncthreads();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dst[i] = src[i];
}

// A few CTAs only: a dependent that does not wait must find room to run during the spin, and a
// GEMM's CTAs each take most of an SM. A grid sized to the copy (up to 1024 CTAs of 256 threads)
// fills every SM from ~2700 rows of 768: such a GEMM could then start only after the copy, and would
// pass for waiting.
constexpr int kDelayedCopyBlocks = 8;

}  // namespace

cudaError_t launch_delayed_copy(const void* src, void* dst, int64_t bytes, const int64_t* spin_ns, cudaStream_t stream) {
    const int64_t count = bytes / 16;
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div<int64_t>(count, 256), kDelayedCopyBlocks));
    return launch_kernel(delayed_copy_kernel, dim3(blocks), dim3(256), 0, stream, static_cast<const uint4*>(src),
                         static_cast<uint4*>(dst), count, spin_ns);
}

cudaError_t graph_consumers(cudaGraph_t graph, std::vector<const void*>* functions) {
    functions->clear();
    return for_each_candidate(graph, [&](const Edge&, CUfunction consumer) {
        if (std::find(functions->begin(), functions->end(), consumer) == functions->end())
            functions->push_back(consumer);
        return cudaSuccess;
    });
}

cudaError_t relax_graph_edges(cudaGraph_t graph, const void* const* functions, int32_t count, int32_t* relaxed) {
    std::vector<Edge> chosen;
    cudaError_t err = for_each_candidate(graph, [&](const Edge& e, CUfunction consumer) {
        if (std::find(functions, functions + count, consumer) != functions + count) chosen.push_back(e);
        return cudaSuccess;
    });
    *relaxed = 0;
    if (err != cudaSuccess) return err;
    for (const Edge& e : chosen) {  // edited after the walk: the walk's edge list stays valid
        cudaGraphEdgeData programmatic{};
        programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
        programmatic.type = cudaGraphDependencyTypeProgrammatic;
        if ((err = cudaGraphRemoveDependencies(graph, &e.from, &e.to, &e.data, 1)) != cudaSuccess) return err;
        if ((err = cudaGraphAddDependencies(graph, &e.from, &e.to, &programmatic, 1)) != cudaSuccess) return err;
        ++*relaxed;
    }
    return err;
}

cudaError_t remove_zeroing_memsets(cudaGraph_t graph, const void* base, size_t bytes, size_t slot_bytes,
                                   int32_t* removed) {
    *removed = 0;
    size_t count = 0;
    cudaError_t err = cudaGraphGetNodes(graph, nullptr, &count);
    if (err != cudaSuccess) return err;
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0 && (err = cudaGraphGetNodes(graph, nodes.data(), &count)) != cudaSuccess) return err;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(base);
    std::vector<Edge> edges;  // read once, then kept as each removal leaves the graph
    if ((err = edges_of(graph, &edges)) != cudaSuccess) return err;
    for (cudaGraphNode_t node : nodes) {
        if (!zeroes_inside_one_slot(node, lo, lo + bytes, slot_bytes)) continue;
        std::vector<cudaGraphNode_t> before, after;
        for (const Edge& e : edges) {
            if (e.to == node) before.push_back(e.from);
            if (e.from == node) after.push_back(e.to);
        }
        if ((err = cudaGraphDestroyNode(node)) != cudaSuccess) return err;
        edges.erase(std::remove_if(edges.begin(), edges.end(),
                                   [&](const Edge& e) { return e.from == node || e.to == node; }),
                    edges.end());
        for (cudaGraphNode_t from : before)
            for (cudaGraphNode_t to : after) {
                const bool joined = std::any_of(edges.begin(), edges.end(),
                                                [&](const Edge& e) { return e.from == from && e.to == to; });
                if (joined) continue;
                if ((err = cudaGraphAddDependencies(graph, &from, &to, nullptr, 1)) != cudaSuccess) return err;
                edges.push_back({from, to, cudaGraphEdgeData{}});
            }
        ++*removed;
    }
    return cudaSuccess;
}

}  // namespace padfree
