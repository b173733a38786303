// Prefix-sum packing (ByteTransformer's remove/rebuild padding): launchers over device pointers.
// Arguments are validated by capi/padding_capi.cpp; these only enqueue on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace padfree {

// seqlens: [batch] -> cu_seqlens: [batch + 1], cu_seqlens[0] = 0. batch >= 0 (0 writes [0]).
void launch_cu_seqlens_from_seqlens(const int32_t* seqlens, int32_t batch, int32_t* cu_seqlens,
                                    cudaStream_t stream);

// mask: [batch, padded_seqlen] -> cu_seqlens: [batch + 1]; adds to *invalid_rows (if not null) the
// number of rows that are not ones-then-zeros. batch >= 0, padded_seqlen >= 0 (as the C ABI allows).
void launch_cu_seqlens_from_mask(const int32_t* mask, int32_t batch, int32_t padded_seqlen,
                                 int32_t* cu_seqlens, int32_t* invalid_rows, cudaStream_t stream);

// padded: [batch, padded_seqlen, row_bytes] -> packed: [total_tokens, row_bytes].
// 1 <= row_bytes < 2^31; a sequence longer than padded_seqlen is cut at padded_seqlen, and each
// sequence's packed rows are clamped to [0, total_tokens] (rows past it are not copied).
void launch_remove_padding(const void* padded, const int32_t* cu_seqlens, int32_t batch,
                           int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes,
                           void* packed, cudaStream_t stream);

// packed: [total_tokens, row_bytes] -> padded: [batch, padded_seqlen, row_bytes], zeros past
// each sequence's length; packed rows are clamped as in launch_remove_padding, and the padded
// rows they no longer cover are zeros too.
void launch_rebuild_padding(const void* packed, const int32_t* cu_seqlens, int32_t batch,
                            int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes,
                            void* padded, cudaStream_t stream);

}  // namespace padfree
