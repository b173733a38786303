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

// Rows beyond which the CUDA-core kernel gives way to the tensor-core one (each weight element is used
// rows times on CUDA cores).
constexpr int32_t kDecodeLinearMaxRows = 8;
// The rows of x are staged in shared memory: rows (rounded up to a power of two) * in_features elements
// at most this many bytes, and with the LayerNorm's gamma and beta at most kDecodeLinearMaxSharedBytes.
constexpr int32_t kDecodeLinearMaxStageBytes = 96 * 1024;
constexpr int32_t kDecodeLinearMaxSharedBytes = 192 * 1024;

// 9 to 64 rows, float16 / bfloat16, compute capability 9.0+ (decode_linear_mma.cu): the same fusions on
// tensor cores, in_features split over a cluster of decode_linear_mma_split(in_features) blocks, each
// of which stages its slice of every row and of 64, 128 or 256 features' weights (16 per warp; with a
// 16-byte pad per row) beside float32 partial sums: decode_linear_mma_shared_bytes at most
// kDecodeLinearMmaMaxSharedBytes.
constexpr int32_t kDecodeLinearMmaMaxRows = 64;
constexpr int32_t kDecodeLinearMmaInMultiple = 128;  // in_features: a multiple (each slice whole chunks of 32)
// A block's slice of in_features at most (its 16-byte vectors at most one per thread of the smallest
// block, whose staging loops give each thread one column): in_features up to 8192 (4096 where it is
// not a multiple of 256, which decode_linear_mma_split spreads over 4 blocks).
constexpr int32_t kDecodeLinearMmaMaxSlice = 1024;
constexpr int64_t kDecodeLinearMmaMaxSharedBytes = 200 * 1024;
// Blocks a grid should have at least (about an H100's or H200's SMs) before a block takes more features.
constexpr int64_t kDecodeLinearMmaMinBlocks = 128;

// Blocks in_features is split over: 8 from 1024 (a multiple of 256), else 4.
inline int32_t decode_linear_mma_split(int32_t in_features) {
    return in_features >= 1024 && in_features % 256 == 0 ? 8 : 4;
}
inline int32_t decode_linear_mma_staged_rows(int32_t rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

inline int64_t decode_linear_mma_bytes(int32_t features, int32_t rows, int32_t in_features, bool layernorm) {
    const int64_t staged = decode_linear_mma_staged_rows(rows);
    const int64_t slice = in_features / decode_linear_mma_split(in_features);
    return (features + staged) * (slice + 8) * 2  // weights and x rows, padded
           + (layernorm ? 2 * slice * 2 : 0)      // gamma and beta of the slice
           + features * staged * 4                // partial sums [features][rows]
           + 4 * kDecodeLinearMmaMaxRows * 4;     // row statistics: sum, squares, mean, rstd
}

// Output features per block: 256 or 128 where the grid keeps kDecodeLinearMmaMinBlocks blocks and the
// staging fits, else 64. Each block stages its slice of x whatever its features: fewer, wider blocks
// stage it fewer times (at 16 rows, 1024 -> 4096 in 512 blocks of 64 features took 10.7 us, cuBLASLt
// with a LayerNorm kernel 6.8).
inline int32_t decode_linear_mma_features(int32_t rows, int32_t in_features, int32_t out_features, bool layernorm) {
    const int64_t split = decode_linear_mma_split(in_features);
    for (int32_t features = 256; features > 64; features /= 2)
        if ((out_features + features - 1) / features * split >= kDecodeLinearMmaMinBlocks &&
            decode_linear_mma_bytes(features, rows, in_features, layernorm) <= kDecodeLinearMmaMaxSharedBytes)
            return features;
    return 64;
}

inline int64_t decode_linear_mma_shared_bytes(int32_t rows, int32_t in_features, int32_t out_features,
                                              bool layernorm) {
    return decode_linear_mma_bytes(decode_linear_mma_features(rows, in_features, out_features, layernorm), rows,
                                   in_features, layernorm);
}

// 1 to 64 rows of float16 / bfloat16 on tensor cores with the weight in fragment order
// (decode_linear_fragments.cu; compute capability 8.0+): in_features one of the widths the kernel is
// built for (decode_linear_fragments_takes; the layout itself takes any multiple of 128), out_features a
// multiple of 16; past 16 rows compute capability 9.0+ (thread-block clusters). Its shared memory: the
// rows (padded by 8 elements), the LayerNorm's parameters and the warps' partial sums (~155 KB for 16
// rows of 4096; 64 rows fit up to 1536 wide on sm_90: decode_linear_fragments_fits).
constexpr int32_t kDecodeLinearFragmentsMaxRows = 64;
constexpr int32_t kDecodeLinearFragmentsInMultiple = 128;
constexpr int32_t kDecodeLinearFragmentsOutMultiple = 16;
// The in_features built: the hidden and FFN widths of the usual Marian, BART, mBART and NLLB / M2M100
// sizes (a warp's step count, in_features / 128, is a template parameter: decode_linear_fragments.cu).
inline bool decode_linear_fragments_takes(int32_t in_features) {
    switch (in_features) {
        case 512: case 768: case 1024: case 1536: case 2048: case 3072: case 4096: return true;
        default: return false;
    }
}

// 17-64 rows (a cluster of 2 or 4 blocks, 16 rows each): the rows' space, which the partial sums reuse
// (8 warps x 32 lanes x 2 fragment rows x 2 * cluster row tiles x 4, padded by 4 floats a lane).
constexpr int64_t decode_linear_fragments_cluster_rows_bytes(int32_t cluster, int32_t in_features) {
    const int64_t rows = int64_t{16} * cluster * (in_features + 8) * 2;
    const int64_t part = int64_t{8} * 32 * (2 * 2 * cluster * 4 + 4) * 4;
    return rows > part ? rows : part;
}

constexpr int64_t decode_linear_fragments_shared_bytes(int32_t rows, int32_t in_features, bool layernorm) {
    const int64_t ln = layernorm ? 4 * int64_t{in_features} : 0;
    if (rows > 16) return decode_linear_fragments_cluster_rows_bytes(rows <= 32 ? 2 : 4, in_features) + ln;
    return int64_t{rows} * (in_features + 8) * 2 + ln + 8 * 32 * 4 * 4 * (rows > 8 ? 2 : 1);
}

cudaError_t launch_decode_linear(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream);
// 1-16 rows of a vocabulary-sized projection (out_features at least kDecodeLinearStreamMinOut, a multiple
// of 16; in_features 512, 768 or 1024, and up to 8 rows also 1536 or 2048; float16 / bfloat16; bias and
// LayerNorm, no activation or residual; compute capability 9.0+): the weight streamed by bulk copies
// through shared memory onto tensor cores (decode_linear_stream.cu). launch_decode_linear takes it where
// it applies (decode_linear_streams; PADFREE_DECODE_LINEAR_STREAM=0: nowhere).
constexpr int32_t kDecodeLinearStreamMinOut = 32768;
constexpr int32_t kDecodeLinearStreamMaxRows = 16;
bool decode_linear_streams(int32_t rows, int32_t in_features, int32_t out_features, padfree_dtype dtype);
bool decode_linear_stream_takes(const DecodeLinearArgs& args, padfree_dtype dtype);
cudaError_t launch_decode_linear_stream(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream);
// The tensor-core kernel (rows 9 to 64, 16-bit types; launch_decode_linear dispatches to it) and
// whether the current device runs it (compute capability 9.0+: thread-block clusters).
bool decode_linear_mma_supported();
cudaError_t launch_decode_linear_mma(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream);
// The fragment-order kernel (args.weight in that order) and its layout: weight [out_features,
// in_features] (a 16-bit type) -> out, the same bytes in fragment order.
bool decode_linear_fragments_supported();
// Whether a launch's shared memory (decode_linear_fragments_shared_bytes) fits the current device's.
bool decode_linear_fragments_fits(int32_t rows, int32_t in_features, bool layernorm);
cudaError_t launch_decode_linear_fragments(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream);
cudaError_t launch_decode_linear_fragment_layout(const void* weight, void* out, int32_t out_features,
                                                 int32_t in_features, cudaStream_t stream);

}  // namespace padfree
