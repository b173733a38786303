// The guarded graph's handle behind the C ABI, shared by the files that launch one
// (graph_guard_capi.cpp, and inputs_capi.cpp's input plans).
#pragma once

#include <cuda_runtime.h>

#include "graphs/graph_guard.h"
#include "padfree.h"

struct padfree_guarded_graph {
    padfree::GuardedGraph graph;
};

namespace padfree {

padfree_status launch_guarded_graph(padfree_guarded_graph* graph, cudaStream_t stream);

}  // namespace padfree
