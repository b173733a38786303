// Shared plumbing of the C ABI: the thread-local last error and argument/CUDA checks that turn
// into status codes. Only the capi/*.cpp files include this; kernels stay free of it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "padfree.h"

namespace padfree {

void set_last_error(const std::string& message);

inline cudaStream_t as_cuda_stream(padfree_stream stream) {
    return static_cast<cudaStream_t>(stream);
}

// Formats its arguments into one message: fail(PADFREE_ERROR_INVALID_ARGUMENT, "head_dim ", d).
template <typename... Args>
padfree_status fail(padfree_status status, const Args&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    set_last_error(message.str());
    return status;
}

// After a launch: reports a launch error (bad configuration, no kernel image for this GPU).
padfree_status check_launch(const char* what);

// A failed CUDA API call as PADFREE_ERROR_CUDA, its error cleared first: a failed graph call may
// leave it sticky for the next launch check.
padfree_status cuda_failure(const char* what, cudaError_t err);

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share no byte (an output a kernel
// writes while other threads still read an input must not overlap it).
inline bool disjoint(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
    const char* a0 = static_cast<const char*>(a);
    const char* b0 = static_cast<const char*>(b);
    return a0 + a_bytes <= b0 || b0 + b_bytes <= a0;
}

}  // namespace padfree

// Returns PADFREE_ERROR_INVALID_ARGUMENT with the condition's text when it does not hold.
#define PADFREE_REQUIRE(cond, ...)                                                        \
    do {                                                                                  \
        if (!(cond))                                                                      \
            return ::padfree::fail(PADFREE_ERROR_INVALID_ARGUMENT, __VA_ARGS__);          \
    } while (0)

// Returns the status of a check (a padfree_status expression) when it fails.
#define PADFREE_CHECK(expr)                                                               \
    do {                                                                                  \
        const padfree_status padfree_check_status_ = (expr);                              \
        if (padfree_check_status_ != PADFREE_OK) return padfree_check_status_;            \
    } while (0)

// Wraps a C ABI body so that no C++ exception crosses the boundary.
#define PADFREE_CAPI_GUARD_BEGIN try {
#define PADFREE_CAPI_GUARD_END                                                            \
    }                                                                                     \
    catch (const std::exception& e) {                                                     \
        return ::padfree::fail(PADFREE_ERROR_CUDA, "internal error: ", e.what());         \
    }                                                                                     \
    catch (...) {                                                                         \
        return ::padfree::fail(PADFREE_ERROR_CUDA, "internal error");                     \
    }
