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

struct GuardedGraph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
};

// body is cloned (a child graph of a conditional node): the caller keeps ownership of it.
cudaError_t create_guarded_graph(cudaGraph_t body, const int32_t* stats, FitRanges fit, GuardedGraph* out);
void destroy_guarded_graph(GuardedGraph* graph);

}  // namespace padfree
