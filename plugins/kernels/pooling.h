// Sentence pooling on packed rows: one vector per sequence (CLS, mean or max over its rows), optionally
// L2-normalized. Arguments are validated by capi/pooling_capi.cpp (hidden a multiple of 8 in [8, 8192],
// 16-byte aligned x and out, a known mode and dtype); this only enqueues on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// the pooled row is held in shared memory in fp32 (32 KB at this width), as wide as the LayerNorms go
constexpr int kPoolMaxHidden = 8192;

// x: [total_tokens, hidden] -> out: [batch, hidden]. mode: PADFREE_POOL_CLS / MEAN / MAX; normalize:
// out[b] /= max(||out[b]||_2, 1e-12). Sequence b's rows [cu_seqlens[b], cu_seqlens[b + 1]) are clamped
// to [0, total_tokens]; a sequence left with no rows gives zeros.
void launch_sequence_pool(const void* x, const int32_t* cu_seqlens, int32_t batch, int64_t total_tokens,
                          int32_t hidden, int32_t mode, bool normalize, padfree_dtype dtype, void* out,
                          cudaStream_t stream);

}  // namespace padfree
