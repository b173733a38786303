// How TensorRT finds padfree's creators, in two ways:
//
// 1. IPluginRegistry::loadLibrary("libpadfree_trt.so") (TensorRT and TensorRT-RTX, C++ and Python,
//    trtexec --dynamicPlugins): it dlopens the library, calls setLoggerFinder() and getCreators()
//    below and registers what they return under the library's handle.
// 2. Static registration when the library is loaded into a process that already holds a TensorRT
//    runtime: the library registers its creators in that runtime's getPluginRegistry(). This is how
//    Triton's TensorRT backend (--backend-config=tensorrt,plugins=libpadfree_trt.so) and a plain
//    dlopen / ctypes load bring plugins in. REGISTER_TENSORRT_PLUGIN would do it through a link-time
//    reference to getPluginRegistry(), making one runtime (libnvinfer) a hard dependency, and one build
//    of this library serves TensorRT and TensorRT-RTX alike; so the registry is looked up at load time:
//    first in the global scope (an application linked against the runtime, or one that loaded it
//    RTLD_GLOBAL), then in the runtime libraries already loaded RTLD_LOCAL (Triton loads its backends,
//    and the Python bindings their runtime, RTLD_LOCAL: a global lookup alone finds nothing there
//    and would register nothing, silently). With no runtime loaded yet (LD_PRELOAD of this library
//    alone) there is nothing to register into: preload the runtime after it
//    (LD_PRELOAD="libpadfree_trt.so libnvinfer.so.10": the dynamic loader initializes preloads last
//    to first, so the runtime is ready when this library looks), or use way 1.
//
// loadLibrary refuses a library whose creators are already registered, so getCreators() first
// withdraws the static registration: whichever way the library came in, the creators end up
// registered exactly once.
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "attention_plugin.h"
#include "beam_reorder_plugin.h"
#include "beam_search_step_plugin.h"
#include "bias_gelu_plugin.h"
#include "decoder_cross_attention_plugin.h"
#include "decoder_self_attention_plugin.h"
#include "emb_layernorm_plugin.h"
#include "greedy_step_plugin.h"
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
    static Creator<BeamSearchStepPlugin> beam_search_step;
    static Creator<GreedyStepPlugin> greedy_step;
    static IPluginCreatorInterface* const creators[] = {
        &emb_layernorm,  &attention,       &skip_layernorm,         &layernorm,
        &bias_gelu,      &remove_padding,  &rebuild_padding,        &decoder_self_attention,
        &decoder_cross_attention,          &logits_topk,            &beam_reorder,
        &beam_search_step,       &greedy_step};
    count = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}

using GetPluginRegistry = IPluginRegistry* (*)();
std::atomic<IPluginRegistry*> g_static_registry{nullptr};

// The TensorRT runtimes whose getPluginRegistry() this library registers into, by file name prefix.
constexpr const char* kRuntimePrefixes[] = {"libnvinfer.so", "libtensorrt_rtx.so"};

bool is_runtime(const char* path) {
    const char* slash = std::strrchr(path, '/');
    const char* name = slash ? slash + 1 : path;
    for (const char* prefix : kRuntimePrefixes) {
        if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
    }
    return false;
}

// dl_iterate_phdr callback: the first loaded runtime library that defines getPluginRegistry, whatever
// scope it was loaded into (RTLD_NOLOAD only takes a reference to an object already in the process).
int find_loaded_runtime(dl_phdr_info* info, size_t, void* out) {
    if (info->dlpi_name == nullptr || !is_runtime(info->dlpi_name)) return 0;
    void* handle = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) return 0;
    auto lookup = reinterpret_cast<GetPluginRegistry>(dlsym(handle, "getPluginRegistry"));
    dlclose(handle);  // the runtime stays loaded: it was loaded before this lookup, by someone else
    if (lookup == nullptr) return 0;
    *static_cast<GetPluginRegistry*>(out) = lookup;
    return 1;
}

IPluginRegistry* runtime_registry() {
    auto lookup = reinterpret_cast<GetPluginRegistry>(dlsym(RTLD_DEFAULT, "getPluginRegistry"));
    if (lookup == nullptr) dl_iterate_phdr(find_loaded_runtime, &lookup);
    return lookup ? lookup() : nullptr;
}

struct StaticRegistrar {
    StaticRegistrar() {
        IPluginRegistry* registry = runtime_registry();
        if (registry == nullptr) {
            // Said once, on stderr (no TensorRT logger exists yet): a preload without its runtime would
            // otherwise fail later, at the engine's deserialization, far from the cause.
            std::fprintf(stderr,
                         "libpadfree_trt.so: no TensorRT runtime (libnvinfer / libtensorrt_rtx) is loaded, so its"
                         " plugin creators were not registered; load the runtime with it"
                         " (LD_PRELOAD=\"libpadfree_trt.so libnvinfer.so.10\") or load this library through"
                         " IPluginRegistry::loadLibrary\n");
            return;
        }
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
