// C ABI of the guarded CUDA graph (kernels/graph_guard.h): an opaque handle over its graph and
// executable graph.
#include "graph_guard_capi.h"

#include <algorithm>

#include "capi_util.h"

namespace padfree {
namespace {

// Plans per guarded graph before the list starts over: a few layouts of inputs reach one bucket's
// graph; each plan graph holds a copy of the body.
constexpr size_t kMaxPlanGraphs = 8;

void destroy_plan_graphs(padfree_guarded_graph* g) {
    for (auto& p : g->plan_graphs) destroy_guarded_graph(&p.graph);
    g->plan_graphs.clear();
}

// The plan's graph (made on first use; exec null where it cannot be made). Called under the mutex.
padfree_guarded_graph::PlanGraph& plan_graph(padfree_guarded_graph* g, const PrepareCall& call,
                                             uint64_t plan_serial) {
    auto& graphs = g->plan_graphs;
    const auto found = std::find_if(graphs.begin(), graphs.end(),
                                    [&](const auto& p) { return p.plan_serial == plan_serial; });
    if (found != graphs.end()) return *found;
    if (graphs.size() >= kMaxPlanGraphs) destroy_plan_graphs(g);
    GuardedGraph made;
    const cudaError_t err = create_guarded_graph(
        g->body,
        [&](cudaGraph_t graph, cudaGraphConditionalHandle handle, cudaGraphNode_t* node) {
            return add_prepare_node(graph, call, FitCondition{handle, g->fit, 1}, node);
        },
        &made);
    if (err != cudaSuccess) cudaGetLastError();  // not an error of this call: it takes two launches
    graphs.push_back({plan_serial, made});
    return graphs.back();
}

}  // namespace

padfree_status launch_guarded_graph(padfree_guarded_graph* graph, cudaStream_t stream) {
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    const cudaError_t err = cudaGraphLaunch(graph->graph.exec, stream);
    if (err != cudaSuccess) return cuda_failure("guarded_graph_launch", err);
    return PADFREE_OK;
}

padfree_status launch_guarded_graph_after(padfree_guarded_graph* graph, const PrepareCall& call, uint64_t plan_serial,
                                          cudaStream_t stream) {
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    // the guard reads graph->stats: the prepare kernel may decide in its place only if it writes them
    if (call.stats == graph->stats && prepare_is_one_block(call)) {
        const std::lock_guard<std::mutex> lock(graph->plan_graphs_mutex);
        const GuardedGraph& g = plan_graph(graph, call, plan_serial).graph;
        if (g.exec != nullptr) {
            cudaError_t err = update_prepare_node(g.exec, g.guard, call, FitCondition{g.handle, graph->fit, 1});
            if (err == cudaSuccess) err = cudaGraphLaunch(g.exec, stream);
            if (err != cudaSuccess) return cuda_failure("input_plan_launch", err);
            return PADFREE_OK;
        }
    }
    launch_prepare_padded_inputs(call, stream);
    PADFREE_CHECK(check_launch("input_plan_launch"));
    return launch_guarded_graph(graph, stream);
}

}  // namespace padfree

extern "C" {

padfree_status padfree_guarded_graph_create(void* body, const int32_t* stats, int32_t min_total, int32_t max_total,
                                            int32_t min_longest, int32_t max_longest, padfree_guarded_graph** out) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(body != nullptr, "body is NULL");
    PADFREE_REQUIRE(stats != nullptr, "stats is NULL");
    PADFREE_REQUIRE(out != nullptr, "out is NULL");
    PADFREE_REQUIRE(1 <= min_total && min_total <= max_total, "need 1 <= min_total <= max_total, got ", min_total,
                    ", ", max_total);
    PADFREE_REQUIRE(1 <= min_longest && min_longest <= max_longest, "need 1 <= min_longest <= max_longest, got ",
                    min_longest, ", ", max_longest);
    const padfree::FitRanges fit{min_total, max_total, min_longest, max_longest};
    padfree::GuardedGraph graph;
    cudaError_t err = padfree::create_guarded_graph(static_cast<cudaGraph_t>(body), stats, fit, &graph);
    cudaGraph_t body_copy = nullptr;
    if (err == cudaSuccess && (err = cudaGraphClone(&body_copy, static_cast<cudaGraph_t>(body))) != cudaSuccess)
        padfree::destroy_guarded_graph(&graph);
    if (err != cudaSuccess) return padfree::cuda_failure("guarded_graph_create", err);
    auto* made = new padfree_guarded_graph;
    made->graph = graph;
    made->body = body_copy;
    made->stats = stats;
    made->fit = fit;
    *out = made;
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_guarded_graph_launch(padfree_guarded_graph* graph, padfree_stream stream) {
    return padfree::launch_guarded_graph(graph, padfree::as_cuda_stream(stream));
}

padfree_status padfree_guarded_graph_destroy(padfree_guarded_graph* graph) {
    if (graph == nullptr) return PADFREE_OK;
    padfree::destroy_plan_graphs(graph);
    padfree::destroy_guarded_graph(&graph->graph);
    if (graph->body != nullptr) cudaGraphDestroy(graph->body);
    delete graph;
    return PADFREE_OK;
}

}  // extern "C"
