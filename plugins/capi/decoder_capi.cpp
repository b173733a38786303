// C ABI of the decoder family (kernels/decoder/): one decoding step's embedding, self- and
// cross-attention and its few-row linear layers.
// Argument checks, then the launchers; device values (step, cache_indir, cu_seqlens) are clamped by
// the kernels, never read here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "decoder/cross_attention.h"
#include "decoder/decode_gemm.h"
#include "decoder/decode_linear.h"
#include "decoder/self_attention.h"
#include "decoder/step_embedding.h"
#include "rowwise_checks.h"

namespace {

constexpr int32_t kMaxGridYZ = 65535;           // the most heads taken
// rows x heads queries (x splits, up to 64) index the attention's one-dimensional grid
constexpr int64_t kMaxRowHeads = INT32_MAX / 64;
constexpr int32_t kMaxPositions = 64 * 8192;    // the longest cache or source taken: far past any model's

padfree_status check_heads(const char* what, int32_t num_heads, int32_t head_dim) {
    PADFREE_REQUIRE(num_heads >= 1 && num_heads <= kMaxGridYZ, what, ": num_heads must be in [1, ", kMaxGridYZ,
                    "], got ", num_heads);
    if (head_dim != 64 && head_dim != 128)
        return padfree::fail(PADFREE_ERROR_UNSUPPORTED, what, ": head_dim ", head_dim,
                             " is not built (supported: 64, 128)");
    return PADFREE_OK;
}

padfree_status check_row_heads(const char* what, int64_t rows, int32_t num_heads) {
    PADFREE_REQUIRE(rows * num_heads <= kMaxRowHeads, what, ": rows x num_heads must be <= ", kMaxRowHeads, ", got ",
                    rows * num_heads);
    return PADFREE_OK;
}

padfree_status check_scale(const char* what, float softmax_scale) {
    PADFREE_REQUIRE(std::isfinite(softmax_scale) && softmax_scale > 0.f, what,
                    ": softmax_scale must be finite and positive, got ", softmax_scale);
    return PADFREE_OK;
}

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

padfree_status launched(const char* what, cudaError_t err) {
    if (err != cudaSuccess) return padfree::cuda_failure(what, err);
    return padfree::check_launch(what);
}

// What the decode_linear entry points check alike past their shapes: the activation and the LayerNorm's
// arguments; then (rows and out_features non-zero) the pointers, their alignment and overlaps.
padfree_status check_decode_linear_options(const char* what, int32_t activation, const void* ln_gamma,
                                           const void* ln_beta, float eps, const void* x_norm_out) {
    using namespace padfree;
    PADFREE_REQUIRE(activation >= 0 && activation <= 4, what,
                    ": activation must be 0 (none), 1 (relu), 2 (gelu), 3 (gelu_tanh) or 4 (silu), got ", activation);
    PADFREE_REQUIRE((ln_gamma == nullptr) == (ln_beta == nullptr), what,
                    ": ln_gamma and ln_beta come together (or neither)");
    PADFREE_REQUIRE(x_norm_out == nullptr || ln_gamma != nullptr, what, ": x_norm_out needs ln_gamma/ln_beta");
    if (ln_gamma != nullptr) PADFREE_CHECK(check_eps(eps));
    return PADFREE_OK;
}

padfree_status check_decode_linear_tensors(const char* what, const void* x, const void* weight, const void* bias,
                                           const void* residual, const void* ln_gamma, const void* ln_beta,
                                           int32_t rows, int32_t in_features, int32_t out_features, int64_t element,
                                           const void* out, const void* x_norm_out) {
    using namespace padfree;
    auto named = [&](const char* tensor) { return std::string(what) + ": " + tensor; };
    PADFREE_CHECK(check_tensor(x, named("x").c_str()));
    PADFREE_CHECK(check_tensor(weight, named("weight").c_str()));
    PADFREE_CHECK(check_tensor(out, named("out").c_str()));
    auto element_aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % element == 0; };
    PADFREE_REQUIRE(element_aligned(bias) && element_aligned(residual),
                    what, ": bias and residual must be aligned to the dtype");
    // read and written as 16-byte vectors
    PADFREE_CHECK(check_optional_tensor(ln_gamma, named("ln_gamma").c_str()));
    PADFREE_CHECK(check_optional_tensor(ln_beta, named("ln_beta").c_str()));
    PADFREE_CHECK(check_optional_tensor(x_norm_out, named("x_norm_out").c_str()));
    const int64_t x_bytes = static_cast<int64_t>(rows) * in_features * element;
    const int64_t o_bytes = static_cast<int64_t>(rows) * out_features * element;
    PADFREE_REQUIRE(disjoint(out, o_bytes, x, x_bytes), what, ": out must not overlap x");
    PADFREE_REQUIRE(residual == nullptr || residual == out || disjoint(residual, o_bytes, out, o_bytes),
                    what, ": residual must be out itself or not overlap it");
    if (x_norm_out != nullptr) {
        PADFREE_REQUIRE(disjoint(x_norm_out, x_bytes, x, x_bytes), what, ": x_norm_out must not overlap x");
        PADFREE_REQUIRE(disjoint(x_norm_out, x_bytes, out, o_bytes), what, ": x_norm_out must not overlap out");
    }
    return PADFREE_OK;
}

}  // namespace

extern "C" {

padfree_status padfree_decoder_self_attention_workspace_size(int32_t rows, int32_t num_heads, int32_t head_dim,
                                                             int32_t max_len, int64_t* bytes) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(bytes != nullptr, "decoder_self_attention_workspace_size: bytes is NULL");
    PADFREE_REQUIRE(rows >= 0, "decoder_self_attention: rows must be >= 0, got ", rows);
    PADFREE_CHECK(check_heads("decoder_self_attention", num_heads, head_dim));
    PADFREE_CHECK(check_row_heads("decoder_self_attention", rows, num_heads));
    PADFREE_REQUIRE(max_len >= 1 && max_len <= kMaxPositions, "decoder_self_attention: max_len must be in [1, ",
                    kMaxPositions, "], got ", max_len);
    *bytes = rows == 0 ? 0 : padfree::self_attention_workspace_bytes(rows, num_heads, head_dim, max_len);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decoder_self_attention(const void* qkv, const void* qkv_bias, void* k_cache, void* v_cache,
                                              const int32_t* cache_indir, const int32_t* step, int32_t state_ready,
                                              int32_t rows, int32_t num_heads, int32_t head_dim, int32_t max_len,
                                              float softmax_scale, void* workspace, int64_t workspace_bytes,
                                              padfree_dtype dtype, void* out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(rows >= 0, "decoder_self_attention: rows must be >= 0, got ", rows);
    PADFREE_REQUIRE(state_ready == 0 || state_ready == 1, "decoder_self_attention: state_ready must be 0 or 1, got ",
                    state_ready);
    PADFREE_CHECK(check_heads("decoder_self_attention", num_heads, head_dim));
    PADFREE_CHECK(check_row_heads("decoder_self_attention", rows, num_heads));
    PADFREE_REQUIRE(max_len >= 1 && max_len <= kMaxPositions, "decoder_self_attention: max_len must be in [1, ",
                    kMaxPositions, "], got ", max_len);
    PADFREE_CHECK(check_scale("decoder_self_attention", softmax_scale));
    PADFREE_REQUIRE(workspace_bytes >= 0, "decoder_self_attention: workspace_bytes must be >= 0");
    if (rows == 0) return PADFREE_OK;
    PADFREE_CHECK(check_tensor(qkv, "qkv"));
    PADFREE_CHECK(check_optional_tensor(qkv_bias, "qkv_bias"));
    PADFREE_CHECK(check_tensor(k_cache, "k_cache"));
    PADFREE_CHECK(check_tensor(v_cache, "v_cache"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_CHECK(check_optional_tensor(workspace, "workspace"));
    PADFREE_REQUIRE(cache_indir != nullptr && aligned4(cache_indir), "cache_indir must be a 4-byte aligned pointer");
    PADFREE_REQUIRE(step != nullptr && aligned4(step), "step must be a 4-byte aligned device pointer");
    SelfAttentionArgs args{qkv, qkv_bias, k_cache, v_cache, cache_indir, step, out, rows, num_heads,
                           head_dim, max_len, softmax_scale, state_ready == 1};
    return launched("decoder_self_attention",
                    launch_self_attention(args, workspace, workspace_bytes, dtype, as_cuda_stream(stream)));
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decoder_cross_attention_workspace_size(int32_t rows, int32_t num_heads, int32_t head_dim,
                                                              int32_t max_seqlen, int64_t* bytes) {
    PADFREE_CAPI_GUARD_BEGIN
    PADFREE_REQUIRE(bytes != nullptr, "decoder_cross_attention_workspace_size: bytes is NULL");
    PADFREE_REQUIRE(rows >= 0, "decoder_cross_attention: rows must be >= 0, got ", rows);
    PADFREE_CHECK(check_heads("decoder_cross_attention", num_heads, head_dim));
    PADFREE_CHECK(check_row_heads("decoder_cross_attention", rows, num_heads));
    PADFREE_REQUIRE(max_seqlen >= 1 && max_seqlen <= kMaxPositions, "decoder_cross_attention: max_seqlen must be in [1, ",
                    kMaxPositions, "], got ", max_seqlen);
    *bytes = rows == 0 ? 0 : padfree::cross_attention_workspace_bytes(rows, num_heads, head_dim, max_seqlen);
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decoder_cross_attention(const void* q, const void* q_bias, const void* kv_mem,
                                               const int32_t* cu_seqlens, int32_t batch, int32_t num_beams,
                                               int64_t total_tokens, int32_t max_seqlen, int32_t num_heads,
                                               int32_t head_dim, float softmax_scale, void* workspace,
                                               int64_t workspace_bytes, padfree_dtype dtype, void* out,
                                               padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(batch >= 0, "decoder_cross_attention: batch must be >= 0, got ", batch);
    PADFREE_REQUIRE(num_beams >= 1, "decoder_cross_attention: num_beams must be >= 1, got ", num_beams);
    PADFREE_REQUIRE(static_cast<int64_t>(batch) * num_beams <= INT32_MAX,
                    "decoder_cross_attention: batch * num_beams must fit int32");
    PADFREE_REQUIRE(total_tokens >= 0, "decoder_cross_attention: total_tokens must be >= 0, got ", total_tokens);
    PADFREE_CHECK(check_heads("decoder_cross_attention", num_heads, head_dim));
    PADFREE_CHECK(check_row_heads("decoder_cross_attention", static_cast<int64_t>(batch) * num_beams, num_heads));
    PADFREE_REQUIRE(max_seqlen >= 1 && max_seqlen <= kMaxPositions, "decoder_cross_attention: max_seqlen must be in [1, ",
                    kMaxPositions, "], got ", max_seqlen);
    PADFREE_CHECK(check_scale("decoder_cross_attention", softmax_scale));
    PADFREE_REQUIRE(workspace_bytes >= 0, "decoder_cross_attention: workspace_bytes must be >= 0");
    if (batch == 0) return PADFREE_OK;
    PADFREE_CHECK(check_tensor(q, "q"));
    PADFREE_CHECK(check_optional_tensor(q_bias, "q_bias"));
    PADFREE_CHECK(check_tensor(kv_mem, "kv_mem"));
    PADFREE_CHECK(check_tensor(out, "out"));
    PADFREE_CHECK(check_optional_tensor(workspace, "workspace"));
    PADFREE_REQUIRE(cu_seqlens != nullptr && aligned4(cu_seqlens), "cu_seqlens must be a 4-byte aligned pointer");
    CrossAttentionArgs args{q, q_bias, kv_mem, cu_seqlens, out, batch * num_beams, batch, num_beams,
                            static_cast<int32_t>(std::min<int64_t>(total_tokens, INT32_MAX)), max_seqlen,
                            num_heads, head_dim, softmax_scale};
    return launched("decoder_cross_attention",
                    launch_cross_attention(args, workspace, workspace_bytes, dtype, as_cuda_stream(stream)));
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decode_gemm(const void* x, const void* weight, const void* bias, const void* residual,
                                  const float* ln_colsum, float eps, int32_t activation, int32_t rows,
                                  int32_t in_features, int32_t out_features, padfree_dtype dtype, void* out,
                                  padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(dtype != PADFREE_FLOAT32, "decode_gemm: float16 or bfloat16 (tensor cores), got float32; use a GEMM");
    PADFREE_REQUIRE(rows >= 0 && rows <= kDecodeGemmMaxRows, "decode_gemm: rows must be in [0, ", kDecodeGemmMaxRows,
                    "], got ", rows);
    PADFREE_REQUIRE(in_features >= 64 && decode_gemm_split(in_features) != 0, "decode_gemm: in_features must be a ",
                    "multiple of 64 that 1, 2, 4 or 8 blocks split into slices of at most ", kDecodeGemmMaxSlice,
                    " (up to ", kDecodeGemmMaxSplit * kDecodeGemmMaxSlice, "), got ", in_features, "; use a GEMM");
    PADFREE_REQUIRE(out_features >= 0 && out_features % kDecodeGemmTileN == 0, "decode_gemm: out_features must be ",
                    "a multiple of ", kDecodeGemmTileN, ", got ", out_features, "; use a GEMM");
    PADFREE_CHECK(check_decode_linear_options("decode_gemm", activation, nullptr, nullptr, 0.f, nullptr));
    if (ln_colsum != nullptr) PADFREE_CHECK(check_eps(eps));
    if (!decode_gemm_supported())
        return fail(PADFREE_ERROR_UNSUPPORTED, "decode_gemm: needs compute capability 9.0 and the library's sm_90a ",
                    "code; use a GEMM");
    if (rows == 0 || out_features == 0) return PADFREE_OK;
    PADFREE_CHECK(check_decode_linear_tensors("decode_gemm", x, weight, bias, residual, nullptr, nullptr, rows,
                                              in_features, out_features, 2, out, nullptr));
    PADFREE_CHECK(check_optional_tensor(ln_colsum, "decode_gemm: ln_colsum"));
    const DecodeGemmArgs args{x, weight, bias, residual, ln_colsum, out, rows, in_features, out_features, eps,
                              static_cast<DecodeActivation>(activation)};
    return launched("decode_gemm", launch_decode_gemm(args, dtype, as_cuda_stream(stream)));
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decode_linear(const void* x, const void* weight, const void* bias, const void* residual,
                                    const void* ln_gamma, const void* ln_beta, float eps, int32_t activation,
                                    int32_t rows, int32_t in_features, int32_t out_features, padfree_dtype dtype,
                                    void* out, void* x_norm_out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(rows >= 0 && rows <= kDecodeLinearMmaMaxRows, "decode_linear: rows must be in [0, ",
                    kDecodeLinearMmaMaxRows, "], got ", rows);
    PADFREE_CHECK(check_width("decode_linear: in_features", in_features, 0));
    PADFREE_REQUIRE(out_features >= 0, "decode_linear: out_features must be >= 0, got ", out_features);
    PADFREE_CHECK(check_decode_linear_options("decode_linear", activation, ln_gamma, ln_beta, eps, x_norm_out));
    const int64_t element = dtype == PADFREE_FLOAT32 ? 4 : 2;
    if (rows <= kDecodeLinearMaxRows) {  // the CUDA-core kernel
        int32_t staged = 1;
        while (staged < rows) staged *= 2;
        PADFREE_REQUIRE(staged * in_features * element <= kDecodeLinearMaxStageBytes,
                        "decode_linear: rows x in_features (", rows, " x ", in_features, ") exceeds the ",
                        kDecodeLinearMaxStageBytes, " bytes staged in shared memory; use a GEMM");
        PADFREE_REQUIRE(ln_gamma == nullptr || (staged + 2) * in_features * element <= kDecodeLinearMaxSharedBytes,
                        "decode_linear: rows x in_features (", rows, " x ", in_features, ") with the LayerNorm's ",
                        "parameters exceeds the ", kDecodeLinearMaxSharedBytes, " bytes of shared memory; use a GEMM");
    } else {  // the tensor-core kernel
        PADFREE_REQUIRE(dtype != PADFREE_FLOAT32, "decode_linear: more than ", kDecodeLinearMaxRows,
                        " rows run on tensor cores in float16 or bfloat16, got float32 with ", rows,
                        " rows; use a GEMM");
        PADFREE_REQUIRE(in_features % kDecodeLinearMmaInMultiple == 0, "decode_linear: more than ",
                        kDecodeLinearMaxRows, " rows need in_features a multiple of ", kDecodeLinearMmaInMultiple,
                        ", got ", in_features, "; use a GEMM");
        const int32_t split = decode_linear_mma_split(in_features);
        PADFREE_REQUIRE(in_features / split <= kDecodeLinearMmaMaxSlice, "decode_linear: more than ",
                        kDecodeLinearMaxRows, " rows take in_features up to ", split * kDecodeLinearMmaMaxSlice,
                        split == 8 ? "" : " where it is not a multiple of 256", ", got ", in_features,
                        "; use a GEMM");
        const int64_t shared = decode_linear_mma_shared_bytes(rows, in_features, out_features, ln_gamma != nullptr);
        PADFREE_REQUIRE(shared <= kDecodeLinearMmaMaxSharedBytes, "decode_linear: rows x in_features (", rows, " x ",
                        in_features, ") takes ", shared, " bytes of shared memory, past the ",
                        kDecodeLinearMmaMaxSharedBytes, "; use a GEMM");
        PADFREE_REQUIRE(decode_linear_mma_supported(), "decode_linear: more than ", kDecodeLinearMaxRows,
                        " rows need compute capability 9.0 or newer (thread-block clusters); use a GEMM");
    }
    if (rows == 0 || out_features == 0) return PADFREE_OK;
    PADFREE_CHECK(check_decode_linear_tensors("decode_linear", x, weight, bias, residual, ln_gamma, ln_beta, rows,
                                              in_features, out_features, element, out, x_norm_out));
    DecodeLinearArgs args{x, weight, bias, residual, ln_gamma, ln_beta, out, x_norm_out, rows, in_features,
                          out_features, eps, static_cast<DecodeActivation>(activation)};
    return launched("decode_linear", launch_decode_linear(args, dtype, as_cuda_stream(stream)));
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decode_linear_streams(int32_t rows, int32_t in_features, int32_t out_features,
                                             padfree_dtype dtype, int32_t* streams) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_REQUIRE(streams != nullptr, "decode_linear_streams: streams must not be NULL");
    PADFREE_CHECK(check_dtype(dtype));
    *streams = decode_linear_streams(rows, in_features, out_features, dtype) ? 1 : 0;
    return PADFREE_OK;
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decode_linear_fragment_layout(const void* weight, int32_t out_features, int32_t in_features,
                                                    padfree_dtype dtype, void* out, padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(dtype != PADFREE_FLOAT32,
                    "decode_linear_fragment_layout: float16 or bfloat16 weights, got float32");
    PADFREE_REQUIRE(in_features > 0 && in_features % kDecodeLinearFragmentsInMultiple == 0,
                    "decode_linear_fragment_layout: in_features must be a positive multiple of ",
                    kDecodeLinearFragmentsInMultiple, ", got ", in_features);
    PADFREE_REQUIRE(out_features >= 0 && out_features % kDecodeLinearFragmentsOutMultiple == 0,
                    "decode_linear_fragment_layout: out_features must be a multiple of ",
                    kDecodeLinearFragmentsOutMultiple, ", got ", out_features);
    if (out_features == 0) return PADFREE_OK;
    PADFREE_CHECK(check_tensor(weight, "decode_linear_fragment_layout: weight"));
    PADFREE_CHECK(check_tensor(out, "decode_linear_fragment_layout: out"));
    const int64_t bytes = int64_t{out_features} * in_features * 2;
    PADFREE_REQUIRE(disjoint(out, bytes, weight, bytes), "decode_linear_fragment_layout: out must not overlap weight");
    const cudaError_t err =
        launch_decode_linear_fragment_layout(weight, out, out_features, in_features, as_cuda_stream(stream));
    return launched("decode_linear_fragment_layout", err);
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decode_linear_fragments(const void* x, const void* weight_fragments, const void* bias,
                                              const void* residual, const void* ln_gamma, const void* ln_beta,
                                              float eps, int32_t activation, int32_t rows, int32_t in_features,
                                              int32_t out_features, padfree_dtype dtype, void* out, void* x_norm_out,
                                              padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(dtype != PADFREE_FLOAT32, "decode_linear_fragments: float16 or bfloat16, got float32");
    PADFREE_REQUIRE(rows >= 0 && rows <= kDecodeLinearFragmentsMaxRows,
                    "decode_linear_fragments: rows must be in [0, ", kDecodeLinearFragmentsMaxRows, "], got ", rows);
    PADFREE_REQUIRE(decode_linear_fragments_takes(in_features),
                    "decode_linear_fragments: in_features must be one of 512, 768, 1024, 1536, 2048, 3072, 4096, got ",
                    in_features, "; use decode_linear");
    PADFREE_REQUIRE(out_features >= 0 && out_features % kDecodeLinearFragmentsOutMultiple == 0,
                    "decode_linear_fragments: out_features must be a multiple of ", kDecodeLinearFragmentsOutMultiple,
                    ", got ", out_features);
    PADFREE_CHECK(
        check_decode_linear_options("decode_linear_fragments", activation, ln_gamma, ln_beta, eps, x_norm_out));
    PADFREE_REQUIRE(decode_linear_fragments_supported(),
                    "decode_linear_fragments: needs compute capability 8.0 or newer (mma.sync); use decode_linear");
    PADFREE_REQUIRE(decode_linear_fragments_fits(rows, in_features, ln_gamma != nullptr),
                    "decode_linear_fragments: ", rows, " rows of ", in_features,
                    " do not fit this GPU's shared memory (ops.fragments.fragments_fit says what does); use "
                    "decode_linear");
    if (rows == 0 || out_features == 0) return PADFREE_OK;
    PADFREE_CHECK(check_decode_linear_tensors("decode_linear_fragments", x, weight_fragments, bias, residual, ln_gamma,
                                              ln_beta, rows, in_features, out_features, 2, out, x_norm_out));
    DecodeLinearArgs args{x, weight_fragments, bias, residual, ln_gamma, ln_beta, out, x_norm_out, rows, in_features,
                          out_features, eps, static_cast<DecodeActivation>(activation)};
    return launched("decode_linear_fragments", launch_decode_linear_fragments(args, dtype, as_cuda_stream(stream)));
    PADFREE_CAPI_GUARD_END
}

padfree_status padfree_decoder_step_embedding(const int64_t* tokens, const int32_t* step, const void* word_emb,
                                             int32_t vocab, float embed_scale, const void* positions,
                                             int32_t num_positions, int32_t position_offset, int32_t pad_token,
                                             int32_t pad_position, const void* ln_gamma, const void* ln_beta,
                                             float eps, int32_t rows, int32_t hidden, padfree_dtype dtype, void* out,
                                             padfree_stream stream) {
    PADFREE_CAPI_GUARD_BEGIN
    using namespace padfree;
    PADFREE_CHECK(check_dtype(dtype));
    PADFREE_REQUIRE(rows >= 0, "decoder_step_embedding: rows must be >= 0, got ", rows);
    PADFREE_CHECK(check_width("decoder_step_embedding: hidden", hidden, 8192));
    PADFREE_REQUIRE(vocab >= 1, "decoder_step_embedding: vocab must be >= 1, got ", vocab);
    PADFREE_REQUIRE(num_positions >= 1, "decoder_step_embedding: num_positions must be >= 1, got ", num_positions);
    PADFREE_REQUIRE(position_offset >= 0 && pad_position >= 0,
                    "decoder_step_embedding: position_offset and pad_position must be >= 0");
    PADFREE_REQUIRE(std::isfinite(embed_scale), "decoder_step_embedding: embed_scale must be finite");
    PADFREE_REQUIRE((ln_gamma == nullptr) == (ln_beta == nullptr),
                    "decoder_step_embedding: ln_gamma and ln_beta come together (or neither)");
    if (ln_gamma != nullptr) {
        PADFREE_CHECK(check_eps(eps));
        PADFREE_CHECK(check_tensor(ln_gamma, "decoder_step_embedding: ln_gamma"));
        PADFREE_CHECK(check_tensor(ln_beta, "decoder_step_embedding: ln_beta"));
    }
    if (rows == 0) return PADFREE_OK;
    PADFREE_REQUIRE(tokens != nullptr && reinterpret_cast<uintptr_t>(tokens) % 8 == 0,
                    "decoder_step_embedding: tokens must be an 8-byte aligned device pointer (int64)");
    PADFREE_REQUIRE(step != nullptr && aligned4(step), "decoder_step_embedding: step must be a 4-byte aligned pointer");
    PADFREE_CHECK(check_tensor(word_emb, "decoder_step_embedding: word_emb"));
    PADFREE_CHECK(check_tensor(positions, "decoder_step_embedding: positions"));
    PADFREE_CHECK(check_tensor(out, "decoder_step_embedding: out"));
    const StepEmbeddingArgs args{tokens, step, word_emb, positions, ln_gamma, ln_beta, out, rows, hidden, vocab,
                                 num_positions, position_offset, pad_token, pad_position, embed_scale, eps};
    return launched("decoder_step_embedding", launch_step_embedding(args, dtype, as_cuda_stream(stream)));
    PADFREE_CAPI_GUARD_END
}

}  // extern "C"
