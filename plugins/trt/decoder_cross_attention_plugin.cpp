#include "decoder_cross_attention_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& DecoderCrossAttentionPlugin::schema() {
    static const Schema s{"PadfreeDecoderCrossAttention",
                          {{"num_beams", PluginFieldType::kINT32},
                           {"num_heads", PluginFieldType::kINT32},
                           {"head_dim", PluginFieldType::kINT32},
                           {"softmax_scale", PluginFieldType::kFLOAT32},
                           {"own_workspace", PluginFieldType::kINT32, true, Scalar{0}}}};
    return s;
}

bool DecoderCrossAttentionPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    if (values[kNumBeams].i < 1) {
        error = concat("num_beams = ", values[kNumBeams].i, ": expected >= 1");
        return false;
    }
    return check_heads(values[kNumHeads].i, values[kHeadDim].i, 2, error) &&
           check_softmax_scale(values[kSoftmaxScale].f, error) && check_flag(values[kOwnWorkspace].i, "own_workspace", error);
}

IoKind DecoderCrossAttentionPlugin::io_kind(int32_t pos) const {
    switch (pos) {
        case kCuSeqlens: return IoKind::kInt32;
        case kMaxSeqlen: return IoKind::kAny;  // only its length is read
        default: return IoKind::kActivation;   // q, q_bias, kv_mem, context
    }
}

bool DecoderCrossAttentionPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                                std::string& error) const {
    const int64_t width = int64_t{field_i32(kNumHeads)} * field_i32(kHeadDim);
    const DimsExprs& q = inputs[kQ];
    const IDimensionExpr* q_width = builder.constant(width);
    if (!check_rank(q, 2, "q", error) || !check_same(q.d[1], q_width, "q width (num_heads*head_dim)", error) ||
        !check_vector(inputs[kQBias], q_width, "q_bias", error) || !check_rank(inputs[kKvMem], 2, "kv_mem", error) ||
        !check_same(inputs[kKvMem].d[1], builder.constant(2 * width), "kv_mem width (2*num_heads*head_dim)", error) ||
        !check_rank(inputs[kCuSeqlens], 1, "cu_seqlens", error) || !check_rank(inputs[kMaxSeqlen], 1, "max_seqlen", error))
        return false;
    outputs[0].nbDims = 2;
    outputs[0].d[0] = q.d[0];
    outputs[0].d[1] = q_width;
    return true;
}

size_t DecoderCrossAttentionPlugin::getWorkspaceSize(const DynamicPluginTensorDesc* in, int32_t nbInputs,
                                                     const DynamicPluginTensorDesc*, int32_t) const noexcept {
    if (owns_workspace() || nbInputs != kNumInputs || in[kQ].max.nbDims != 2 || in[kMaxSeqlen].max.nbDims != 1) return 0;
    const int64_t max_seqlen = in[kMaxSeqlen].max.d[0];
    if (max_seqlen < 1 || max_seqlen > INT32_MAX) return 0;
    return max_workspace_over_rows(in[kQ].min.d[0], in[kQ].max.d[0], [&](int32_t rows, int64_t* bytes) {
        return padfree_decoder_cross_attention_workspace_size(rows, field_i32(kNumHeads), field_i32(kHeadDim),
                                                              static_cast<int32_t>(max_seqlen), bytes);
    });
}

int64_t DecoderCrossAttentionPlugin::workspace_bytes_at(const PluginTensorDesc* in, std::string& error) const {
    int32_t rows = 0, max_seqlen = 0;
    int64_t bytes = 0;
    if (!check_rank(in[kQ], 2, "q", error) || !check_rank(in[kMaxSeqlen], 1, "max_seqlen", error) ||
        !to_i32(in[kQ].dims.d[0], "rows", rows, error) || !to_i32(in[kMaxSeqlen].dims.d[0], "max_seqlen", max_seqlen, error))
        return -1;
    if (rows == 0) return 0;
    const padfree_status status = padfree_decoder_cross_attention_workspace_size(
        rows, field_i32(kNumHeads), field_i32(kHeadDim), max_seqlen, &bytes);
    return queried_bytes(status, bytes, error);
}

padfree_status DecoderCrossAttentionPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*,
                                                const void* const* inputs, void* const* outputs, void* workspace,
                                                cudaStream_t stream, std::string& error) const {
    const int32_t beams = field_i32(kNumBeams), heads = field_i32(kNumHeads), head_dim = field_i32(kHeadDim);
    const int64_t width = int64_t{heads} * head_dim;
    int32_t rows = 0, batch = 0, max_seqlen = 0;
    if (!check_rank(in[kQ], 2, "q", error) || !to_i32(in[kQ].dims.d[0], "rows", rows, error) ||
        !check_same(in[kQ].dims.d[1], width, "q width", error) || !check_vector(in[kQBias], width, "q_bias", error) ||
        !check_rank(in[kKvMem], 2, "kv_mem", error) || !check_same(in[kKvMem].dims.d[1], 2 * width, "kv_mem width", error) ||
        !check_rank(in[kCuSeqlens], 1, "cu_seqlens", error) ||
        !to_i32(in[kCuSeqlens].dims.d[0] - 1, "batch (cu_seqlens length - 1)", batch, error) ||
        !check_same(rows, int64_t{batch} * beams, "q rows (batch * num_beams)", error) ||
        !check_rank(in[kMaxSeqlen], 1, "max_seqlen", error) ||
        !to_i32(in[kMaxSeqlen].dims.d[0], "max_seqlen", max_seqlen, error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    // What getWorkspaceSize asked for covers these sizes (its rows and length are the profile's bounds).
    int64_t workspace_bytes = 0;
    if (workspace != nullptr && rows > 0) {
        const padfree_status status =
            padfree_decoder_cross_attention_workspace_size(rows, heads, head_dim, max_seqlen, &workspace_bytes);
        if (status != PADFREE_OK) return status;
    }
    return padfree_decoder_cross_attention(inputs[kQ], inputs[kQBias], inputs[kKvMem],
                                           static_cast<const int32_t*>(inputs[kCuSeqlens]), batch, beams,
                                           in[kKvMem].dims.d[0], max_seqlen, heads, head_dim, field_f32(kSoftmaxScale),
                                           workspace, workspace_bytes, to_padfree_dtype(in[kQ].type), outputs[0], stream);
}

}  // namespace trt
}  // namespace padfree
