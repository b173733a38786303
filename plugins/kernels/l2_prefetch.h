// L2Prefetch: a byte range a kernel starts moving into L2 before it waits on its producer (common.cuh:
// prefetch_range_l2), in a header the C ABI's host code can include.
#pragma once

#include <cstdint>

namespace padfree {

// The weights of the GEMMs after a kernel. At small batches each of a forward's GEMMs is latency-bound
// and finds its weights in DRAM (BERT-base's 170 MB pass through an H100's 50 MB of L2); asked for a
// kernel or two ahead, those reads overlap the kernels between. A hint: no result depends on it.
struct L2Prefetch {
    const void* ptr = nullptr;
    int64_t bytes = 0;
};

}  // namespace padfree
