#include "greedy_step_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& GreedyStepPlugin::schema() {
    static const Schema s{"PadfreeGreedyStep",
                          {{"pad_token_id", PluginFieldType::kINT32}, {"has_eos", PluginFieldType::kINT32}}};
    return s;
}

bool GreedyStepPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    return check_flag(values[kHasEos].i, "has_eos", error);  // any pad id: HF's may be any integer
}

int32_t GreedyStepPlugin::getAliasedInput(int32_t outputIndex) noexcept {
    return outputIndex >= 0 && outputIndex < kStateTensors ? kSequences + outputIndex : -1;
}

IoKind GreedyStepPlugin::io_kind(int32_t pos) const {
    const int32_t inputs = expected_inputs();
    if (pos >= inputs) {
        const int32_t o = pos - inputs;
        return o == kUnfinishedOut ? IoKind::kInt32 : IoKind::kInt64;
    }
    return pos == kSequences || pos == kGenerated ? IoKind::kInt64 : IoKind::kInt32;
}

bool GreedyStepPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                     std::string& error) const {
    const DimsExprs& sequences = inputs[kSequences];
    if (!check_rank(inputs[kCandIds], 2, "cand_ids", error) ||
        !check_same(inputs[kCandIds].d[1], builder.constant(1), "cand_ids width (the top-1)", error) ||
        !check_vector(inputs[kStep], builder.constant(1), "step", error) ||
        !check_rank(sequences, 2, "sequences", error) ||
        !check_same(sequences.d[0], inputs[kCandIds].d[0], "sequences rows", error) ||
        !check_vector(inputs[kGenerated], sequences.d[0], "generated", error) ||
        !check_vector(inputs[kUnfinished], sequences.d[0], "unfinished", error) ||
        (field_i32(kHasEos) == 1 && !check_rank(inputs[kEosIds], 1, "eos_ids", error)))
        return false;
    for (int32_t o = 0; o < kStateTensors; ++o) outputs[o] = inputs[kSequences + o];
    outputs[kNextTokens] = inputs[kGenerated];
    return true;
}

padfree_status GreedyStepPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc* out,
                                     const void* const* inputs, void* const* outputs, void*, cudaStream_t stream,
                                     std::string& error) const {
    int32_t rows = 0, max_length = 0, num_eos = 0;
    if (!check_rank(in[kSequences], 2, "sequences", error) || !to_i32(in[kSequences].dims.d[0], "rows", rows, error) ||
        !to_i32(in[kSequences].dims.d[1], "max_length", max_length, error) ||
        !check_rank(in[kCandIds], 2, "cand_ids", error) || !check_same(in[kCandIds].dims.d[0], rows, "cand_ids rows", error) ||
        !check_same(in[kCandIds].dims.d[1], 1, "cand_ids width", error) || !check_vector(in[kStep], 1, "step", error) ||
        !check_vector(in[kGenerated], rows, "generated", error) || !check_vector(in[kUnfinished], rows, "unfinished", error) ||
        (field_i32(kHasEos) == 1 &&
         (!check_rank(in[kEosIds], 1, "eos_ids", error) || !to_i32(in[kEosIds].dims.d[0], "eos_ids length", num_eos, error))))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    for (int32_t o = 0; o < kStateTensors; ++o)
        if (!check_rank(out[o], in[kSequences + o].dims.nbDims, "state output", error) ||
            !check_same(out[o].dims.d[0], rows, "state output rows", error))
            return PADFREE_ERROR_INVALID_ARGUMENT;
    if (rows == 0) return PADFREE_OK;
    // The kernel updates the state in place: a state input TensorRT did not alias is copied to its output.
    const padfree_status copied = copy_unaliased_state(in, inputs, outputs, kSequences, 0, kStateTensors, stream, error);
    if (copied != PADFREE_OK) return copied;
    // advance_step 0: the kernel only reads the step (the graph advances it); no stop flag (done NULL):
    // the loop runs its fixed trip count.
    return padfree_greedy_step(static_cast<const int32_t*>(inputs[kCandIds]),
                               num_eos > 0 ? static_cast<const int32_t*>(inputs[kEosIds]) : nullptr, num_eos,
                               static_cast<int64_t*>(outputs[kSequencesOut]), static_cast<int64_t*>(outputs[kNextTokens]),
                               static_cast<int64_t*>(outputs[kGeneratedOut]), outputs[kUnfinishedOut], 4, nullptr,
                               const_cast<int32_t*>(static_cast<const int32_t*>(inputs[kStep])), rows, max_length,
                               field_i32(kPadTokenId), 0, stream);
}

}  // namespace trt
}  // namespace padfree
