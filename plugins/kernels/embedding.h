// Embeddings of packed tokens followed by LayerNorm (or not), in one kernel: a launcher over device
// pointers. Arguments are validated by capi/embedding_capi.cpp (hidden a multiple of 8 in
// [8, 8192], 16-byte aligned tables, positive table sizes); this only enqueues on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "l2_prefetch.h"
#include "padfree.h"

namespace padfree {

// out[t] = LayerNorm(word_emb[id] + position_emb[position_offset + t - cu_seqlens[b]] + type_emb[tt])
// with b the sequence of token t (rows past cu_seqlens[batch] count as part of the last one). Ids and
// positions are clamped into their tables. token_type_ids NULL: type 0; type_emb NULL: no type term.
// gamma and beta NULL (both): no LayerNorm, out[t] = the sum (fp32, rounded once to the dtype); eps unused.
// prefetch: a range to start moving into L2 before the wait on the previous kernel (a hint).
void launch_embedding_layernorm(const int32_t* input_ids, const int32_t* token_type_ids,
                                const int32_t* cu_seqlens, int32_t batch, int64_t total_tokens,
                                const void* word_emb, int32_t vocab_size, const void* position_emb,
                                int32_t max_positions, int32_t position_offset, const void* type_emb,
                                int32_t type_vocab_size, const void* gamma, const void* beta,
                                int32_t hidden, float eps, L2Prefetch prefetch, padfree_dtype dtype,
                                void* out, cudaStream_t stream);

}  // namespace padfree
