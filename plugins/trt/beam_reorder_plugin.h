// PadfreeBeamReorder: the cache indirection after a beam step (padfree_beam_reorder_cache_indir).
// The kernel does not work in place, so the output is a tensor of its own (no aliasing).
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class BeamReorderPlugin final : public Plugin<BeamReorderPlugin> {
public:
    enum Input { kCacheIndir, kParents, kStep, kNumInputs };

    explicit BeamReorderPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return 1; }

protected:
    int32_t expected_inputs() const override { return kNumInputs; }
    IoKind io_kind(int32_t) const override { return IoKind::kInt32; }
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;
};

}  // namespace trt
}  // namespace padfree
