// The guard is a one-thread kernel node followed by an IF conditional node (CUDA 12.4+) whose body
// is the caller's graph as a child graph: the decision stays on the device, so the host launches the
// whole thing without waiting for the measurement it depends on.
#include "graph_guard.cuh"

namespace padfree {
namespace {

__global__ void fits_guard_kernel(const int32_t* stats, FitCondition condition) {
    set_fit_condition(condition, stats[0], stats[1], stats[2]);
}

cudaError_t build(cudaGraph_t graph, cudaGraph_t body, const AddGuardNode& add_guard, GuardedGraph* g) {
    // cudaGraphCondAssignDefault: every launch starts from "skip", so a guard that never ran cannot
    // leave the previous launch's decision behind
    cudaError_t err = cudaGraphConditionalHandleCreate(&g->handle, graph, 0, cudaGraphCondAssignDefault);
    if (err != cudaSuccess) return err;
    if ((err = add_guard(graph, g->handle, &g->guard)) != cudaSuccess) return err;
    cudaGraphNodeParams if_params{};
    if_params.type = cudaGraphNodeTypeConditional;
    if_params.conditional.handle = g->handle;
    if_params.conditional.type = cudaGraphCondTypeIf;
    if_params.conditional.size = 1;
    cudaGraphNode_t if_node;
    if ((err = cudaGraphAddNode(&if_node, graph, &g->guard, nullptr, 1, &if_params)) != cudaSuccess) return err;
    cudaGraphNode_t child;
    return cudaGraphAddChildGraphNode(&child, if_params.conditional.phGraph_out[0], nullptr, 0, body);
}

}  // namespace

cudaError_t create_guarded_graph(cudaGraph_t body, const AddGuardNode& add_guard, GuardedGraph* out) {
    GuardedGraph g;
    cudaError_t err = cudaGraphCreate(&g.graph, 0);
    if (err == cudaSuccess) err = build(g.graph, body, add_guard, &g);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&g.exec, g.graph, 0);
    if (err != cudaSuccess) {
        destroy_guarded_graph(&g);
        return err;
    }
    *out = g;
    return cudaSuccess;
}

cudaError_t create_guarded_graph(cudaGraph_t body, const int32_t* stats, FitRanges fit, GuardedGraph* out) {
    return create_guarded_graph(
        body,
        [stats, fit](cudaGraph_t graph, cudaGraphConditionalHandle handle, cudaGraphNode_t* node) {
            const int32_t* stats_arg = stats;
            FitCondition condition{handle, fit, 1};
            void* args[] = {&stats_arg, &condition};
            cudaKernelNodeParams params{};
            params.func = reinterpret_cast<void*>(fits_guard_kernel);
            params.gridDim = dim3(1);
            params.blockDim = dim3(1);
            params.kernelParams = args;
            return cudaGraphAddKernelNode(node, graph, nullptr, 0, &params);
        },
        out);
}

void destroy_guarded_graph(GuardedGraph* graph) {
    if (graph->exec != nullptr) cudaGraphExecDestroy(graph->exec);
    if (graph->graph != nullptr) cudaGraphDestroy(graph->graph);
    *graph = GuardedGraph{};
}

}  // namespace padfree
