#include "logits_topk_plugin.h"

#include <cmath>

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& LogitsTopKPlugin::schema() {
    static const Schema s{"PadfreeLogitsTopK",
                          {{"k", PluginFieldType::kINT32},
                           {"normalize", PluginFieldType::kINT32},
                           {"repetition_penalty", PluginFieldType::kFLOAT32},
                           {"has_bias", PluginFieldType::kINT32},
                           {"has_beam_scores", PluginFieldType::kINT32},
                           {"has_banned", PluginFieldType::kINT32},
                           {"has_penalty", PluginFieldType::kINT32},
                           {"has_forced", PluginFieldType::kINT32},
                           {"own_workspace", PluginFieldType::kINT32, true, Scalar{0}}}};
    return s;
}

bool LogitsTopKPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    // k's upper bound (min(64, V)) is the kernel library's to refuse, V being known at run time only.
    if (values[kK].i < 1) {
        error = concat("k = ", values[kK].i, ": expected k >= 1");
        return false;
    }
    const float penalty = values[kRepetitionPenalty].f;
    if (!(penalty > 0.0f) || !std::isfinite(penalty)) {
        error = concat("repetition_penalty = ", penalty, ": expected a finite positive penalty");
        return false;
    }
    return check_flag(values[kNormalize].i, "normalize", error) && check_flag(values[kHasBias].i, "has_bias", error) &&
           check_flag(values[kHasBeamScores].i, "has_beam_scores", error) &&
           check_flag(values[kHasBanned].i, "has_banned", error) &&
           check_flag(values[kHasPenalty].i, "has_penalty", error) &&
           check_flag(values[kHasForced].i, "has_forced", error) &&
           check_flag(values[kOwnWorkspace].i, "own_workspace", error);
}

bool LogitsTopKPlugin::present(Role role) const {
    switch (role) {
        case kBias: return field_i32(kHasBias) == 1;
        case kBeamScores: return field_i32(kHasBeamScores) == 1;
        case kBannedIds: return field_i32(kHasBanned) == 1;
        case kPenaltyIds: return field_i32(kHasPenalty) == 1;
        case kForcedIds: return field_i32(kHasForced) == 1;
        default: return true;
    }
}

int32_t LogitsTopKPlugin::input_index(Role role) const {
    if (!present(role)) return -1;
    int32_t index = 0;
    for (int32_t r = 0; r < role; ++r) index += present(static_cast<Role>(r)) ? 1 : 0;
    return index;
}

int32_t LogitsTopKPlugin::expected_inputs() const {
    int32_t count = 0;
    for (int32_t r = 0; r < kNumRoles; ++r) count += present(static_cast<Role>(r)) ? 1 : 0;
    return count;
}

IoKind LogitsTopKPlugin::io_kind(int32_t pos) const {
    if (pos == input_index(kLogits) || pos == input_index(kBias)) return IoKind::kActivation;
    if (pos == input_index(kBeamScores) || pos == expected_inputs() + kScores) return IoKind::kFloat32;
    return IoKind::kInt32;  // banned, penalty and forced ids; the ids output
}

bool LogitsTopKPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                     std::string& error) const {
    const DimsExprs& logits = inputs[input_index(kLogits)];
    if (!check_rank(logits, 2, "logits", error)) return false;
    const IDimensionExpr* rows = logits.d[0];
    if (present(kBias) && !check_vector(inputs[input_index(kBias)], logits.d[1], "bias (vocabulary)", error)) return false;
    if (present(kBeamScores) && !check_vector(inputs[input_index(kBeamScores)], rows, "beam_scores", error)) return false;
    if (present(kForcedIds) && !check_vector(inputs[input_index(kForcedIds)], rows, "forced_ids", error)) return false;
    for (Role role : {kBannedIds, kPenaltyIds}) {
        if (!present(role)) continue;
        const char* name = role == kBannedIds ? "banned_ids" : "penalty_ids";
        const DimsExprs& ids = inputs[input_index(role)];
        if (!check_rank(ids, 2, name, error) || !check_same(ids.d[0], rows, name, error)) return false;
    }
    for (int32_t o : {kScores, kIds}) {
        outputs[o].nbDims = 2;
        outputs[o].d[0] = rows;
        outputs[o].d[1] = builder.constant(field_i32(kK));
    }
    return true;
}

size_t LogitsTopKPlugin::getWorkspaceSize(const DynamicPluginTensorDesc* in, int32_t nbInputs,
                                          const DynamicPluginTensorDesc*, int32_t) const noexcept {
    if (owns_workspace() || nbInputs != expected_inputs()) return 0;
    const DynamicPluginTensorDesc& logits = in[input_index(kLogits)];
    if (logits.max.nbDims != 2) return 0;
    const int64_t rows = logits.max.d[0], vocab = logits.max.d[1];
    int64_t bytes = 0;
    if (rows > INT32_MAX || vocab > INT32_MAX ||
        padfree_logits_topk_workspace_size(static_cast<int32_t>(rows), static_cast<int32_t>(vocab), field_i32(kK),
                                           &bytes) != PADFREE_OK)
        return 0;  // enqueue reports the C ABI's refusal
    return static_cast<size_t>(bytes);
}

int64_t LogitsTopKPlugin::workspace_bytes_at(const PluginTensorDesc* in, std::string& error) const {
    const PluginTensorDesc& logits = in[input_index(kLogits)];
    int32_t rows = 0, vocab = 0;
    int64_t bytes = 0;
    if (!check_rank(logits, 2, "logits", error) || !to_i32(logits.dims.d[0], "rows", rows, error) ||
        !to_i32(logits.dims.d[1], "vocabulary", vocab, error))
        return -1;
    if (rows == 0) return 0;
    // the query first: the order in which a call's arguments are evaluated is unspecified
    const padfree_status status = padfree_logits_topk_workspace_size(rows, vocab, field_i32(kK), &bytes);
    return queried_bytes(status, bytes, error);
}

padfree_status LogitsTopKPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                                     void* const* outputs, void* workspace, cudaStream_t stream,
                                     std::string& error) const {
    const PluginTensorDesc& logits = in[input_index(kLogits)];
    const int32_t k = field_i32(kK);
    int32_t rows = 0, vocab = 0, num_banned = 0, num_penalty = 0;
    if (!check_rank(logits, 2, "logits", error) || !to_i32(logits.dims.d[0], "rows", rows, error) ||
        !to_i32(logits.dims.d[1], "vocabulary", vocab, error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    if ((present(kBias) && !check_vector(in[input_index(kBias)], vocab, "bias (vocabulary)", error)) ||
        (present(kBeamScores) && !check_vector(in[input_index(kBeamScores)], rows, "beam_scores", error)) ||
        (present(kForcedIds) && !check_vector(in[input_index(kForcedIds)], rows, "forced_ids", error)))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    for (Role role : {kBannedIds, kPenaltyIds}) {
        if (!present(role)) continue;
        const char* name = role == kBannedIds ? "banned_ids" : "penalty_ids";
        const PluginTensorDesc& ids = in[input_index(role)];
        if (!check_rank(ids, 2, name, error) || !check_same(ids.dims.d[0], rows, name, error) ||
            !to_i32(ids.dims.d[1], name, role == kBannedIds ? num_banned : num_penalty, error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
    }
    // getWorkspaceSize asked for the profile's largest rows and vocabulary; the query is monotonic in
    // both and needs no device, so this size is within what TensorRT allocated.
    int64_t workspace_bytes = 0;
    if (rows > 0) {
        const padfree_status status = padfree_logits_topk_workspace_size(rows, vocab, k, &workspace_bytes);
        if (status != PADFREE_OK) return status;
    }
    const auto optional = [&](Role role) { return present(role) ? inputs[input_index(role)] : nullptr; };
    return padfree_logits_topk(inputs[input_index(kLogits)], optional(kBias), static_cast<const float*>(optional(kBeamScores)),
                               static_cast<const int32_t*>(optional(kPenaltyIds)), num_penalty,
                               field_f32(kRepetitionPenalty), static_cast<const int32_t*>(optional(kBannedIds)),
                               num_banned, static_cast<const int32_t*>(optional(kForcedIds)), nullptr, 0, rows,
                               vocab, k, field_i32(kNormalize), workspace, workspace_bytes,
                               to_padfree_dtype(logits.type), static_cast<float*>(outputs[kScores]),
                               static_cast<int32_t*>(outputs[kIds]), stream);
}

}  // namespace trt
}  // namespace padfree
