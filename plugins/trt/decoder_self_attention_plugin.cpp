#include "decoder_self_attention_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& DecoderSelfAttentionPlugin::schema() {
    static const Schema s{"PadfreeDecoderSelfAttention",
                          {{"num_heads", PluginFieldType::kINT32},
                           {"head_dim", PluginFieldType::kINT32},
                           {"softmax_scale", PluginFieldType::kFLOAT32},
                           {"own_workspace", PluginFieldType::kINT32, true, Scalar{0}}}};
    return s;
}

bool DecoderSelfAttentionPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    return check_heads(values[kNumHeads].i, values[kHeadDim].i, 3, error) &&
           check_softmax_scale(values[kSoftmaxScale].f, error) && check_flag(values[kOwnWorkspace].i, "own_workspace", error);
}

int32_t DecoderSelfAttentionPlugin::getAliasedInput(int32_t outputIndex) noexcept {
    return outputIndex == kKCacheOut ? kKCache : outputIndex == kVCacheOut ? kVCache : -1;
}

IoKind DecoderSelfAttentionPlugin::io_kind(int32_t pos) const {
    return pos == kCacheIndir || pos == kStep ? IoKind::kInt32 : IoKind::kActivation;
}

bool DecoderSelfAttentionPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                               std::string& error) const {
    const int64_t width = int64_t{field_i32(kNumHeads)} * field_i32(kHeadDim);
    const DimsExprs& qkv = inputs[kQkv];
    const DimsExprs& k = inputs[kKCache];
    const DimsExprs& v = inputs[kVCache];
    const DimsExprs& indir = inputs[kCacheIndir];
    const IDimensionExpr* qkv_width = builder.constant(3 * width);
    if (!check_rank(qkv, 2, "qkv", error) || !check_same(qkv.d[1], qkv_width, "qkv width (3*num_heads*head_dim)", error) ||
        !check_vector(inputs[kQkvBias], qkv_width, "qkv_bias", error) || !check_rank(k, 4, "k_cache", error) ||
        !check_same(k.d[0], qkv.d[0], "k_cache rows", error) ||
        !check_same(k.d[1], builder.constant(field_i32(kNumHeads)), "k_cache heads (num_heads)", error) ||
        !check_same(k.d[3], builder.constant(field_i32(kHeadDim)), "k_cache head size (head_dim)", error) ||
        !check_rank(v, 4, "v_cache", error) || !check_rank(indir, 2, "cache_indir", error) ||
        !check_same(indir.d[0], qkv.d[0], "cache_indir rows", error) ||
        !check_same(indir.d[1], k.d[2], "cache_indir length (L)", error) ||
        !check_vector(inputs[kStep], builder.constant(1), "step", error))
        return false;
    for (int32_t d = 0; d < 4; ++d)
        if (!check_same(v.d[d], k.d[d], "v_cache extent (as k_cache)", error)) return false;
    outputs[kContext].nbDims = 2;
    outputs[kContext].d[0] = qkv.d[0];
    outputs[kContext].d[1] = builder.constant(width);
    outputs[kKCacheOut] = k;
    outputs[kVCacheOut] = v;
    return true;
}

size_t DecoderSelfAttentionPlugin::getWorkspaceSize(const DynamicPluginTensorDesc* in, int32_t nbInputs,
                                                    const DynamicPluginTensorDesc*, int32_t) const noexcept {
    if (owns_workspace() || nbInputs != kNumInputs || in[kQkv].max.nbDims != 2 || in[kKCache].max.nbDims != 4) return 0;
    const int64_t max_len = in[kKCache].max.d[2];
    if (max_len < 1 || max_len > INT32_MAX) return 0;
    return max_workspace_over_rows(in[kQkv].min.d[0], in[kQkv].max.d[0], [&](int32_t rows, int64_t* bytes) {
        return padfree_decoder_self_attention_workspace_size(rows, field_i32(kNumHeads), field_i32(kHeadDim),
                                                             static_cast<int32_t>(max_len), bytes);
    });
}

int64_t DecoderSelfAttentionPlugin::workspace_bytes_at(const PluginTensorDesc* in, std::string& error) const {
    int32_t rows = 0, max_len = 0;
    int64_t bytes = 0;
    if (!check_rank(in[kQkv], 2, "qkv", error) || !check_rank(in[kKCache], 4, "k_cache", error) ||
        !to_i32(in[kQkv].dims.d[0], "rows", rows, error) || !to_i32(in[kKCache].dims.d[2], "k_cache length (L)", max_len, error))
        return -1;
    if (rows == 0) return 0;
    const padfree_status status = padfree_decoder_self_attention_workspace_size(
        rows, field_i32(kNumHeads), field_i32(kHeadDim), max_len, &bytes);
    return queried_bytes(status, bytes, error);
}

padfree_status DecoderSelfAttentionPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc* out,
                                               const void* const* inputs, void* const* outputs, void* workspace,
                                               cudaStream_t stream, std::string& error) const {
    const int32_t heads = field_i32(kNumHeads), head_dim = field_i32(kHeadDim);
    const PluginTensorDesc& qkv = in[kQkv];
    const Dims& k = in[kKCache].dims;
    int32_t rows = 0, max_len = 0;
    if (!check_rank(qkv, 2, "qkv", error) || !to_i32(qkv.dims.d[0], "rows", rows, error) ||
        !check_same(qkv.dims.d[1], 3 * int64_t{heads} * head_dim, "qkv width", error) ||
        !check_vector(in[kQkvBias], 3 * int64_t{heads} * head_dim, "qkv_bias", error) ||
        !check_rank(in[kKCache], 4, "k_cache", error) || !check_same(k.d[0], rows, "k_cache rows", error) ||
        !check_same(k.d[1], heads, "k_cache heads", error) || !to_i32(k.d[2], "k_cache length (L)", max_len, error) ||
        !check_same(k.d[3], head_dim, "k_cache head size", error) || !check_rank(in[kVCache], 4, "v_cache", error) ||
        !check_rank(in[kCacheIndir], 2, "cache_indir", error) ||
        !check_same(in[kCacheIndir].dims.d[0], rows, "cache_indir rows", error) ||
        !check_same(in[kCacheIndir].dims.d[1], max_len, "cache_indir length", error) ||
        !check_vector(in[kStep], 1, "step", error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    for (int32_t d = 0; d < 4; ++d)
        if (!check_same(in[kVCache].dims.d[d], k.d[d], "v_cache extent", error)) return PADFREE_ERROR_INVALID_ARGUMENT;
    for (int32_t o : {kKCacheOut, kVCacheOut})
        if (!check_rank(out[o], 4, "cache output", error) || !check_same(out[o].dims.d[2], max_len, "cache output length", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
    // The kernel writes the outputs in place; a cache TensorRT did not alias is copied there first.
    static_assert(kVCache == kKCache + 1 && kVCacheOut == kKCacheOut + 1, "the caches pair in order");
    const padfree_status copied = copy_unaliased_state(in, inputs, outputs, kKCache, kKCacheOut, 2, stream, error);
    if (copied != PADFREE_OK) return copied;
    // What getWorkspaceSize asked for covers these sizes (its rows and length are the profile's bounds).
    int64_t workspace_bytes = 0;
    if (workspace != nullptr && rows > 0) {
        const padfree_status status =
            padfree_decoder_self_attention_workspace_size(rows, heads, head_dim, max_len, &workspace_bytes);
        if (status != PADFREE_OK) return status;
    }
    return padfree_decoder_self_attention(inputs[kQkv], inputs[kQkvBias], outputs[kKCacheOut], outputs[kVCacheOut],
                                          static_cast<const int32_t*>(inputs[kCacheIndir]),
                                          static_cast<const int32_t*>(inputs[kStep]), 0, rows, heads, head_dim, max_len,
                                          field_f32(kSoftmaxScale), workspace, workspace_bytes,
                                          to_padfree_dtype(qkv.type), outputs[kContext], stream);
}

}  // namespace trt
}  // namespace padfree
