#include "remove_padding_plugin.h"

#include <cuda_runtime_api.h>

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& RemovePaddingPlugin::schema() {
    static const Schema s{"PadfreeRemovePadding", {}};
    return s;
}

bool RemovePaddingPlugin::validate(const std::vector<Scalar>&, std::string&) { return true; }

IoKind RemovePaddingPlugin::io_kind(int32_t pos) const {
    switch (pos) {
        case kPadded: return IoKind::kAny;
        case kMask: return IoKind::kInt32;
        case kNumInputs + kPacked: return IoKind::kSameAsInput0;
        default: return IoKind::kInt32;  // cu_seqlens, total_tokens
    }
}

bool RemovePaddingPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                        std::string& error) const {
    const DimsExprs& padded = inputs[kPadded];
    const DimsExprs& mask = inputs[kMask];
    if (padded.nbDims < 2) {
        error = concat("padded: expected rank >= 2 ([B, S, ...]), got rank ", padded.nbDims);
        return false;
    }
    if (!check_rank(mask, 2, "attention_mask", error) || !check_same(mask.d[0], padded.d[0], "mask batch", error) ||
        !check_same(mask.d[1], padded.d[1], "mask length", error))
        return false;
    // Every token may be real (upper bound B*S, what TensorRT allocates); tune for half of them.
    const IDimensionExpr* upper = builder.operation(DimensionOperation::kPROD, *padded.d[0], *padded.d[1]);
    const IDimensionExpr* opt = builder.operation(DimensionOperation::kCEIL_DIV, *upper, *builder.constant(2));
    const IDimensionExpr* total = builder.declareSizeTensor(kTotalTokens, *opt, *upper);
    if (total == nullptr) {
        error = "TensorRT refused the total_tokens size tensor";
        return false;
    }
    outputs[kPacked].nbDims = padded.nbDims - 1;
    outputs[kPacked].d[0] = total;
    for (int32_t k = 2; k < padded.nbDims; ++k) outputs[kPacked].d[k - 1] = padded.d[k];
    outputs[kCuSeqlens].nbDims = 1;
    outputs[kCuSeqlens].d[0] = builder.operation(DimensionOperation::kSUM, *mask.d[0], *builder.constant(1));
    outputs[kTotalTokens].nbDims = 0;
    return true;
}

padfree_status RemovePaddingPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*,
                                        const void* const* inputs, void* const* outputs, void*, cudaStream_t stream,
                                        std::string& error) const {
    const Dims& padded = in[kPadded].dims;
    int32_t batch = 0, padded_seqlen = 0;
    int64_t bytes = 0;
    if (padded.nbDims < 2 || !check_rank(in[kMask], 2, "attention_mask", error) ||
        !to_i32(padded.d[0], "batch", batch, error) || !to_i32(padded.d[1], "padded length", padded_seqlen, error) ||
        !check_same(in[kMask].dims.d[0], batch, "mask batch", error) ||
        !check_same(in[kMask].dims.d[1], padded_seqlen, "mask length", error) || !row_bytes(in[kPadded], 2, bytes, error)) {
        if (error.empty()) error = "padded: expected rank >= 2";
        return PADFREE_ERROR_INVALID_ARGUMENT;
    }
    auto* cu_seqlens = static_cast<int32_t*>(outputs[kCuSeqlens]);
    // A mask that is not left-aligned is the caller's to refuse (the runtime checks it on the host):
    // here it is counted by no one, and a row with n ones packs its first n positions, wherever
    // its ones are (values other than 1 count as padding).
    padfree_status status = padfree_cu_seqlens_from_mask(static_cast<const int32_t*>(inputs[kMask]), batch,
                                                         padded_seqlen, cu_seqlens, nullptr, stream);
    if (status != PADFREE_OK) return status;
    // The packed output is allocated at its upper bound, B*S rows, before T is known.
    status = padfree_remove_padding(inputs[kPadded], cu_seqlens, batch, int64_t{batch} * padded_seqlen, padded_seqlen,
                                    bytes, outputs[kPacked], stream);
    if (status != PADFREE_OK) return status;
    // The size tensor is cu_seqlens[batch], read back by TensorRT to shape the packed output.
    const cudaError_t copied = cudaMemcpyAsync(outputs[kTotalTokens], cu_seqlens + batch, sizeof(int32_t),
                                               cudaMemcpyDeviceToDevice, stream);
    if (copied != cudaSuccess) {
        error = concat("copying total_tokens: ", cudaGetErrorString(copied));
        return PADFREE_ERROR_CUDA;
    }
    return PADFREE_OK;
}

}  // namespace trt
}  // namespace padfree
