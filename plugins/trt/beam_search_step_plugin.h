// PadfreeBeamSearchStep: one step of HF's beam search for every source (padfree_beam_search_step), the
// search's options as fields. The state is read-modify-write: outputs 0-6 alias inputs 3-9
// (getAliasedInput); the kernel updates the output buffers, after a state input TensorRT did not alias
// is copied there. Flags travel as int32 (TensorRT plugins carry no bool or uint8 tensors), sequences and
// tokens as int64 (HF's dtype, the kernel's).
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class BeamSearchStepPlugin final : public Plugin<BeamSearchStepPlugin> {
public:
    enum Field { kNumBeams, kLengthPenalty, kEarlyStopping, kHasEos, kOwnWorkspace };
    enum Input {
        kCandScores, kCandIds, kStep, kRunning, kRunningScores, kPool, kPoolScores, kPoolLengths, kPoolFinished,
        kImprovable, kEosIds
    };
    // The state outputs come in the state inputs' order (kRunning + output).
    enum Output {
        kRunningOut, kRunningScoresOut, kPoolOut, kPoolScoresOut, kPoolLengthsOut, kPoolFinishedOut, kImprovableOut,
        kNextTokens, kParents, kNumOutputs
    };
    static constexpr int32_t kStateTensors = kNextTokens;

    explicit BeamSearchStepPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return kNumOutputs; }
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;
    // The C ABI's workspace query at the profile's largest batch and max_length, plus the stop flag.
    size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                            const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) const noexcept override;

protected:
    bool owns_workspace() const override { return field_i32(kOwnWorkspace) == 1; }
    int64_t workspace_bytes_at(const nvinfer1::PluginTensorDesc* in, std::string& error) const override;
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
