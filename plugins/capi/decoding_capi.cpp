// C ABI of the decoding family (kernels/decoding/): the fused log-softmax top-k of a decoding step, the
// beam reorder of the cache indirection and the searches' per-step bookkeeping. Argument checks, then the launchers.
#include <cmath>
#include <cstdint>

#include "decoding/beam_reorder.h"
#include "decoding/logits.h"
#include "decoding/search.h"
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
    const int64_t bytes = static_cast<int64_t>(rows) * max_len * 4;
    PADFREE_REQUIRE(disjoint(cache_indir, bytes, out, bytes), "beam_reorder_cache_indir: out must not overlap cache_indir");
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
                                   const int32_t* step, int32_t num_steps, int32_t rows, int32_t vocab, int32_t k,
                                   int32_t normalize, void* workspace, int64_t workspace_bytes, padfree_dtype dtype,
                                   float* out_scores, int32_t* out_ids, padfree_stream stream) {
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
    PADFREE_REQUIRE(step == nullptr || num_steps >= 1,
                    "logits_topk: num_steps (the tables' first dimension) must be >= 1 where step is given, got ",
                    num_steps);
    if (rows == 0) return PADFREE_OK;
    PADFREE_CHECK(check_tensor(logits, "logits"));
    PADFREE_CHECK(check_optional_tensor(bias, "bias"));
    PADFREE_CHECK(check_tensor(workspace, "workspace"));
    PADFREE_REQUIRE(workspace_bytes >= logits_topk_workspace_bytes(rows, vocab, k),
                    "logits_topk: workspace too small (see padfree_logits_topk_workspace_size)");
    PADFREE_REQUIRE(out_scores != nullptr && out_ids != nullptr && aligned4(out_scores) && aligned4(out_ids),
                    "logits_topk: out_scores and out_ids must be 4-byte aligned pointers");
    PADFREE_REQUIRE((beam_scores == nullptr || aligned4(beam_scores)) && (penalty_ids == nullptr || aligned4(penalty_ids)) &&
                        (banned_ids == nullptr || aligned4(banned_ids)) && (forced_ids == nullptr || aligned4(forced_ids)) &&
                        (step == nullptr || aligned4(step)),
                    "logits_topk: beam_scores, step and the id tensors must be 4-byte aligned");
    LogitsTopkArgs args{logits, bias, beam_scores, penalty_ids, banned_ids, forced_ids, step, num_steps, out_scores,
                        out_ids, rows, vocab, k, num_penalty, num_banned, repetition_penalty, normalize != 0};
    const cudaError_t err = launch_logits_topk(args, workspace, dtype, as_cuda_stream(stream));
    if (err != cudaSuccess) return cuda_failure("logits_topk: configuring the merge kernel", err);
    return check_launch("logits_topk");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_beam_search_workspace_size(int32_t batch, int32_t num_beams, int32_t max_length,
                                                 int32_t indir_len, int64_t* bytes, int64_t* counters_offset) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(bytes != nullptr && counters_offset != nullptr,
                    "beam_search_workspace_size: bytes and counters_offset must not be NULL");
    PADFREE_REQUIRE(batch >= 0 && num_beams >= 1 && max_length >= 2 && indir_len >= 0,
                    "beam_search_workspace_size: expected batch >= 0, num_beams >= 1, max_length >= 2, indir_len >= 0");
    *bytes = padfree::beam_search_workspace_bytes(batch, num_beams, max_length, indir_len);
    *counters_offset = padfree::beam_search_counters_offset(batch, num_beams, max_length, indir_len);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_beam_search_step(const float* cand_scores, const int32_t* cand_ids, int32_t keep,
                                        const int32_t* eos_ids, int32_t num_eos, int64_t* running,
                                        float* running_scores, int64_t* pool, float* pool_scores,
                                        int64_t* pool_lengths, void* pool_finished, void* improvable,
                                        int32_t flag_bytes, uint8_t* done, int64_t* next_tokens, int32_t* parents,
                                        int32_t* cache_indir,
                                        int32_t indir_len, int32_t* step, int32_t batch, int32_t num_beams,
                                        int32_t max_length, float length_penalty, int32_t early_stopping,
                                        int32_t advance_step, void* workspace, int64_t workspace_bytes,
                                        padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_REQUIRE(batch >= 0, "beam_search_step: batch must be >= 0, got ", batch);
    PADFREE_REQUIRE(num_beams >= 1 && num_beams <= kBeamSearchMaxBeams, "beam_search_step: num_beams must be in [1, ",
                    kBeamSearchMaxBeams, "], got ", num_beams);
    PADFREE_REQUIRE(keep >= num_beams && keep <= kBeamSearchMaxKeep, "beam_search_step: keep must be in [num_beams, ",
                    kBeamSearchMaxKeep, "], got ", keep);
    PADFREE_REQUIRE(num_eos >= 0 && (num_eos == 0 || eos_ids != nullptr),
                    "beam_search_step: num_eos must be >= 0 and eos_ids non-NULL where it is > 0");
    PADFREE_REQUIRE(max_length >= 2, "beam_search_step: max_length must be >= 2, got ", max_length);
    PADFREE_REQUIRE(cache_indir == nullptr || indir_len >= max_length - 1,
                    "beam_search_step: cache_indir needs indir_len >= max_length - 1, got ", indir_len);
    PADFREE_REQUIRE(std::isfinite(length_penalty), "beam_search_step: length_penalty must be finite");
    PADFREE_REQUIRE(early_stopping >= 0 && early_stopping <= 2,
                    "beam_search_step: early_stopping must be 0 (False), 1 (True) or 2 (never), got ", early_stopping);
    PADFREE_REQUIRE(advance_step == 0 || advance_step == 1, "beam_search_step: advance_step must be 0 or 1");
    PADFREE_REQUIRE(flag_bytes == 1 || flag_bytes == 4,
                    "beam_search_step: flag_bytes must be 1 (uint8 flags) or 4 (int32 flags), got ", flag_bytes);
    if (batch == 0) return PADFREE_OK;
    PADFREE_REQUIRE(cand_scores && cand_ids && running && running_scores && pool && pool_scores && pool_lengths &&
                        pool_finished && improvable && done && next_tokens && parents && step && workspace,
                    "beam_search_step: a required pointer is NULL");
    const int32_t indir = cache_indir != nullptr ? indir_len : 0;
    PADFREE_REQUIRE(workspace_bytes >= beam_search_workspace_bytes(batch, num_beams, max_length, indir),
                    "beam_search_step: workspace too small (see padfree_beam_search_workspace_size)");
    PADFREE_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "beam_search_step: workspace must be 16-byte aligned");
    BeamSearchStepArgs args{cand_scores, cand_ids, eos_ids, running, running_scores, pool, pool_scores, pool_lengths,
                            pool_finished, improvable, done, next_tokens, parents, cache_indir, step, workspace,
                            batch, num_beams, keep, num_eos, max_length, indir, length_penalty, early_stopping,
                            flag_bytes, advance_step != 0};
    launch_beam_search_step(args, as_cuda_stream(stream));
    return check_launch("beam_search_step");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_greedy_step(const int32_t* cand_ids, const int32_t* eos_ids, int32_t num_eos,
                                   int64_t* sequences, int64_t* next_tokens, int64_t* generated, void* unfinished,
                                   int32_t flag_bytes, uint8_t* done, int32_t* step, int32_t rows, int32_t max_length,
                                   int64_t pad_token_id, int32_t advance_step, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_REQUIRE(rows >= 0, "greedy_step: rows must be >= 0, got ", rows);
    PADFREE_REQUIRE(max_length >= 2, "greedy_step: max_length must be >= 2, got ", max_length);
    PADFREE_REQUIRE(num_eos >= 0 && (num_eos == 0 || eos_ids != nullptr),
                    "greedy_step: num_eos must be >= 0 and eos_ids non-NULL where it is > 0");
    PADFREE_REQUIRE(advance_step == 0 || advance_step == 1, "greedy_step: advance_step must be 0 or 1");
    PADFREE_REQUIRE(flag_bytes == 1 || flag_bytes == 4,
                    "greedy_step: flag_bytes must be 1 (uint8 flags) or 4 (int32 flags), got ", flag_bytes);
    if (rows == 0) return PADFREE_OK;
    PADFREE_REQUIRE(cand_ids && sequences && next_tokens && generated && unfinished && step,
                    "greedy_step: a required pointer is NULL");
    GreedyStepArgs args{cand_ids, eos_ids, sequences, next_tokens, generated, unfinished, done, step,
                        rows, num_eos, max_length, pad_token_id, flag_bytes, advance_step != 0};
    launch_greedy_step(args, as_cuda_stream(stream));
    return check_launch("greedy_step");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
