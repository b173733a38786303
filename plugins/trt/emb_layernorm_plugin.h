// PadfreeEmbLayerNorm: word + position (+ token type) embeddings of packed tokens, then
// LayerNorm (padfree_embedding_layernorm). token_type_ids and token_type_embeddings are inputs only
// when has_token_type == 1, gamma and beta only when has_layernorm == 1 (0: the sum itself, Marian's
// and M2M100's embedding), so input positions depend on those fields.
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class EmbLayerNormPlugin final : public Plugin<EmbLayerNormPlugin> {
public:
    enum Field { kEpsilon, kPositionOffset, kHasTokenType, kHasLayerNorm };
    // Roles of the inputs; their positions come from input_index().
    enum Role { kInputIds, kTokenTypeIds, kCuSeqlens, kWordEmb, kPositionEmb, kTypeEmb, kGamma, kBeta };

    explicit EmbLayerNormPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return 1; }

protected:
    int32_t expected_inputs() const override;
    IoKind io_kind(int32_t pos) const override;
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;

private:
    bool has_token_type() const { return field_i32(kHasTokenType) == 1; }
    bool has_layernorm() const { return field_i32(kHasLayerNorm) == 1; }
    // The input position of a role; -1 for the roles its fields leave out.
    int32_t input_index(Role role) const;
};

}  // namespace trt
}  // namespace padfree
