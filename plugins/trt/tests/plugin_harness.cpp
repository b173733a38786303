// Calls every padfree plugin's IPluginV3 methods directly, as TensorRT would while building and
// running an engine: creators and fields, output types and shapes, format combinations,
// serialization round trips, refusal of corrupt bytes, error reporting, and (gpu_checks.cpp) enqueue
// against the C ABI. Prints PASS/FAIL/SKIP lines; exits non-zero on any failure.
//   padfree_trt_harness           run every test
//   padfree_trt_harness --list    print the creators (name version namespace fields), for the spec check
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>

#include "expr_double.h"
#include "harness.h"
#include "padfree.h"

using namespace nvinfer1;

namespace padfree {
namespace harness {

std::vector<Test>& tests() {
    static std::vector<Test> all;
    return all;
}

FieldValue int_field(const std::string& name, int32_t value) {
    FieldValue v{name, PluginFieldType::kINT32, {}};
    v.i = value;
    return v;
}

FieldValue float_field(const std::string& name, float value) {
    FieldValue v{name, PluginFieldType::kFLOAT32, {}};
    v.f = value;
    return v;
}

const std::vector<Case>& cases() {
    // T = 37 packed tokens, B = 3 sequences (cu_seqlens of 4), S = 20, H = 64: T, B and S are runtime
    // dimensions, weights are constants, as in an exported encoder.
    const std::vector<bool> dyn1{true}, dyn2{true, false}, const1{false}, const2{false, false};
    static const std::vector<Case> all = {
        {"emb_layernorm_with_type", "PadfreeEmbLayerNorm",
         {float_field("epsilon", 1e-12f), int_field("position_offset", 0), int_field("has_token_type", 1),
          int_field("has_layernorm", 1)},
         "iiifffff" "f", 8,
         {{37}, {37}, {4}, {100, 64}, {64, 64}, {2, 64}, {64}, {64}},
         {dyn1, dyn1, dyn1, const2, const2, const2, const1, const1},
         {{37, 64}},
         {{4, 1, 65}, {5, 1, 63}, {6, 0, 65}, {7, 0, 63}},
         {float_field("epsilon", INFINITY), int_field("position_offset", -1), int_field("has_token_type", 2),
          int_field("has_layernorm", 2)}},
        {"emb_layernorm_without_type", "PadfreeEmbLayerNorm",
         {float_field("epsilon", 1e-5f), int_field("position_offset", 2), int_field("has_token_type", 0),
          int_field("has_layernorm", 1)},
         "iiffff" "f", 6,
         {{37}, {4}, {100, 64}, {66, 64}, {64}, {64}},
         {dyn1, dyn1, const2, const2, const1, const1},
         {{37, 64}},
         {{3, 1, 32}, {4, 0, 32}},
         {float_field("epsilon", NAN)}},
        // Marian / M2M100: the sum without a LayerNorm (no gamma, beta inputs)
        {"emb_without_layernorm", "PadfreeEmbLayerNorm",
         {float_field("epsilon", 1e-5f), int_field("position_offset", 2), int_field("has_token_type", 0),
          int_field("has_layernorm", 0)},
         "iiff" "f", 4,
         {{37}, {4}, {100, 64}, {66, 64}},
         {dyn1, dyn1, const2, const2},
         {{37, 64}},
         {{3, 1, 32}},
         {int_field("has_layernorm", -1)}},
        {"emb_with_type_without_layernorm", "PadfreeEmbLayerNorm",
         {float_field("epsilon", 1e-12f), int_field("position_offset", 0), int_field("has_token_type", 1),
          int_field("has_layernorm", 0)},
         "iiifff" "f", 6,
         {{37}, {37}, {4}, {100, 64}, {64, 64}, {2, 64}},
         {dyn1, dyn1, dyn1, const2, const2, const2},
         {{37, 64}},
         {{4, 1, 65}, {5, 1, 63}},
         {}},
        {"attention", "PadfreeAttention",
         {int_field("num_heads", 2), int_field("head_dim", 32), float_field("softmax_scale", 0.1767767f)},
         "ffim" "f", 4,
         {{37, 192}, {192}, {4}, {20}},
         {dyn2, const1, dyn1, dyn1},
         {{37, 64}},
         {{0, 1, 191}, {1, 0, 96}},
         {int_field("num_heads", 0), int_field("head_dim", -64), float_field("softmax_scale", -1.0f),
          float_field("softmax_scale", INFINITY)}},
        {"skip_layernorm", "PadfreeSkipLayerNorm",
         {float_field("epsilon", 1e-12f)},
         "fffff" "f", 5,
         {{37, 64}, {37, 64}, {64}, {64}, {64}},
         {dyn2, dyn2, const1, const1, const1},
         {{37, 64}},
         {{1, 1, 32}, {2, 0, 63}, {3, 0, 65}, {4, 0, 1}},
         {float_field("epsilon", -1e-5f)}},
        {"layernorm", "PadfreeLayerNorm",
         {float_field("epsilon", 1e-5f)},
         "fff" "f", 3,
         {{37, 64}, {64}, {64}},
         {dyn2, const1, const1},
         {{37, 64}},
         {{1, 0, 63}, {2, 0, 128}},
         {float_field("epsilon", NAN)}},
        {"bias_gelu", "PadfreeBiasGelu",
         {int_field("approximate", 1)},
         "ff" "f", 2,
         {{37, 128}, {128}},
         {dyn2, const1},
         {{37, 128}},
         {{1, 0, 64}},
         {int_field("approximate", 2), int_field("approximate", -1)}},
        {"remove_padding_rows", "PadfreeRemovePadding", {},
         "ai" "sii", 2,
         {{3, 20, 64}, {3, 20}},
         {{true, true, false}, {true, true}},
         {{37, 64}, {4}, {}},
         {{1, 1, 21}, {1, 0, 2}},
         {}},
        {"remove_padding_ids", "PadfreeRemovePadding", {},
         "ai" "sii", 2,
         {{3, 20}, {3, 20}},
         {{true, true}, {true, true}},
         {{37}, {4}, {}},
         {{1, 1, 19}},
         {}},
        {"rebuild_padding", "PadfreeRebuildPadding", {},
         "aii" "s", 3,
         {{37, 64}, {4}, {3, 20}},
         {dyn2, dyn1, {true, true}},
         {{3, 20, 64}},
         {{1, 0, 3}},
         {}},
        // A decoding step: R = 6 hypotheses (3 sources x 2 beams), a cache of L = 16 positions; R is a
        // runtime dimension, the cache length, heads and sizes constants, as in a per-step engine.
        {"decoder_self_attention", "PadfreeDecoderSelfAttention",
         {int_field("num_heads", 2), int_field("head_dim", 64), float_field("softmax_scale", 0.125f),
          int_field("own_workspace", 0)},
         "ffffii" "fff", 6,
         {{6, 384}, {384}, {6, 2, 16, 64}, {6, 2, 16, 64}, {6, 16}, {1}},
         {dyn2, const1, {true, false, false, false}, {true, false, false, false}, dyn2, const1},
         {{6, 128}, {6, 2, 16, 64}, {6, 2, 16, 64}},
         {{0, 1, 383}, {1, 0, 192}, {2, 1, 3}, {2, 3, 32}, {3, 3, 128}, {4, 1, 15}, {5, 0, 2}},
         {int_field("num_heads", 0), int_field("head_dim", -64), float_field("softmax_scale", -1.0f),
          float_field("softmax_scale", NAN), int_field("own_workspace", 2)}},
        {"decoder_cross_attention", "PadfreeDecoderCrossAttention",
         {int_field("num_beams", 2), int_field("num_heads", 2), int_field("head_dim", 64),
          float_field("softmax_scale", 0.125f), int_field("own_workspace", 0)},
         "fffim" "f", 5,
         {{6, 128}, {128}, {37, 256}, {4}, {20}},
         {dyn2, const1, dyn2, dyn1, dyn1},
         {{6, 128}},
         {{0, 1, 127}, {1, 0, 64}, {2, 1, 128}},
         {int_field("num_beams", 0), int_field("num_heads", -1), int_field("head_dim", 0),
          float_field("softmax_scale", INFINITY), int_field("own_workspace", -1)}},
        {"logits_topk_all_inputs", "PadfreeLogitsTopK",
         {int_field("k", 4), int_field("normalize", 1), float_field("repetition_penalty", 1.2f),
          int_field("has_bias", 1), int_field("has_beam_scores", 1), int_field("has_banned", 1),
          int_field("has_penalty", 1), int_field("has_forced", 1), int_field("own_workspace", 0)},
         "ffFiii" "Fi", 6,
         {{6, 100}, {100}, {6}, {6, 3}, {6, 5}, {6}},
         {dyn2, const1, dyn1, dyn2, dyn2, dyn1},
         {{6, 4}, {6, 4}},
         {{1, 0, 99}},
         {int_field("k", 0), int_field("normalize", 2), float_field("repetition_penalty", 0.0f),
          float_field("repetition_penalty", NAN), int_field("has_bias", 2), int_field("has_forced", -1),
          int_field("own_workspace", 3)}},
        {"logits_topk_greedy", "PadfreeLogitsTopK",
         {int_field("k", 1), int_field("normalize", 0), float_field("repetition_penalty", 1.0f),
          int_field("has_bias", 0), int_field("has_beam_scores", 0), int_field("has_banned", 0),
          int_field("has_penalty", 0), int_field("has_forced", 0), int_field("own_workspace", 0)},
         "f" "Fi", 1,
         {{6, 100}},
         {dyn2},
         {{6, 1}, {6, 1}},
         {},
         {int_field("k", -1)}},
        // Beam search: B = 3 sources x 2 beams (R = 6), NK = 4 candidates per row, M = 8 positions.
        {"beam_search_step", "PadfreeBeamSearchStep",
         {int_field("num_beams", 2), float_field("length_penalty", 1.0f), int_field("early_stopping", 0),
          int_field("has_eos", 1), int_field("own_workspace", 0)},
         "FiiLFLFLiii" "LFLFLiiLi", 11,
         {{6, 4}, {6, 4}, {1}, {3, 2, 8}, {3, 2}, {3, 2, 8}, {3, 2}, {3, 2}, {3, 2}, {3}, {2}},
         {dyn2, dyn2, const1, {true, false, false}, dyn2, {true, false, false}, dyn2, dyn2, dyn2, dyn1, const1},
         {{3, 2, 8}, {3, 2}, {3, 2, 8}, {3, 2}, {3, 2}, {3, 2}, {3}, {6}, {6}},
         {{1, 1, 3}, {2, 0, 2}, {3, 1, 3}, {5, 2, 9}, {6, 1, 3}, {8, 1, 1}},
         {int_field("num_beams", 0), int_field("num_beams", 17), float_field("length_penalty", NAN),
          int_field("early_stopping", 3), int_field("has_eos", 2), int_field("own_workspace", -1)}},
        // Greedy: R = 6 rows, M = 8 positions.
        {"greedy_step", "PadfreeGreedyStep",
         {int_field("pad_token_id", 1), int_field("has_eos", 1)},
         "iiLLii" "LLiL", 6,
         {{6, 1}, {1}, {6, 8}, {6}, {6}, {2}},
         {dyn2, const1, dyn2, dyn1, dyn1, const1},
         {{6, 8}, {6}, {6}, {6}},
         {{0, 1, 2}, {1, 0, 2}},
         {int_field("has_eos", 2), int_field("has_eos", -1)}},
        {"beam_reorder", "PadfreeBeamReorder", {},
         "iii" "i", 3,
         {{6, 16}, {6}, {1}},
         {dyn2, dyn1, const1},
         {{6, 16}},
         {{2, 0, 2}},
         {}},
    };
    return all;
}

const Case& case_named(const std::string& label) {
    for (const Case& c : cases())
        if (c.label == label) return c;
    throw Failure("no case " + label);
}

std::vector<FieldValue> with_fields(const Case& c, const std::vector<FieldValue>& changes) {
    std::vector<FieldValue> fields = c.fields;
    for (const FieldValue& change : changes)
        for (FieldValue& f : fields)
            if (f.name == change.name) f = change;
    return fields;
}

IPluginCreatorV3One* find_creator(const std::string& name) {
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = getCreators(count);
    for (int32_t k = 0; k < count; ++k) {
        auto* creator = static_cast<IPluginCreatorV3One*>(creators[k]);
        if (name == creator->getPluginName()) return creator;
    }
    throw Failure("no creator named " + name);
}

IPluginV3* create(const Case& c, const std::vector<FieldValue>& fields, TensorRTPhase phase) {
    std::vector<PluginField> storage;
    for (const FieldValue& v : fields) storage.emplace_back(v.name.c_str(), &v.i, v.type, 1);
    PluginFieldCollection fc{static_cast<int32_t>(storage.size()), storage.data()};
    return find_creator(c.plugin)->createPlugin("layer", &fc, phase);
}

IPluginV3* create_runtime(const std::string& plugin, const void* blob, int32_t bytes) {
    PluginField field("padfree_state", blob, PluginFieldType::kUNKNOWN, bytes);
    PluginFieldCollection fc{1, &field};
    return find_creator(plugin)->createPlugin("layer", &fc, TensorRTPhase::kRUNTIME);
}

IPluginV3OneBuild* build_of(IPluginV3* p) {
    return static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
}

IPluginV3OneRuntime* runtime_of(IPluginV3* p) {
    return static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}

std::vector<uint8_t> serialize(IPluginV3* p) {
    const PluginFieldCollection* fc = runtime_of(p)->getFieldsToSerialize();
    EXPECT(fc != nullptr && fc->nbFields == 1 && fc->fields[0].type == PluginFieldType::kUNKNOWN,
           "one kUNKNOWN state field");
    const auto* bytes = static_cast<const uint8_t*>(fc->fields[0].data);
    return std::vector<uint8_t>(bytes, bytes + fc->fields[0].length);
}

std::vector<DataType> io_types(const Case& c, DataType activation) {
    std::vector<DataType> types;
    for (char kind : c.kinds) {
        switch (kind) {
            case 'i': case 'm': types.push_back(DataType::kINT32); break;
            case 'F': types.push_back(DataType::kFLOAT); break;
            case 'L': types.push_back(DataType::kINT64); break;
            case 's': types.push_back(types.at(0)); break;
            default: types.push_back(activation); break;
        }
    }
    return types;
}

namespace {

using Plugin = std::unique_ptr<IPluginV3>;

// The case's input shapes as expressions; `dims` replaces the sample's values (not which are dynamic).
std::vector<DimsExprs> input_exprs(ExprBuilder& builder, const Case& c,
                                   const std::vector<std::vector<int64_t>>* dims = nullptr) {
    const std::vector<std::vector<int64_t>>& values = dims ? *dims : c.input_dims;
    std::vector<DimsExprs> inputs;
    for (size_t k = 0; k < values.size(); ++k) inputs.push_back(builder.dims(values[k], c.dynamic[k]));
    return inputs;
}

// Output shapes for the case's sample, or throws with the plugin's message.
std::vector<std::vector<int64_t>> output_shapes(IPluginV3* p, const Case& c, ExprBuilder& builder,
                                                const std::vector<DimsExprs>& inputs, bool expect_ok = true) {
    const int32_t nb_out = build_of(p)->getNbOutputs();
    std::vector<DimsExprs> outputs(nb_out);
    const int32_t rc = build_of(p)->getOutputShapes(inputs.data(), c.nb_inputs, nullptr, 0, outputs.data(), nb_out,
                                                    builder);
    if (!expect_ok) {
        EXPECT(rc != 0, c.label, ": inconsistent shapes were accepted");
        return {};
    }
    EXPECT(rc == 0, c.label, ": getOutputShapes failed: ", padfree_trt_last_error());
    std::vector<std::vector<int64_t>> values;
    for (const DimsExprs& d : outputs) values.push_back(ExprBuilder::values(d));
    return values;
}

std::vector<DynamicPluginTensorDesc> descs(const Case& c, const std::vector<DataType>& types) {
    std::vector<DynamicPluginTensorDesc> io(types.size());
    for (size_t k = 0; k < types.size(); ++k) {
        io[k].desc.type = types[k];
        io[k].desc.format = TensorFormat::kLINEAR;
        const auto& dims = k < c.input_dims.size() ? c.input_dims[k] : c.output_dims[k - c.input_dims.size()];
        io[k].desc.dims.nbDims = static_cast<int32_t>(dims.size());
        for (size_t d = 0; d < dims.size(); ++d) io[k].desc.dims.d[d] = dims[d];
    }
    return io;
}

void for_each_case(const std::function<void(const Case&)>& body) {
    for (const Case& c : cases()) body(c);
}

const DataType kActivationTypes[] = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16};

// ---- creators and registration ----------------------------------------------------------------
bool g_registered_at_load = false;
size_t g_registered_count = 0;
std::vector<std::string> g_registered_namespaces;

Register creators_test("creators_match_cases", [] {
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = getCreators(count);
    EXPECT(count == 13, "13 creators, got ", count);
    for_each_case([](const Case& c) {
        IPluginCreatorV3One* creator = find_creator(c.plugin);
        EXPECT(std::string(creator->getPluginVersion()) == "1", c.plugin);
        EXPECT(std::string(creator->getPluginNamespace()) == "padfree", c.plugin);
        const PluginFieldCollection* names = creator->getFieldNames();
        EXPECT(names->nbFields == static_cast<int32_t>(c.fields.size()), c.plugin, " field count");
        for (int32_t k = 0; k < names->nbFields; ++k)
            EXPECT(c.fields[k].name == names->fields[k].name && c.fields[k].type == names->fields[k].type,
                   c.plugin, " field ", k);
    });
    (void)creators;
});

Register static_registration_test("static_registration_then_getCreators", [] {
    // main() recorded what the load-time registrar did before anything called getCreators().
    EXPECT(g_registered_at_load, "the registrar found the exported getPluginRegistry()");
    EXPECT(g_registered_count == 13, "13 creators registered at load, got ", g_registered_count);
    for (const std::string& ns : g_registered_namespaces) EXPECT(ns == "padfree", "namespace ", ns);
    // getCreators() (what loadLibrary calls) withdraws them so that loadLibrary can register them.
    EXPECT(Registry::instance().creators.empty(), "static registrations withdrawn by getCreators()");
    EXPECT(padfree_trt_statically_registered() == 0, "registrar state cleared");
});

// ---- types, formats, shapes ---------------------------------------------------------------------
Register types_test("output_types_per_dtype", [] {
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        EXPECT(p, c.label, ": ", padfree_trt_last_error());
        const int32_t nb_out = build_of(p.get())->getNbOutputs();
        EXPECT(nb_out == static_cast<int32_t>(c.kinds.size()) - c.nb_inputs, c.label, " outputs");
        for (DataType activation : kActivationTypes) {
            const std::vector<DataType> types = io_types(c, activation);
            std::vector<DataType> out(nb_out, DataType::kINT8);
            EXPECT(build_of(p.get())->getOutputDataTypes(out.data(), nb_out, types.data(), c.nb_inputs) == 0,
                   c.label, ": ", padfree_trt_last_error());
            for (int32_t k = 0; k < nb_out; ++k) EXPECT(out[k] == types[c.nb_inputs + k], c.label, " output ", k);
        }
        // Wrong input counts are refused with a message, not read past.
        const std::vector<DataType> types = io_types(c, DataType::kHALF);
        std::vector<DataType> out(nb_out);
        EXPECT(build_of(p.get())->getOutputDataTypes(out.data(), nb_out, types.data(), c.nb_inputs - 1) != 0,
               c.label, " one input short");
        // A float input of another dtype than the first one is refused (strongly typed networks).
        size_t first = c.kinds.find('f');
        size_t second = c.kinds.find('f', first + 1);
        if (second != std::string::npos && second < static_cast<size_t>(c.nb_inputs)) {
            std::vector<DataType> mixed = types;
            mixed[second] = DataType::kFLOAT;
            EXPECT(build_of(p.get())->getOutputDataTypes(out.data(), nb_out, mixed.data(), c.nb_inputs) != 0,
                   c.label, " mixed float dtypes");
            EXPECT(std::strstr(padfree_trt_last_error(), "share one dtype") != nullptr, padfree_trt_last_error());
        }
        size_t int_pos = c.kinds.find('i');
        if (int_pos < static_cast<size_t>(c.nb_inputs)) {
            std::vector<DataType> wrong = types;
            wrong[int_pos] = DataType::kINT64;
            EXPECT(build_of(p.get())->getOutputDataTypes(out.data(), nb_out, wrong.data(), c.nb_inputs) != 0,
                   c.label, " int64 ids");
        }
    });
});

Register formats_test("supports_format_combination", [] {
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        const int32_t nb_out = build_of(p.get())->getNbOutputs();
        for (DataType activation : kActivationTypes) {
            std::vector<DynamicPluginTensorDesc> io = descs(c, io_types(c, activation));
            for (int32_t pos = 0; pos < c.nb_inputs + nb_out; ++pos)
                EXPECT(build_of(p.get())->supportsFormatCombination(pos, io.data(), c.nb_inputs, nb_out), c.label,
                       " position ", pos);
        }
        std::vector<DynamicPluginTensorDesc> io = descs(c, io_types(c, DataType::kHALF));
        for (int32_t pos = 0; pos < c.nb_inputs + nb_out; ++pos) {
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[pos].desc.format = TensorFormat::kCHW32;
            EXPECT(!build_of(p.get())->supportsFormatCombination(pos, bad.data(), c.nb_inputs, nb_out), c.label,
                   " non-linear format at ", pos);
            const char kind = c.kinds[pos];
            bad = io;
            bad[pos].desc.type = kind == 'i' ? DataType::kFLOAT : (kind == 'm' ? DataType::kINT4 : DataType::kINT8);
            if (kind == 'a' || (kind == 's' && pos == 0)) bad[pos].desc.type = DataType::kINT4;  // sub-byte rows
            if (kind == 'f') bad[pos].desc.type = DataType::kINT32;
            EXPECT(!build_of(p.get())->supportsFormatCombination(pos, bad.data(), c.nb_inputs, nb_out), c.label,
                   " wrong type at ", pos);
        }
        // The activation type is set by the first float position; a later one must follow it.
        size_t first = c.kinds.find('f');
        size_t later = c.kinds.find('f', first + 1);
        if (later != std::string::npos) {
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[later].desc.type = DataType::kBF16;
            EXPECT(!build_of(p.get())->supportsFormatCombination(static_cast<int32_t>(later), bad.data(),
                                                                 c.nb_inputs, nb_out),
                   c.label, " mixed float types at ", later);
        }
    });
});

Register shapes_test("output_shapes", [] {
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        ExprBuilder builder;
        builder.size_tensor_value = 37;
        auto inputs = input_exprs(builder, c);
        auto shapes = output_shapes(p.get(), c, builder, inputs);
        EXPECT(shapes == c.output_dims, c.label, ": unexpected output shapes");
        if (c.plugin == "PadfreeRemovePadding") {
            EXPECT(builder.declared.size() == 1, "one size tensor declared");
            const SizeTensorDecl& d = builder.declared[0];
            EXPECT(d.output_index == 2 && d.upper == 60 && d.opt == 30, "size tensor: output ", d.output_index,
                   " opt ", d.opt, " upper ", d.upper);
        }
        // Mismatched weights are constants, so they are refused while building; the padding plugins'
        // mismatches are between runtime dims, which only enqueue can see (recorder test).
        if (c.plugin.find("Padding") != std::string::npos) return;
        for (const auto& bad : c.bad_dims) {
            ExprBuilder b2;
            std::vector<std::vector<int64_t>> dims = c.input_dims;
            dims[bad[0]][bad[1]] = bad[2];
            output_shapes(p.get(), c, b2, input_exprs(b2, c, &dims), /*expect_ok=*/false);
        }
    });
});

// ---- fields and serialization -----------------------------------------------------------------
// The default of a case's field k (getFieldNames' data), or nullptr where it has none.
const int32_t* default_of(const Case& c, size_t k) {
    return static_cast<const int32_t*>(find_creator(c.plugin)->getFieldNames()->fields[k].data);
}

Register fields_test("build_fields_refused", [] {
    for_each_case([](const Case& c) {
        for (size_t k = 0; k < c.fields.size(); ++k) {
            std::vector<FieldValue> missing = c.fields;
            missing.erase(missing.begin() + k);
            if (const int32_t* value = default_of(c, k)) {
                // A field with a default (added after the first exports) may be left out: it takes it.
                std::vector<FieldValue> as_default = c.fields;
                std::memcpy(&as_default[k].i, value, sizeof(int32_t));
                Plugin without(create(c, missing));
                EXPECT(without, c.label, " without ", c.fields[k].name, ": ", padfree_trt_last_error());
                EXPECT(serialize(without.get()) == serialize(Plugin(create(c, as_default)).get()), c.label,
                       " without ", c.fields[k].name, ": not its default");
            } else {
                EXPECT(!Plugin(create(c, missing)), c.label, " without ", c.fields[k].name);
            }
            std::vector<FieldValue> retyped = c.fields;
            retyped[k].type = retyped[k].type == PluginFieldType::kINT32 ? PluginFieldType::kFLOAT32
                                                                          : PluginFieldType::kINT32;
            EXPECT(!Plugin(create(c, retyped)), c.label, " with ", c.fields[k].name, " of the wrong type");
            std::vector<FieldValue> twice = c.fields;
            twice.push_back(c.fields[k]);
            EXPECT(!Plugin(create(c, twice)), c.label, " with ", c.fields[k].name, " twice");
        }
        std::vector<FieldValue> unknown = c.fields;
        unknown.push_back(int_field("not_a_field", 1));
        EXPECT(!Plugin(create(c, unknown)), c.label, " with an unknown field");
        EXPECT(std::strstr(padfree_trt_last_error(), "not_a_field") != nullptr, padfree_trt_last_error());
        // What the ONNX parser may pass through besides the fields is accepted.
        std::vector<FieldValue> with_parser_attrs = c.fields;
        with_parser_attrs.push_back(int_field("plugin_version", 1));
        EXPECT(Plugin(create(c, with_parser_attrs)), c.label, ": ", padfree_trt_last_error());
        for (const FieldValue& bad : c.bad_fields)
            EXPECT(!Plugin(create(c, with_fields(c, {bad}))), c.label, " accepted an invalid ", bad.name);
    });
});

Register roundtrip_test("serialization_round_trip", [] {
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        const std::vector<uint8_t> blob = serialize(p.get());
        Plugin q(create_runtime(c.plugin, blob.data(), static_cast<int32_t>(blob.size())));
        EXPECT(q, c.label, ": ", padfree_trt_last_error());
        EXPECT(serialize(q.get()) == blob, c.label, " re-serialized differently");
        Plugin cloned(p->clone());
        EXPECT(cloned && serialize(cloned.get()) == blob, c.label, " clone");
        ExprBuilder b1, b2;
        b1.size_tensor_value = b2.size_tensor_value = 37;
        auto in1 = input_exprs(b1, c);
        auto in2 = input_exprs(b2, c);
        EXPECT(output_shapes(p.get(), c, b1, in1) == output_shapes(q.get(), c, b2, in2), c.label,
               " deserialized plugin shapes");
    });
});

Register older_state_test("state_without_defaulted_fields_takes_their_defaults", [] {
    // An engine built before a field with a default was added carries a state that ends before it:
    // it loads as the default. Fewer fields than those without a default is corruption.
    bool any = false;
    for_each_case([&](const Case& c) {
        size_t required = c.fields.size();
        while (required > 0 && default_of(c, required - 1) != nullptr) --required;
        if (required == c.fields.size()) return;
        std::vector<FieldValue> as_default = c.fields;
        for (size_t k = required; k < c.fields.size(); ++k) std::memcpy(&as_default[k].i, default_of(c, k), 4);
        const std::vector<uint8_t> blob = serialize(Plugin(create(c, as_default)).get());
        const size_t count_at = blob.size() - 8 * c.fields.size() - 4;  // u32 count, then 8 bytes per field
        for (size_t count = 0; count < c.fields.size(); ++count) {
            std::vector<uint8_t> older(blob.begin(), blob.end() - 8 * (c.fields.size() - count));
            const uint32_t n = static_cast<uint32_t>(count);
            std::memcpy(&older[count_at], &n, 4);
            Plugin q(create_runtime(c.plugin, older.data(), static_cast<int32_t>(older.size())));
            if (count < required) {
                EXPECT(!q, c.label, ": a state of ", count, " fields accepted");
                continue;
            }
            EXPECT(q, c.label, " state of ", count, " fields: ", padfree_trt_last_error());
            EXPECT(serialize(q.get()) == blob, c.label, " state of ", count, " fields: not the defaults");
            any = true;
        }
    });
    EXPECT(any, "no case has a field with a default");
});

Register corrupt_test("corrupt_state_refused", [] {
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        const std::vector<uint8_t> blob = serialize(p.get());
        for (size_t n = 0; n < blob.size(); ++n) {
            // Truncated copies live in exactly-sized buffers so that any over-read is an ASan/valgrind hit.
            std::vector<uint8_t> cut(blob.begin(), blob.begin() + n);
            EXPECT(!Plugin(create_runtime(c.plugin, n ? cut.data() : nullptr, static_cast<int32_t>(n))), c.label,
                   " accepted ", n, " of ", blob.size(), " bytes");
        }
        std::vector<uint8_t> longer = blob;
        longer.push_back(0);
        EXPECT(!Plugin(create_runtime(c.plugin, longer.data(), static_cast<int32_t>(longer.size()))), c.label,
               " trailing byte");
        EXPECT(std::strstr(padfree_trt_last_error(), "trailing") != nullptr, padfree_trt_last_error());
        // Every single-byte corruption is either refused or, where it only changed a value, yields a
        // plugin whose fields pass validation (re-serialization reproduces the corrupted bytes).
        for (size_t k = 0; k < blob.size(); ++k) {
            std::vector<uint8_t> flipped = blob;
            flipped[k] ^= 0xFF;
            Plugin q(create_runtime(c.plugin, flipped.data(), static_cast<int32_t>(flipped.size())));
            if (!q) continue;
            const size_t header = blob.size() - 8 * c.fields.size();  // then per field: u32 type, 4 value bytes
            EXPECT(k >= header && (k - header) % 8 >= 4, c.label, " corruption outside the field values at byte ",
                   k, " accepted");
            EXPECT(serialize(q.get()) == flipped, c.label, " byte ", k, " accepted but re-serialized differently");
        }
        std::vector<uint8_t> versioned = blob;
        versioned[4] += 1;  // format version (after the 4-byte magic)
        EXPECT(!Plugin(create_runtime(c.plugin, versioned.data(), static_cast<int32_t>(versioned.size()))), c.label);
        EXPECT(std::strstr(padfree_trt_last_error(), "format version") != nullptr, padfree_trt_last_error());
        // Another plugin's state is refused by name.
        const std::string other = c.plugin == "PadfreeLayerNorm" ? "PadfreeBiasGelu" : "PadfreeLayerNorm";
        EXPECT(!Plugin(create_runtime(other, blob.data(), static_cast<int32_t>(blob.size()))), c.label, " as ", other);
        // Build-style named fields at run time are refused (TensorRT hands back what we serialized).
        EXPECT(!Plugin(create(c, c.fields, TensorRTPhase::kRUNTIME)), c.label);
        PluginField negative("padfree_state", blob.data(), PluginFieldType::kUNKNOWN, -5);
        PluginFieldCollection neg{1, &negative};
        EXPECT(!Plugin(find_creator(c.plugin)->createPlugin("layer", &neg, TensorRTPhase::kRUNTIME)), c.label);
    });
});

// ---- field ranges -------------------------------------------------------------------------------
Register attention_sizes_test("attention_sizes_refused_without_overflow", [] {
    // The qkv width 3 * num_heads * head_dim must fit int32; a product past int64 (from a corrupt
    // blob) must be refused too, not wrap around into a value that passes.
    const Case& c = case_named("attention");
    const int32_t big = std::numeric_limits<int32_t>::max();
    const std::array<std::array<int32_t, 2>, 4> refused{{{big, big}, {big, 1}, {715827883, 1}, {1 << 16, 1 << 15}}};
    for (const auto& [heads, head_dim] : refused) {
        EXPECT(!Plugin(create(c, with_fields(c, {int_field("num_heads", heads), int_field("head_dim", head_dim)}))),
               "num_heads ", heads, ", head_dim ", head_dim, " accepted");
        EXPECT(std::strstr(padfree_trt_last_error(), "num_heads") != nullptr, padfree_trt_last_error());
    }
    // The widest that fits: 3 * 715827882 = 2^31 - 2.
    EXPECT(Plugin(create(c, with_fields(c, {int_field("num_heads", 715827882), int_field("head_dim", 1)}))),
           padfree_trt_last_error());
    // The same sizes written into an engine's plugin state are refused as it is deserialized.
    Plugin p(create(c, c.fields));
    std::vector<uint8_t> blob = serialize(p.get());
    const size_t first_value = blob.size() - 8 * c.fields.size() + 4;  // per field: u32 type, 4 value bytes
    std::memcpy(&blob[first_value + 8 * 0], &big, sizeof big);  // num_heads
    std::memcpy(&blob[first_value + 8 * 1], &big, sizeof big);  // head_dim
    EXPECT(!Plugin(create_runtime(c.plugin, blob.data(), static_cast<int32_t>(blob.size()))),
           "a state of num_heads = head_dim = 2^31 - 1 accepted");
    EXPECT(std::strstr(padfree_trt_last_error(), "num_heads") != nullptr, padfree_trt_last_error());
});

Register epsilon_test("epsilon_rule_is_the_c_abis", [] {
    // Finite and >= 0, as the C ABI and padfree.ops check it: eps 0 is a well defined LayerNorm
    // (unless a row's variance is 0), a large eps only flattens the output.
    for (const char* label : {"emb_layernorm_with_type", "skip_layernorm", "layernorm"}) {
        const Case& c = case_named(label);
        for (float eps : {0.0f, 1e-12f, 1.0f, 2.0f, 1e30f})
            EXPECT(Plugin(create(c, with_fields(c, {float_field("epsilon", eps)}))), label, " epsilon ", eps, ": ",
                   padfree_trt_last_error());
        for (float eps : {-1e-5f, NAN, INFINITY, -INFINITY}) {
            EXPECT(!Plugin(create(c, with_fields(c, {float_field("epsilon", eps)}))), label, " epsilon ", eps);
            EXPECT(std::strstr(padfree_trt_last_error(), "finite epsilon >= 0") != nullptr, padfree_trt_last_error());
        }
    }
});

// ---- error reporting at run time (no device needed: the checks refuse before any kernel) ------------
Register recorder_test("enqueue_errors_reach_the_error_recorder", [] {
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        for (const auto& bad : c.bad_dims) {
            ErrorRecorder recorder;
            ResourceContext context(&recorder);
            Plugin attached(runtime_of(p.get())->attachToContext(&context));
            EXPECT(attached, c.label, " attachToContext");
            std::vector<DynamicPluginTensorDesc> io = descs(c, io_types(c, DataType::kHALF));
            io[bad[0]].desc.dims.d[bad[1]] = bad[2];
            std::vector<PluginTensorDesc> in, out;
            for (int32_t k = 0; k < static_cast<int32_t>(io.size()); ++k)
                (k < c.nb_inputs ? in : out).push_back(io[k].desc);
            std::vector<const void*> inputs(in.size(), nullptr);
            std::vector<void*> outputs(out.size(), nullptr);
            const int32_t rc = runtime_of(attached.get())
                                   ->enqueue(in.data(), out.data(), inputs.data(), outputs.data(), nullptr, nullptr);
            EXPECT(rc != 0, c.label, " enqueue accepted input ", bad[0], " dim ", bad[1], " = ", bad[2]);
            EXPECT(recorder.errors.size() == 1, c.label, " recorder saw ", recorder.errors.size(), " errors");
            // Refused by the plugin's own check (naming the bad extent), not by the C ABI's pointer checks.
            EXPECT(recorder.errors[0].second.find(c.plugin) == 0 &&
                       recorder.errors[0].second.find(str("got ", bad[2], ",")) != std::string::npos,
                   recorder.errors[0].second);
        }
    });
});

// ---- the decoder plugins ---------------------------------------------------------------------------
Register aliasing_test("decoder_caches_alias_their_inputs", [] {
    // Every plugin's build capability is IPluginV3OneBuildV2; only read-modify-write state aliases its
    // input, with the input's type and shape: the self-attention's caches (k_cache_out -> k_cache,
    // v_cache_out -> v_cache) and the searches' state (beam: outputs 0-6 -> inputs 3-9; greedy: 0-2 -> 2-4).
    for_each_case([](const Case& c) {
        Plugin p(create(c, c.fields));
        auto* build = static_cast<IPluginV3OneBuildV2*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
        const InterfaceInfo info = build->getInterfaceInfo();
        EXPECT(std::string(info.kind) == "PLUGIN_V3ONE_BUILD" && info.major == 2, c.label, ": ", info.kind, " ",
               info.major);
        for (int32_t o = 0; o < build->getNbOutputs(); ++o) {
            const int32_t want = c.plugin == "PadfreeDecoderSelfAttention" && o > 0 ? o + 1
                                 : c.plugin == "PadfreeBeamSearchStep" && o < 7  ? o + 3
                                 : c.plugin == "PadfreeGreedyStep" && o < 3      ? o + 2
                                                                                 : -1;
            EXPECT(build->getAliasedInput(o) == want, c.label, " output ", o, " aliases ", build->getAliasedInput(o));
            if (want < 0) continue;
            EXPECT(c.output_dims[o] == c.input_dims[want] && c.kinds[c.nb_inputs + o] == c.kinds[want], c.label,
                   " aliased output ", o, " differs from its input");
        }
    });
});

// Profile bounds for a case: every desc's min/opt/max is its sample shape, then `edit` changes some.
std::vector<DynamicPluginTensorDesc> profile(const Case& c, const std::function<void(std::vector<DynamicPluginTensorDesc>&)>& edit) {
    std::vector<DynamicPluginTensorDesc> io = descs(c, io_types(c, DataType::kHALF));
    for (DynamicPluginTensorDesc& d : io) d.min = d.opt = d.max = d.desc.dims;
    edit(io);
    return io;
}

size_t workspace_of(const Case& c, const std::vector<DynamicPluginTensorDesc>& io) {
    Plugin p(create(c, c.fields));
    const int32_t nb_out = static_cast<int32_t>(io.size()) - c.nb_inputs;
    return build_of(p.get())->getWorkspaceSize(io.data(), c.nb_inputs, io.data() + c.nb_inputs, nb_out);
}

Register workspace_test("decoder_workspace_is_the_c_abis_at_the_profile_bounds", [] {
    // Rows 1..48 (the split counts depend on the rows, not monotonically), the cache's and the
    // sources' longest lengths: the largest of the C ABI's answers.
    const int32_t max_rows = 48;
    int64_t self_want = 0, cross_want = 0, bytes = 0;
    for (int32_t rows = 1; rows <= max_rows; ++rows) {
        EXPECT(padfree_decoder_self_attention_workspace_size(rows, 2, 64, 512, &bytes) == PADFREE_OK, padfree_last_error());
        self_want = std::max(self_want, bytes);
        EXPECT(padfree_decoder_cross_attention_workspace_size(rows, 2, 64, 256, &bytes) == PADFREE_OK, padfree_last_error());
        cross_want = std::max(cross_want, bytes);
    }
    const Case& self = case_named("decoder_self_attention");
    const size_t self_got = workspace_of(self, profile(self, [&](auto& io) {
        for (int k : {0, 2, 3, 4, 6, 7, 8}) io[k].min.d[0] = 1, io[k].max.d[0] = max_rows;
        for (int k : {2, 3, 7, 8}) io[k].max.d[2] = 512;
        io[4].max.d[1] = 512;
    }));
    EXPECT(self_want > 0 && self_got == static_cast<size_t>(self_want), "self-attention: ", self_got, " vs ", self_want);
    const Case& cross = case_named("decoder_cross_attention");
    const size_t cross_got = workspace_of(cross, profile(cross, [&](auto& io) {
        io[0].min.d[0] = io[5].min.d[0] = 1;
        io[0].max.d[0] = io[5].max.d[0] = max_rows;
        io[4].max.d[0] = 256;
    }));
    EXPECT(cross_want > 0 && cross_got == static_cast<size_t>(cross_want), "cross-attention: ", cross_got, " vs ",
           cross_want);
    // Top-k: the query at the largest rows and vocabulary (it grows with both).
    EXPECT(padfree_logits_topk_workspace_size(max_rows, 32000, 4, &bytes) == PADFREE_OK, padfree_last_error());
    const Case& topk = case_named("logits_topk_all_inputs");
    const size_t topk_got = workspace_of(topk, profile(topk, [&](auto& io) {
        io[0].max.d[0] = max_rows;
        io[0].max.d[1] = io[1].max.d[0] = 32000;
    }));
    EXPECT(bytes > 0 && topk_got == static_cast<size_t>(bytes), "top-k: ", topk_got, " vs ", bytes);
    // Beam search: the C ABI's at the largest batch and max_length (it grows with both), and its stop flag.
    int64_t counters = 0;
    EXPECT(padfree_beam_search_workspace_size(max_rows, 2, 64, 0, &bytes, &counters) == PADFREE_OK, padfree_last_error());
    const Case& beam = case_named("beam_search_step");
    const size_t beam_got = workspace_of(beam, profile(beam, [&](auto& io) {
        for (int k : {3, 4, 5, 6, 7, 8, 9}) io[k].max.d[0] = max_rows;
        io[3].max.d[2] = io[5].max.d[2] = 64;
    }));
    EXPECT(beam_got == static_cast<size_t>(bytes) + 16, "beam search: ", beam_got, " vs ", bytes, " + 16");
    // own_workspace 1: the plugin holds its scratch and asks TensorRT for none, at any profile.
    for (const Case* c : {&self, &cross, &topk, &beam}) {
        Plugin own(create(*c, with_fields(*c, {int_field("own_workspace", 1)})));
        std::vector<DynamicPluginTensorDesc> wide = profile(*c, [&](auto& io) {
            for (auto& d : io)
                for (int32_t k = 0; k < d.max.nbDims; ++k) d.max.d[k] = std::max<int64_t>(d.max.d[k], 64);
        });
        EXPECT(build_of(own.get())->getWorkspaceSize(wide.data(), c->nb_inputs, wide.data() + c->nb_inputs,
                                                     static_cast<int32_t>(wide.size()) - c->nb_inputs) == 0,
               c->label, " with own_workspace asked TensorRT for a workspace");
    }
    // A head_dim the kernels are not built for: no workspace asked (enqueue reports the C ABI's refusal).
    Plugin odd(create(self, with_fields(self, {int_field("head_dim", 32)})));
    std::vector<DynamicPluginTensorDesc> io = profile(self, [](auto&) {});
    EXPECT(build_of(odd.get())->getWorkspaceSize(io.data(), self.nb_inputs, io.data() + self.nb_inputs, 3) == 0,
           "head_dim 32");
    // The other plugins take none.
    for_each_case([](const Case& c) {
        if (c.plugin.find("Decoder") != std::string::npos || c.plugin == "PadfreeLogitsTopK" ||
            c.plugin == "PadfreeBeamSearchStep")
            return;
        EXPECT(workspace_of(c, profile(c, [](auto&) {})) == 0, c.label);
    });
});

// Enqueue with the case's sample shapes, `edit`ed, and null pointers: the plugin's refusal message.
std::string enqueue_refusal(const Case& c, const std::function<void(std::vector<PluginTensorDesc>&)>& edit) {
    Plugin p(create(c, c.fields));
    ErrorRecorder recorder;
    ResourceContext context(&recorder);
    Plugin attached(runtime_of(p.get())->attachToContext(&context));
    std::vector<PluginTensorDesc> io;
    for (const DynamicPluginTensorDesc& d : descs(c, io_types(c, DataType::kHALF))) io.push_back(d.desc);
    edit(io);
    std::vector<const void*> inputs(c.nb_inputs, nullptr);
    std::vector<void*> outputs(io.size() - c.nb_inputs, nullptr);
    EXPECT(runtime_of(attached.get())->enqueue(io.data(), io.data() + c.nb_inputs, inputs.data(), outputs.data(),
                                               nullptr, nullptr) != 0, c.label, " enqueue accepted");
    EXPECT(recorder.errors.size() == 1, c.label, " recorder saw ", recorder.errors.size(), " errors");
    return recorder.errors[0].second;
}

Register decoder_runtime_test("decoder_runtime_dims_checked_in_enqueue", [] {
    // Mismatches between runtime dimensions, which only enqueue sees.
    const std::string rows = enqueue_refusal(case_named("decoder_cross_attention"), [](auto& io) {
        io[0].dims.d[0] = 5, io[5].dims.d[0] = 5;  // 5 rows for 3 sources x 2 beams
    });
    EXPECT(rows.find("batch * num_beams") != std::string::npos && rows.find("got 5,") != std::string::npos, rows);
    const std::string indir = enqueue_refusal(case_named("decoder_self_attention"), [](auto& io) { io[4].dims.d[0] = 7; });
    EXPECT(indir.find("cache_indir rows: got 7,") != std::string::npos, indir);
    const std::string parents = enqueue_refusal(case_named("beam_reorder"), [](auto& io) { io[1].dims.d[0] = 5; });
    EXPECT(parents.find("parents: got 5,") != std::string::npos, parents);
    const std::string scores = enqueue_refusal(case_named("logits_topk_all_inputs"), [](auto& io) { io[2].dims.d[0] = 5; });
    EXPECT(scores.find("beam_scores: got 5,") != std::string::npos, scores);
    const std::string beam = enqueue_refusal(case_named("beam_search_step"), [](auto& io) {
        io[0].dims.d[0] = io[1].dims.d[0] = 5;  // 5 rows for 3 sources x 2 beams
    });
    EXPECT(beam.find("batch * num_beams") != std::string::npos && beam.find("got 5,") != std::string::npos, beam);
    const std::string greedy = enqueue_refusal(case_named("greedy_step"), [](auto& io) { io[3].dims.d[0] = 5; });
    EXPECT(greedy.find("generated: got 5,") != std::string::npos, greedy);
    const std::string improvable = enqueue_refusal(case_named("beam_search_step"), [](auto& io) { io[9].dims.d[0] = 4; });
    EXPECT(improvable.find("improvable: got 4,") != std::string::npos, improvable);
    // k above the vocabulary: the C ABI's refusal, before any pointer is read.
    const std::string k = enqueue_refusal(case_named("logits_topk_all_inputs"), [](auto& io) {
        io[0].dims.d[1] = io[1].dims.d[0] = 3;
    });
    EXPECT(k.find("k must be in") != std::string::npos, k);
});

}  // namespace

// Stands in for the logger TensorRT hands over through setLoggerFinder() in loadLibrary: the
// creators' refusals land here (checked below) instead of on stderr.
class CapturingLogger : public ILogger {
public:
    void log(Severity severity, const char* msg) noexcept override {
        if (severity == Severity::kERROR) errors.emplace_back(msg);
    }
    std::vector<std::string> errors;
};

class LoggerFinder : public ILoggerFinder {
public:
    ILogger* findLogger() override { return &logger; }
    CapturingLogger logger;
};

LoggerFinder& logger_finder() {
    static LoggerFinder finder;
    return finder;
}

Register logger_test("creator_errors_reach_the_logger", [] {
    const Case& c = cases().front();
    const size_t before = logger_finder().logger.errors.size();
    std::vector<FieldValue> fields = c.fields;
    fields.push_back(int_field("bogus", 0));
    EXPECT(!std::unique_ptr<IPluginV3>(create(c, fields)), "unknown field refused");
    EXPECT(logger_finder().logger.errors.size() == before + 1, "one error logged");
    const std::string& msg = logger_finder().logger.errors.back();
    EXPECT(msg.find(c.plugin) == 0 && msg.find("bogus") != std::string::npos, msg);
});

int run_all() {
    int failed = 0;
    for (const Test& t : tests()) {
        try {
            t.body();
            std::cout << "PASS " << t.name << std::endl;
        } catch (const Failure& e) {
            if (std::strncmp(e.what(), "SKIP:", 5) == 0) {
                std::cout << "SKIP " << t.name << ": " << (e.what() + 5) << std::endl;
                continue;
            }
            std::cout << "FAIL " << t.name << ": " << e.what() << std::endl;
            ++failed;
        } catch (const std::exception& e) {
            std::cout << "FAIL " << t.name << ": exception: " << e.what() << std::endl;
            ++failed;
        }
    }
    std::cout << (failed ? "FAILED " : "OK ") << failed << " of " << tests().size() << " tests failed" << std::endl;
    return failed ? 1 : 0;
}

void list_creators() {
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = getCreators(count);
    for (int32_t k = 0; k < count; ++k) {
        auto* creator = static_cast<IPluginCreatorV3One*>(creators[k]);
        std::cout << creator->getPluginName() << " " << creator->getPluginVersion() << " "
                  << creator->getPluginNamespace();
        const PluginFieldCollection* fields = creator->getFieldNames();
        for (int32_t f = 0; f < fields->nbFields; ++f) {
            std::cout << " " << fields->fields[f].name << ":"
                      << (fields->fields[f].type == PluginFieldType::kINT32 ? "int32" : "float32");
            if (fields->fields[f].data != nullptr) {  // its default (an int32 or float32)
                if (fields->fields[f].type == PluginFieldType::kINT32)
                    std::cout << "=" << *static_cast<const int32_t*>(fields->fields[f].data);
                else
                    std::cout << "=" << *static_cast<const float*>(fields->fields[f].data);
            }
        }
        std::cout << "\n";
    }
    for (const Case& c : cases()) {
        Plugin p(create(c, c.fields));
        std::cout << "io " << c.label << " " << c.plugin << " " << c.nb_inputs << " "
                  << build_of(p.get())->getNbOutputs();
        for (const FieldValue& f : c.fields)  // the int fields, which decide the optional ports
            if (f.type == PluginFieldType::kINT32) std::cout << " " << f.name << "=" << f.i;
        std::cout << "\n";
        // alias LABEL [OUTPUT:INPUT ...]: the outputs getAliasedInput shares with an input (the spec's "aliases")
        auto* build = static_cast<IPluginV3OneBuildV2*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
        std::cout << "alias " << c.label;
        for (int32_t o = 0; o < build->getNbOutputs(); ++o)
            if (build->getAliasedInput(o) >= 0) std::cout << " " << o << ":" << build->getAliasedInput(o);
        std::cout << "\n";
    }
}

}  // namespace harness
}  // namespace padfree

int main(int argc, char** argv) {
    using namespace padfree::harness;
    // Before anything calls getCreators(): what the load-time registrar did.
    g_registered_at_load = padfree_trt_statically_registered() == 1;
    g_registered_count = Registry::instance().creators.size();
    g_registered_namespaces = Registry::instance().namespaces;
    if (argc > 1 && std::string(argv[1]) == "--list") {
        list_creators();
        return 0;
    }
    setLoggerFinder(&logger_finder());
    const int rc = run_all();
    std::cout << logger_finder().logger.errors.size() << " refusals logged, e.g.: "
              << (logger_finder().logger.errors.empty() ? "" : logger_finder().logger.errors.back()) << std::endl;
    return rc;
}
