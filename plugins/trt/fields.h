// Plugin fields: one schema per plugin (the "fields" of plugins/spec/plugins.json), parsed from the
// named fields TensorRT's ONNX parser hands over at build time, and carried through the engine as
// one versioned byte blob that is bounds-checked and validated on the way back in.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace padfree {
namespace trt {

union Scalar {
    int32_t i;
    float f;
};

// Every padfree field is a scalar int32 or float32 (see plugins.json). A field added to a plugin after
// graphs were exported and engines built with it has a default (plugins.json "default", the value
// that keeps the old behaviour) and comes after the fields without one: a node that lacks it and a
// state blob that ends before it read as that value, so those graphs and engines still load.
struct FieldSpec {
    const char* name;
    nvinfer1::PluginFieldType type;  // kINT32 or kFLOAT32
    bool has_default = false;
    Scalar default_value{};
};

struct Schema {
    const char* plugin_name;
    std::vector<FieldSpec> fields;
};

// The single field a serialized plugin carries: kUNKNOWN bytes in the blob format below.
constexpr const char* kStateFieldName = "padfree_state";
// Bumped when the blob layout changes; engines built with another layout are refused.
constexpr uint32_t kStateFormatVersion = 1;

// Build phase: every schema field exactly once (a field with a default at most once), with its type
// and length 1. The attributes the ONNX parser consumes itself (plugin_version, plugin_namespace) are
// ignored if they reach us; any other unknown name is refused so that a drift between the exporter
// and the plugins shows at build time.
bool parse_named_fields(const Schema& schema, const nvinfer1::PluginFieldCollection* fc,
                        std::vector<Scalar>& values, std::string& error);

// Layout (host byte order, as TensorRT plans are not portable across hosts anyway):
//   "PFTR" | u32 format version | u32 name length | name bytes | u32 field count |
//   per field: u32 PluginFieldType | 4 value bytes
std::vector<uint8_t> encode_state(const Schema& schema, const std::vector<Scalar>& values);

// Runtime phase: exactly one kStateFieldName field; every read is bounds-checked and the blob must
// name this plugin, carry this format version and this schema's field types, and end exactly. Its
// field count may stop short of the schema's only before fields with a default (a blob written before
// they were added), which then take their defaults.
bool decode_state(const Schema& schema, const nvinfer1::PluginFieldCollection* fc,
                  std::vector<Scalar>& values, std::string& error);

}  // namespace trt
}  // namespace padfree
