// What every padfree plugin shares: the IPluginV3 capability plumbing, field storage and
// serialization, dtype/format rules, error reporting and the creator. A plugin file only states
// its I/O kinds, output shapes, field checks and the C ABI call of enqueue.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fields.h"
#include "padfree.h"

namespace padfree {
namespace trt {

constexpr const char* kPluginVersion = "1";      // plugins.json "version"
constexpr const char* kPluginNamespace = "padfree";  // plugins.json "namespace"

// ---- error reporting ------------------------------------------------------------------------
// Goes to the execution context's error recorder when the plugin has one (attachToContext), else to
// the logger TensorRT handed over through setLoggerFinder, else to stderr. The last message is kept
// per thread for padfree_trt_last_error().
void report_error(nvinfer1::IErrorRecorder* recorder, nvinfer1::ErrorCode code, const std::string& message);
void set_logger_finder(nvinfer1::ILoggerFinder* finder);

template <typename... Args>
std::string concat(const Args&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

// ---- dtypes ---------------------------------------------------------------------------------
bool is_activation_type(nvinfer1::DataType type);  // fp32, fp16, bf16: the C ABI's float dtypes
padfree_dtype to_padfree_dtype(nvinfer1::DataType type);
// Bytes per element of a type the padding plugins move as raw rows; 0 for sub-byte/unknown types.
int64_t element_size(nvinfer1::DataType type);
const char* type_name(nvinfer1::DataType type);

// How a plugin's input or output (by TensorRT's position: inputs, then outputs) may be typed.
// All positions use the linear format.
enum class IoKind {
    kInt32,         // int32 (ids, cu_seqlens, masks, size tensors)
    kActivation,    // fp32/fp16/bf16, the same type at every kActivation position of the plugin
    kAny,           // any type of whole bytes (only its shape or raw bytes are used)
    kSameAsInput0,  // the type of input 0 (padding plugins: rows keep their type)
};

// ---- the plugin base ------------------------------------------------------------------------
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime {
public:
    PluginBase(const Schema& schema, std::vector<Scalar> values);
    PluginBase(const PluginBase& other);
    PluginBase& operator=(const PluginBase&) = delete;
    ~PluginBase() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;

    // IPluginV3OneCore
    const char* getPluginName() const noexcept override { return schema_.plugin_name; }
    const char* getPluginVersion() const noexcept override { return kPluginVersion; }
    const char* getPluginNamespace() const noexcept override { return kPluginNamespace; }

    // IPluginV3OneBuild: types and formats follow io_kind(); shapes and enqueue are the plugin's.
    int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                            const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                               const nvinfer1::DataType* inputTypes, int32_t nbInputs) const noexcept override;
    bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* inOut,
                                   int32_t nbInputs, int32_t nbOutputs) noexcept override;
    int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                            const nvinfer1::DimsExprs* shapeInputs, int32_t nbShapeInputs,
                            nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                            nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    // The C ABI kernels take no workspace.
    size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc*, int32_t,
                            const nvinfer1::DynamicPluginTensorDesc*, int32_t) const noexcept override {
        return 0;
    }

    // IPluginV3OneRuntime
    int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                          const nvinfer1::PluginTensorDesc* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(const nvinfer1::PluginTensorDesc* inputDesc, const nvinfer1::PluginTensorDesc* outputDesc,
                    const void* const* inputs, void* const* outputs, void* workspace,
                    cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

protected:
    // What each plugin states.
    virtual int32_t expected_inputs() const = 0;
    virtual IoKind io_kind(int32_t pos) const = 0;
    // Output shapes from input shapes; returns false with `error` set on a shape it cannot take.
    virtual bool output_shapes(const nvinfer1::DimsExprs* inputs, nvinfer1::DimsExprs* outputs,
                               nvinfer1::IExprBuilder& builder, std::string& error) const = 0;
    // Concrete shapes at run time: checks the plugin cannot leave to the C ABI (consistency between
    // inputs), then the ABI call. Returns the ABI status, or sets `error` and returns INVALID_ARGUMENT.
    virtual padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                               const void* const* inputs, void* const* outputs, cudaStream_t stream,
                               std::string& error) const = 0;

    int32_t field_i32(size_t index) const { return values_[index].i; }
    float field_f32(size_t index) const { return values_[index].f; }
    // Reports through this plugin's recorder, prefixed with the plugin's name; returns 1 (failure).
    int32_t fail(nvinfer1::ErrorCode code, const std::string& message) const;

private:
    bool check_io_counts(int32_t nbInputs, int32_t nbOutputs, const char* where) const;

    const Schema& schema_;
    std::vector<Scalar> values_;
    nvinfer1::IErrorRecorder* recorder_ = nullptr;
    std::vector<uint8_t> state_;  // backs serialized_ while TensorRT reads it
    nvinfer1::PluginField serialized_;
    nvinfer1::PluginFieldCollection serialized_collection_{};
};

// Clone through the most-derived copy constructor, as TensorRT needs a full IPluginV3 copy.
template <class Derived>
class Plugin : public PluginBase {
public:
    using PluginBase::PluginBase;
    nvinfer1::IPluginV3* clone() noexcept override {
        try {
            return new Derived(static_cast<const Derived&>(*this));
        } catch (const std::exception& e) {
            fail(nvinfer1::ErrorCode::kFAILED_ALLOCATION, concat("clone failed: ", e.what()));
            return nullptr;
        }
    }
};

// ---- shape and range helpers for plugins ------------------------------------------------------
// An int64 TensorRT dimension handed to an int32 ABI argument.
bool to_i32(int64_t value, const char* what, int32_t& out, std::string& error);
// Bytes of one row: the product of dims[first..] times the element size.
bool row_bytes(const nvinfer1::PluginTensorDesc& desc, int32_t first, int64_t& out, std::string& error);
bool check_rank(const nvinfer1::DimsExprs& dims, int32_t rank, const char* name, std::string& error);
bool check_rank(const nvinfer1::PluginTensorDesc& desc, int32_t rank, const char* name, std::string& error);
// Two extents that must agree (a weight's length and the activations' width, say); the C ABI
// takes one of them, so a mismatch caught here is an out-of-bounds access avoided.
bool check_same(int64_t value, int64_t expected, const char* what, std::string& error);
// Where both are build-time constants, the same check while the network is built.
bool check_same(const nvinfer1::IDimensionExpr* value, const nvinfer1::IDimensionExpr* expected, const char* what,
                std::string& error);
// A per-channel vector (gamma, beta, bias): rank 1 and `length` long, at run time and, where
// constant, at build time.
bool check_vector(const nvinfer1::PluginTensorDesc& desc, int64_t length, const char* name, std::string& error);
bool check_vector(const nvinfer1::DimsExprs& dims, const nvinfer1::IDimensionExpr* length, const char* name,
                  std::string& error);
// Field checks shared by the plugins.
bool check_epsilon(float epsilon, std::string& error);

// ---- the creator ----------------------------------------------------------------------------
// P provides: static const Schema& schema(); static bool validate(const std::vector<Scalar>&, std::string&);
// and a constructor P(std::vector<Scalar>).
class CreatorBase : public nvinfer1::IPluginCreatorV3One {
public:
    explicit CreatorBase(const Schema& schema);
    const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override { return &field_names_; }
    const char* getPluginName() const noexcept override { return schema_.plugin_name; }
    const char* getPluginVersion() const noexcept override { return kPluginVersion; }
    const char* getPluginNamespace() const noexcept override { return kPluginNamespace; }
    nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                      nvinfer1::TensorRTPhase phase) noexcept override;

protected:
    virtual bool validate(const std::vector<Scalar>& values, std::string& error) const = 0;
    virtual nvinfer1::IPluginV3* make(std::vector<Scalar> values) const = 0;

private:
    const Schema& schema_;
    std::vector<nvinfer1::PluginField> fields_;
    nvinfer1::PluginFieldCollection field_names_{};
};

template <class P>
class Creator final : public CreatorBase {
public:
    Creator() : CreatorBase(P::schema()) {}

protected:
    bool validate(const std::vector<Scalar>& values, std::string& error) const override {
        return P::validate(values, error);
    }
    nvinfer1::IPluginV3* make(std::vector<Scalar> values) const override { return new P(std::move(values)); }
};

}  // namespace trt
}  // namespace padfree
