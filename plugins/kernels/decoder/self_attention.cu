// Masked self-attention over the K/V cache through the cache indirection (decoder_attention.cuh).
#include "self_attention.h"

#include "decoder_attention.cuh"

namespace padfree {

int64_t self_attention_workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t max_len) {
    return decoder::workspace_bytes(rows, num_heads, head_dim, max_len);
}

cudaError_t launch_self_attention(const SelfAttentionArgs& args, void* workspace, int64_t workspace_bytes,
                                  padfree_dtype dtype, cudaStream_t stream) {
    decoder::DecoderAttentionArgs a = decoder::attention_args(args);
    a.splits = decoder::fitting_splits(static_cast<int64_t>(args.rows) * args.num_heads, args.max_len, args.head_dim,
                                       workspace != nullptr ? workspace_bytes : 0);
    a.partial = static_cast<float*>(workspace);
    return decoder::launch_decoder_attention<true>(a, args.head_dim, dtype, stream);
}

}  // namespace padfree
