#include "bias_gelu_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& BiasGeluPlugin::schema() {
    static const Schema s{"PadfreeBiasGelu", {{"approximate", PluginFieldType::kINT32}}};
    return s;
}

bool BiasGeluPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    const int32_t approximate = values[kApproximate].i;
    if (approximate == PADFREE_GELU_ERF || approximate == PADFREE_GELU_TANH) return true;
    error = concat("approximate = ", approximate, ": expected 0 (erf) or 1 (tanh)");
    return false;
}

bool BiasGeluPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder&,
                                   std::string& error) const {
    const DimsExprs& x = inputs[kX];
    if (!check_rank(x, 2, "x", error) || !check_vector(inputs[kBias], x.d[1], "bias", error)) return false;
    outputs[0] = x;
    return true;
}

padfree_status BiasGeluPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                                   void* const* outputs, void*, cudaStream_t stream, std::string& error) const {
    const Dims& x = in[kX].dims;
    int32_t cols = 0;
    if (!check_rank(in[kX], 2, "x", error) || !to_i32(x.d[1], "columns", cols, error) ||
        !check_vector(in[kBias], cols, "bias", error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    return padfree_bias_gelu(inputs[kX], inputs[kBias], x.d[0], cols, field_i32(kApproximate),
                             to_padfree_dtype(in[kX].type), outputs[0], stream);
}

}  // namespace trt
}  // namespace padfree
