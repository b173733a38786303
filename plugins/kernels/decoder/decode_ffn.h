// A decode step's whole feed-forward sublayer for a few rows, as one kernel:
//   out = act(LN(x) W1^T + b1) W2^T + b2 + residual
// (arguments validated by capi/decoder_capi.cpp; decode_ffn.cu says why one kernel).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode_linear.h"
#include "padfree.h"

namespace padfree {

// x [rows, hidden]; w1 [ffn, hidden] and w2 [hidden, ffn] (nn.Linear's layout); b1 [ffn], b2 [hidden],
// ln_gamma / ln_beta [hidden], residual [rows, hidden]: each optional. residual_normalized: LN(x) (as
// rounded to the dtype) is the residual, a post-LN sublayer's (residual then null). h [rows, ffn]: the
// activation between the two layers, a workspace every block writes and reads. barrier: the uint64 the
// kernel's grid barrier counts arrivals on, zero before the first launch, then only ever grown by whole
// grids (one per stream that runs the kernel: two grids counting on one at once would mix their
// arrivals).
struct DecodeFfnArgs {
    const void* x;
    const void* ln_gamma;
    const void* ln_beta;
    const void* w1;
    const void* b1;
    const void* w2;
    const void* b2;
    const void* residual;
    void* h;
    unsigned long long* barrier;
    void* out;
    int32_t rows;
    int32_t hidden;
    int32_t ffn;
    float eps;
    DecodeActivation activation;
    int32_t residual_normalized;
    // the launch's split (decode_ffn_plan), set by launch_decode_ffn
    int32_t fc1_features;  // of the ffn features per block
    int32_t fc2_features;  // of the hidden features per block
    int32_t alias_h;       // the staged h rows reuse the fc1 weight tile's shared memory
};

constexpr int32_t kDecodeFfnMaxRows = 8;             // one mma's N: the rows staged (zeros past rows)
constexpr int32_t kDecodeFfnWidthMultiple = 32;      // hidden and ffn in whole 32-wide chunks
constexpr int32_t kDecodeFfnThreads = 256;           // 8 warps
constexpr int32_t kDecodeFfnPad = 32;                // elements after each staged row (64 bytes: see .cu)
constexpr int32_t kDecodeFfnMaxFc1Features = 128;    // per block: one 16-row M-tile per warp
constexpr int32_t kDecodeFfnMaxFc2Features = kDecodeFfnThreads / kDecodeFfnMaxRows;  // an output per thread

// One block per SM (at most): each block holds fc1_features rows of W1 and fc2_features rows of W2
// in shared memory, so the grid is every SM and the split follows from the SM count.
struct DecodeFfnPlan {
    int32_t blocks = 0, fc1_features = 0, fc2_features = 0;
    int64_t shared_bytes = 0;
    bool alias_h = false;
};

inline DecodeFfnPlan decode_ffn_plan(int32_t hidden, int32_t ffn, int32_t sms) {
    DecodeFfnPlan p;
    if (sms <= 0 || hidden <= 0 || ffn <= 0) return p;
    p.fc2_features = (hidden + sms - 1) / sms;
    p.blocks = (hidden + p.fc2_features - 1) / p.fc2_features;
    p.fc1_features = (ffn + p.blocks - 1) / p.blocks;
    const int64_t ld1 = hidden + kDecodeFfnPad, ld2 = ffn + kDecodeFfnPad;
    const int64_t w1 = p.fc1_features * ld1, w2 = p.fc2_features * ld2;
    const int64_t xs = kDecodeFfnMaxRows * ld1, hs = kDecodeFfnMaxRows * ld2;
    p.alias_h = hs <= w1;
    const int64_t elements = w1 + w2 + xs + (p.alias_h ? 0 : hs) + 2 * int64_t{hidden};
    p.shared_bytes = elements * 2                                    // 16-bit types only
                     + int64_t{kDecodeFfnThreads / 32} * 16 * kDecodeFfnMaxRows * 4  // warps' partial sums
                     + 2 * int64_t{kDecodeFfnMaxFc1Features} * 4     // the block's biases (float32)
                     + 16;                                           // two mbarriers
    return p;
}

// Whether the kernel runs rows x (hidden, ffn) in dtype on the current device, and if not, why (a
// static string): 1 to 8 rows, float16 / bfloat16, compute capability 9.0+, hidden and ffn multiples
// of 32, at most 128 fc1 and 32 fc2 features per block, the block's shared memory within the device's.
const char* decode_ffn_unsupported(int32_t rows, int32_t hidden, int32_t ffn, padfree_dtype dtype);

cudaError_t launch_decode_ffn(DecodeFfnArgs args, padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
