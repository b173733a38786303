// A decode step's linear layer for 1 to 256 rows on Hopper's wgmma with the input's LayerNorm folded
// into the weight (arguments validated by capi/decoder_capi.cpp):
//   out = act(y) + residual,  y = x W^T + bias                          (ln_colsum null)
//                             y = rstd * (x W^T - mean * ln_colsum) + bias   (ln_colsum given)
// with mean and rstd each x row's LayerNorm statistics (float32, eps). With W = W0 diag(gamma),
// ln_colsum = W 1 (float32, of W as stored) and bias = b0 + W0 beta, the second form is
// act(LN(x) W0^T + b0) + residual: the LayerNorm costs no pass over x before the products, only its
// two row sums beside them and two terms in the epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode_linear.h"
#include "padfree.h"

namespace padfree {

struct DecodeGemmArgs {
    const void* x;          // [rows, in_features]
    const void* weight;     // [out_features, in_features]
    const void* bias;       // [out_features] or null
    const void* residual;   // [rows, out_features] or null (may be out)
    const float* ln_colsum; // [out_features] or null
    void* out;              // [rows, out_features]
    int32_t rows;
    int32_t in_features;
    int32_t out_features;
    float eps;
    DecodeActivation activation;
};

constexpr int32_t kDecodeGemmTileM = 64;       // rows a block: wgmma's M; fewer rows arrive as zeros
constexpr int32_t kDecodeGemmMaxRows = 256;    // rows a call: a block row (grid y) per 64
constexpr int32_t kDecodeGemmTileN = 32;       // output features per block
constexpr int32_t kDecodeGemmMaxSlice = 512;   // in_features per block: split over a cluster beyond
constexpr int32_t kDecodeGemmMaxSplit = 8;
// Blocks an SM holds (shared memory ~74 KB a block): a third, so that the next kernel's blocks find room
// while this one runs and request their weights early.
constexpr int32_t kDecodeGemmBlocksPerSm = 3;

// Blocks in_features is split over (1, 2, 4 or 8: the fewest with a slice of whole 64-wide chunks up to
// kDecodeGemmMaxSlice), or 0 where none is.
inline int32_t decode_gemm_split(int32_t in_features) {
    for (int32_t split = 1; split <= kDecodeGemmMaxSplit; split *= 2)
        if (in_features % (64 * split) == 0 && in_features / split <= kDecodeGemmMaxSlice) return split;
    return 0;
}

// Whether the current device runs the kernel (the library's sm_90a code on compute capability 9.0).
bool decode_gemm_supported();
cudaError_t launch_decode_gemm(const DecodeGemmArgs& args, padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
