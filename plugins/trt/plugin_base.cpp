#include "plugin_base.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>

using namespace nvinfer1;

namespace padfree {
namespace trt {

// ---- error reporting ------------------------------------------------------------------------
namespace {
std::atomic<ILoggerFinder*> g_logger_finder{nullptr};
thread_local std::string g_last_error;
}  // namespace

void set_logger_finder(ILoggerFinder* finder) { g_logger_finder.store(finder); }

void report_error(IErrorRecorder* recorder, ErrorCode code, const std::string& message) {
    g_last_error = message;
    if (recorder != nullptr) {
        recorder->reportError(code, message.c_str());
        return;
    }
    ILoggerFinder* finder = g_logger_finder.load();
    ILogger* logger = finder ? finder->findLogger() : nullptr;
    if (logger != nullptr) {
        logger->log(ILogger::Severity::kERROR, message.c_str());
        return;
    }
    std::fprintf(stderr, "padfree_trt error: %s\n", message.c_str());
}

// ---- dtypes ---------------------------------------------------------------------------------
bool is_activation_type(DataType type) {
    return type == DataType::kFLOAT || type == DataType::kHALF || type == DataType::kBF16;
}

padfree_dtype to_padfree_dtype(DataType type) {
    switch (type) {
        case DataType::kHALF: return PADFREE_FLOAT16;
        case DataType::kBF16: return PADFREE_BFLOAT16;
        default: return PADFREE_FLOAT32;
    }
}

int64_t element_size(DataType type) {
    switch (type) {
        case DataType::kFLOAT: case DataType::kINT32: return 4;
        case DataType::kHALF: case DataType::kBF16: return 2;
        case DataType::kINT8: case DataType::kUINT8: case DataType::kBOOL: case DataType::kFP8: return 1;
        case DataType::kINT64: return 8;
        default: return 0;
    }
}

const char* type_name(DataType type) {
    switch (type) {
        case DataType::kFLOAT: return "float32";
        case DataType::kHALF: return "float16";
        case DataType::kBF16: return "bfloat16";
        case DataType::kINT32: return "int32";
        case DataType::kINT64: return "int64";
        case DataType::kINT8: return "int8";
        case DataType::kUINT8: return "uint8";
        case DataType::kBOOL: return "bool";
        default: return "an unsupported type";
    }
}

// ---- shape helpers --------------------------------------------------------------------------
bool to_i32(int64_t value, const char* what, int32_t& out, std::string& error) {
    if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
        error = concat(what, " = ", value, " is out of the int32 range the kernels take");
        return false;
    }
    out = static_cast<int32_t>(value);
    return true;
}

bool row_bytes(const PluginTensorDesc& desc, int32_t first, int64_t& out, std::string& error) {
    int64_t bytes = element_size(desc.type);
    if (bytes == 0) {
        error = concat("rows of ", type_name(desc.type), " cannot be moved as bytes");
        return false;
    }
    for (int32_t k = first; k < desc.dims.nbDims; ++k) {
        const int64_t d = desc.dims.d[k];
        if (d < 0 || (d > 0 && bytes > std::numeric_limits<int64_t>::max() / d)) {
            error = concat("row size overflows at dimension ", k);
            return false;
        }
        bytes *= d;
    }
    out = bytes;
    return true;
}

bool check_rank(const DimsExprs& dims, int32_t rank, const char* name, std::string& error) {
    if (dims.nbDims == rank) return true;
    error = concat(name, ": expected rank ", rank, ", got rank ", dims.nbDims);
    return false;
}

bool check_rank(const PluginTensorDesc& desc, int32_t rank, const char* name, std::string& error) {
    if (desc.dims.nbDims == rank) return true;
    error = concat(name, ": expected rank ", rank, ", got rank ", desc.dims.nbDims);
    return false;
}

bool check_same(int64_t value, int64_t expected, const char* what, std::string& error) {
    if (value == expected) return true;
    error = concat(what, ": got ", value, ", expected ", expected);
    return false;
}

bool check_same(const IDimensionExpr* value, const IDimensionExpr* expected, const char* what, std::string& error) {
    if (value == nullptr || expected == nullptr || !value->isConstant() || !expected->isConstant()) return true;
    return check_same(value->getConstantValue(), expected->getConstantValue(), what, error);
}

bool check_vector(const PluginTensorDesc& desc, int64_t length, const char* name, std::string& error) {
    return check_rank(desc, 1, name, error) && check_same(desc.dims.d[0], length, name, error);
}

bool check_vector(const DimsExprs& dims, const IDimensionExpr* length, const char* name, std::string& error) {
    return check_rank(dims, 1, name, error) && check_same(dims.d[0], length, name, error);
}

// The C ABI's rule (rowwise_checks.h check_eps), so that a plugin accepts what its kernel runs.
bool check_epsilon(float epsilon, std::string& error) {
    if (std::isfinite(epsilon) && epsilon >= 0.0f) return true;
    error = concat("epsilon = ", epsilon, ": expected a finite epsilon >= 0");
    return false;
}

bool check_heads(int64_t num_heads, int64_t head_dim, int64_t width_factor, std::string& error) {
    if (num_heads > 0 && head_dim > 0 && num_heads <= INT32_MAX / width_factor / head_dim) return true;
    error = concat("num_heads = ", num_heads, ", head_dim = ", head_dim, ": expected positive sizes with ", width_factor,
                   " * num_heads * head_dim <= 2^31 - 1");
    return false;
}

bool check_softmax_scale(float scale, std::string& error) {
    if (scale > 0.0f && std::isfinite(scale)) return true;
    error = concat("softmax_scale = ", scale, ": expected a finite positive scale");
    return false;
}

bool check_flag(int32_t value, const char* name, std::string& error) {
    if (value == 0 || value == 1) return true;
    error = concat(name, " = ", value, ": expected 0 or 1");
    return false;
}

int64_t queried_bytes(padfree_status status, int64_t bytes, std::string& error) {
    if (status == PADFREE_OK) return bytes;
    error = padfree_last_error();
    return -1;
}

padfree_status copy_unaliased_state(const PluginTensorDesc* in, const void* const* inputs, void* const* outputs,
                                    int32_t first_input, int32_t first_output, int32_t count, cudaStream_t stream,
                                    std::string& error) {
    for (int32_t k = 0; k < count; ++k) {
        const int32_t input = first_input + k, output = first_output + k;
        int64_t bytes = 0;
        if (!row_bytes(in[input], 0, bytes, error)) return PADFREE_ERROR_INVALID_ARGUMENT;
        if (outputs[output] == inputs[input] || bytes == 0) continue;
        const cudaError_t copied =
            cudaMemcpyAsync(outputs[output], inputs[input], bytes, cudaMemcpyDeviceToDevice, stream);
        if (copied != cudaSuccess) {
            error = concat("copying input ", input, " into its output: ", cudaGetErrorString(copied));
            return PADFREE_ERROR_CUDA;
        }
    }
    return PADFREE_OK;
}

// ---- PluginBase -----------------------------------------------------------------------------
PluginBase::PluginBase(const Schema& schema, std::vector<Scalar> values)
    : schema_(schema), values_(std::move(values)) {}

// TensorRT's recorder and allocator stay with the context the original was attached to, and its
// scratch with it; a clone starts without any.
PluginBase::PluginBase(const PluginBase& other)
    : IPluginV3(other), IPluginV3OneCore(other), IPluginV3OneBuildV2(other), IPluginV3OneRuntime(other),
      schema_(other.schema_), values_(other.values_) {}

PluginBase::~PluginBase() { release_scratch(); }

void PluginBase::release_scratch() noexcept {
    if (scratch_ == nullptr) return;
    // Stream-ordered frees would need the stream the scratch was last used on; a plugin is destroyed
    // after its context's work, so the synchronous free is safe and simple.
    if (allocator_ != nullptr) {
        allocator_->deallocateAsync(scratch_, nullptr);
    } else {
        cudaFree(scratch_);
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
}

int32_t PluginBase::reserve_scratch(const PluginTensorDesc* in, bool quiet_query) noexcept {
    std::string error;
    int64_t bytes = -1;
    try {
        bytes = workspace_bytes_at(in, error);
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (bytes < 0) return quiet_query ? 0 : fail(ErrorCode::kINVALID_ARGUMENT, concat("own workspace: ", error));
    if (bytes <= scratch_bytes_) return 0;
    release_scratch();
    void* memory = nullptr;
    if (allocator_ != nullptr) {
        memory = allocator_->allocateAsync(static_cast<uint64_t>(bytes), 256, 0, nullptr);
    } else if (cudaMalloc(&memory, static_cast<size_t>(bytes)) != cudaSuccess) {
        cudaGetLastError();  // clear it: the failure is reported below
        memory = nullptr;
    }
    if (memory == nullptr)
        return fail(ErrorCode::kFAILED_ALLOCATION, concat("own workspace: ", bytes, " bytes could not be allocated"));
    scratch_ = memory;
    scratch_bytes_ = bytes;
    return 0;
}

IPluginCapability* PluginBase::getCapabilityInterface(PluginCapabilityType type) noexcept {
    switch (type) {
        case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
        case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuildV2*>(this);
        case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

int32_t PluginBase::fail(ErrorCode code, const std::string& message) const {
    report_error(recorder_, code, concat(schema_.plugin_name, ": ", message));
    return 1;
}

bool PluginBase::check_io_counts(int32_t nbInputs, int32_t nbOutputs, const char* where) const {
    if (nbInputs == expected_inputs() && nbOutputs == getNbOutputs()) return true;
    fail(ErrorCode::kINVALID_ARGUMENT,
         concat(where, ": expected ", expected_inputs(), " inputs and ", getNbOutputs(), " outputs, got ",
                nbInputs, " and ", nbOutputs, " (see plugins/spec/plugins.json)"));
    return false;
}

int32_t PluginBase::configurePlugin(const DynamicPluginTensorDesc*, int32_t nbInputs,
                                    const DynamicPluginTensorDesc*, int32_t nbOutputs) noexcept {
    return check_io_counts(nbInputs, nbOutputs, "configurePlugin") ? 0 : 1;
}

int32_t PluginBase::onShapeChange(const PluginTensorDesc* in, int32_t nbInputs, const PluginTensorDesc*,
                                  int32_t nbOutputs) noexcept {
    if (!check_io_counts(nbInputs, nbOutputs, "onShapeChange")) return 1;
    // TensorRT calls this before enqueue whenever the shapes change, outside any stream capture: the
    // place to allocate.
    return owns_workspace() ? reserve_scratch(in, false) : 0;
}

int32_t PluginBase::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs, const DataType* inputTypes,
                                       int32_t nbInputs) const noexcept {
    if (!check_io_counts(nbInputs, nbOutputs, "getOutputDataTypes")) return 1;
    // Strongly typed networks hand us the ONNX types: refuse a mix here, where the message can
    // name the input, rather than letting supportsFormatCombination find no combination.
    int32_t activation_input = -1;
    for (int32_t k = 0; k < nbInputs; ++k) {
        const IoKind kind = io_kind(k);
        const DataType type = inputTypes[k];
        if (kind == IoKind::kInt32 && type != DataType::kINT32)
            return fail(ErrorCode::kINVALID_ARGUMENT, concat("input ", k, " must be int32, got ", type_name(type)));
        if (kind == IoKind::kFloat32 && type != DataType::kFLOAT)
            return fail(ErrorCode::kINVALID_ARGUMENT, concat("input ", k, " must be float32, got ", type_name(type)));
        if (kind == IoKind::kInt64 && type != DataType::kINT64)
            return fail(ErrorCode::kINVALID_ARGUMENT, concat("input ", k, " must be int64, got ", type_name(type)));
        if (kind == IoKind::kActivation) {
            if (!is_activation_type(type))
                return fail(ErrorCode::kINVALID_ARGUMENT,
                            concat("input ", k, " must be float32, float16 or bfloat16, got ", type_name(type)));
            if (activation_input < 0) {
                activation_input = k;
            } else if (type != inputTypes[activation_input]) {
                return fail(ErrorCode::kINVALID_ARGUMENT,
                            concat("input ", k, " is ", type_name(type), " but input ", activation_input, " is ",
                                   type_name(inputTypes[activation_input]), ": float inputs share one dtype"));
            }
        }
        if ((kind == IoKind::kAny || kind == IoKind::kSameAsInput0) && element_size(type) == 0)
            return fail(ErrorCode::kINVALID_ARGUMENT, concat("input ", k, " has ", type_name(type)));
    }
    for (int32_t k = 0; k < nbOutputs; ++k) {
        switch (io_kind(nbInputs + k)) {
            case IoKind::kInt32: outputTypes[k] = DataType::kINT32; break;
            case IoKind::kFloat32: outputTypes[k] = DataType::kFLOAT; break;
            case IoKind::kInt64: outputTypes[k] = DataType::kINT64; break;
            case IoKind::kSameAsInput0: outputTypes[k] = inputTypes[0]; break;
            case IoKind::kActivation:
                if (activation_input < 0) return fail(ErrorCode::kINTERNAL_ERROR, "no float input to type the output");
                outputTypes[k] = inputTypes[activation_input];
                break;
            case IoKind::kAny: return fail(ErrorCode::kINTERNAL_ERROR, "an output of any type");
        }
    }
    return 0;
}

bool PluginBase::supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* inOut, int32_t nbInputs,
                                           int32_t nbOutputs) noexcept {
    if (pos < 0 || pos >= nbInputs + nbOutputs || nbInputs != expected_inputs()) return false;
    const PluginTensorDesc& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR) return false;
    switch (io_kind(pos)) {
        case IoKind::kInt32: return desc.type == DataType::kINT32;
        case IoKind::kFloat32: return desc.type == DataType::kFLOAT;
        case IoKind::kInt64: return desc.type == DataType::kINT64;
        case IoKind::kAny: return element_size(desc.type) != 0;
        case IoKind::kSameAsInput0: return pos == 0 ? element_size(desc.type) != 0 : desc.type == inOut[0].desc.type;
        case IoKind::kActivation:
            if (!is_activation_type(desc.type)) return false;
            // Only positions before `pos` are settled (TensorRT's rule); the first one sets the type.
            for (int32_t k = 0; k < pos; ++k)
                if (io_kind(k) == IoKind::kActivation) return desc.type == inOut[k].desc.type;
            return true;
    }
    return false;
}

int32_t PluginBase::getOutputShapes(const DimsExprs* inputs, int32_t nbInputs, const DimsExprs*, int32_t,
                                    DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept {
    if (!check_io_counts(nbInputs, nbOutputs, "getOutputShapes")) return 1;
    std::string error;
    try {
        if (output_shapes(inputs, outputs, exprBuilder, error)) return 0;
    } catch (const std::exception& e) {
        error = e.what();
    }
    return fail(ErrorCode::kINVALID_ARGUMENT, error);
}

int32_t PluginBase::enqueue(const PluginTensorDesc* inputDesc, const PluginTensorDesc* outputDesc,
                            const void* const* inputs, void* const* outputs, void* workspace,
                            cudaStream_t stream) noexcept {
    std::string error;
    padfree_status status = PADFREE_ERROR_INVALID_ARGUMENT;
    if (owns_workspace()) {
        // onShapeChange reserved it for these shapes; a direct caller that skipped it gets it here.
        // Shapes the query refuses are left to run(), whose checks name what is wrong.
        if (reserve_scratch(inputDesc, true) != 0) return 1;
        workspace = scratch_;
    }
    try {
        status = run(inputDesc, outputDesc, inputs, outputs, workspace, stream, error);
    } catch (const std::exception& e) {
        return fail(ErrorCode::kINTERNAL_ERROR, concat("enqueue: ", e.what()));
    }
    if (status == PADFREE_OK) return 0;
    if (error.empty()) error = padfree_last_error();
    const ErrorCode code = status == PADFREE_ERROR_INVALID_ARGUMENT ? ErrorCode::kINVALID_ARGUMENT
                           : status == PADFREE_ERROR_UNSUPPORTED    ? ErrorCode::kINVALID_CONFIG
                                                                    : ErrorCode::kFAILED_EXECUTION;
    return fail(code, concat("enqueue: ", padfree_status_string(status), ": ", error));
}

IPluginV3* PluginBase::attachToContext(IPluginResourceContext* context) noexcept {
    IPluginV3* copy = clone();
    if (copy != nullptr && context != nullptr) {
        static_cast<PluginBase*>(copy)->recorder_ = context->getErrorRecorder();
        static_cast<PluginBase*>(copy)->allocator_ = context->getGpuAllocator();
    }
    return copy;
}

const PluginFieldCollection* PluginBase::getFieldsToSerialize() noexcept {
    try {
        state_ = encode_state(schema_, values_);
    } catch (const std::exception& e) {
        fail(ErrorCode::kFAILED_ALLOCATION, concat("serialization failed: ", e.what()));
        return nullptr;
    }
    serialized_ = PluginField(kStateFieldName, state_.data(), PluginFieldType::kUNKNOWN,
                              static_cast<int32_t>(state_.size()));
    serialized_collection_.nbFields = 1;
    serialized_collection_.fields = &serialized_;
    return &serialized_collection_;
}

// ---- CreatorBase ----------------------------------------------------------------------------
CreatorBase::CreatorBase(const Schema& schema) : schema_(schema) {
    // A field's data points at its default where it has one (else NULL), so that what a creator takes
    // is fully described by getFieldNames (the harness checks the defaults against plugins.json).
    for (const FieldSpec& spec : schema_.fields)
        fields_.emplace_back(spec.name, spec.has_default ? &spec.default_value : nullptr, spec.type, 1);
    field_names_.nbFields = static_cast<int32_t>(fields_.size());
    field_names_.fields = fields_.data();
}

IPluginV3* CreatorBase::createPlugin(const char* name, const PluginFieldCollection* fc,
                                     TensorRTPhase phase) noexcept {
    std::string error;
    try {
        std::vector<Scalar> values;
        const bool parsed = phase == TensorRTPhase::kRUNTIME ? decode_state(schema_, fc, values, error)
                                                             : parse_named_fields(schema_, fc, values, error);
        if (parsed && validate(values, error)) return make(std::move(values));
    } catch (const std::exception& e) {
        error = concat("internal error: ", e.what());
    }
    report_error(nullptr, ErrorCode::kINVALID_ARGUMENT,
                 concat(schema_.plugin_name, " (layer ", name ? name : "?", "): ", error));
    return nullptr;
}

}  // namespace trt
}  // namespace padfree

extern "C" __attribute__((visibility("default"))) const char* padfree_trt_last_error(void) {
    return padfree::trt::g_last_error.c_str();
}
