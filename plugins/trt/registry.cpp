// How TensorRT finds padfree's creators, in two ways:
//
// 1. IPluginRegistry::loadLibrary("libpadfree_trt.so") (TensorRT and TensorRT-RTX, C++ and Python,
//    trtexec --dynamicPlugins): it dlopens the library, calls setLoggerFinder() and getCreators()
//    below and registers what they return under the library's handle.
// 2. Static registration when the library is loaded into a process where TensorRT's
//    getPluginRegistry() is globally visible (an application linked against libnvinfer, or one that
//    loaded it RTLD_GLOBAL). REGISTER_TENSORRT_PLUGIN would do this with a link-time reference to
//    getPluginRegistry(), making libnvinfer a hard dependency: a library loaded by loadLibrary from
//    the Python bindings (which load libnvinfer / libtensorrt_rtx RTLD_LOCAL) would then fail to
//    load on that unresolved symbol. So the symbol is looked up at load time instead, and when it
//    is absent static registration is simply skipped.
//
// loadLibrary refuses a library whose creators are already registered, so getCreators() first
// withdraws the static registration: whichever way the library came in, the creators end up
// registered exactly once.
#include <dlfcn.h>

#include <atomic>

#include "attention_plugin.h"
#include "beam_reorder_plugin.h"
#include "bias_gelu_plugin.h"
#include "decoder_cross_attention_plugin.h"
#include "decoder_self_attention_plugin.h"
#include "emb_layernorm_plugin.h"
#include "layernorm_plugin.h"
#include "logits_topk_plugin.h"
#include "rebuild_padding_plugin.h"
#include "remove_padding_plugin.h"
#include "skip_layernorm_plugin.h"

using namespace nvinfer1;

namespace padfree {
namespace trt {
namespace {

// Function-local statics: constructed on first use, never before the static registrar needs them.
IPluginCreatorInterface* const* all_creators(int32_t& count) {
    static Creator<EmbLayerNormPlugin> emb_layernorm;
    static Creator<AttentionPlugin> attention;
    static Creator<SkipLayerNormPlugin> skip_layernorm;
    static Creator<LayerNormPlugin> layernorm;
    static Creator<BiasGeluPlugin> bias_gelu;
    static Creator<RemovePaddingPlugin> remove_padding;
    static Creator<RebuildPaddingPlugin> rebuild_padding;
    static Creator<DecoderSelfAttentionPlugin> decoder_self_attention;
    static Creator<DecoderCrossAttentionPlugin> decoder_cross_attention;
    static Creator<LogitsTopKPlugin> logits_topk;
    static Creator<BeamReorderPlugin> beam_reorder;
    static IPluginCreatorInterface* const creators[] = {
        &emb_layernorm,  &attention,       &skip_layernorm,         &layernorm,
        &bias_gelu,      &remove_padding,  &rebuild_padding,        &decoder_self_attention,
        &decoder_cross_attention,          &logits_topk,            &beam_reorder};
    count = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}

using GetPluginRegistry = IPluginRegistry* (*)();
std::atomic<IPluginRegistry*> g_static_registry{nullptr};

struct StaticRegistrar {
    StaticRegistrar() {
        auto lookup = reinterpret_cast<GetPluginRegistry>(dlsym(RTLD_DEFAULT, "getPluginRegistry"));
        IPluginRegistry* registry = lookup ? lookup() : nullptr;
        if (registry == nullptr) return;
        int32_t count = 0;
        IPluginCreatorInterface* const* creators = all_creators(count);
        for (int32_t k = 0; k < count; ++k) registry->registerCreator(*creators[k], kPluginNamespace);
        g_static_registry.store(registry);
    }
};
const StaticRegistrar g_static_registrar;

}  // namespace
}  // namespace trt
}  // namespace padfree

extern "C" {

__attribute__((visibility("default"))) void setLoggerFinder(ILoggerFinder* finder) {
    padfree::trt::set_logger_finder(finder);
}

__attribute__((visibility("default"))) IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
    using namespace padfree::trt;
    IPluginCreatorInterface* const* creators = all_creators(nbCreators);
    if (IPluginRegistry* registry = g_static_registry.exchange(nullptr)) {
        for (int32_t k = 0; k < nbCreators; ++k) registry->deregisterCreator(*creators[k]);
    }
    return creators;
}

// For tests and tools: whether the load-time static registration found a registry (1) or not (0).
__attribute__((visibility("default"))) int padfree_trt_statically_registered(void) {
    return padfree::trt::g_static_registry.load() != nullptr ? 1 : 0;
}

}  // extern "C"
