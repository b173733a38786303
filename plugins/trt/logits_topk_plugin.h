// PadfreeLogitsTopK: the k best next tokens per hypothesis (padfree_logits_topk): log-softmax (or raw
// logits), HF's processors, beam scores, top-k. bias, beam_scores, banned_ids, penalty_ids and
// forced_ids are inputs only where their has_* field is 1, so input positions depend on the fields.
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class LogitsTopKPlugin final : public Plugin<LogitsTopKPlugin> {
public:
    enum Field {
        kK, kNormalize, kRepetitionPenalty, kHasBias, kHasBeamScores, kHasBanned, kHasPenalty, kHasForced,
        kOwnWorkspace
    };
    // Roles of the inputs in plugins.json order; their positions come from input_index().
    enum Role { kLogits, kBias, kBeamScores, kBannedIds, kPenaltyIds, kForcedIds, kNumRoles };
    enum Output { kScores, kIds };

    explicit LogitsTopKPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return 2; }
    // The C ABI's workspace query at the profile's largest rows and vocabulary.
    size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                            const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) const noexcept override;

protected:
    bool owns_workspace() const override { return field_i32(kOwnWorkspace) == 1; }
    int64_t workspace_bytes_at(const nvinfer1::PluginTensorDesc* in, std::string& error) const override;
    int32_t expected_inputs() const override;
    IoKind io_kind(int32_t pos) const override;
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;

private:
    bool present(Role role) const;
    // The input position of a role; -1 for an optional role that is absent.
    int32_t input_index(Role role) const;
};

}  // namespace trt
}  // namespace padfree
