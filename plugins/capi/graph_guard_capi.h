// The guarded graph's handle behind the C ABI, shared by the files that launch one
// (graph_guard_capi.cpp, and inputs_capi.cpp's input plans).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "graph_guard.h"
#include "inputs.h"
#include "padfree.h"

struct padfree_guarded_graph {
    padfree::GuardedGraph graph;  // the guard kernel over `stats`, then the body
    cudaGraph_t body = nullptr;   // a clone of the body, for the graphs below
    const int32_t* stats = nullptr;
    padfree::FitRanges fit{};

    // Behind an input plan whose prepare step is one kernel writing `stats`, that kernel decides the
    // IF node itself, in one graph with the body: one launch instead of two, no guard kernel between
    // (launch_guarded_graph_after). One such graph per plan (per layout of inputs), made on first use.
    struct PlanGraph {
        uint64_t plan_serial;
        padfree::GuardedGraph graph;  // exec null: it could not be made (the plan takes two launches)
    };
    std::vector<PlanGraph> plan_graphs;
    std::mutex plan_graphs_mutex;  // also serializes a plan graph's update with its launch
};

namespace padfree {

padfree_status launch_guarded_graph(padfree_guarded_graph* graph, cudaStream_t stream);

// launch_prepare_padded_inputs(call) then launch_guarded_graph(graph), as one graph where it can be.
padfree_status launch_guarded_graph_after(padfree_guarded_graph* graph, const PrepareCall& call, uint64_t plan_serial,
                                          cudaStream_t stream);

}  // namespace padfree
