#include "attention_plugin.h"

#include <cmath>

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& AttentionPlugin::schema() {
    static const Schema s{"PadfreeAttention",
                          {{"num_heads", PluginFieldType::kINT32},
                           {"head_dim", PluginFieldType::kINT32},
                           {"softmax_scale", PluginFieldType::kFLOAT32}}};
    return s;
}

bool AttentionPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    const int64_t heads = values[kNumHeads].i, head_dim = values[kHeadDim].i;
    const float scale = values[kSoftmaxScale].f;
    // Divided, not multiplied: a corrupt blob's sizes near INT32_MAX would overflow even int64.
    if (heads <= 0 || head_dim <= 0 || heads > INT32_MAX / 3 / head_dim) {
        error = concat("num_heads = ", heads, ", head_dim = ", head_dim,
                       ": expected positive sizes with 3 * num_heads * head_dim <= 2^31 - 1");
        return false;
    }
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
        error = concat("softmax_scale = ", scale, ": expected a finite positive scale");
        return false;
    }
    // Unsupported head_dim values are the kernel library's to refuse (PADFREE_ERROR_UNSUPPORTED),
    // so that adding one there needs no plugin change.
    return true;
}

IoKind AttentionPlugin::io_kind(int32_t pos) const {
    switch (pos) {
        case kCuSeqlens: return IoKind::kInt32;
        case kMaxSeqlen: return IoKind::kAny;  // only its length is read
        default: return IoKind::kActivation;   // qkv, qkv_bias, context
    }
}

bool AttentionPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                    std::string& error) const {
    const int64_t width = int64_t{field_i32(kNumHeads)} * field_i32(kHeadDim);
    const DimsExprs& qkv = inputs[kQkv];
    const IDimensionExpr* qkv_width = builder.constant(3 * width);
    if (!check_rank(qkv, 2, "qkv", error) || !check_same(qkv.d[1], qkv_width, "qkv width (3*num_heads*head_dim)", error) ||
        !check_vector(inputs[kQkvBias], qkv_width, "qkv_bias", error) ||
        !check_rank(inputs[kCuSeqlens], 1, "cu_seqlens", error) || !check_rank(inputs[kMaxSeqlen], 1, "max_seqlen", error))
        return false;
    outputs[0].nbDims = 2;
    outputs[0].d[0] = qkv.d[0];
    outputs[0].d[1] = builder.constant(width);
    return true;
}

padfree_status AttentionPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                                    void* const* outputs, void*, cudaStream_t stream, std::string& error) const {
    const int32_t heads = field_i32(kNumHeads), head_dim = field_i32(kHeadDim);
    const int64_t qkv_width = 3 * int64_t{heads} * head_dim;
    int32_t batch = 0, max_seqlen = 0;
    if (!check_rank(in[kQkv], 2, "qkv", error) || !check_same(in[kQkv].dims.d[1], qkv_width, "qkv width", error) ||
        !check_vector(in[kQkvBias], qkv_width, "qkv_bias", error) || !check_rank(in[kCuSeqlens], 1, "cu_seqlens", error) ||
        !to_i32(in[kCuSeqlens].dims.d[0] - 1, "batch (cu_seqlens length - 1)", batch, error) ||
        !check_rank(in[kMaxSeqlen], 1, "max_seqlen", error) ||
        !to_i32(in[kMaxSeqlen].dims.d[0], "max_seqlen", max_seqlen, error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    return padfree_attention_varlen(inputs[kQkv], inputs[kQkvBias], static_cast<const int32_t*>(inputs[kCuSeqlens]),
                                    batch, in[kQkv].dims.d[0], max_seqlen, heads, head_dim, field_f32(kSoftmaxScale), 0,
                                    to_padfree_dtype(in[kQkv].type), outputs[0], stream);
}

}  // namespace trt
}  // namespace padfree
