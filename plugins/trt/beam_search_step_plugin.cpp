#include "beam_search_step_plugin.h"

#include <cuda_runtime_api.h>

#include <cmath>

using namespace nvinfer1;

namespace padfree {
namespace trt {
namespace {

constexpr int32_t kMaxBeams = 16;  // padfree_beam_search_step's bound

// The workspace: the C ABI's (its 16 counter bytes end it), then 16 bytes for the stop flag, which the
// kernel sets and nothing here reads (the loop runs its fixed trip count). Counters and flag are zeroed by
// one memset per step: a workspace from TensorRT is shared with other layers, so the kernel's "left zero"
// cannot be relied on.
struct Layout {
    int64_t counters = 0;
    int64_t done = 0;   // = the C ABI's size
    int64_t bytes = 0;  // done + 16
};

padfree_status layout_at(int64_t batch, int32_t beams, int64_t max_length, Layout& out, std::string& error) {
    int32_t b = 0, m = 0;
    if (!to_i32(batch, "batch", b, error) || !to_i32(max_length, "max_length", m, error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    int64_t bytes = 0, counters = 0;
    const padfree_status status = padfree_beam_search_workspace_size(b, beams, m, 0, &bytes, &counters);
    if (status != PADFREE_OK) {
        error = padfree_last_error();
        return status;
    }
    out = {counters, bytes, bytes + 16};
    return PADFREE_OK;
}

}  // namespace

const Schema& BeamSearchStepPlugin::schema() {
    static const Schema s{"PadfreeBeamSearchStep",
                          {{"num_beams", PluginFieldType::kINT32},
                           {"length_penalty", PluginFieldType::kFLOAT32},
                           {"early_stopping", PluginFieldType::kINT32},
                           {"has_eos", PluginFieldType::kINT32},
                           {"own_workspace", PluginFieldType::kINT32, true, Scalar{0}}}};
    return s;
}

bool BeamSearchStepPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    if (values[kNumBeams].i < 1 || values[kNumBeams].i > kMaxBeams) {
        error = concat("num_beams = ", values[kNumBeams].i, ": expected 1 <= num_beams <= ", kMaxBeams);
        return false;
    }
    if (!std::isfinite(values[kLengthPenalty].f)) {
        error = concat("length_penalty = ", values[kLengthPenalty].f, ": expected a finite number");
        return false;
    }
    if (values[kEarlyStopping].i < 0 || values[kEarlyStopping].i > 2) {
        error = concat("early_stopping = ", values[kEarlyStopping].i, ": expected 0 (False), 1 (True) or 2 (never)");
        return false;
    }
    return check_flag(values[kHasEos].i, "has_eos", error) && check_flag(values[kOwnWorkspace].i, "own_workspace", error);
}

int32_t BeamSearchStepPlugin::getAliasedInput(int32_t outputIndex) noexcept {
    return outputIndex >= 0 && outputIndex < kStateTensors ? kRunning + outputIndex : -1;
}

IoKind BeamSearchStepPlugin::io_kind(int32_t pos) const {
    const int32_t inputs = expected_inputs();
    if (pos >= inputs) {  // an output
        switch (pos - inputs) {
            case kRunningOut: case kPoolOut: case kPoolLengthsOut: case kNextTokens: return IoKind::kInt64;
            case kRunningScoresOut: case kPoolScoresOut: return IoKind::kFloat32;
            default: return IoKind::kInt32;
        }
    }
    switch (pos) {
        case kRunning: case kPool: case kPoolLengths: return IoKind::kInt64;
        case kCandScores: case kRunningScores: case kPoolScores: return IoKind::kFloat32;
        default: return IoKind::kInt32;
    }
}

bool BeamSearchStepPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                         std::string& error) const {
    const DimsExprs& cand = inputs[kCandScores];
    const DimsExprs& running = inputs[kRunning];
    const IDimensionExpr* beams = builder.constant(field_i32(kNumBeams));
    if (!check_rank(cand, 2, "cand_scores", error) || !check_rank(inputs[kCandIds], 2, "cand_ids", error) ||
        !check_same(inputs[kCandIds].d[0], cand.d[0], "cand_ids rows", error) ||
        !check_same(inputs[kCandIds].d[1], cand.d[1], "cand_ids width (NK)", error) ||
        !check_vector(inputs[kStep], builder.constant(1), "step", error) || !check_rank(running, 3, "running", error) ||
        !check_same(running.d[1], beams, "running beams (num_beams)", error) ||
        !check_same(cand.d[0], builder.operation(DimensionOperation::kPROD, *running.d[0], *beams),
                    "cand_scores rows (batch * num_beams)", error) ||
        !check_rank(inputs[kPool], 3, "pool", error) ||
        !check_vector(inputs[kImprovable], running.d[0], "improvable", error))
        return false;
    for (int32_t d = 0; d < 3; ++d)
        if (!check_same(inputs[kPool].d[d], running.d[d], "pool extent (as running)", error)) return false;
    for (const auto& [input, name] : {std::pair<int32_t, const char*>{kRunningScores, "running_scores"},
                                      {kPoolScores, "pool_scores"}, {kPoolLengths, "pool_lengths"},
                                      {kPoolFinished, "pool_finished"}}) {
        if (!check_rank(inputs[input], 2, name, error) || !check_same(inputs[input].d[0], running.d[0], name, error) ||
            !check_same(inputs[input].d[1], beams, name, error))
            return false;
    }
    if (field_i32(kHasEos) == 1 && !check_rank(inputs[kEosIds], 1, "eos_ids", error)) return false;
    for (int32_t o = 0; o < kStateTensors; ++o) outputs[o] = inputs[kRunning + o];
    for (int32_t o : {kNextTokens, kParents}) {
        outputs[o].nbDims = 1;
        outputs[o].d[0] = cand.d[0];
    }
    return true;
}

size_t BeamSearchStepPlugin::getWorkspaceSize(const DynamicPluginTensorDesc* in, int32_t nbInputs,
                                              const DynamicPluginTensorDesc*, int32_t) const noexcept {
    if (owns_workspace() || nbInputs != expected_inputs() || in[kRunning].max.nbDims != 3) return 0;
    Layout layout;
    std::string error;
    // The sizes grow with batch and max_length: the profile's maxima bound every shape it admits.
    if (layout_at(in[kRunning].max.d[0], field_i32(kNumBeams), in[kRunning].max.d[2], layout, error) != PADFREE_OK)
        return 0;  // enqueue then reports the C ABI's refusal
    return static_cast<size_t>(layout.bytes);
}

int64_t BeamSearchStepPlugin::workspace_bytes_at(const PluginTensorDesc* in, std::string& error) const {
    if (!check_rank(in[kRunning], 3, "running", error)) return -1;
    Layout layout;
    if (layout_at(in[kRunning].dims.d[0], field_i32(kNumBeams), in[kRunning].dims.d[2], layout, error) != PADFREE_OK)
        return -1;
    return layout.bytes;
}

padfree_status BeamSearchStepPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc* out,
                                         const void* const* inputs, void* const* outputs, void* workspace,
                                         cudaStream_t stream, std::string& error) const {
    const int32_t beams = field_i32(kNumBeams);
    int32_t batch = 0, max_length = 0, keep = 0, num_eos = 0;
    if (!check_rank(in[kRunning], 3, "running", error) || !to_i32(in[kRunning].dims.d[0], "batch", batch, error) ||
        !check_same(in[kRunning].dims.d[1], beams, "running beams (num_beams)", error) ||
        !to_i32(in[kRunning].dims.d[2], "max_length", max_length, error) ||
        !check_rank(in[kCandScores], 2, "cand_scores", error) ||
        !check_same(in[kCandScores].dims.d[0], int64_t{batch} * beams, "cand_scores rows (batch * num_beams)", error) ||
        !to_i32(in[kCandScores].dims.d[1], "cand_scores width (NK)", keep, error) ||
        !check_rank(in[kCandIds], 2, "cand_ids", error) ||
        !check_same(in[kCandIds].dims.d[0], in[kCandScores].dims.d[0], "cand_ids rows", error) ||
        !check_same(in[kCandIds].dims.d[1], keep, "cand_ids width", error) || !check_vector(in[kStep], 1, "step", error) ||
        !check_vector(in[kImprovable], batch, "improvable", error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    for (int32_t d = 0; d < 3; ++d)
        if (!check_same(in[kPool].dims.d[d], in[kRunning].dims.d[d], "pool extent", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
    for (int32_t input : {kRunningScores, kPoolScores, kPoolLengths, kPoolFinished})
        if (!check_rank(in[input], 2, "a [batch, num_beams] state", error) ||
            !check_same(in[input].dims.d[0], batch, "state batch", error) ||
            !check_same(in[input].dims.d[1], beams, "state beams", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
    if (field_i32(kHasEos) == 1 &&
        (!check_rank(in[kEosIds], 1, "eos_ids", error) || !to_i32(in[kEosIds].dims.d[0], "eos_ids length", num_eos, error)))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    for (int32_t o = 0; o < kStateTensors; ++o)
        if (!check_rank(out[o], in[kRunning + o].dims.nbDims, "state output", error) ||
            !check_same(out[o].dims.d[0], batch, "state output batch", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
    if (batch == 0) return PADFREE_OK;
    Layout layout;
    const padfree_status sized = layout_at(batch, beams, max_length, layout, error);
    if (sized != PADFREE_OK) return sized;
    if (workspace == nullptr) {
        error = "no workspace";
        return PADFREE_ERROR_INVALID_ARGUMENT;
    }
    // The kernel updates the state in place: a state input TensorRT did not alias is copied to its output.
    const padfree_status copied = copy_unaliased_state(in, inputs, outputs, kRunning, 0, kStateTensors, stream, error);
    if (copied != PADFREE_OK) return copied;
    char* ws = static_cast<char*>(workspace);
    const cudaError_t zeroed = cudaMemsetAsync(ws + layout.counters, 0, static_cast<size_t>(layout.bytes - layout.counters), stream);
    if (zeroed != cudaSuccess) {
        error = concat("zeroing the step's counters: ", cudaGetErrorString(zeroed));
        return PADFREE_ERROR_CUDA;
    }
    // advance_step 0: the kernel only reads the step (the graph advances it), so the input is not written.
    return padfree_beam_search_step(
        static_cast<const float*>(inputs[kCandScores]), static_cast<const int32_t*>(inputs[kCandIds]), keep,
        num_eos > 0 ? static_cast<const int32_t*>(inputs[kEosIds]) : nullptr, num_eos,
        static_cast<int64_t*>(outputs[kRunningOut]), static_cast<float*>(outputs[kRunningScoresOut]),
        static_cast<int64_t*>(outputs[kPoolOut]), static_cast<float*>(outputs[kPoolScoresOut]),
        static_cast<int64_t*>(outputs[kPoolLengthsOut]), outputs[kPoolFinishedOut], outputs[kImprovableOut], 4,
        reinterpret_cast<uint8_t*>(ws + layout.done), static_cast<int64_t*>(outputs[kNextTokens]),
        static_cast<int32_t*>(outputs[kParents]), nullptr, 0,
        const_cast<int32_t*>(static_cast<const int32_t*>(inputs[kStep])), batch, beams, max_length,
        field_f32(kLengthPenalty), field_i32(kEarlyStopping), 0, ws, layout.bytes, stream);
}

}  // namespace trt
}  // namespace padfree
