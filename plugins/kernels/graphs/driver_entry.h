// Driver API functions looked up through the runtime: padfree links only the CUDA runtime, and the
// few driver calls it needs (graph node introspection, tensor maps) are reached this way.
#pragma once

#include <cuda_runtime.h>

namespace padfree {

// The driver's `name` as of `version` (e.g. 12000), or null where this driver has none.
template <class Fn>
Fn driver_entry(const char* name, int version) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return reinterpret_cast<Fn>(fn);
}

}  // namespace padfree
