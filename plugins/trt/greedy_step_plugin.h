// PadfreeGreedyStep: one step of greedy search's bookkeeping (padfree_greedy_step), the pad token as a
// field. The state is read-modify-write: outputs 0-2 alias inputs 2-4 (getAliasedInput), with the copy
// of a state input TensorRT did not alias, as PadfreeBeamSearchStep's; flags travel as int32.
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class GreedyStepPlugin final : public Plugin<GreedyStepPlugin> {
public:
    enum Field { kPadTokenId, kHasEos };
    enum Input { kCandIds, kStep, kSequences, kGenerated, kUnfinished, kEosIds };
    enum Output { kSequencesOut, kGeneratedOut, kUnfinishedOut, kNextTokens, kNumOutputs };
    static constexpr int32_t kStateTensors = kNextTokens;

    explicit GreedyStepPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return kNumOutputs; }
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;

protected:
    int32_t expected_inputs() const override { return field_i32(kHasEos) == 1 ? kEosIds + 1 : kEosIds; }
    IoKind io_kind(int32_t pos) const override;
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;
};

}  // namespace trt
}  // namespace padfree
