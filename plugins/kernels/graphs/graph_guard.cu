// The guard is a one-thread kernel node followed by an IF conditional node (CUDA 12.4+) whose body
// is the caller's graph as a child graph: the decision stays on the device, so the host launches the
// whole thing without waiting for the measurement it depends on. Behind a head kernel that makes the
// measurement, the head decides (GuardCondition), and no guard kernel runs.
#include "graph_guard.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include "driver_entry.h"

namespace padfree {
namespace {

// A head's arguments are set through the driver with the kernel's CUfunction found once: the
// runtime's call resolves the host stub on every call, on the path the GPU idles through.
struct DriverCalls {
    PFN_cuGraphKernelNodeGetParams_v12000 node_params =
        driver_entry<PFN_cuGraphKernelNodeGetParams_v12000>("cuGraphKernelNodeGetParams", 12000);
    PFN_cuGraphExecKernelNodeSetParams_v12000 set_exec_node_params =
        driver_entry<PFN_cuGraphExecKernelNodeSetParams_v12000>("cuGraphExecKernelNodeSetParams", 12000);
};

const DriverCalls& driver() {
    static const DriverCalls calls;
    return calls;
}

void* driver_function(cudaGraphNode_t node) {
    CUDA_KERNEL_NODE_PARAMS_v2 params{};
    if (driver().node_params == nullptr || driver().set_exec_node_params == nullptr ||
        driver().node_params(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS)
        return nullptr;
    return params.func;
}

cudaError_t set_head(GuardedGraph* g, const cudaKernelNodeParams& head) {
    if (g->head_function == nullptr) return cudaGraphExecKernelNodeSetParams(g->headed_exec, g->head, &head);
    CUDA_KERNEL_NODE_PARAMS_v2 params{};
    params.func = static_cast<CUfunction>(g->head_function);
    params.gridDimX = head.gridDim.x;
    params.gridDimY = head.gridDim.y;
    params.gridDimZ = head.gridDim.z;
    params.blockDimX = head.blockDim.x;
    params.blockDimY = head.blockDim.y;
    params.blockDimZ = head.blockDim.z;
    params.sharedMemBytes = head.sharedMemBytes;
    params.kernelParams = head.kernelParams;
    params.extra = head.extra;
    if (driver().set_exec_node_params(reinterpret_cast<CUgraphExec>(g->headed_exec),
                                      reinterpret_cast<CUgraphNode>(g->head), &params) == CUDA_SUCCESS)
        return cudaSuccess;
    return cudaGraphExecKernelNodeSetParams(g->headed_exec, g->head, &head);  // the same refusal, as a cudaError_t
}

__global__ void fits_guard_kernel(cudaGraphConditionalHandle handle, const int32_t* stats, FitRanges fit) {
    cudaGraphSetConditional(handle, fits_ranges(fit, stats[0], stats[1], stats[2]) ? 1u : 0u);
}

// cudaGraphCondAssignDefault: every launch starts from "skip", so a guard that never ran cannot
// leave the previous launch's decision behind
cudaError_t skipping_condition(cudaGraph_t graph, cudaGraphConditionalHandle* handle) {
    return cudaGraphConditionalHandleCreate(handle, graph, 0, cudaGraphCondAssignDefault);
}

// IF(body) on `handle` into graph, behind `after`.
cudaError_t add_if(cudaGraph_t graph, cudaGraphConditionalHandle handle, cudaGraphNode_t after, cudaGraph_t body) {
    cudaGraphNodeParams if_params{};
    if_params.type = cudaGraphNodeTypeConditional;
    if_params.conditional.handle = handle;
    if_params.conditional.type = cudaGraphCondTypeIf;
    if_params.conditional.size = 1;
    cudaGraphNode_t if_node;
    cudaError_t err = cudaGraphAddNode(&if_node, graph, &after, nullptr, 1, &if_params);
    if (err != cudaSuccess) return err;
    cudaGraphNode_t child;
    return cudaGraphAddChildGraphNode(&child, if_params.conditional.phGraph_out[0], nullptr, 0, body);
}

// guard -> IF(body) into graph.
cudaError_t build(cudaGraph_t graph, cudaGraph_t body, const int32_t* stats, FitRanges fit) {
    cudaGraphConditionalHandle handle;
    cudaError_t err = skipping_condition(graph, &handle);
    if (err != cudaSuccess) return err;
    void* args[] = {&handle, &stats, &fit};
    cudaKernelNodeParams guard_params{};
    guard_params.func = reinterpret_cast<void*>(fits_guard_kernel);
    guard_params.gridDim = dim3(1);
    guard_params.blockDim = dim3(1);
    guard_params.kernelParams = args;
    cudaGraphNode_t guard;
    if ((err = cudaGraphAddKernelNode(&guard, graph, nullptr, 0, &guard_params)) != cudaSuccess) return err;
    return add_if(graph, handle, guard, body);
}

// What the head's GuardCondition argument is in g's headed graph.
GuardCondition headed_condition(const GuardedGraph& g) { return GuardCondition{g.headed_condition, g.fit, 1}; }

// head (deciding the condition) -> IF(body).
cudaError_t build_headed(GuardedGraph* g, const cudaKernelNodeParams& head, GuardCondition* condition) {
    cudaError_t err = cudaGraphCreate(&g->headed_graph, 0);
    if (err == cudaSuccess) err = skipping_condition(g->headed_graph, &g->headed_condition);
    if (err == cudaSuccess) {
        *condition = headed_condition(*g);
        err = cudaGraphAddKernelNode(&g->head, g->headed_graph, nullptr, 0, &head);
    }
    if (err == cudaSuccess) err = add_if(g->headed_graph, g->headed_condition, g->head, g->body);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&g->headed_exec, g->headed_graph, 0);
    if (err != cudaSuccess) {
        if (g->headed_graph != nullptr) cudaGraphDestroy(g->headed_graph);
        g->headed_graph = nullptr;
        g->head = nullptr;
        g->headed_condition = 0;
        return err;
    }
    g->head_func = head.func;
    g->head_function = driver_function(g->head);
    return cudaSuccess;
}

}  // namespace

cudaError_t create_guarded_graph(cudaGraph_t body, const int32_t* stats, FitRanges fit, GuardedGraph* out) {
    GuardedGraph g;
    g.stats = stats;
    g.fit = fit;
    cudaError_t err = cudaGraphClone(&g.body, body);
    if (err == cudaSuccess) err = cudaGraphCreate(&g.graph, 0);
    if (err == cudaSuccess) err = build(g.graph, g.body, stats, fit);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&g.exec, g.graph, 0);
    if (err != cudaSuccess) {
        destroy_guarded_graph(&g);
        return err;
    }
    *out = g;
    return cudaSuccess;
}

void destroy_guarded_graph(GuardedGraph* graph) {
    for (cudaGraphExec_t exec : {graph->exec, graph->headed_exec})
        if (exec != nullptr) cudaGraphExecDestroy(exec);
    for (cudaGraph_t g : {graph->graph, graph->headed_graph, graph->body})
        if (g != nullptr) cudaGraphDestroy(g);
    *graph = GuardedGraph{};
}

cudaError_t launch_guarded_graph_behind(GuardedGraph* graph, const cudaKernelNodeParams& head,
                                        GuardCondition* condition, const int32_t* head_stats, cudaStream_t stream) {
    if (graph->headed_failed || head_stats != graph->stats) return cudaErrorNotSupported;
    if (graph->headed_exec == nullptr) {
        if (build_headed(graph, head, condition) != cudaSuccess) {
            cudaGetLastError();  // not this call's error: the caller goes the two launches' way
            graph->headed_failed = true;
            return cudaErrorNotSupported;
        }
    } else {
        if (head.func != graph->head_func) return cudaErrorNotSupported;
        *condition = headed_condition(*graph);
        const cudaError_t err = set_head(graph, head);
        if (err != cudaSuccess) return err;
    }
    return cudaGraphLaunch(graph->headed_exec, stream);
}

}  // namespace padfree
