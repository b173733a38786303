// PadfreeBiasGelu: y = gelu(x + bias), erf or tanh form (padfree_bias_gelu).
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class BiasGeluPlugin final : public Plugin<BiasGeluPlugin> {
public:
    enum Field { kApproximate };
    enum Input { kX, kBias, kNumInputs };

    explicit BiasGeluPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return 1; }

protected:
    int32_t expected_inputs() const override { return kNumInputs; }
    IoKind io_kind(int32_t) const override { return IoKind::kActivation; }
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;
};

}  // namespace trt
}  // namespace padfree
