#include "beam_reorder_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {

const Schema& BeamReorderPlugin::schema() {
    static const Schema s{"PadfreeBeamReorder", {}};
    return s;
}

bool BeamReorderPlugin::validate(const std::vector<Scalar>&, std::string&) { return true; }

bool BeamReorderPlugin::output_shapes(const DimsExprs* inputs, DimsExprs* outputs, IExprBuilder& builder,
                                      std::string& error) const {
    const DimsExprs& indir = inputs[kCacheIndir];
    if (!check_rank(indir, 2, "cache_indir", error) || !check_vector(inputs[kParents], indir.d[0], "parents", error) ||
        !check_vector(inputs[kStep], builder.constant(1), "step", error))
        return false;
    outputs[0] = indir;
    return true;
}

padfree_status BeamReorderPlugin::run(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                                      void* const* outputs, void*, cudaStream_t stream, std::string& error) const {
    int32_t rows = 0, max_len = 0;
    if (!check_rank(in[kCacheIndir], 2, "cache_indir", error) ||
        !to_i32(in[kCacheIndir].dims.d[0], "rows", rows, error) ||
        !to_i32(in[kCacheIndir].dims.d[1], "cache length (L)", max_len, error) ||
        !check_vector(in[kParents], rows, "parents", error) || !check_vector(in[kStep], 1, "step", error))
        return PADFREE_ERROR_INVALID_ARGUMENT;
    return padfree_beam_reorder_cache_indir(static_cast<const int32_t*>(inputs[kCacheIndir]),
                                            static_cast<const int32_t*>(inputs[kParents]),
                                            static_cast<const int32_t*>(inputs[kStep]), rows, max_len,
                                            static_cast<int32_t*>(outputs[0]), stream);
}

}  // namespace trt
}  // namespace padfree
