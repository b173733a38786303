// C ABI of the graph-surgery helpers (kernels/graphs/graph_edges.h) and of a relaxed graph's executable copy,
// which lets a caller compare a relaxed graph with the captured one before committing to it.
#include "capi_util.h"
#include "graphs/graph_edges.h"

struct padfree_graph_exec {
    cudaGraphExec_t exec = nullptr;
};

namespace {

padfree_status check_functions(const void* const* functions, int32_t count) {
    PADFREE_REQUIRE(count >= 0, "count must be >= 0, got ", count);
    PADFREE_REQUIRE(count == 0 || functions != nullptr, "functions is NULL");
    return PADFREE_OK;
}

}  // namespace

extern "C" {

padfree_status padfree_graph_consumers(void* graph, const void** functions, int32_t capacity, int32_t* count) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    PADFREE_REQUIRE(count != nullptr, "count is NULL");
    PADFREE_REQUIRE(capacity >= 0, "capacity must be >= 0, got ", capacity);
    PADFREE_REQUIRE(capacity == 0 || functions != nullptr, "functions is NULL");
    std::vector<const void*> found;
    const cudaError_t err = padfree::graph_consumers(static_cast<cudaGraph_t>(graph), &found);
    if (err != cudaSuccess) return padfree::cuda_failure("graph_consumers", err);
    for (size_t i = 0; i < found.size() && i < static_cast<size_t>(capacity); ++i) functions[i] = found[i];
    *count = static_cast<int32_t>(found.size());
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_probe_delayed_copy(const void* src, void* dst, int64_t bytes, const int64_t* spin_ns,
                                          padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(src != nullptr && dst != nullptr, "src and dst must not be NULL");
    PADFREE_REQUIRE(spin_ns != nullptr, "spin_ns is NULL");
    PADFREE_REQUIRE(bytes > 0 && bytes % 16 == 0, "bytes must be a positive multiple of 16, got ", bytes);
    PADFREE_REQUIRE(reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0,
                    "src and dst must be 16-byte aligned");
    const cudaError_t err = padfree::launch_delayed_copy(src, dst, bytes, spin_ns, padfree::as_cuda_stream(stream));
    if (err != cudaSuccess) return padfree::cuda_failure("probe_delayed_copy", err);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_graph_relax_edges(void* graph, const void* const* functions, int32_t count,
                                         int32_t* relaxed) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    PADFREE_REQUIRE(relaxed != nullptr, "relaxed is NULL");
    PADFREE_CHECK(check_functions(functions, count));
    const cudaError_t err = padfree::relax_graph_edges(static_cast<cudaGraph_t>(graph), functions, count, relaxed);
    if (err != cudaSuccess) return padfree::cuda_failure("graph_relax_edges", err);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_graph_remove_zeroing_memsets(void* graph, const void* base, int64_t bytes, int64_t slot_bytes,
                                                    int32_t* removed) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    PADFREE_REQUIRE(base != nullptr, "base is NULL");
    PADFREE_REQUIRE(removed != nullptr, "removed is NULL");
    PADFREE_REQUIRE(slot_bytes > 0 && bytes >= slot_bytes, "expected 0 < slot_bytes <= bytes, got slot_bytes ",
                    slot_bytes, " and bytes ", bytes);
    const cudaError_t err = padfree::remove_zeroing_memsets(static_cast<cudaGraph_t>(graph), base,
                                                            static_cast<size_t>(bytes),
                                                            static_cast<size_t>(slot_bytes), removed);
    if (err != cudaSuccess) return padfree::cuda_failure("graph_remove_zeroing_memsets", err);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_graph_exec_create(void* graph, const void* const* functions, int32_t count, int32_t* relaxed,
                                         padfree_graph_exec** out) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(graph != nullptr, "graph is NULL");
    PADFREE_REQUIRE(relaxed != nullptr, "relaxed is NULL");
    PADFREE_REQUIRE(out != nullptr, "out is NULL");
    PADFREE_CHECK(check_functions(functions, count));
    cudaGraph_t copy = nullptr;
    cudaError_t err = cudaGraphClone(&copy, static_cast<cudaGraph_t>(graph));
    if (err != cudaSuccess) return padfree::cuda_failure("graph_exec_create (clone)", err);
    cudaGraphExec_t exec = nullptr;
    err = padfree::relax_graph_edges(copy, functions, count, relaxed);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, copy, 0);
    cudaGraphDestroy(copy);  // the executable graph does not need it
    if (err != cudaSuccess) return padfree::cuda_failure("graph_exec_create", err);
    *out = new padfree_graph_exec{exec};
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_graph_exec_launch(padfree_graph_exec* exec, padfree_stream stream) {
    PADFREE_REQUIRE(exec != nullptr, "exec is NULL");
    const cudaError_t err = cudaGraphLaunch(exec->exec, padfree::as_cuda_stream(stream));
    if (err != cudaSuccess) return padfree::cuda_failure("graph_exec_launch", err);
    return PADFREE_OK;
}

padfree_status padfree_graph_exec_destroy(padfree_graph_exec* exec) {
    if (exec == nullptr) return PADFREE_OK;
    cudaGraphExecDestroy(exec->exec);
    delete exec;
    return PADFREE_OK;
}

}  // extern "C"
