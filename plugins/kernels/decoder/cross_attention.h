// Cross-attention of one decoding step over the packed encoder output: the launcher the C ABI calls.
// Arguments are validated by capi/decoder_capi.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// q [rows, H, D] (+ q_bias [H, D] or null); kv_mem [total_tokens, 2, H, D] (K | V, bias added);
// cu_seqlens [batch + 1]; rows = batch * num_beams, row r reads source r / num_beams in place.
struct CrossAttentionArgs {
    const void* q;
    const void* q_bias;
    const void* kv_mem;
    const int32_t* cu_seqlens;
    void* out;
    int32_t rows;
    int32_t batch;
    int32_t num_beams;
    int32_t total_tokens;
    int32_t max_seqlen;
    int32_t num_heads;
    int32_t head_dim;
    float softmax_scale;
};

int64_t cross_attention_workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t max_seqlen);

cudaError_t launch_cross_attention(const CrossAttentionArgs& args, void* workspace, int64_t workspace_bytes,
                                   padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
