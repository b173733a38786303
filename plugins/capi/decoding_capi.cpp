// C ABI of the decoding family (kernels/decoding/): the fused log-softmax top-k of a decoding step and
// the beam reorder of the cache indirection. Argument checks, then the launchers.
#include <cmath>
#include <cstdint>

#include "decoding/beam_reorder.h"
#include "decoding/logits.h"
#include "rowwise_checks.h"

namespace {

constexpr int32_t kMaxGridY = 65535;  // logits rows are grid dimension y of the first stage

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

}  // namespace

extern "C" {

padfree_status padfree_beam_reorder_cache_indir(const int32_t* cache_indir, const int32_t* parents,
                                                const int32_t* step, int32_t rows, int32_t max_len, int32_t* out,
                                                padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_REQUIRE(rows >= 0, "beam_reorder_cache_indir: rows must be >= 0, got ", rows);
    PADFREE_REQUIRE(max_len >= 1, "beam_reorder_cache_indir: max_len must be >= 1, got ", max_len);
    if (rows == 0) return PADFREE_OK;
    PADFREE_REQUIRE(cache_indir != nullptr && out != nullptr && parents != nullptr && step != nullptr,
                    "beam_reorder_cache_indir: cache_indir, parents, step and out must not be NULL");
    PADFREE_REQUIRE(aligned4(parents) && aligned4(step), "beam_reorder_cache_indir: parents and step must be 4-byte aligned");
    // rows of max_len % 4 == 0 ints are moved as 16-byte vectors
    const uintptr_t align = max_len % 4 == 0 ? 16 : 4;
    PADFREE_REQUIRE(reinterpret_cast<uintptr_t>(cache_indir) % align == 0 && reinterpret_cast<uintptr_t>(out) % align == 0,
                    "beam_reorder_cache_indir: cache_indir and out must be ", align, "-byte aligned");
    const char* a0 = reinterpret_cast<const char*>(cache_indir);
    const char* b0 = reinterpret_cast<const char*>(out);
    const int64_t bytes = static_cast<int64_t>(rows) * max_len * 4;
    PADFREE_REQUIRE(a0 + bytes <= b0 || b0 + bytes <= a0, "beam_reorder_cache_indir: out must not overlap cache_indir");
    launch_beam_reorder_cache_indir(cache_indir, parents, step, rows, max_len, out, as_cuda_stream(stream));
    return check_launch("beam_reorder_cache_indir");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_logits_topk_workspace_size(int32_t rows, int32_t vocab, int32_t k, int64_t* bytes) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(bytes != nullptr, "logits_topk_workspace_size: bytes is NULL");
    PADFREE_REQUIRE(rows >= 0 && rows <= kMaxGridY, "logits_topk: rows must be in [0, ", kMaxGridY, "], got ", rows);
    PADFREE_REQUIRE(vocab >= 1, "logits_topk: vocab must be >= 1, got ", vocab);
    PADFREE_REQUIRE(k >= 1 && k <= padfree::kLogitsTopkMaxK && k <= vocab, "logits_topk: k must be in [1, min(",
                    padfree::kLogitsTopkMaxK, ", vocab)], got ", k);
    *bytes = padfree::logits_topk_workspace_bytes(rows, vocab, k);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_logits_topk(const void* logits, const void* bias, const float* beam_scores,
                                   const int32_t* penalty_ids, int32_t num_penalty, float repetition_penalty,
                                   const int32_t* banned_ids, int32_t num_banned, const int32_t* forced_ids,
                                   int32_t rows, int32_t vocab, int32_t k, int32_t normalize, void* workspace,
                                   int64_t workspace_bytes, padfree_dtype dtype, float* out_scores,
                                   int32_t* out_ids, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(rows >= 0 && rows <= kMaxGridY, "logits_topk: rows must be in [0, ", kMaxGridY, "], got ", rows);
    PADFREE_REQUIRE(vocab >= 1, "logits_topk: vocab must be >= 1, got ", vocab);
    PADFREE_REQUIRE(k >= 1 && k <= kLogitsTopkMaxK && k <= vocab, "logits_topk: k must be in [1, min(",
                    kLogitsTopkMaxK, ", vocab)], got ", k);
    PADFREE_REQUIRE(num_penalty >= 0 && num_banned >= 0 &&
                        static_cast<int64_t>(num_penalty) + num_banned <= kLogitsTopkMaxSpecialIds,
                    "logits_topk: num_penalty + num_banned must be in [0, ", kLogitsTopkMaxSpecialIds, "], got ",
                    num_penalty, " + ", num_banned);
    PADFREE_REQUIRE(num_penalty == 0 || penalty_ids != nullptr, "logits_topk: penalty_ids is NULL");
    PADFREE_REQUIRE(num_banned == 0 || banned_ids != nullptr, "logits_topk: banned_ids is NULL");
    PADFREE_REQUIRE(std::isfinite(repetition_penalty) && repetition_penalty > 0.f,
                    "logits_topk: repetition_penalty must be finite and positive, got ", repetition_penalty);
    PADFREE_REQUIRE(normalize == 0 || normalize == 1, "logits_topk: normalize must be 0 or 1, got ", normalize);
    if (rows == 0) return PADFREE_OK;
    PADFREE_CHECK(check_tensor(logits, "logits"));
    PADFREE_CHECK(check_optional_tensor(bias, "bias"));
    PADFREE_CHECK(check_tensor(workspace, "workspace"));
    PADFREE_REQUIRE(workspace_bytes >= logits_topk_workspace_bytes(rows, vocab, k),
                    "logits_topk: workspace too small (see padfree_logits_topk_workspace_size)");
    PADFREE_REQUIRE(out_scores != nullptr && out_ids != nullptr && aligned4(out_scores) && aligned4(out_ids),
                    "logits_topk: out_scores and out_ids must be 4-byte aligned pointers");
    PADFREE_REQUIRE((beam_scores == nullptr || aligned4(beam_scores)) && (penalty_ids == nullptr || aligned4(penalty_ids)) &&
                        (banned_ids == nullptr || aligned4(banned_ids)) && (forced_ids == nullptr || aligned4(forced_ids)),
                    "logits_topk: beam_scores and the id tensors must be 4-byte aligned");
    LogitsTopkArgs args{logits, bias, beam_scores, penalty_ids, banned_ids, forced_ids, out_scores, out_ids,
                        rows, vocab, k, num_penalty, num_banned, repetition_penalty, normalize != 0};
    const cudaError_t err = launch_logits_topk(args, workspace, dtype, as_cuda_stream(stream));
    if (err != cudaSuccess) return cuda_failure("logits_topk: configuring the merge kernel", err);
    return check_launch("logits_topk");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
