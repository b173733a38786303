#include "layernorm_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& LayerNormPlugin::schema() {
    static const Schema s{"PadfreeLayerNorm", {{"epsilon", PluginFieldType::kFLOAT32}}};
    return s;
}

bool LayerNormPlugin::validate(const std::vector<Scalar>& values, std::string& error) {
    return check_epsilon(values[kEpsilon].f, error);
}

bool LayerNormPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder&,
                                    std::string& error) const {
    const DimsExprs& x = inputs[kX];
    if (!check_rank(x, 2, "x", error) || !check_vector(inputs[kGamma], x.d[1], "gamma", error) ||
        !check_vector(inputs[kBeta], x.d[1], "beta", error))
        return false;
    outputs[0] = x;
    return true;
}

padfree_status LayerNormPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                                    void* const* outputs, void*, cudaStream_t stream, std::string& error) const {
    const Dims& x = in[kX].dims;
    int32_t hidden = 0;
    if (!check_rank(in[kX], 2, "x", error) || !to_i32(x.d[1], "hidden", hidden, error) ||
        !check_vector(in[kGamma], hidden, "gamma", error) || !check_vector(in[kBeta], hidden, "beta", error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    return padfree_layernorm(inputs[kX], inputs[kGamma], inputs[kBeta], x.d[0], hidden, field_f32(kEpsilon),
                             to_padfree_dtype(in[kX].type), outputs[0], stream);
}

}  // namespace trt
}  // namespace padfree
