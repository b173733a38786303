// The beam search's reorder of the cache indirection: the launcher the C ABI calls (arguments are
// validated by capi/decoding_capi.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace padfree {

// cache_indir, out: [rows, max_len] int32; parents: [rows] int32; step: device int32 scalar.
// out[r, t] = cache_indir[parents[r], t] for t < step, out[r, step] = parents[r]; positions past
// step are not written. Parents and step are clamped into range (values then unspecified).
void launch_beam_reorder_cache_indir(const int32_t* cache_indir, const int32_t* parents, const int32_t* step,
                                     int32_t rows, int32_t max_len, int32_t* out, cudaStream_t stream);

}  // namespace padfree
