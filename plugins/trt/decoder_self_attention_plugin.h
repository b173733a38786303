// PadfreeDecoderSelfAttention: one decoding step's masked self-attention over the K/V cache through
// the cache indirection (padfree_decoder_self_attention). The caches are read-modify-write: outputs 1
// and 2 (k_cache_out, v_cache_out) alias inputs 2 and 3 (getAliasedInput); the kernel always writes
// the output buffers, after copying the input cache into one that TensorRT did not alias.
#pragma once

#include "plugin_base.h"

namespace padfree {
namespace trt {

class DecoderSelfAttentionPlugin final : public Plugin<DecoderSelfAttentionPlugin> {
public:
    enum Field { kNumHeads, kHeadDim, kSoftmaxScale, kOwnWorkspace };
    enum Input { kQkv, kQkvBias, kKCache, kVCache, kCacheIndir, kStep, kNumInputs };
    enum Output { kContext, kKCacheOut, kVCacheOut, kNumOutputs };

    explicit DecoderSelfAttentionPlugin(std::vector<Scalar> values) : Plugin(schema(), std::move(values)) {}
    static const Schema& schema();
    static bool validate(const std::vector<Scalar>& values, std::string& error);
    int32_t getNbOutputs() const noexcept override { return kNumOutputs; }
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;
    // The C ABI's workspace query at the profile's largest cache length, over its row counts.
    size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                            const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) const noexcept override;

protected:
    bool owns_workspace() const override { return field_i32(kOwnWorkspace) == 1; }
    int64_t workspace_bytes_at(const nvinfer1::PluginTensorDesc* in, std::string& error) const override;
    int32_t expected_inputs() const override { return kNumInputs; }
    IoKind io_kind(int32_t pos) const override;
    bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                       nvinfer1::IExprBuilder& builder, std::string& error) const override;
    padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                       const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                       std::string& error) const override;
};

}  // namespace trt
}  // namespace padfree
