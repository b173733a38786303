#include "rebuild_padding_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& RebuildPaddingPlugin::schema() {
    static const Schema s{"PadfreeRebuildPadding", {}};
    return s;
}

bool RebuildPaddingPlugin::validate(const std::vector<Scalar>&, std::string&) { return true; }

IoKind RebuildPaddingPlugin::io_kind(int32_t pos) const {
    switch (pos) {
        case kPacked: return IoKind::kAny;
        case kNumInputs: return IoKind::kSameAsInput0;  // padded
        default: return IoKind::kInt32;                 // cu_seqlens, attention_mask
    }
}

bool RebuildPaddingPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                         std::string& error) const {
    const DimsExprs& packed = inputs[kPacked];
    const DimsExprs& mask = inputs[kMask];
    if (packed.nbDims < 1 || packed.nbDims + 1 > Dims::MAX_DIMS) {
        error = concat("packed: expected rank 1 to ", Dims::MAX_DIMS - 1, ", got rank ", packed.nbDims);
        return false;
    }
    if (!check_rank(mask, 2, "attention_mask", error) ||
        !check_vector(inputs[kCuSeqlens], builder.operation(DimensionOperation::kSUM, *mask.d[0], *builder.constant(1)),
                      "cu_seqlens (batch + 1)", error))
        return false;
    outputs[0].nbDims = packed.nbDims + 1;
    outputs[0].d[0] = mask.d[0];
    outputs[0].d[1] = mask.d[1];
    for (int32_t k = 1; k < packed.nbDims; ++k) outputs[0].d[k + 1] = packed.d[k];
    return true;
}

padfree_status RebuildPaddingPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*,
                                         const void* const* inputs, void* const* outputs, void*, cudaStream_t stream,
                                         std::string& error) const {
    int32_t batch = 0, padded_seqlen = 0;
    int64_t bytes = 0;
    if (in[kPacked].dims.nbDims < 1 || !check_rank(in[kMask], 2, "attention_mask", error) ||
        !to_i32(in[kMask].dims.d[0], "batch", batch, error) ||
        !to_i32(in[kMask].dims.d[1], "padded length", padded_seqlen, error) ||
        !check_vector(in[kCuSeqlens], int64_t{batch} + 1, "cu_seqlens (batch + 1)", error) ||
        !row_bytes(in[kPacked], 1, bytes, error)) {
        if (error.empty()) error = "packed: expected rank >= 1";
        return PADFREE_ERROR_INVALID_ARGUMENT;
    }
    return padfree_rebuild_padding(inputs[kPacked], static_cast<const int32_t*>(inputs[kCuSeqlens]), batch,
                                   in[kPacked].dims.d[0], padded_seqlen, bytes, outputs[0], stream);
}

}  // namespace trt
}  // namespace padfree
