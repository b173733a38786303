// Bias + GELU where the GEMM epilogue does not take it: a launcher over device pointers. Arguments
// are validated by capi/activation_capi.cpp (cols a multiple of 8, 16-byte aligned pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// out = gelu(x + bias); x, out: [rows, cols]; bias: [cols] or NULL. approximate: PADFREE_GELU_ERF
// or PADFREE_GELU_TANH. out may alias x.
void launch_bias_gelu(const void* x, const void* bias, int64_t rows, int32_t cols, int32_t approximate,
                      padfree_dtype dtype, void* out, cudaStream_t stream);

}  // namespace padfree
