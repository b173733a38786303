// Argument checks shared by the row-wise families' C ABI (layernorm, embedding, activation): the
// kernels read 16-byte vectors, so widths are multiples of 8 elements and pointers 16-byte aligned.
// Host code only (kernels/common.cuh is device code, so its helpers are not used here).
#pragma once

#include <cmath>
#include <cstdint>

#include "capi_util.h"
#include "l2_prefetch.h"

namespace padfree {

inline padfree_status check_dtype(padfree_dtype dtype) {
    PADFREE_REQUIRE(dtype == PADFREE_FLOAT32 || dtype == PADFREE_FLOAT16 || dtype == PADFREE_BFLOAT16, "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16), got ",
                    static_cast<int>(dtype));
    return PADFREE_OK;
}

// name: the width's name in messages ("hidden", "cols"); max_width <= 0 means no upper bound.
inline padfree_status check_width(const char* name, int32_t width, int32_t max_width) {
    PADFREE_REQUIRE(width > 0 && width % 8 == 0, name, " must be a positive multiple of 8, got ", width);
    PADFREE_REQUIRE(max_width <= 0 || width <= max_width, name, " must be <= ", max_width, ", got ", width);
    return PADFREE_OK;
}

inline padfree_status check_eps(float eps) {
    PADFREE_REQUIRE(std::isfinite(eps) && eps >= 0.f, "eps must be finite and >= 0, got ", eps);
    return PADFREE_OK;
}

// A required tensor: not NULL and 16-byte aligned.
inline padfree_status check_tensor(const void* p, const char* name) {
    PADFREE_REQUIRE(p != nullptr, name, " is NULL");
    PADFREE_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, name, " must be 16-byte aligned (vectorized loads)");
    return PADFREE_OK;
}

// An optional tensor: NULL, or 16-byte aligned.
inline padfree_status check_optional_tensor(const void* p, const char* name) {
    return p == nullptr ? PADFREE_OK : check_tensor(p, name);
}

// An L2 prefetch range: none (NULL and 0), or memory and a byte count (any alignment: the kernel
// prefetches every 128-byte line the range touches).
inline padfree_status check_l2_prefetch(const void* p, int64_t bytes, L2Prefetch* range) {
    PADFREE_REQUIRE(bytes >= 0, "l2_prefetch_bytes must be >= 0, got ", bytes);
    PADFREE_REQUIRE(p != nullptr || bytes == 0, "l2_prefetch is NULL but l2_prefetch_bytes is ", bytes);
    *range = L2Prefetch{p, bytes};
    return PADFREE_OK;
}

}  // namespace padfree
