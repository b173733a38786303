#include "emb_layernorm_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& EmbLayerNormPlugin::schema() {
    static const Schema s{"PadfreeEmbLayerNorm",
                          {{"epsilon", PluginFieldType::kFLOAT32},
                           {"position_offset", PluginFieldType::kINT32},
                           {"has_token_type", PluginFieldType::kINT32},
                           // added after the first engines: their states read as 1, a LayerNorm
                           {"has_layernorm", PluginFieldType::kINT32, true, Scalar{1}}}};
    return s;
}

bool EmbLayerNormPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    if (!check_epsilon(values[kEpsilon].f, error)) return false;
    if (values[kPositionOffset].i < 0) {
        error = concat("position_offset = ", values[kPositionOffset].i, ": expected >= 0");
        return false;
    }
    for (Field flag : {kHasTokenType, kHasLayerNorm})
        if (values[flag].i != 0 && values[flag].i != 1) {
            error = concat(schema().fields[flag].name, " = ", values[flag].i, ": expected 0 or 1");
            return false;
        }
    return true;
}

// plugins.json order: input_ids, [token_type_ids], cu_seqlens, word, position, [type], [gamma, beta].
// The optional ones are trailing within their group, so the table with both present, minus the
// positions of absent roles before each, gives every layout.
int32_t EmbLayerNormPlugin::input_index(Role role) const {
    if ((role == kTokenTypeIds || role == kTypeEmb) && !has_token_type()) return -1;
    if ((role == kGamma || role == kBeta) && !has_layernorm()) return -1;
    static constexpr int32_t with_all[] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t index = with_all[role];
    if (!has_token_type()) index -= role > kTypeEmb ? 2 : (role > kTokenTypeIds ? 1 : 0);
    return index;
}

int32_t EmbLayerNormPlugin::expected_inputs() const {
    return 4 + (has_token_type() ? 2 : 0) + (has_layernorm() ? 2 : 0);
}

IoKind EmbLayerNormPlugin::io_kind(int32_t pos) const {
    const bool ids = pos == input_index(kInputIds) || pos == input_index(kCuSeqlens) ||
                     (has_token_type() && pos == input_index(kTokenTypeIds));
    return ids ? IoKind::kInt32 : IoKind::kActivation;
}

bool EmbLayerNormPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder&,
                                       std::string& error) const {
    const DimsExprs& ids = inputs[input_index(kInputIds)];
    const DimsExprs& word = inputs[input_index(kWordEmb)];
    const DimsExprs& position = inputs[input_index(kPositionEmb)];
    const IDimensionExpr* hidden = word.d[1];
    if (!check_rank(ids, 1, "input_ids", error) || !check_rank(inputs[input_index(kCuSeqlens)], 1, "cu_seqlens", error) ||
        !check_rank(word, 2, "word_embeddings", error) || !check_rank(position, 2, "position_embeddings", error) ||
        !check_same(position.d[1], hidden, "position_embeddings width", error))
        return false;
    if (has_layernorm() && (!check_vector(inputs[input_index(kGamma)], hidden, "gamma", error) ||
                            !check_vector(inputs[input_index(kBeta)], hidden, "beta", error)))
        return false;
    if (has_token_type()) {
        const DimsExprs& types = inputs[input_index(kTypeEmb)];
        if (!check_rank(inputs[input_index(kTokenTypeIds)], 1, "token_type_ids", error) ||
            !check_rank(types, 2, "token_type_embeddings", error) ||
            !check_same(types.d[1], hidden, "token_type_embeddings width", error))
            return false;
    }
    outputs[0].nbDims = 2;
    outputs[0].d[0] = ids.d[0];
    outputs[0].d[1] = hidden;
    return true;
}

padfree_status EmbLayerNormPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*,
                                       const void* const* inputs, void* const* outputs, void*, cudaStream_t stream,
                                       std::string& error) const {
    const PluginTensorDesc& ids = in[input_index(kInputIds)];
    const PluginTensorDesc& word = in[input_index(kWordEmb)];
    const PluginTensorDesc& position = in[input_index(kPositionEmb)];
    int32_t batch = 0, vocab = 0, hidden = 0, positions = 0, types = 0;
    if (!check_rank(ids, 1, "input_ids", error) || !check_rank(in[input_index(kCuSeqlens)], 1, "cu_seqlens", error) ||
        !to_i32(in[input_index(kCuSeqlens)].dims.d[0] - 1, "batch (cu_seqlens length - 1)", batch, error) ||
        !check_rank(word, 2, "word_embeddings", error) || !to_i32(word.dims.d[0], "vocab_size", vocab, error) ||
        !to_i32(word.dims.d[1], "hidden", hidden, error) || !check_rank(position, 2, "position_embeddings", error) ||
        !to_i32(position.dims.d[0], "max_positions", positions, error) ||
        !check_same(position.dims.d[1], hidden, "position_embeddings width", error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    const void* gamma = nullptr;  // NULL and NULL: no LayerNorm (the C ABI's rule)
    const void* beta = nullptr;
    if (has_layernorm()) {
        if (!check_vector(in[input_index(kGamma)], hidden, "gamma", error) ||
            !check_vector(in[input_index(kBeta)], hidden, "beta", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
        gamma = inputs[input_index(kGamma)];
        beta = inputs[input_index(kBeta)];
    }
    const void* type_ids = nullptr;
    const void* type_emb = nullptr;
    if (has_token_type()) {
        const PluginTensorDesc& type_desc = in[input_index(kTypeEmb)];
        if (!check_vector(in[input_index(kTokenTypeIds)], ids.dims.d[0], "token_type_ids", error) ||
            !check_rank(type_desc, 2, "token_type_embeddings", error) ||
            !to_i32(type_desc.dims.d[0], "type_vocab_size", types, error) ||
            !check_same(type_desc.dims.d[1], hidden, "token_type_embeddings width", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
        type_ids = inputs[input_index(kTokenTypeIds)];
        type_emb = inputs[input_index(kTypeEmb)];
    }
    return padfree_embedding_layernorm(
        static_cast<const int32_t*>(inputs[input_index(kInputIds)]), static_cast<const int32_t*>(type_ids),
        static_cast<const int32_t*>(inputs[input_index(kCuSeqlens)]), batch, ids.dims.d[0], inputs[input_index(kWordEmb)],
        vocab, inputs[input_index(kPositionEmb)], positions, field_i32(kPositionOffset), type_emb, types,
        gamma, beta, hidden, field_f32(kEpsilon), nullptr, 0,
        to_padfree_dtype(word.type), outputs[0], stream);
}

}  // namespace trt
}  // namespace padfree
