// Beam reorder of the cache indirection: a new hypothesis inherits its parent's row of indices (one
// int per position) instead of the parent's K/V cache (rows x layers x heads x positions x head_dim
// values): the cache is written once per position and never moved.
#include "beam_reorder.h"

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kThreads = 128;

template <bool kVec>
__global__ void __launch_bounds__(kThreads) beam_reorder_kernel(const int32_t* cache_indir, const int32_t* parents,
                                                                const int32_t* step_ptr, int32_t rows,
                                                                int32_t max_len, int32_t* out) {
    wait_on_producer();
    const int r = blockIdx.x;
    const int step = min(max(*step_ptr, 0), max_len - 1);
    const int parent = min(max(parents[r], 0), rows - 1);
    const int32_t* src = cache_indir + static_cast<int64_t>(parent) * max_len;
    int32_t* dst = out + static_cast<int64_t>(r) * max_len;
    if constexpr (kVec) {  // max_len % 4 == 0: 16-byte rows
        for (int t = threadIdx.x * 4; t <= step; t += kThreads * 4) {
            int4 v = *reinterpret_cast<const int4*>(src + t);
            if (t + 0 == step) v.x = parent;
            if (t + 1 == step) v.y = parent;
            if (t + 2 == step) v.z = parent;
            if (t + 3 == step) v.w = parent;
            if (t + 3 <= step) {
                *reinterpret_cast<int4*>(dst + t) = v;
            } else {  // the vector holding step: nothing past it is written
                dst[t] = v.x;
                if (t + 1 <= step) dst[t + 1] = v.y;
                if (t + 2 <= step) dst[t + 2] = v.z;
            }
        }
    } else {
        for (int t = threadIdx.x; t <= step; t += kThreads) dst[t] = t == step ? parent : src[t];
    }
    allow_consumers();
}

}  // namespace

void launch_beam_reorder_cache_indir(const int32_t* cache_indir, const int32_t* parents, const int32_t* step,
                                     int32_t rows, int32_t max_len, int32_t* out, cudaStream_t stream) {
    if (rows == 0) return;
    if (max_len % 4 == 0)
        launch_kernel(beam_reorder_kernel<true>, dim3(rows), dim3(kThreads), 0, stream, cache_indir, parents, step,
                      rows, max_len, out);
    else
        launch_kernel(beam_reorder_kernel<false>, dim3(rows), dim3(kThreads), 0, stream, cache_indir, parents, step,
                      rows, max_len, out);
}

}  // namespace padfree
