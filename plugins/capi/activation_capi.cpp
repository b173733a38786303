// C ABI of the activation family: argument checks, then the launcher of kernels/activation.h.
#include "activation.h"
#include "rowwise_checks.h"

extern "C" {

padfree_status padfree_bias_gelu(const void* x, const void* bias, int64_t rows, int32_t cols,
                                 int32_t approximate, padfree_dtype dtype, void* out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_tensor(x, "x"));
    PADFREE_CHECK(check_optional_tensor(bias, "bias"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_REQUIRE(rows >= 0, "rows must be >= 0, got ", rows);
    PADFREE_CHECK(check_width("cols", cols, 0));
    PADFREE_REQUIRE(approximate == PADFREE_GELU_ERF || approximate == PADFREE_GELU_TANH,
                    "approximate must be 0 (erf) or 1 (tanh), got ", approximate);
    PADFREE_CHECK(check_dtype(dtype));
    launch_bias_gelu(x, bias, rows, cols, approximate, dtype, out, as_cuda_stream(stream));
    return check_launch("bias_gelu");
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
