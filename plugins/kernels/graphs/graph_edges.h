// Surgery on captured CUDA graphs: programmatic edges from padfree's kernels into other libraries'
// kernels, and memsets a caller has made redundant.
//
// padfree's kernels are launched with programmatic stream serialization (PDL), so a captured graph
// already lets each of them launch while its producer drains. The kernels that consume their output
// (cuBLASLt's GEMMs, captured from torch) are launched without it: each such edge is a full
// dependency, and at small batches, where a forward is ~90 kernels of a few microseconds, those
// launch gaps are a large share of it. An edge may be programmatic only where the consumer waits on
// its producer (griddepcontrol.wait) before touching memory, which no API reports: the caller finds out
// per consumer function (padfree.torch.edges: with launch_delayed_copy as the producer).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace padfree {

// The distinct functions of kernel nodes that a padfree kernel node feeds through a full edge.
cudaError_t graph_consumers(cudaGraph_t graph, std::vector<const void*>* functions);

// The probe's producer: copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from src to
// dst, but lets its dependents launch at once and spins *spin_ns (device memory, so that a captured
// probe can be replayed with another spin) before it copies, on 8 CTAs (the other SMs stay free for
// the dependent). Launched with PDL, like every padfree
// kernel: captured ahead of a consumer, relaxed, it tells whether the consumer waits on it.
cudaError_t launch_delayed_copy(const void* src, void* dst, int64_t bytes, const int64_t* spin_ns, cudaStream_t stream);

// Makes every full edge from a padfree kernel node into a kernel node running one of `functions`
// programmatic (the consumer may launch once each producer CTA triggered or exited). relaxed: how many.
cudaError_t relax_graph_edges(cudaGraph_t graph, const void* const* functions, int32_t count, int32_t* relaxed);

// Removes each memset node that writes zeros inside one slot of [base, base + bytes) (slots of
// slot_bytes from base), joining its dependencies to its dependents (removed: how many). For a
// caller that zeroes those slots itself, once, before any of the memsets would have run: cuBLASLt
// zeroes its tile scheduler's counter in the workspace before each GEMM that uses one, and in a graph
// each such memset node leaves the GPU idle ~3.5 us before its GEMM (H100), where a kernel-to-kernel
// edge costs ~0.2. A memset over more than one slot (the caller's own zeroing) stays.
cudaError_t remove_zeroing_memsets(cudaGraph_t graph, const void* base, size_t bytes, size_t slot_bytes,
                                   int32_t* removed);

}  // namespace padfree
