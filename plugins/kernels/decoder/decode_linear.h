// A decode step's linear layer for a few rows: out = act(LN(x) W^T + bias) + residual, with the input's
// LayerNorm and the bias, activation and residual fused (arguments validated by capi/decoder_capi.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

enum class DecodeActivation : int32_t { kNone = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3, kSilu = 4 };

// x [rows, in] and weight [out, in] (nn.Linear's layout); bias [out], residual [rows, out], ln_gamma /
// ln_beta [in] (LayerNorm of each x row first, float32 statistics, rounded to the dtype as a LayerNorm
// output is), x_norm_out [rows, in] (that LayerNorm's output, for a post-LN residual): each optional.
struct DecodeLinearArgs {
    const void* x;
    const void* weight;
    const void* bias;
    const void* residual;
    const void* ln_gamma;
    const void* ln_beta;
    void* out;
    void* x_norm_out;
    int32_t rows;
    int32_t in_features;
    int32_t out_features;
    float eps;
    DecodeActivation activation;
};

// Rows beyond which a GEMM on tensor cores is the faster kernel (each weight element is used rows times
// on CUDA cores here).
constexpr int32_t kDecodeLinearMaxRows = 8;
// The rows of x are staged in shared memory: rows (rounded up to a power of two) * in_features elements
// at most this many bytes, and with the LayerNorm's gamma and beta at most kDecodeLinearMaxSharedBytes.
constexpr int32_t kDecodeLinearMaxStageBytes = 96 * 1024;
constexpr int32_t kDecodeLinearMaxSharedBytes = 192 * 1024;

cudaError_t launch_decode_linear(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
