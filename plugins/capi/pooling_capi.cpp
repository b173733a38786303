// C ABI of the pooling family: argument checks, then the launcher of kernels/pooling.h.
#include "pooling.h"
#include "rowwise_checks.h"

extern "C" {

padfree_status padfree_sequence_pool(const void* x, const int32_t* cu_seqlens, int32_t batch, int64_t total_tokens,
                                     int32_t hidden, int32_t mode, int32_t normalize, padfree_dtype dtype, void* out,
                                     padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_tensor(x, "x"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_REQUIRE(cu_seqlens != nullptr, "cu_seqlens is NULL");
    PADFREE_REQUIRE(reinterpret_cast<uintptr_t>(cu_seqlens) % 4 == 0, "cu_seqlens must be 4-byte aligned");
    PADFREE_REQUIRE(batch >= 0, "batch must be >= 0, got ", batch);
    PADFREE_REQUIRE(total_tokens >= 0, "total_tokens must be >= 0, got ", total_tokens);
    PADFREE_CHECK(check_width("hidden", hidden, kPoolMaxHidden));
    PADFREE_REQUIRE(mode == PADFREE_POOL_CLS || mode == PADFREE_POOL_MEAN || mode == PADFREE_POOL_MAX,
                    "mode must be 0 (cls), 1 (mean) or 2 (max), got ", mode);
    PADFREE_REQUIRE(normalize == 0 || normalize == 1, "normalize must be 0 or 1, got ", normalize);
    PADFREE_CHECK(check_dtype(dtype));
    launch_sequence_pool(x, cu_seqlens, batch, total_tokens, hidden, mode, normalize != 0, dtype, out,
                         as_cuda_stream(stream));
    return check_launch("sequence_pool");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
