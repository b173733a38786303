// Masked self-attention of one decoding step over the K/V cache: the launcher the C ABI calls.
// Arguments are validated by capi/decoder_capi.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// qkv [rows, 3, H, D] (+ qkv_bias [3, H, D] or null); k_cache, v_cache [rows, H, L, D];
// cache_indir [rows, L] int32; step: device int32 scalar; out [rows, H, D].
struct SelfAttentionArgs {
    const void* qkv;
    const void* qkv_bias;
    void* k_cache;
    void* v_cache;
    const int32_t* cache_indir;
    const int32_t* step;
    void* out;
    int32_t rows;
    int32_t num_heads;
    int32_t head_dim;
    int32_t max_len;
    float softmax_scale;
    // step, cache_indir and the caches' earlier positions are no running kernel's output (the C ABI's
    // state_ready): read before the PDL wait
    bool state_ready;
};

// Bytes of scratch the launch wants for its split-K partials (0: it runs unsplit).
int64_t self_attention_workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t max_len);

// Launches with at most the splits `workspace_bytes` holds (unsplit where it holds none).
cudaError_t launch_self_attention(const SelfAttentionArgs& args, void* workspace, int64_t workspace_bytes,
                                  padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
