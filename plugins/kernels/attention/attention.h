// Fused multi-head attention over variable-length sequences: the launcher the C ABI calls.
// Arguments are validated by capi/attention_capi.cpp; this only picks a kernel and enqueues it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// qkv:        [total_tokens, 3, num_heads, head_dim]  (Q | K | V blocks of each token's row)
// qkv_bias:   [3, num_heads, head_dim] or null
// cu_seqlens: [batch + 1] int32; out: [total_tokens, num_heads, head_dim]
enum class AttentionGridOrder : int32_t {
    // (query tile, sequence, head): the tiles of one sequence and head side by side (their K/V
    // shared in L2)
    kTilesSequencesHeads = 0,
    // (head, sequence, query tile from the last): the CTAs of the longest sequences first
    kHeadsSequencesLastTileFirst = 1,
    // (query tile, head, sequence from the last): each sequence's whole QKV rows at once, the
    // producer's last rows (still in L2) first
    kTilesHeadsLastSequenceFirst = 2,
};

struct AttentionArgs {
    const void* qkv;
    const void* qkv_bias;
    const int32_t* cu_seqlens;
    void* out;
    // Rows of qkv and out, capped at INT32_MAX (cu_seqlens entries are int32): each sequence's
    // [start, end) is clamped to [0, total_rows].
    int32_t total_rows;
    int32_t num_heads;
    float softmax_scale;
    float scale_log2;  // softmax_scale * log2(e), filled in by the launcher (exp2 softmax)
    bool causal;
    // Grid order, set by the launcher (attention.cu says when each).
    AttentionGridOrder grid_order;
};

// The head sizes kernels are built for (32, 64 and 128).
bool attention_head_dim_supported(int32_t head_dim);

// batch >= 1, max_seqlen >= 1, head_dim supported, dtype valid. Returns the error of configuring
// the kernel (shared-memory size) if any; launch errors are left for cudaGetLastError.
cudaError_t launch_attention_varlen(AttentionArgs args, int32_t batch, int32_t max_seqlen,
                                    int32_t head_dim, padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
