#include "expr_double.h"

#include <algorithm>
#include <limits>

using namespace nvinfer1;

namespace padfree {
namespace harness {

Expr::Expr(int64_t value, bool constant, bool size_tensor)
    : value_(value), constant_(constant), size_tensor_(size_tensor) {
    impl_.self = this;
    mImpl = &impl_;
}

bool Expr::Impl::isConstant() const { return self->constant_; }
int64_t Expr::Impl::getConstantValue() const {
    return self->constant_ ? self->value_ : std::numeric_limits<int64_t>::min();
}
bool Expr::Impl::isSizeTensor() const { return self->size_tensor_; }

ExprBuilder::ExprBuilder() {
    impl_.self = this;
    mImpl = &impl_;
}

const Expr* ExprBuilder::make(int64_t value, bool constant, bool size_tensor) {
    pool_.push_back(std::make_unique<Expr>(value, constant, size_tensor));
    return pool_.back().get();
}

DimsExprs ExprBuilder::dims(const std::vector<int64_t>& values, const std::vector<bool>& dynamic) {
    DimsExprs out{};
    out.nbDims = static_cast<int32_t>(values.size());
    for (size_t k = 0; k < values.size(); ++k) out.d[k] = make(values[k], !dynamic[k]);
    return out;
}

std::vector<int64_t> ExprBuilder::values(const DimsExprs& dims) {
    std::vector<int64_t> out;
    for (int32_t k = 0; k < dims.nbDims; ++k)
        out.push_back(dims.d[k] ? static_cast<const Expr*>(dims.d[k])->value() : -1);
    return out;
}

const IDimensionExpr* ExprBuilder::Impl::constant(int64_t value) { return self->make(value, true); }

const IDimensionExpr* ExprBuilder::Impl::operation(DimensionOperation op, const IDimensionExpr& a,
                                                   const IDimensionExpr& b) {
    const int64_t x = static_cast<const Expr&>(a).value(), y = static_cast<const Expr&>(b).value();
    int64_t r = 0;
    switch (op) {
        case DimensionOperation::kSUM: r = x + y; break;
        case DimensionOperation::kPROD: r = x * y; break;
        case DimensionOperation::kMAX: r = std::max(x, y); break;
        case DimensionOperation::kMIN: r = std::min(x, y); break;
        case DimensionOperation::kSUB: r = x - y; break;
        case DimensionOperation::kEQUAL: r = x == y; break;
        case DimensionOperation::kLESS: r = x < y; break;
        case DimensionOperation::kFLOOR_DIV: r = y ? x / y : 0; break;
        case DimensionOperation::kCEIL_DIV: r = y ? (x + y - 1) / y : 0; break;
    }
    return self->make(r, a.isConstant() && b.isConstant());
}

const IDimensionExpr* ExprBuilder::Impl::declareSizeTensor(int32_t outputIndex, const IDimensionExpr& opt,
                                                           const IDimensionExpr& upper) {
    self->declared.push_back({outputIndex, static_cast<const Expr&>(opt).value(), static_cast<const Expr&>(upper).value()});
    return self->make(self->size_tensor_value, false, true);
}

Registry& Registry::instance() {
    static Registry registry;
    return registry;
}

bool Registry::registerCreator(IPluginCreatorInterface& creator, const char* ns) noexcept {
    creators.push_back(&creator);
    namespaces.emplace_back(ns ? ns : "");
    return true;
}

IPluginCreatorInterface* const* Registry::getAllCreators(int32_t* count) const noexcept {
    *count = static_cast<int32_t>(creators.size());
    return creators.data();
}

bool Registry::deregisterCreator(const IPluginCreatorInterface& creator) noexcept {
    auto it = std::find(creators.begin(), creators.end(), &creator);
    if (it == creators.end()) return false;
    namespaces.erase(namespaces.begin() + (it - creators.begin()));
    creators.erase(it);
    return true;
}

}  // namespace harness
}  // namespace padfree

// What libnvinfer exports; found by libpadfree_trt's static registrar through dlsym(RTLD_DEFAULT).
extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginRegistry* getPluginRegistry() noexcept {
    return &padfree::harness::Registry::instance();
}
