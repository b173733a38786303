// C ABI of the embedding family: argument checks, then the launcher of kernels/embedding.h.
#include "embedding.h"
#include "layernorm.h"
#include "rowwise_checks.h"

extern "C" {

padfree_status padfree_embedding_layernorm(
    const int32_t* input_ids, const int32_t* token_type_ids, const int32_t* cu_seqlens, int32_t batch,
    int64_t total_tokens, const void* word_emb, int32_t vocab_size, const void* position_emb,
    int32_t max_positions, int32_t position_offset, const void* type_emb, int32_t type_vocab_size,
    const void* gamma, const void* beta, int32_t hidden, float eps, const void* l2_prefetch,
    int64_t l2_prefetch_bytes, padfree_dtype dtype, void* out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_REQUIRE(input_ids != nullptr, "input_ids is NULL");
    PADFREE_REQUIRE(cu_seqlens != nullptr, "cu_seqlens is NULL");
    PADFREE_CHECK(check_tensor(word_emb, "word_emb"));
    PADFREE_CHECK(check_tensor(position_emb, "position_emb"));
    PADFREE_CHECK(check_optional_tensor(type_emb, "type_emb"));
    // Both NULL: no LayerNorm (Marian, M2M100). One without the other is a caller's mistake, not a
    // request for half a LayerNorm.
    PADFREE_REQUIRE((gamma == nullptr) == (beta == nullptr), "gamma and beta must both be given (LayerNorm) or both "
                    "be NULL (no LayerNorm), got gamma ", gamma == nullptr ? "NULL" : "given", " and beta ",
                    beta == nullptr ? "NULL" : "given");
    PADFREE_CHECK(check_optional_tensor(gamma, "gamma"));
    PADFREE_CHECK(check_optional_tensor(beta, "beta"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_REQUIRE(total_tokens >= 0, "total_tokens must be >= 0, got ", total_tokens);
    PADFREE_REQUIRE(batch >= 1 || total_tokens == 0, "batch must be >= 1 when there are tokens, got ", batch);
    PADFREE_REQUIRE(vocab_size >= 1, "vocab_size must be >= 1, got ", vocab_size);
    PADFREE_REQUIRE(max_positions >= 1, "max_positions must be >= 1, got ", max_positions);
    PADFREE_REQUIRE(position_offset >= 0, "position_offset must be >= 0, got ", position_offset);
    PADFREE_REQUIRE(type_emb == nullptr || type_vocab_size >= 1,
                    "type_vocab_size must be >= 1 with a type_emb table, got ", type_vocab_size);
    PADFREE_CHECK(check_width("hidden", hidden, kMaxHidden));
    PADFREE_CHECK(check_eps(eps));
    PADFREE_CHECK(check_dtype(dtype));
    L2Prefetch prefetch;
    PADFREE_CHECK(check_l2_prefetch(l2_prefetch, l2_prefetch_bytes, &prefetch));
    launch_embedding_layernorm(input_ids, token_type_ids, cu_seqlens, batch, total_tokens, word_emb,
                               vocab_size, position_emb, max_positions, position_offset, type_emb,
                               type_vocab_size, gamma, beta, hidden, eps, prefetch, dtype, out,
                               as_cuda_stream(stream));
    return check_launch("embedding_layernorm");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
