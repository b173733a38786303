// C ABI of the padding family: argument checks, then the launchers of kernels/padding.h.
#include <cstdint>
#include <limits>

#include "capi_util.h"
#include "padding.h"

namespace {

padfree_status check_copy_args(const void* src, const int32_t* cu_seqlens, int32_t batch,
                               int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes,
                               const void* dst, const char* src_name, const char* dst_name) {
    PADFREE_REQUIRE(src != nullptr, src_name, " is NULL");
    PADFREE_REQUIRE(dst != nullptr, dst_name, " is NULL");
    PADFREE_REQUIRE(cu_seqlens != nullptr, "cu_seqlens is NULL");
    PADFREE_REQUIRE(batch >= 0, "batch must be >= 0, got ", batch);
    PADFREE_REQUIRE(total_tokens >= 0, "total_tokens must be >= 0, got ", total_tokens);
    PADFREE_REQUIRE(padded_seqlen >= 0, "padded_seqlen must be >= 0, got ", padded_seqlen);
    PADFREE_REQUIRE(row_bytes >= 1, "row_bytes must be >= 1, got ", row_bytes);
    const int64_t rows = static_cast<int64_t>(batch) * padded_seqlen;
    PADFREE_REQUIRE(rows == 0 || row_bytes <= std::numeric_limits<int64_t>::max() / rows,
                    "batch * padded_seqlen * row_bytes overflows int64 (", batch, " * ", padded_seqlen,
                    " * ", row_bytes, ")");
    return PADFREE_OK;
}

}  // namespace

extern "C" {

padfree_status padfree_cu_seqlens_from_seqlens(const int32_t* seqlens, int32_t batch,
                                               int32_t* cu_seqlens, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(seqlens != nullptr, "seqlens is NULL");
    PADFREE_REQUIRE(cu_seqlens != nullptr, "cu_seqlens is NULL");
    PADFREE_REQUIRE(batch >= 0, "batch must be >= 0, got ", batch);
    padfree::launch_cu_seqlens_from_seqlens(seqlens, batch, cu_seqlens, padfree::as_cuda_stream(stream));
    return padfree::check_launch("cu_seqlens_from_seqlens");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_cu_seqlens_from_mask(const int32_t* mask, int32_t batch, int32_t padded_seqlen,
                                            int32_t* cu_seqlens, int32_t* invalid_rows,
                                            padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(mask != nullptr, "mask is NULL");
    PADFREE_REQUIRE(cu_seqlens != nullptr, "cu_seqlens is NULL");
    PADFREE_REQUIRE(batch >= 0, "batch must be >= 0, got ", batch);
    PADFREE_REQUIRE(padded_seqlen >= 0, "padded_seqlen must be >= 0, got ", padded_seqlen);
    padfree::launch_cu_seqlens_from_mask(mask, batch, padded_seqlen, cu_seqlens, invalid_rows,
                                         padfree::as_cuda_stream(stream));
    return padfree::check_launch("cu_seqlens_from_mask");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_remove_padding(const void* padded, const int32_t* cu_seqlens, int32_t batch,
                                      int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes,
                                      void* packed, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_CHECK(check_copy_args(padded, cu_seqlens, batch, total_tokens, padded_seqlen, row_bytes, packed,
                                  "padded", "packed"));
    padfree::launch_remove_padding(padded, cu_seqlens, batch, total_tokens, padded_seqlen, row_bytes, packed,
                                   padfree::as_cuda_stream(stream));
    return padfree::check_launch("remove_padding");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_rebuild_padding(const void* packed, const int32_t* cu_seqlens, int32_t batch,
                                       int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes,
                                       void* padded, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_CHECK(check_copy_args(packed, cu_seqlens, batch, total_tokens, padded_seqlen, row_bytes, padded,
                                  "packed", "padded"));
    padfree::launch_rebuild_padding(packed, cu_seqlens, batch, total_tokens, padded_seqlen, row_bytes, padded,
                                    padfree::as_cuda_stream(stream));
    return padfree::check_launch("rebuild_padding");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
