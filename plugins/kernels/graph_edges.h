// Programmatic edges from padfree's kernels into other libraries' kernels in a captured CUDA graph.
//
// padfree's kernels are launched with programmatic stream serialization (PDL), so a captured graph
// already lets each of them launch while its producer drains. The kernels that consume their output
// (cuBLASLt's GEMMs, captured from torch) are launched without it: each such edge is a full
// dependency, and at small batches, where a forward is ~90 kernels of a few microseconds, those
// launch gaps are a large share of it. An edge may be programmatic only where the consumer waits on
// its producer (griddepcontrol.wait) before touching memory, which no API reports: the caller decides
// per consumer function (padfree.torch checks each one's relaxed graph against the full one).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace padfree {

// The distinct functions of kernel nodes that a padfree kernel node feeds through a full edge.
cudaError_t graph_consumers(cudaGraph_t graph, std::vector<const void*>* functions);

// Makes every full edge from a padfree kernel node into a kernel node running one of `functions`
// programmatic (the consumer may launch once each producer CTA triggered or exited). relaxed: how many.
cudaError_t relax_graph_edges(cudaGraph_t graph, const void* const* functions, int32_t count, int32_t* relaxed);

}  // namespace padfree
