// Fused bias + log-softmax + logits processors + top-k of a decoding step over vocabularies up to
// 256k: the launcher the C ABI calls (arguments validated by capi/decoding_capi.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// logits [rows, vocab] (any float dtype); bias [vocab] or null (same dtype); beam_scores [rows] fp32
// or null; penalty_ids [rows, num_penalty], banned_ids [rows, num_banned] int32 (-1 and ids outside
// [0, vocab) unused); forced_ids [rows] int32 or null (< 0 or >= vocab: not forced). Where step is
// non-null (a device int32), banned_ids and forced_ids are tables over steps, [num_steps, rows,
// num_banned] and [num_steps, rows], and a row's lists are at *step (clamped to [0, num_steps - 1]):
// a decode step captured once reads its step's lists itself, with no gather kernel before it.
// out_scores [rows, k] fp32, out_ids [rows, k] int32, descending, ties to the smaller id.
struct LogitsTopkArgs {
    const void* logits;
    const void* bias;
    const float* beam_scores;
    const int32_t* penalty_ids;
    const int32_t* banned_ids;
    const int32_t* forced_ids;
    const int32_t* step;
    int32_t num_steps;
    float* out_scores;
    int32_t* out_ids;
    int32_t rows;
    int32_t vocab;
    int32_t k;
    int32_t num_penalty;
    int32_t num_banned;
    float repetition_penalty;
    bool normalize;
};

constexpr int32_t kLogitsTopkMaxK = 64;
constexpr int32_t kLogitsTopkMaxSpecialIds = 2048;  // num_penalty + num_banned

// Scratch of the two stages (per-block statistics and candidates).
int64_t logits_topk_workspace_bytes(int32_t rows, int32_t vocab, int32_t k);

// workspace: at least logits_topk_workspace_bytes, 16-byte aligned. Returns a configuration error
// (shared memory), launch errors are left for cudaGetLastError.
cudaError_t launch_logits_topk(const LogitsTopkArgs& args, void* workspace, padfree_dtype dtype,
                               cudaStream_t stream);

}  // namespace padfree
