// C ABI of the guarded CUDA graph (kernels/graphs/graph_guard.h): an opaque handle over its graph and
// executable graph.
#include "graph_guard_capi.h"

#include "capi_util.h"

namespace padfree {

padfree_status launch_guarded_graph(padfree_guarded_graph* graph, cudaStream_t stream) {
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    const cudaError_t err = cudaGraphLaunch(graph->graph.exec, stream);
    if (err != cudaSuccess) return cuda_failure("guarded_graph_launch", err);
    return PADFREE_OK;
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
    padfree::GuardedGraph graph;
    const cudaError_t err = padfree::create_guarded_graph(static_cast<cudaGraph_t>(body), stats,
                                                          {min_total, max_total, min_longest, max_longest}, &graph);
    if (err != cudaSuccess) return padfree::cuda_failure("guarded_graph_create", err);
    *out = new padfree_guarded_graph{graph};
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_guarded_graph_launch(padfree_guarded_graph* graph, padfree_stream stream) {
    return padfree::launch_guarded_graph(graph, padfree::as_cuda_stream(stream));
}

padfree_status padfree_guarded_graph_destroy(padfree_guarded_graph* graph) {
    if (graph == nullptr) return PADFREE_OK;
    padfree::destroy_guarded_graph(&graph->graph);
    delete graph;
    return PADFREE_OK;
}

}  // extern "C"
