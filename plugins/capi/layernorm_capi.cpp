// C ABI of the LayerNorm family: argument checks, then the launchers of kernels/layernorm.h.
#include "layernorm.h"
#include "rowwise_checks.h"

extern "C" {

padfree_status padfree_layernorm(const void* x, const void* gamma, const void* beta, int64_t rows,
                                 int32_t hidden, float eps, padfree_dtype dtype, void* out,
                                 padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_tensor(x, "x"));
    PADFREE_CHECK(check_tensor(gamma, "gamma"));
    PADFREE_CHECK(check_tensor(beta, "beta"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_REQUIRE(rows >= 0, "rows must be >= 0, got ", rows);
    PADFREE_CHECK(check_width("hidden", hidden, kMaxHidden));
    PADFREE_CHECK(check_eps(eps));
    PADFREE_CHECK(check_dtype(dtype));
    launch_layernorm(x, gamma, beta, rows, hidden, eps, dtype, out, as_cuda_stream(stream));
    return check_launch("layernorm");
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_skip_layernorm(const void* x, const void* residual, const void* bias,
                                      const void* gamma, const void* beta, int64_t rows, int32_t hidden,
                                      float eps, const void* l2_prefetch, int64_t l2_prefetch_bytes,
                                      padfree_dtype dtype, void* out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_tensor(x, "x"));
    PADFREE_CHECK(check_optional_tensor(residual, "residual"));
    PADFREE_CHECK(check_optional_tensor(bias, "bias"));
    PADFREE_CHECK(check_tensor(gamma, "gamma"));
    PADFREE_CHECK(check_tensor(beta, "beta"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_REQUIRE(rows >= 0, "rows must be >= 0, got ", rows);
    PADFREE_CHECK(check_width("hidden", hidden, kMaxHidden));
    PADFREE_CHECK(check_eps(eps));
    PADFREE_CHECK(check_dtype(dtype));
    L2Prefetch prefetch;
    PADFREE_CHECK(check_l2_prefetch(l2_prefetch, l2_prefetch_bytes, &prefetch));
    launch_skip_layernorm(x, residual, bias, gamma, beta, rows, hidden, eps, prefetch, dtype, out,
                          as_cuda_stream(stream));
    return check_launch("skip_layernorm");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
