// The plugin harness's shared pieces: a tiny test registry, the plugin cases (fields, sample
// shapes and I/O kinds per node of plugins/spec/plugins.json), and creation through getCreators().
#pragma once

#include <NvInferRuntime.h>

#include <array>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" const char* padfree_trt_last_error(void);
extern "C" int padfree_trt_statically_registered(void);
extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder);

namespace padfree {
namespace harness {

struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string str(const Args&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

#define EXPECT(cond, ...)                                                                              \
    do {                                                                                               \
        if (!(cond))                                                                                   \
            throw ::padfree::harness::Failure(::padfree::harness::str(__FILE__, ":", __LINE__, ": ",   \
                                                                      #cond, " -- ", __VA_ARGS__));   \
    } while (0)

struct Test {
    std::string name;
    std::function<void()> body;
};
std::vector<Test>& tests();
struct Register {
    Register(const char* name, std::function<void()> body) { tests().push_back({name, std::move(body)}); }
};

// One build-time field value, as the ONNX parser would hand it.
struct FieldValue {
    std::string name;
    nvinfer1::PluginFieldType type;
    union {
        int32_t i;
        float f;
    };
};
FieldValue int_field(const std::string& name, int32_t value);
FieldValue float_field(const std::string& name, float value);

// I/O kinds, one letter per position (inputs, then outputs): 'i' int32, 'L' int64, 'F' float32, 'f' the
// activation dtype, 'a' any type (a float dtype is used in samples), 'm' any type carrying only a shape
// (int32 in samples), 's' same as input 0.
struct Case {
    std::string label;
    std::string plugin;
    std::vector<FieldValue> fields;
    std::string kinds;  // inputs then outputs
    int32_t nb_inputs;
    std::vector<std::vector<int64_t>> input_dims;
    std::vector<std::vector<bool>> dynamic;  // per input dim: a runtime dimension
    std::vector<std::vector<int64_t>> output_dims;  // expected, for the sample
    // Inconsistent inputs the plugin must refuse: {input, dim, value} applied to the sample.
    std::vector<std::array<int64_t, 3>> bad_dims;
    // Field values the creator must refuse.
    std::vector<FieldValue> bad_fields;
};
const std::vector<Case>& cases();
const Case& case_named(const std::string& label);
// The case's fields with the named ones replaced.
std::vector<FieldValue> with_fields(const Case& c, const std::vector<FieldValue>& changes);

nvinfer1::IPluginCreatorV3One* find_creator(const std::string& name);
// Creates through the creator from named fields (as the ONNX parser hands them at build time), or
// from a serialized blob (create_runtime).
nvinfer1::IPluginV3* create(const Case& c, const std::vector<FieldValue>& fields,
                            nvinfer1::TensorRTPhase phase = nvinfer1::TensorRTPhase::kBUILD);
nvinfer1::IPluginV3* create_runtime(const std::string& plugin, const void* blob, int32_t bytes);
nvinfer1::IPluginV3OneBuild* build_of(nvinfer1::IPluginV3* p);
nvinfer1::IPluginV3OneRuntime* runtime_of(nvinfer1::IPluginV3* p);
std::vector<uint8_t> serialize(nvinfer1::IPluginV3* p);
// Input/output types of a case for an activation dtype.
std::vector<nvinfer1::DataType> io_types(const Case& c, nvinfer1::DataType activation);

// GPU checks (gpu_checks.cpp): enqueue against the C ABI; returns a skip reason or "".
std::string gpu_skip_reason();

}  // namespace harness
}  // namespace padfree
