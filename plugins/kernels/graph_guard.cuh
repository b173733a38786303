// The guard's predicate on the device, for the guard kernel and for kernels that measure the totals
// themselves and decide the IF node in its place (one node fewer in front of the body).
#pragma once

#include "graph_guard.h"

namespace padfree {

__device__ __forceinline__ bool totals_fit(const FitRanges& fit, int32_t flags, int32_t total, int32_t longest) {
    return flags == 0 && total >= fit.min_total && total <= fit.max_total && longest >= fit.min_longest &&
           longest <= fit.max_longest;
}

// One thread calls this (concurrent cudaGraphSetConditional calls are undefined).
__device__ __forceinline__ void set_fit_condition(const FitCondition& condition, int32_t flags, int32_t total,
                                                  int32_t longest) {
    if (condition.active) cudaGraphSetConditional(condition.handle, totals_fit(condition.fit, flags, total, longest));
}

}  // namespace padfree
