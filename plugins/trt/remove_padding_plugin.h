// PadfreeRemovePadding: padded rows [B, S, ...] -> packed rows [T, ...] and cu_seqlens from the
// attention mask (padfree_cu_seqlens_from_mask + padfree_remove_padding). T is data-dependent: a
// third output, the 0-D int32 size tensor total_tokens, tells TensorRT its value (IPluginV3's
// IExprBuilder::declareSizeTensor), and B * S bounds it for memory.
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class RemovePaddingPlugin final : public Plugin<RemovePaddingPlugin> {
public:
    enum Input { kPadded, kMask, kNumInputs };
    enum Output { kPacked, kCuSeqlens, kTotalTokens, kNumOutputs };

    explicit RemovePaddingPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return kNumOutputs; }

protected:
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
