// The guard is a one-thread kernel node followed by an IF conditional node (CUDA 12.4+) whose body
// is the caller's graph as a child graph: the decision stays on the device, so the host launches the
// whole thing without waiting for the measurement it depends on.
#include "graph_guard.h"

namespace padfree {
namespace {

__global__ void fits_guard_kernel(cudaGraphConditionalHandle handle, const int32_t* stats, FitRanges fit) {
    const int32_t flags = stats[0], total = stats[1], longest = stats[2];
    const bool fits = flags == 0 && total >= fit.min_total && total <= fit.max_total && longest >= fit.min_longest &&
                      longest <= fit.max_longest;
    cudaGraphSetConditional(handle, fits ? 1u : 0u);
}

cudaError_t build(cudaGraph_t graph, cudaGraph_t body, const int32_t* stats, FitRanges fit) {
    cudaGraphConditionalHandle handle;
    // cudaGraphCondAssignDefault: every launch starts from "skip", so a guard that never ran cannot
    // leave the previous launch's decision behind
    cudaError_t err = cudaGraphConditionalHandleCreate(&handle, graph, 0, cudaGraphCondAssignDefault);
    if (err != cudaSuccess) return err;
    void* args[] = {&handle, &stats, &fit};
    cudaKernelNodeParams guard_params{};
    guard_params.func = reinterpret_cast<void*>(fits_guard_kernel);
    guard_params.gridDim = dim3(1);
    guard_params.blockDim = dim3(1);
    guard_params.kernelParams = args;
    cudaGraphNode_t guard;
    if ((err = cudaGraphAddKernelNode(&guard, graph, nullptr, 0, &guard_params)) != cudaSuccess) return err;
    cudaGraphNodeParams if_params{};
    if_params.type = cudaGraphNodeTypeConditional;
    if_params.conditional.handle = handle;
    if_params.conditional.type = cudaGraphCondTypeIf;
    if_params.conditional.size = 1;
    cudaGraphNode_t if_node;
    if ((err = cudaGraphAddNode(&if_node, graph, &guard, nullptr, 1, &if_params)) != cudaSuccess) return err;
    cudaGraphNode_t child;
    return cudaGraphAddChildGraphNode(&child, if_params.conditional.phGraph_out[0], nullptr, 0, body);
}

}  // namespace

cudaError_t create_guarded_graph(cudaGraph_t body, const int32_t* stats, FitRanges fit, GuardedGraph* out) {
    GuardedGraph g;
    cudaError_t err = cudaGraphCreate(&g.graph, 0);
    if (err == cudaSuccess) err = build(g.graph, body, stats, fit);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&g.exec, g.graph, 0);
    if (err != cudaSuccess) {
        destroy_guarded_graph(&g);
        return err;
    }
    *out = g;
    return cudaSuccess;
}

void destroy_guarded_graph(GuardedGraph* graph) {
    if (graph->exec != nullptr) cudaGraphExecDestroy(graph->exec);
    if (graph->graph != nullptr) cudaGraphDestroy(graph->graph);
    *graph = GuardedGraph{};
}

}  // namespace padfree
