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
    kFloat32,       // fp32 whatever the activation dtype (beam scores, top-k scores)
    kInt64,         // int64 (the beam search's sequences and tokens, HF's dtype)
};

// ---- the plugin base ------------------------------------------------------------------------
// The build capability is IPluginV3OneBuildV2 (TensorRT >= 10.3): getAliasedInput() lets a plugin
// that updates a tensor in place (the decoder's K/V cache) alias an output to an input; the others
// keep its default (-1: no alias).
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuildV2,
                   public nvinfer1::IPluginV3OneRuntime {
public:
    PluginBase(const Schema& schema, std::vector<Scalar> values);
    PluginBase(const PluginBase& other);
    PluginBase& operator=(const PluginBase&) = delete;
    ~PluginBase() override;

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
    // Most C ABI kernels take no workspace; the decoder plugins override this with the C ABI's
    // *_workspace_size query at the profile's maxima, and get that memory as run()'s `workspace`.
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
    // `workspace`: what TensorRT allocated for getWorkspaceSize (null where that is 0).
    virtual padfree_status run(const nvinfer1::PluginTensorDesc* in, const nvinfer1::PluginTensorDesc* out,
                               const void* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream,
                               std::string& error) const = 0;

    // A plugin whose own_workspace field is 1 holds its scratch instead of asking TensorRT for a
    // workspace (TensorRT-RTX cannot give one to a plugin inside a loop: docs/PLUGINS.md). It answers
    // getWorkspaceSize with 0 and states here the C ABI's query at the run-time shapes; the base
    // allocates that much when the shapes change (through the context's GPU allocator, cudaMalloc
    // without one) and hands it to run() as `workspace`.
    virtual bool owns_workspace() const { return false; }
    // Bytes of scratch at these shapes; -1 with `error` set where the query fails.
    virtual int64_t workspace_bytes_at(const nvinfer1::PluginTensorDesc* in, std::string& error) const {
        (void)in, (void)error;
        return 0;
    }

    int32_t field_i32(size_t index) const { return values_[index].i; }
    float field_f32(size_t index) const { return values_[index].f; }
    // Reports through this plugin's recorder, prefixed with the plugin's name; returns 1 (failure).
    int32_t fail(nvinfer1::ErrorCode code, const std::string& message) const;

private:
    bool check_io_counts(int32_t nbInputs, int32_t nbOutputs, const char* where) const;
    // Grows the held scratch to workspace_bytes_at(in); 0 on success, else the failure reported (a
    // failed size query too, unless quiet_query).
    int32_t reserve_scratch(const nvinfer1::PluginTensorDesc* in, bool quiet_query) noexcept;
    void release_scratch() noexcept;

    const Schema& schema_;
    std::vector<Scalar> values_;
    nvinfer1::IErrorRecorder* recorder_ = nullptr;
    nvinfer1::IGpuAllocator* allocator_ = nullptr;  // the context's (attachToContext); null: cudaMalloc
    void* scratch_ = nullptr;                       // own_workspace's memory, never shared with a clone
    int64_t scratch_bytes_ = 0;
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
// num_heads, head_dim > 0 with width_factor * num_heads * head_dim <= 2^31 - 1 (divided, never
// multiplied: a corrupt blob's sizes near INT32_MAX would overflow even int64). Which head_dim values
// are built is the kernel library's to say (PADFREE_ERROR_UNSUPPORTED from enqueue).
bool check_heads(int64_t num_heads, int64_t head_dim, int64_t width_factor, std::string& error);
bool check_softmax_scale(float scale, std::string& error);
// A field that is a 0/1 flag (has_bias, normalize).
bool check_flag(int32_t value, const char* name, std::string& error);
// The bytes a C ABI workspace query answered, or -1 with the C ABI's message in error.
int64_t queried_bytes(padfree_status status, int64_t bytes, std::string& error);
// Read-modify-write plugins (outputs aliased to inputs, getAliasedInput): the kernel updates the output
// buffers in place, so each of the `count` state inputs from `first_input` that TensorRT did not alias
// (handed a buffer of its own) is copied into its output from `first_output` first, stream-ordered; an
// aliased one is already there. PADFREE_OK, or the failure with `error` set.
padfree_status copy_unaliased_state(const nvinfer1::PluginTensorDesc* in, const void* const* inputs,
                                    void* const* outputs, int32_t first_input, int32_t first_output, int32_t count,
                                    cudaStream_t stream, std::string& error);
// A workspace query of the C ABI for every row count of a profile's range [min_rows, max_rows]: the
// largest answer (the kernels' split counts are not monotonic in the rows), 0 where the query fails
// (enqueue then reports the C ABI's refusal).
template <class Query>
size_t max_workspace_over_rows(int64_t min_rows, int64_t max_rows, Query query) {
    int64_t most = 0;
    for (int64_t rows = min_rows < 1 ? 1 : min_rows; rows <= max_rows && rows <= INT32_MAX; ++rows) {
        int64_t bytes = 0;
        if (query(static_cast<int32_t>(rows), &bytes) != PADFREE_OK) return 0;
        if (bytes > most) most = bytes;
    }
    return static_cast<size_t>(most);
}

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
