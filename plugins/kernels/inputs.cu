// Padded integer inputs -> packed int32 inputs, in two passes around one small read-back (inputs.h).
// Rows are short (a few hundred ids): one block per row, grid-strided, loads widened to int64 by a
// runtime element size, since these kernels move kilobytes and the dispatch would only add code.
#include "inputs.h"

#include "common.cuh"
#include "padding.h"

namespace padfree {
namespace {

constexpr int kRowThreads = 128;
constexpr int32_t kMaxRowBlocks = 1 << 16;

__device__ __forceinline__ int64_t load_int(const void* base, int bytes, int64_t i) {
    switch (bytes) {
        case 1: return static_cast<const uint8_t*>(base)[i];
        case 4: return static_cast<const int32_t*>(base)[i];
        default: return static_cast<const int64_t*>(base)[i];
    }
}

__global__ void padded_input_stats_kernel(const void* mask, int mask_bytes, const void* ids,
                                          const void* types, int id_bytes, int32_t batch, int32_t padded_seqlen,
                                          int64_t vocab_size, int64_t type_vocab_size, int32_t* seqlens,
                                          int32_t* stats) {
    wait_on_producer();
    __shared__ int ones, row_flags;
    for (int32_t row = blockIdx.x; row < batch; row += gridDim.x) {
        const int64_t base = static_cast<int64_t>(row) * padded_seqlen;
        if (threadIdx.x == 0) ones = row_flags = 0;
        __syncthreads();
        int flags = 0;
        int count = 0;
        if (mask == nullptr) {
            count = threadIdx.x == 0 ? padded_seqlen : 0;
        } else {
            for (int32_t j = threadIdx.x; j < padded_seqlen; j += blockDim.x) {
                const int64_t m = load_int(mask, mask_bytes, base + j);
                count += m == 1;
                if (m != 0 && m != 1) flags |= PADFREE_INPUT_MASK_VALUE;
            }
        }
        atomicAdd(&ones, count);
        __syncthreads();
        const int32_t length = ones;
        for (int32_t j = threadIdx.x; j < padded_seqlen; j += blockDim.x) {
            const bool valid = j < length;
            if (mask != nullptr && (load_int(mask, mask_bytes, base + j) == 1) != valid)
                flags |= PADFREE_INPUT_MASK_ALIGN;  // a one after a zero: not right padding
            if (!valid) continue;
            const int64_t id = load_int(ids, id_bytes, base + j);
            if (id < 0 || id >= vocab_size) flags |= PADFREE_INPUT_ID_RANGE;
            if (types != nullptr) {
                const int64_t type = load_int(types, id_bytes, base + j);
                if (type < 0 || type >= type_vocab_size) flags |= PADFREE_INPUT_TYPE_RANGE;
            }
        }
        if (length == 0) flags |= PADFREE_INPUT_EMPTY_ROW;
        if (flags) atomicOr(&row_flags, flags);
        __syncthreads();
        if (threadIdx.x == 0) {
            seqlens[row] = length;
            if (row_flags) atomicOr(&stats[0], row_flags);
            atomicAdd(&stats[1], length);
            atomicMax(&stats[2], length);
        }
        __syncthreads();  // the shared counters are reset for the next row
    }
}

// Block per row: copies its ids to cu_seqlens[row] onwards; block 0 also writes the capacity tail.
__global__ void pack_padded_inputs_kernel(const void* ids, const void* types, int id_bytes,
                                          const int32_t* seqlens, int32_t batch, int32_t padded_seqlen,
                                          int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                                          int32_t* packed_types, int32_t* cu_seqlens) {
    wait_on_producer();
    if (blockIdx.x == 0)
        for (int32_t b = batch + 1 + threadIdx.x; b <= cu_capacity; b += blockDim.x) cu_seqlens[b] = cu_seqlens[batch];
    for (int32_t row = blockIdx.x; row < batch; row += gridDim.x) {
        const int64_t base = static_cast<int64_t>(row) * padded_seqlen;
        const int32_t start = cu_seqlens[row];
        // clamped to the packed buffers, whatever seqlens holds: memory stays safe
        const int32_t length = min(min(max(seqlens[row], 0), padded_seqlen), max(packed_capacity - start, 0));
        for (int32_t j = threadIdx.x; j < length; j += blockDim.x) {
            packed_ids[start + j] = static_cast<int32_t>(load_int(ids, id_bytes, base + j));
            if (packed_types != nullptr)
                packed_types[start + j] = static_cast<int32_t>(load_int(types, id_bytes, base + j));
        }
    }
}

unsigned row_blocks(int32_t batch) { return static_cast<unsigned>(batch < kMaxRowBlocks ? batch : kMaxRowBlocks); }

}  // namespace

void launch_padded_input_stats(const void* mask, int mask_bytes, const void* input_ids,
                               const void* token_type_ids, int id_bytes, int32_t batch,
                               int32_t padded_seqlen, int64_t vocab_size, int64_t type_vocab_size,
                               int32_t* seqlens, int32_t* stats, int32_t* host_stats, cudaStream_t stream) {
    cudaMemsetAsync(stats, 0, 3 * sizeof(int32_t), stream);
    launch_kernel(padded_input_stats_kernel, row_blocks(batch), kRowThreads, 0, stream, mask, mask_bytes, input_ids,
                  token_type_ids, id_bytes, batch, padded_seqlen, vocab_size, type_vocab_size, seqlens, stats);
    if (host_stats != nullptr)
        cudaMemcpyAsync(host_stats, stats, 3 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
}

void launch_pack_padded_inputs(const void* input_ids, const void* token_type_ids, int id_bytes,
                               const int32_t* seqlens, int32_t batch, int32_t padded_seqlen,
                               int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                               int32_t* packed_token_type_ids, int32_t* cu_seqlens, cudaStream_t stream) {
    launch_cu_seqlens_from_seqlens(seqlens, batch, cu_seqlens, stream);
    int32_t* packed_types = token_type_ids != nullptr ? packed_token_type_ids : nullptr;
    launch_kernel(pack_padded_inputs_kernel, row_blocks(batch), kRowThreads, 0, stream, input_ids, token_type_ids,
                  id_bytes, seqlens, batch, padded_seqlen, cu_capacity, packed_capacity, packed_ids, packed_types,
                  cu_seqlens);
}

}  // namespace padfree
