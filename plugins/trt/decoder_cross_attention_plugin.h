// PadfreeDecoderCrossAttention: one decoding step's cross-attention over the packed encoder rows of
// each hypothesis' source (padfree_decoder_cross_attention); q [R = B * num_beams, num_heads * head_dim].
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class DecoderCrossAttentionPlugin final : public Plugin<DecoderCrossAttentionPlugin> {
public:
    enum Field { kNumBeams, kNumHeads, kHeadDim, kSoftmaxScale, kOwnWorkspace };
    enum Input { kQ, kQBias, kKvMem, kCuSeqlens, kMaxSeqlen, kNumInputs };

    explicit DecoderCrossAttentionPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return 1; }
    // The C ABI's workspace query at the profile's longest source, over its row counts.
    size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                            const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) const noexcept override;

protected:
    bool owns_workspace() const override { return field_i32(kOwnWorkspace) == 1; }
    int64_t workspace_bytes_at(const nvinfer1::PluginTensorDesc* in, std::string& error) const override;
    int32_t expected_inputs() const override { return kNumInputs; }
    IoKind io_kind(int32_t pos) const override;
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;
};

}  // namespace trt
}  // namespace padfree
