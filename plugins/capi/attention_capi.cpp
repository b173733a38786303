// C ABI entry of fused varlen attention: argument checks, then the launcher (kernels/attention/attention.h).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention/attention.h"
#include "capi_util.h"

namespace {

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

constexpr int32_t kMaxGridYZ = 65535;  // batch and heads are grid dimensions y and z

}  // namespace

extern "C" padfree_status padfree_attention_varlen(const void* qkv, const void* qkv_bias,
                                                   const int32_t* cu_seqlens, int32_t batch,
                                                   int64_t total_tokens, int32_t max_seqlen,
                                                   int32_t num_heads, int32_t head_dim,
                                                   float softmax_scale, uint32_t flags,
                                                   padfree_dtype dtype, void* out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using padfree::fail;
    PADFREE_REQUIRE(dtype == PADFREE_FLOAT32 || dtype == PADFREE_FLOAT16 || dtype == PADFREE_BFLOAT16,
                    "attention: unknown dtype code ", static_cast<int>(dtype));
    PADFREE_REQUIRE(batch >= 0 && batch <= kMaxGridYZ, "attention: batch must be in [0, ", kMaxGridYZ,
                    "], got ", batch);
    PADFREE_REQUIRE(total_tokens >= 0, "attention: total_tokens must be >= 0, got ", total_tokens);
    PADFREE_REQUIRE(num_heads >= 1 && num_heads <= kMaxGridYZ, "attention: num_heads must be in [1, ",
                    kMaxGridYZ, "], got ", num_heads);
    PADFREE_REQUIRE(head_dim >= 1, "attention: head_dim must be positive, got ", head_dim);
    if (!padfree::attention_head_dim_supported(head_dim))
        return fail(PADFREE_ERROR_UNSUPPORTED, "attention: head_dim ", head_dim,
                    " is not built (supported: 32, 64, 128)");
    if (flags & ~static_cast<uint32_t>(PADFREE_ATTENTION_CAUSAL))
        return fail(PADFREE_ERROR_UNSUPPORTED, "attention: unknown flags ", flags, " (only PADFREE_ATTENTION_CAUSAL is defined)");
    PADFREE_REQUIRE(std::isfinite(softmax_scale) && softmax_scale > 0.f,
                    "attention: softmax_scale must be finite and positive, got ", softmax_scale);
    if (batch == 0) return PADFREE_OK;
    PADFREE_REQUIRE(max_seqlen >= 1, "attention: max_seqlen must be >= 1, got ", max_seqlen);
    PADFREE_REQUIRE(qkv != nullptr && cu_seqlens != nullptr && out != nullptr,
                    "attention: qkv, cu_seqlens and out must not be null");
    // 16-byte rows are loaded and stored whole; the bias is read in element pairs.
    PADFREE_REQUIRE(aligned(qkv, 16) && aligned(out, 16), "attention: qkv and out must be 16-byte aligned");
    PADFREE_REQUIRE(qkv_bias == nullptr || aligned(qkv_bias, 4), "attention: qkv_bias must be 4-byte aligned");
    PADFREE_REQUIRE(aligned(cu_seqlens, 4), "attention: cu_seqlens must be 4-byte aligned");

    padfree::AttentionArgs args{};
    args.qkv = qkv;
    args.qkv_bias = qkv_bias;
    args.cu_seqlens = cu_seqlens;
    args.out = out;
    // cu_seqlens entries are int32: no sequence reaches a row past INT32_MAX.
    args.total_rows = static_cast<int32_t>(std::min<int64_t>(total_tokens, INT32_MAX));
    args.num_heads = num_heads;
    args.softmax_scale = softmax_scale;
    args.causal = (flags & PADFREE_ATTENTION_CAUSAL) != 0;
    const cudaError_t err = padfree::launch_attention_varlen(args, batch, max_seqlen, head_dim, dtype,
                                                             padfree::as_cuda_stream(stream));
    if (err != cudaSuccess)
        return fail(PADFREE_ERROR_CUDA, "attention: configuring the kernel failed: ", cudaGetErrorName(err),
                    ": ", cudaGetErrorString(err));
    return padfree::check_launch("padfree_attention_varlen");
    PADFREE_CAPI_GUARD_END
}
