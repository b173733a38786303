// Test doubles for what TensorRT hands a plugin while it builds and runs: shape expressions (an
// IExprBuilder that evaluates as it goes), an error recorder, a resource context and a plugin
// registry. TensorRT's own implementations live in libnvinfer, which this harness must not need.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace padfree {
namespace harness {

// An expression that carries its value for the sample shape; "dynamic" ones report not constant,
// as TensorRT's do for runtime dimensions, so a plugin that wrongly relies on constants shows.
class Expr : public nvinfer1::IDimensionExpr {
public:
    Expr(int64_t value, bool constant, bool size_tensor);
    ~Expr() noexcept override = default;
    int64_t value() const { return value_; }

private:
    struct Impl : nvinfer1::apiv::VDimensionExpr {
        const Expr* self = nullptr;
        bool isConstant() const override;
        int64_t getConstantValue() const override;
        bool isSizeTensor() const override;
    };
    Impl impl_;
    int64_t value_;
    bool constant_;
    bool size_tensor_;
};

struct SizeTensorDecl {
    int32_t output_index;
    int64_t opt;
    int64_t upper;
};

class ExprBuilder : public nvinfer1::IExprBuilder {
public:
    ExprBuilder();
    ~ExprBuilder() noexcept override = default;
    const Expr* make(int64_t value, bool constant, bool size_tensor = false);
    // dims: the sample shape; dynamic[k] marks runtime dimensions.
    nvinfer1::DimsExprs dims(const std::vector<int64_t>& values, const std::vector<bool>& dynamic);
    // Value of output dimensions (nullptr entries become -1).
    static std::vector<int64_t> values(const nvinfer1::DimsExprs& dims);

    // What declareSizeTensor recorded; the size tensor's sample value is `size_tensor_value`.
    std::vector<SizeTensorDecl> declared;
    int64_t size_tensor_value = 0;

private:
    struct Impl : nvinfer1::apiv::VExprBuilder {
        ExprBuilder* self = nullptr;
        const nvinfer1::IDimensionExpr* constant(int64_t value) override;
        const nvinfer1::IDimensionExpr* operation(nvinfer1::DimensionOperation op, const nvinfer1::IDimensionExpr& a,
                                                  const nvinfer1::IDimensionExpr& b) override;
        const nvinfer1::IDimensionExpr* declareSizeTensor(int32_t outputIndex, const nvinfer1::IDimensionExpr& opt,
                                                          const nvinfer1::IDimensionExpr& upper) override;
    };
    Impl impl_;
    std::deque<std::unique_ptr<Expr>> pool_;
};

class ErrorRecorder : public nvinfer1::IErrorRecorder {
public:
    int32_t getNbErrors() const noexcept override { return static_cast<int32_t>(errors.size()); }
    nvinfer1::ErrorCode getErrorCode(int32_t k) const noexcept override { return errors[k].first; }
    ErrorDesc getErrorDesc(int32_t k) const noexcept override { return errors[k].second.c_str(); }
    bool hasOverflowed() const noexcept override { return false; }
    void clear() noexcept override { errors.clear(); }
    bool reportError(nvinfer1::ErrorCode code, ErrorDesc desc) noexcept override {
        errors.emplace_back(code, desc ? desc : "");
        return true;
    }
    RefCount incRefCount() noexcept override { return 1; }
    RefCount decRefCount() noexcept override { return 0; }
    std::vector<std::pair<nvinfer1::ErrorCode, std::string>> errors;
};

class ResourceContext : public nvinfer1::IPluginResourceContext {
public:
    explicit ResourceContext(nvinfer1::IErrorRecorder* recorder) : recorder_(recorder) {}
    nvinfer1::IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override { return recorder_; }

private:
    nvinfer1::IErrorRecorder* recorder_;
};

// Records registrations; the harness exports getPluginRegistry() returning the one instance, so
// libpadfree_trt's load-time registrar finds it exactly as it would find libnvinfer's.
class Registry : public nvinfer1::IPluginRegistry {
public:
    static Registry& instance();
    void setErrorRecorder(nvinfer1::IErrorRecorder*) noexcept override {}
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
    bool isParentSearchEnabled() const override { return false; }
    void setParentSearchEnabled(bool) override {}
    PluginLibraryHandle loadLibrary(const char*) noexcept override { return nullptr; }
    void deregisterLibrary(PluginLibraryHandle) noexcept override {}
    bool registerCreator(nvinfer1::IPluginCreatorInterface& creator, const char* ns) noexcept override;
    nvinfer1::IPluginCreatorInterface* const* getAllCreators(int32_t* count) const noexcept override;
    nvinfer1::IPluginCreatorInterface* getCreator(const char*, const char*, const char*) noexcept override {
        return nullptr;
    }
    bool deregisterCreator(const nvinfer1::IPluginCreatorInterface& creator) noexcept override;
    nvinfer1::IPluginResource* acquirePluginResource(const char*, nvinfer1::IPluginResource*) noexcept override {
        return nullptr;
    }
    int32_t releasePluginResource(const char*) noexcept override { return 0; }
    nvinfer1::IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* count) noexcept override {
        return getAllCreators(count);
    }

    std::vector<nvinfer1::IPluginCreatorInterface*> creators;
    std::vector<std::string> namespaces;
};

}  // namespace harness
}  // namespace padfree
