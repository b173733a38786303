// Masked self-attention over the K/V cache through the cache indirection (decoder_attention.cuh).
#include "self_attention.h"

#include "decoder_attention.cuh"

namespace padfree {

int64_t self_attention_workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t max_len) {
    return decoder::workspace_bytes(rows, num_heads, head_dim, max_len);
}

cudaError_t launch_self_attention(const SelfAttentionArgs& args, void* workspace, int64_t workspace_bytes,
                                  padfree_dtype dtype, cudaStream_t stream) {
    const int64_t row_heads = static_cast<int64_t>(args.rows) * args.num_heads;
    decoder::DecoderAttentionArgs a{};
    a.splits = decoder::fitting_splits(row_heads, args.max_len, args.head_dim, workspace != nullptr ? workspace_bytes : 0);
    a.q = args.qkv;
    a.q_bias = args.qkv_bias;
    a.q_row_stride = 3 * static_cast<int64_t>(args.num_heads) * args.head_dim;
    a.k_cache = args.k_cache;
    a.v_cache = args.v_cache;
    a.cache_indir = args.cache_indir;
    a.step = args.step;
    a.max_len = args.max_len;
    a.out = args.out;
    a.partial = static_cast<float*>(workspace);
    a.rows = args.rows;
    a.num_heads = args.num_heads;
    a.scale_log2 = args.softmax_scale * kLog2e;
    a.state_ready = args.state_ready;
    return decoder::launch_decoder_attention<true>(a, args.head_dim, dtype, stream);
}

}  // namespace padfree
