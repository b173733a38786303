// C ABI of the model-inputs family: argument checks, then the launchers of kernels/inputs.h.
#include <cstdint>
#include <limits>

#include "capi_util.h"
#include "graph_guard_capi.h"
#include "inputs.h"

// A prepare call's fixed arguments (padfree_input_plan_create): the inputs' addresses apart, and
// host_stats' mapping looked up once.
struct padfree_input_plan {
    bool token_types;
    padfree::PrepareArgs args;
};

namespace {

padfree_status check_padded_shape(int32_t id_bytes, int32_t batch, int32_t padded_seqlen) {
    PADFREE_REQUIRE(id_bytes == 4 || id_bytes == 8, "id_bytes must be 4 (int32) or 8 (int64), got ", id_bytes);
    PADFREE_REQUIRE(batch >= 1, "batch must be >= 1, got ", batch);
    PADFREE_REQUIRE(padded_seqlen >= 1, "padded_seqlen must be >= 1, got ", padded_seqlen);
    // packed positions are int32 (cu_seqlens), and every padded position may be a token
    PADFREE_REQUIRE(static_cast<int64_t>(batch) * padded_seqlen <= std::numeric_limits<int32_t>::max(),
                    "batch * padded_seqlen must be <= 2^31 - 1, got ", batch, " * ", padded_seqlen);
    return PADFREE_OK;
}

// The sizes and buffers of a stats pass (the inputs' pointers apart).
padfree_status check_stats_sizes(bool has_mask, int32_t mask_bytes, int32_t id_bytes, int32_t batch,
                                 int32_t padded_seqlen, int64_t vocab_size, int64_t type_vocab_size,
                                 const int32_t* seqlens, const int32_t* stats) {
    PADFREE_REQUIRE(seqlens != nullptr, "seqlens is NULL");
    PADFREE_REQUIRE(stats != nullptr, "stats is NULL");
    PADFREE_REQUIRE(!has_mask || mask_bytes == 1 || mask_bytes == 4 || mask_bytes == 8,
                    "mask_bytes must be 1 (bool, uint8), 4 (int32) or 8 (int64), got ", mask_bytes);
    PADFREE_CHECK(check_padded_shape(id_bytes, batch, padded_seqlen));
    PADFREE_REQUIRE(vocab_size >= 0, "vocab_size must be >= 0, got ", vocab_size);
    PADFREE_REQUIRE(type_vocab_size >= 0, "type_vocab_size must be >= 0, got ", type_vocab_size);
    return PADFREE_OK;
}

// The sizes and buffers of a pack pass (the inputs' pointers apart).
padfree_status check_pack_sizes(bool has_types, int32_t id_bytes, const int32_t* seqlens, int32_t batch,
                                int32_t padded_seqlen, int32_t cu_capacity, int32_t packed_capacity,
                                const int32_t* packed_ids, const int32_t* packed_token_type_ids,
                                const int32_t* cu_seqlens) {
    PADFREE_REQUIRE(seqlens != nullptr, "seqlens is NULL");
    PADFREE_REQUIRE(packed_ids != nullptr, "packed_ids is NULL");
    PADFREE_REQUIRE(cu_seqlens != nullptr, "cu_seqlens is NULL");
    PADFREE_REQUIRE(!has_types || packed_token_type_ids != nullptr,
                    "packed_token_type_ids is NULL while token_type_ids is given");
    PADFREE_CHECK(check_padded_shape(id_bytes, batch, padded_seqlen));
    PADFREE_REQUIRE(cu_capacity >= batch, "cu_capacity must be >= batch (", batch, "), got ", cu_capacity);
    PADFREE_REQUIRE(packed_capacity >= 0, "packed_capacity must be >= 0, got ", packed_capacity);
    return PADFREE_OK;
}

padfree_status check_stats_args(const void* attention_mask, int32_t mask_bytes, const void* input_ids,
                                int32_t id_bytes, int32_t batch, int32_t padded_seqlen, int64_t vocab_size,
                                int64_t type_vocab_size, const int32_t* seqlens, const int32_t* stats) {
    PADFREE_REQUIRE(input_ids != nullptr, "input_ids is NULL");
    return check_stats_sizes(attention_mask != nullptr, mask_bytes, id_bytes, batch, padded_seqlen, vocab_size,
                             type_vocab_size, seqlens, stats);
}

padfree_status check_pack_args(const void* input_ids, const void* token_type_ids, int32_t id_bytes,
                               const int32_t* seqlens, int32_t batch, int32_t padded_seqlen, int32_t cu_capacity,
                               int32_t packed_capacity, const int32_t* packed_ids,
                               const int32_t* packed_token_type_ids, const int32_t* cu_seqlens) {
    PADFREE_REQUIRE(input_ids != nullptr, "input_ids is NULL");
    return check_pack_sizes(token_type_ids != nullptr, id_bytes, seqlens, batch, padded_seqlen, cu_capacity,
                            packed_capacity, packed_ids, packed_token_type_ids, cu_seqlens);
}

}  // namespace

extern "C" {

padfree_status padfree_padded_input_stats(const void* attention_mask, int32_t mask_bytes, const void* input_ids,
                                          const void* token_type_ids, int32_t id_bytes, int32_t batch,
                                          int32_t padded_seqlen, int64_t vocab_size, int64_t type_vocab_size,
                                          int64_t forbidden_id, int32_t* seqlens, int32_t* stats,
                                          int32_t* host_stats, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_CHECK(check_stats_args(attention_mask, mask_bytes, input_ids, id_bytes, batch, padded_seqlen, vocab_size,
                                   type_vocab_size, seqlens, stats));
    PADFREE_REQUIRE(forbidden_id >= -1, "forbidden_id must be >= -1 (-1: none), got ", forbidden_id);
    padfree::launch_padded_input_stats(attention_mask, mask_bytes, input_ids, token_type_ids, id_bytes, batch,
                                       padded_seqlen, vocab_size, type_vocab_size, forbidden_id, seqlens, stats,
                                       host_stats, padfree::as_cuda_stream(stream));
    return padfree::check_launch("padded_input_stats");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_pack_padded_inputs(const void* input_ids, const void* token_type_ids, int32_t id_bytes,
                                          const int32_t* seqlens, int32_t batch, int32_t padded_seqlen,
                                          int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                                          int32_t* packed_token_type_ids, int32_t* cu_seqlens,
                                          padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_CHECK(check_pack_args(input_ids, token_type_ids, id_bytes, seqlens, batch, padded_seqlen, cu_capacity,
                                  packed_capacity, packed_ids, packed_token_type_ids, cu_seqlens));
    padfree::launch_pack_padded_inputs(input_ids, token_type_ids, id_bytes, seqlens, batch, padded_seqlen,
                                       cu_capacity, packed_capacity, packed_ids, packed_token_type_ids,
                                       cu_seqlens, padfree::as_cuda_stream(stream));
    return padfree::check_launch("pack_padded_inputs");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_prepare_padded_inputs(const void* attention_mask, int32_t mask_bytes, const void* input_ids,
                                             const void* token_type_ids, int32_t id_bytes, int32_t batch,
                                             int32_t padded_seqlen, int64_t vocab_size, int64_t type_vocab_size,
                                             int64_t forbidden_id, int32_t* seqlens, int32_t* stats,
                                             int32_t* host_stats, int32_t cu_capacity, int32_t packed_capacity,
                                             int32_t* packed_ids, int32_t* packed_token_type_ids, int32_t* cu_seqlens,
                                             padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_CHECK(check_stats_args(attention_mask, mask_bytes, input_ids, id_bytes, batch, padded_seqlen, vocab_size,
                                   type_vocab_size, seqlens, stats));
    PADFREE_REQUIRE(forbidden_id >= -1, "forbidden_id must be >= -1 (-1: none), got ", forbidden_id);
    PADFREE_CHECK(check_pack_args(input_ids, token_type_ids, id_bytes, seqlens, batch, padded_seqlen, cu_capacity,
                                  packed_capacity, packed_ids, packed_token_type_ids, cu_seqlens));
    padfree::launch_prepare_padded_inputs(
        {{attention_mask, mask_bytes, input_ids, token_type_ids, id_bytes, batch, padded_seqlen, vocab_size,
          type_vocab_size, forbidden_id},
         seqlens,
         stats,
         host_stats,
         padfree::mapped_host_stats(host_stats),
         padfree::packed_outputs(token_type_ids != nullptr, cu_capacity, packed_capacity, packed_ids,
                                 packed_token_type_ids, cu_seqlens)},
        padfree::as_cuda_stream(stream));
    return padfree::check_launch("prepare_padded_inputs");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_input_plan_create(int32_t mask_bytes, int32_t id_bytes, int32_t with_token_types,
                                         int32_t batch, int32_t padded_seqlen, int64_t vocab_size,
                                         int64_t type_vocab_size, int64_t forbidden_id, int32_t* seqlens,
                                         int32_t* stats, int32_t* host_stats, int32_t cu_capacity,
                                         int32_t packed_capacity, int32_t* packed_ids,
                                         int32_t* packed_token_type_ids, int32_t* cu_seqlens,
                                         padfree_input_plan** out) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(out != nullptr, "out is NULL");
    PADFREE_REQUIRE(forbidden_id >= -1, "forbidden_id must be >= -1 (-1: none), got ", forbidden_id);
    PADFREE_CHECK(check_stats_sizes(mask_bytes != 0, mask_bytes, id_bytes, batch, padded_seqlen, vocab_size,
                                    type_vocab_size, seqlens, stats));
    const bool token_types = with_token_types != 0;
    PADFREE_CHECK(check_pack_sizes(token_types, id_bytes, seqlens, batch, padded_seqlen, cu_capacity,
                                   packed_capacity, packed_ids, packed_token_type_ids, cu_seqlens));
    *out = new padfree_input_plan{
        token_types,
        {{nullptr, mask_bytes, nullptr, nullptr, id_bytes, batch, padded_seqlen, vocab_size, type_vocab_size,
          forbidden_id},
         seqlens,
         stats,
         host_stats,
         padfree::mapped_host_stats(host_stats),
         padfree::packed_outputs(token_types, cu_capacity, packed_capacity, packed_ids, packed_token_type_ids,
                                 cu_seqlens)}};
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_input_plan_launch(const padfree_input_plan* plan, const void* attention_mask,
                                         const void* input_ids, const void* token_type_ids,
                                         padfree_guarded_graph* then, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(plan != nullptr, "plan is NULL");
    PADFREE_REQUIRE(input_ids != nullptr, "input_ids is NULL");
    PADFREE_REQUIRE((attention_mask != nullptr) == (plan->args.in.mask_bytes != 0),
                    "attention_mask must be given exactly where the plan has mask_bytes != 0");
    PADFREE_REQUIRE((token_type_ids != nullptr) == plan->token_types,
                    "token_type_ids must be given exactly where the plan was made with token types");
    const cudaStream_t cuda_stream = padfree::as_cuda_stream(stream);
    padfree::PrepareArgs args = plan->args;
    args.in.mask = attention_mask;
    args.in.ids = input_ids;
    args.in.types = token_type_ids;
    // A small batch's prepare kernel goes in front of the guarded graph, one launch for both: the
    // GPU idles until the graph's body is submitted, and two launches submit it later (measured on
    // the H100).
    padfree::PrepareKernelNode head;
    if (then != nullptr && padfree::one_block_prepare_node(args, &head)) {
        const cudaError_t err =
            padfree::launch_guarded_graph_behind(&then->graph, head.params, &head.guard, args.stats, cuda_stream);
        if (err != cudaErrorNotSupported)
            return err == cudaSuccess ? PADFREE_OK : padfree::cuda_failure("input_plan_launch", err);
    }
    padfree::launch_prepare_padded_inputs(args, cuda_stream);
    PADFREE_CHECK(padfree::check_launch("input_plan_launch"));
    return then == nullptr ? PADFREE_OK : padfree::launch_guarded_graph(then, cuda_stream);
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_input_plan_destroy(padfree_input_plan* plan) {
    delete plan;
    return PADFREE_OK;
}

}  // extern "C"
