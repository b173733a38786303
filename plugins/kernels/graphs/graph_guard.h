// A CUDA graph that runs a captured forward only where the inputs a prepare step measured fit it:
// lets a caller launch the graph it expects before the measurement reaches the host, at the cost of
// one tiny kernel when the guess is wrong (the forward is then skipped on the device, not run on
// inputs it was not captured for).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace padfree {

// stats: device int32 [3] = flags, total, longest (padfree_padded_input_stats' layout), written
// before each launch. The body runs iff flags == 0 and total and longest lie in their ranges.
struct FitRanges {
    int32_t min_total, max_total, min_longest, max_longest;  // inclusive
};

// The guard's decision, made by another kernel of the graph: the head of launch_guarded_graph_behind,
// which measures the totals itself, decides the IF node's condition in place of a guard kernel.
// Disabled (the default) outside such a graph.
struct GuardCondition {
    cudaGraphConditionalHandle handle = 0;
    FitRanges fit{};
    int32_t enabled = 0;
};

#ifdef __CUDACC__
__device__ __forceinline__ bool fits_ranges(const FitRanges& fit, int32_t flags, int32_t total, int32_t longest) {
    return flags == 0 && total >= fit.min_total && total <= fit.max_total && longest >= fit.min_longest &&
           longest <= fit.max_longest;
}

// One thread of the head, once the totals are known.
__device__ __forceinline__ void decide_guard(const GuardCondition& guard, int32_t flags, int32_t total,
                                             int32_t longest) {
    if (guard.enabled) cudaGraphSetConditional(guard.handle, fits_ranges(guard.fit, flags, total, longest) ? 1u : 0u);
}
#endif

struct GuardedGraph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    // What launch_guarded_graph_behind builds its graph from, and that graph once built.
    cudaGraph_t body = nullptr;  // a clone of the caller's
    const int32_t* stats = nullptr;
    FitRanges fit{};
    cudaGraph_t headed_graph = nullptr;
    cudaGraphExec_t headed_exec = nullptr;
    cudaGraphNode_t head = nullptr;
    cudaGraphConditionalHandle headed_condition = 0;
    void* head_func = nullptr;      // the runtime's handle of head's kernel (its host stub)
    void* head_function = nullptr;  // the driver's (CUfunction), null where it cannot be had
    bool headed_failed = false;     // its instantiation failed: not tried again
};

// body is cloned (a child graph of a conditional node): the caller keeps ownership of it.
cudaError_t create_guarded_graph(cudaGraph_t body, const int32_t* stats, FitRanges fit, GuardedGraph* out);
void destroy_guarded_graph(GuardedGraph* graph);

// The kernel `head` (a kernel node's parameters: the step that writes stats), then the guarded graph,
// as one graph launch rather than a kernel launch and a graph launch. head decides the condition
// itself (decide_guard with *condition, which must be one of its arguments) from the totals it
// writes to head_stats, so no guard kernel runs between it and the body. The first call
// instantiates that graph with head's kernel; later calls set head's parameters in it.
// cudaErrorNotSupported, with nothing launched, where that graph cannot be had (the guarded graph
// reads other stats than head_stats, its instantiation failed, on this call or an earlier one, or
// head is another kernel than the first call's): the caller launches both itself.
cudaError_t launch_guarded_graph_behind(GuardedGraph* graph, const cudaKernelNodeParams& head,
                                        GuardCondition* condition, const int32_t* head_stats, cudaStream_t stream);

}  // namespace padfree
