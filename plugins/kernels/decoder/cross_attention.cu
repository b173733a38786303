// Cross-attention over the packed encoder output (decoder_attention.cuh): the beams of one source
// read that source's K/V rows in place (no per-beam copy); their CTAs are neighbours in the grid
// (x = row), so the rows one beam brings into L2 serve the others. Where the sources' beams are many
// items, their source's keys are read once per head on tensor cores instead (cross_attention_beams.cuh).
#include "cross_attention.h"

#include <cstdlib>
#include <cstring>

#include "cross_attention_beams.cuh"
#include "decoder_attention.cuh"

namespace padfree {

int64_t cross_attention_workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t max_seqlen) {
    return decoder::workspace_bytes(rows, num_heads, head_dim, max_seqlen);
}

// PADFREE_CROSS_ATTENTION_PATH=beams|rows overrides the choice where the path can run (A/B runs, tests).
cudaError_t launch_cross_attention(const CrossAttentionArgs& args, void* workspace, int64_t workspace_bytes,
                                   padfree_dtype dtype, cudaStream_t stream) {
    const char* path = std::getenv("PADFREE_CROSS_ATTENTION_PATH");
    const bool rows_forced = path != nullptr && std::strcmp(path, "rows") == 0;
    const bool beams_forced = path != nullptr && std::strcmp(path, "beams") == 0;
    if (!rows_forced && decoder::cross_attention_beams_takes(args, dtype, decoder::current_sms(), beams_forced))
        return decoder::launch_cross_attention_beams(args, dtype, stream);
    const int64_t row_heads = static_cast<int64_t>(args.rows) * args.num_heads;
    decoder::DecoderAttentionArgs a{};
    a.splits = decoder::fitting_splits(row_heads, args.max_seqlen, args.head_dim,
                                       workspace != nullptr ? workspace_bytes : 0);
    a.q = args.q;
    a.q_bias = args.q_bias;
    a.q_row_stride = static_cast<int64_t>(args.num_heads) * args.head_dim;
    a.kv_mem = args.kv_mem;
    a.cu_seqlens = args.cu_seqlens;
    a.batch = args.batch;
    a.total_tokens = args.total_tokens;
    a.max_seqlen = args.max_seqlen;
    a.num_beams = args.num_beams;
    a.out = args.out;
    a.partial = static_cast<float*>(workspace);
    a.rows = args.rows;
    a.num_heads = args.num_heads;
    a.scale_log2 = args.softmax_scale * kLog2e;
    return decoder::launch_decoder_attention<false>(a, args.head_dim, dtype, stream);
}

}  // namespace padfree
