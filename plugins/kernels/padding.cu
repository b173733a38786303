// Prefix-sum packing, as ByteTransformer does it: sequence lengths -> cu_seqlens by a block scan,
// and padded <-> packed copies. Each sequence's valid rows are contiguous in both layouts, so a
// copy is one memcpy per sequence, split over blocks in fixed chunks: no per-element division.
#include "padding.h"

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kMaskThreads = 128;
constexpr int kCopyThreads = 256;
constexpr int kCopyUnitsPerThread = 8;
constexpr int kCopyChunk = kCopyThreads * kCopyUnitsPerThread;  // units per block and chunk
constexpr int64_t kMaxGrid = 1 << 20;                           // beyond this, blocks loop

// One block: cu_seqlens from lengths (common.cuh: block_prefix_sum).
__global__ void prefix_sum_kernel(const int32_t* lengths, int32_t batch, int32_t* cu_seqlens) {
    wait_on_producer();
    block_prefix_sum(lengths, batch, cu_seqlens);
}

// One block per mask row: length = number of ones; the row is valid when it is exactly `length`
// ones followed by zeros. Lengths go to cu_seqlens[1 + row] for the scan that follows.
__global__ void mask_row_lengths_kernel(const int32_t* mask, int32_t padded_seqlen, int32_t* lengths,
                                        int32_t* invalid_rows) {
    wait_on_producer();
    __shared__ int count;
    const int32_t* m = mask + static_cast<int64_t>(blockIdx.x) * padded_seqlen;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    int ones = 0;
    for (int32_t j = threadIdx.x; j < padded_seqlen; j += blockDim.x) ones += (m[j] == 1);
    atomicAdd(&count, ones);
    __syncthreads();
    const int length = count;
    int bad = 0;
    for (int32_t j = threadIdx.x; j < padded_seqlen; j += blockDim.x) bad |= m[j] != (j < length ? 1 : 0);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        lengths[blockIdx.x] = length;
        if (bad && invalid_rows != nullptr) atomicAdd(invalid_rows, 1);
    }
}

// Sequence b's packed rows [start, start + length), clamped to the packed tensor's total_rows
// rows (whatever cu_seqlens holds) and cut at padded_seqlen: no copy leaves either tensor.
struct PackedRange {
    int32_t start;
    int32_t length;
};

__device__ PackedRange packed_range(const int32_t* cu_seqlens, int32_t b, int32_t total_rows,
                                    int32_t padded_seqlen) {
    const int32_t start = min(max(cu_seqlens[b], 0), total_rows);
    const int32_t end = min(max(cu_seqlens[b + 1], start), total_rows);
    return {start, min(end - start, padded_seqlen)};
}

struct Chunking {
    int64_t units_per_row;
    int64_t chunks_per_sequence;  // over the padded extent, padded_seqlen * units_per_row
    int64_t blocks;
};

Chunking chunking(int32_t batch, int32_t padded_seqlen, int64_t row_bytes, int unit_bytes) {
    Chunking c;
    c.units_per_row = row_bytes / unit_bytes;
    c.chunks_per_sequence = ceil_div<int64_t>(static_cast<int64_t>(padded_seqlen) * c.units_per_row, kCopyChunk);
    c.blocks = static_cast<int64_t>(batch) * c.chunks_per_sequence;
    return c;
}

// A block's chunk: units [begin, end) of src -> dst, units at or past `valid` (and not past end)
// written as zeros. Every load is issued before any store: through two pointers that may alias, the
// compiler would otherwise keep each load behind the previous store, kCopyUnitsPerThread round
// trips in a row (a small batch's copy is that latency: 5.6 us for BERT-base's 1x128 output).
template <typename U>
__device__ __forceinline__ void copy_chunk(const U* src, U* dst, int64_t begin, int64_t end, int64_t valid) {
    U units[kCopyUnitsPerThread];
#pragma unroll
    for (int k = 0; k < kCopyUnitsPerThread; ++k) {
        const int64_t i = begin + threadIdx.x + static_cast<int64_t>(k) * kCopyThreads;
        units[k] = i < end && i < valid ? src[i] : U{};
    }
#pragma unroll
    for (int k = 0; k < kCopyUnitsPerThread; ++k) {
        const int64_t i = begin + threadIdx.x + static_cast<int64_t>(k) * kCopyThreads;
        if (i < end) dst[i] = units[k];
    }
}

// Block (b, c) copies units [c * kCopyChunk, ...) of sequence b's valid rows.
template <typename U>
__global__ void __launch_bounds__(kCopyThreads) remove_padding_kernel(const U* padded, const int32_t* cu_seqlens,
                                                                      int32_t total_rows, int32_t padded_seqlen,
                                                                      Chunking c, U* packed) {
    wait_on_producer();
    for (int64_t block = blockIdx.x; block < c.blocks; block += gridDim.x) {
        const int32_t b = static_cast<int32_t>(block / c.chunks_per_sequence);
        const int64_t begin = (block % c.chunks_per_sequence) * kCopyChunk;
        const PackedRange r = packed_range(cu_seqlens, b, total_rows, padded_seqlen);
        const int64_t valid = static_cast<int64_t>(r.length) * c.units_per_row;
        const int64_t end = min(begin + static_cast<int64_t>(kCopyChunk), valid);
        copy_chunk(padded + static_cast<int64_t>(b) * padded_seqlen * c.units_per_row,
                   packed + static_cast<int64_t>(r.start) * c.units_per_row, begin, end, valid);
    }
}

// Block (b, c) writes units [c * kCopyChunk, ...) of padded sequence b: copied rows, then zeros.
template <typename U>
__global__ void __launch_bounds__(kCopyThreads) rebuild_padding_kernel(const U* packed, const int32_t* cu_seqlens,
                                                                       int32_t total_rows, int32_t padded_seqlen,
                                                                       Chunking c, U* padded) {
    wait_on_producer();
    const int64_t padded_units = static_cast<int64_t>(padded_seqlen) * c.units_per_row;
    for (int64_t block = blockIdx.x; block < c.blocks; block += gridDim.x) {
        const int32_t b = static_cast<int32_t>(block / c.chunks_per_sequence);
        const int64_t begin = (block % c.chunks_per_sequence) * kCopyChunk;
        const PackedRange r = packed_range(cu_seqlens, b, total_rows, padded_seqlen);
        copy_chunk(packed + static_cast<int64_t>(r.start) * c.units_per_row,
                   padded + static_cast<int64_t>(b) * padded_units, begin,
                   min(begin + static_cast<int64_t>(kCopyChunk), padded_units),
                   static_cast<int64_t>(r.length) * c.units_per_row);
    }
}

// The widest unit (16, 8, 4, 2 or 1 bytes) that divides row_bytes and both base addresses: every
// row then starts aligned, since row offsets are multiples of row_bytes.
int copy_unit_bytes(const void* a, const void* b, int64_t row_bytes) {
    for (int unit = kVectorBytes; unit > 1; unit /= 2)
        if (row_bytes % unit == 0 && is_aligned(a, unit) && is_aligned(b, unit)) return unit;
    return 1;
}

template <typename F>
void dispatch_unit(int unit_bytes, F&& f) {
    switch (unit_bytes) {
        case 16: f(TypeTag<uint4>{}); break;
        case 8: f(TypeTag<uint2>{}); break;
        case 4: f(TypeTag<uint32_t>{}); break;
        case 2: f(TypeTag<uint16_t>{}); break;
        default: f(TypeTag<uint8_t>{}); break;
    }
}

// cu_seqlens entries are int32, so rows past INT32_MAX are reachable by no sequence.
int32_t int32_rows(int64_t total_tokens) {
    return static_cast<int32_t>(total_tokens < INT32_MAX ? total_tokens : INT32_MAX);
}

unsigned grid_for(int64_t blocks) { return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid); }

}  // namespace

void launch_cu_seqlens_from_seqlens(const int32_t* seqlens, int32_t batch, int32_t* cu_seqlens,
                                    cudaStream_t stream) {
    launch_kernel(prefix_sum_kernel, 1, kScanThreads, 0, stream, seqlens, batch, cu_seqlens);
}

void launch_cu_seqlens_from_mask(const int32_t* mask, int32_t batch, int32_t padded_seqlen,
                                 int32_t* cu_seqlens, int32_t* invalid_rows, cudaStream_t stream) {
    if (batch > 0)
        launch_kernel(mask_row_lengths_kernel, batch, kMaskThreads, 0, stream, mask, padded_seqlen, cu_seqlens + 1,
                      invalid_rows);
    launch_kernel(prefix_sum_kernel, 1, kScanThreads, 0, stream, cu_seqlens + 1, batch, cu_seqlens);
}

void launch_remove_padding(const void* padded, const int32_t* cu_seqlens, int32_t batch,
                           int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes, void* packed,
                           cudaStream_t stream) {
    const int unit = copy_unit_bytes(padded, packed, row_bytes);
    const Chunking c = chunking(batch, padded_seqlen, row_bytes, unit);
    if (c.blocks == 0) return;
    const int32_t total_rows = int32_rows(total_tokens);
    dispatch_unit(unit, [&](auto tag) {
        using U = typename decltype(tag)::type;
        launch_kernel(remove_padding_kernel<U>, grid_for(c.blocks), kCopyThreads, 0, stream,
                      static_cast<const U*>(padded), cu_seqlens, total_rows, padded_seqlen, c, static_cast<U*>(packed));
    });
}

void launch_rebuild_padding(const void* packed, const int32_t* cu_seqlens, int32_t batch,
                            int64_t total_tokens, int32_t padded_seqlen, int64_t row_bytes,
                            void* padded,
                            cudaStream_t stream) {
    const int unit = copy_unit_bytes(padded, packed, row_bytes);
    const Chunking c = chunking(batch, padded_seqlen, row_bytes, unit);
    if (c.blocks == 0) return;
    const int32_t total_rows = int32_rows(total_tokens);
    dispatch_unit(unit, [&](auto tag) {
        using U = typename decltype(tag)::type;
        launch_kernel(rebuild_padding_kernel<U>, grid_for(c.blocks), kCopyThreads, 0, stream,
                      static_cast<const U*>(packed), cu_seqlens, total_rows, padded_seqlen, c, static_cast<U*>(padded));
    });
}

}  // namespace padfree
