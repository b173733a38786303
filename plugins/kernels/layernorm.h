// LayerNorm and skip LayerNorm on packed rows: launchers over device pointers. Arguments are
// validated by capi/layernorm_capi.cpp (hidden a multiple of 8 in [8, 8192], 16-byte aligned
// pointers, a known dtype); these only enqueue on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "l2_prefetch.h"
#include "padfree.h"

namespace padfree {

constexpr int kMaxHidden = 8192;

// x, out: [rows, hidden]; gamma, beta: [hidden]. out may alias x.
void launch_layernorm(const void* x, const void* gamma, const void* beta, int64_t rows, int32_t hidden,
                      float eps, padfree_dtype dtype, void* out, cudaStream_t stream);

// out = LayerNorm(x + bias + residual) * gamma + beta; bias and residual may be NULL. out may alias x or
// residual. prefetch: a range to start moving into L2 before the wait on the previous kernel (a hint).
void launch_skip_layernorm(const void* x, const void* residual, const void* bias, const void* gamma,
                           const void* beta, int64_t rows, int32_t hidden, float eps, L2Prefetch prefetch,
                           padfree_dtype dtype, void* out, cudaStream_t stream);

}  // namespace padfree
