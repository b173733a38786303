// Padded integer inputs -> packed int32 inputs, in two passes around one small read-back (inputs.h),
// or up to 2048 rows in one launch that does both. Rows are short (a few hundred ids): a warp checks a
// row, a block packs one; loads are widened to int64 by a runtime element size, since these kernels
// move kilobytes and the dispatch would only add code.
#include "inputs.h"

#include <cooperative_groups.h>

#include "common.cuh"
#include "padding.h"

namespace padfree {
namespace {

constexpr int kRowThreads = 128;
constexpr int32_t kMaxRowBlocks = 1 << 16;
constexpr int kWarpsPerStatsBlock = 4;
// Batches of up to this many positions are measured by one CTA of kOneBlockThreads, which also
// writes cu_seqlens and the host's copy of the totals (prepare_padded_inputs).
constexpr int kOneBlockThreads = 1024;
constexpr int64_t kOneBlockMaxPositions = 1 << 15;
constexpr int32_t kOneBlockMaxRows = 2048;  // lengths and starts in shared memory (16 KB)
// Up to kOneBlockMaxRows rows, batches of more rows than one CTA has warps (or of more positions)
// are prepared by a cooperative grid of CTAs this size, at most one per SM.
constexpr int kGridThreads = 256;

// The inputs' element types, one instantiation per pair (dispatched per row, outside the loops), so
// that the loads of several positions have no branch on a width between them and can be in flight
// together.
struct NoMask {};  // no attention_mask: every position is a token

template <typename T>
__device__ __forceinline__ int64_t load_at(const void* base, int64_t i) {
    return static_cast<const T*>(base)[i];
}

template <>
__device__ __forceinline__ int64_t load_at<NoMask>(const void*, int64_t) {
    return 1;
}

// f(Id{}) with Id in {int32_t, int64_t}: the ids' (and types') element type.
template <typename F>
__device__ __forceinline__ auto with_id_type(const PaddedInputs& in, F&& f) {
    return in.id_bytes == 4 ? f(int32_t{}) : f(int64_t{});
}

// f(Mask{}, Id{}) with Mask in {NoMask, uint8_t, int32_t, int64_t}, Id as with_id_type's.
template <typename F>
__device__ __forceinline__ auto with_input_types(const PaddedInputs& in, F&& f) {
    const auto with_ids = [&](auto mask) { return with_id_type(in, [&](auto id) { return f(mask, id); }); };
    if (in.mask == nullptr) return with_ids(NoMask{});
    switch (in.mask_bytes) {
        case 1: return with_ids(uint8_t{});
        case 4: return with_ids(int32_t{});
        default: return with_ids(int64_t{});
    }
}

struct RowStats {
    int32_t length;
    int flags;
};

// One warp measures and checks one row; every lane gets the result. Mask, ids and types are loaded
// together in one pass, before the length is known: the checks that depend on it (ones form a
// prefix, ids in range below it) come from the positions of the last one and of the first bad id
// and type, reduced over the warp, so that no second round of loads waits for the length.
template <typename Mask, typename Id>
__device__ __forceinline__ RowStats check_row_as(const PaddedInputs& in, int32_t row, int lane) {
    const int64_t base = static_cast<int64_t>(row) * in.padded_seqlen;
    int flags = 0;
    int count = 0;
    int32_t last_one = -1;                                      // the row's last position of a 1
    int32_t first_bad_id = in.padded_seqlen, first_bad_type = in.padded_seqlen, first_forbidden = in.padded_seqlen;
#pragma unroll 4  // independent loads in flight: a row is a few dependent round trips otherwise
    for (int32_t j = lane; j < in.padded_seqlen; j += kWarpSize) {
        const int64_t m = load_at<Mask>(in.mask, base + j);
        const int64_t id = load_at<Id>(in.ids, base + j);
        // loaded whatever the positions before held (a load behind that test waits for them)
        const int64_t type = in.types != nullptr ? load_at<Id>(in.types, base + j) : 0;
        if (m == 1) {
            ++count;
            last_one = j;
        } else if (m != 0) {
            flags |= PADFREE_INPUT_MASK_VALUE;
        }
        if ((id < 0 || id >= in.vocab_size) && first_bad_id == in.padded_seqlen) first_bad_id = j;
        if (id == in.forbidden_id && in.forbidden_id >= 0 && first_forbidden == in.padded_seqlen) first_forbidden = j;
        if (in.types != nullptr && (type < 0 || type >= in.type_vocab_size) && first_bad_type == in.padded_seqlen)
            first_bad_type = j;
    }
    const int32_t length = static_cast<int32_t>(__reduce_add_sync(0xffffffffu, count));
    // right padding: the ones are exactly positions [0, length)
    if (__reduce_max_sync(0xffffffffu, last_one) != length - 1) flags |= PADFREE_INPUT_MASK_ALIGN;
    if (__reduce_min_sync(0xffffffffu, first_bad_id) < length) flags |= PADFREE_INPUT_ID_RANGE;
    if (__reduce_min_sync(0xffffffffu, first_bad_type) < length) flags |= PADFREE_INPUT_TYPE_RANGE;
    if (__reduce_min_sync(0xffffffffu, first_forbidden) < length) flags |= PADFREE_INPUT_FORBIDDEN_ID;
    if (length == 0) flags |= PADFREE_INPUT_EMPTY_ROW;
    return {length, static_cast<int>(__reduce_or_sync(0xffffffffu, static_cast<unsigned>(flags)))};
}

__device__ __forceinline__ RowStats check_row(const PaddedInputs& in, int32_t row, int lane) {
    return with_input_types(
        in, [&](auto mask, auto id) { return check_row_as<decltype(mask), decltype(id)>(in, row, lane); });
}

// `threads` threads (this one is `rank`) copy row `row`'s first `seqlen` ids (and types) to packed
// position `start` onwards, clamped to the packed buffers whatever seqlen holds: memory stays safe.
// Loads go in groups of kPackGroup before their stores: the packed and padded buffers may alias as
// far as the compiler knows, so a load after a store would wait for it, a round trip per position
// (a 256-position row took 8 of them in a row, on the HF-style call's critical path).
constexpr int kPackGroup = 4;

template <typename Id>
__device__ __forceinline__ void pack_row_as(const PaddedInputs& in, int32_t row, int32_t seqlen, int32_t start,
                                            const PackedOutputs& out, int rank, int threads) {
    const int64_t base = static_cast<int64_t>(row) * in.padded_seqlen;
    const int32_t length = min(min(max(seqlen, 0), in.padded_seqlen), max(out.packed_capacity - start, 0));
    const bool types = out.packed_types != nullptr;
    for (int32_t first = rank; first < length; first += kPackGroup * threads) {
        int32_t ids[kPackGroup], type_ids[kPackGroup];
#pragma unroll
        for (int k = 0; k < kPackGroup; ++k) {
            const int32_t j = first + k * threads;
            if (j >= length) break;
            ids[k] = static_cast<int32_t>(load_at<Id>(in.ids, base + j));
            if (types) type_ids[k] = static_cast<int32_t>(load_at<Id>(in.types, base + j));
        }
#pragma unroll
        for (int k = 0; k < kPackGroup; ++k) {
            const int32_t j = first + k * threads;
            if (j >= length) break;
            out.packed_ids[start + j] = ids[k];
            if (types) out.packed_types[start + j] = type_ids[k];
        }
    }
}

__device__ __forceinline__ void pack_row(const PaddedInputs& in, int32_t row, int32_t seqlen, int32_t start,
                                         const PackedOutputs& out, int rank, int threads) {
    with_id_type(in, [&](auto id) { pack_row_as<decltype(id)>(in, row, seqlen, start, out, rank, threads); });
}

// The rows of this thread's warp, one warp per row over the whole grid: first, first + step, ...
struct WarpRows {
    int32_t first;
    int32_t step;
};

__device__ __forceinline__ WarpRows warp_rows() {
    const int32_t warps = static_cast<int32_t>(blockDim.x) / kWarpSize;
    return {static_cast<int32_t>(blockIdx.x) * warps + static_cast<int32_t>(threadIdx.x) / kWarpSize,
            static_cast<int32_t>(gridDim.x) * warps};
}

// Checks this warp's rows and stores their lengths to seqlens (and to lengths where not null); lane 0
// folds each row into *flags (OR), *longest (max) and *total (sum, where not null), shared or global.
__device__ __forceinline__ void check_warp_rows(const PaddedInputs& in, int32_t* seqlens, int32_t* lengths,
                                                int* flags, int* longest, int* total) {
    const int lane = threadIdx.x % kWarpSize;
    const WarpRows rows = warp_rows();
    for (int32_t row = rows.first; row < in.batch; row += rows.step) {
        const RowStats r = check_row(in, row, lane);
        if (lane == 0) {
            seqlens[row] = r.length;
            if (lengths != nullptr) lengths[row] = r.length;
            if (r.flags) atomicOr(flags, r.flags);
            atomicMax(longest, r.length);
            if (total != nullptr) atomicAdd(total, r.length);
        }
    }
}

// After a block scan of every length into starts (shared): cu_seqlens with its capacity tail, by
// one block.
__device__ __forceinline__ void store_cu_seqlens(const int32_t* starts, int32_t batch, int total,
                                                 const PackedOutputs& out) {
    for (int32_t b = threadIdx.x; b <= out.cu_capacity; b += blockDim.x)
        out.cu_seqlens[b] = b <= batch ? starts[b] : total;
}

// This warp's rows packed, from lengths and starts in shared memory.
__device__ __forceinline__ void pack_warp_rows(const PaddedInputs& in, const int32_t* lengths, const int32_t* starts,
                                               const PackedOutputs& out) {
    const WarpRows rows = warp_rows();
    for (int32_t row = rows.first; row < in.batch; row += rows.step)
        pack_row(in, row, lengths[row], starts[row], out, threadIdx.x % kWarpSize, kWarpSize);
}

// A warp per row, grid-strided; totals by atomics into stats (zeroed before).
__global__ void padded_input_stats_kernel(PaddedInputs in, int32_t* seqlens, int32_t* stats) {
    wait_on_producer();
    check_warp_rows(in, seqlens, nullptr, &stats[0], &stats[2], &stats[1]);
}

// The whole prepare step for a small batch in one CTA, which has every length: the totals (no memset
// first), cu_seqlens with its capacity tail (no scan launch), the pack (no pack launch), and the
// totals' host copy (a store to mapped host memory instead of a copy launch). In front of the
// HF-style call's graph, each launch saved is latency the GPU idles through; inside, lengths and
// starts stay in shared memory, so the scan and the pack wait for no global round trip. The host
// copy is written before the pack and without a system fence: the host polls until all three values
// are written (it set them to -1) and then only enqueues work behind this kernel, so a fence would
// only hold the kernel back.
__global__ void __launch_bounds__(kOneBlockThreads, 1) one_block_prepare_kernel(PaddedInputs in, int32_t* seqlens,
                                                                            int32_t* stats, int32_t* host_stats,
                                                                            PackedOutputs out, GuardCondition guard) {
    wait_on_producer();
    __shared__ int flags, longest;
    __shared__ int32_t lengths[kOneBlockMaxRows], starts[kOneBlockMaxRows + 1];
    if (threadIdx.x == 0) flags = longest = 0;
    __syncthreads();
    check_warp_rows(in, seqlens, lengths, &flags, &longest, nullptr);
    __syncthreads();  // lengths and the shared totals are complete
    const int total = block_prefix_sum(lengths, in.batch, starts);
    __syncthreads();  // starts complete
    if (threadIdx.x == 0) {
        stats[0] = flags;
        stats[1] = total;
        stats[2] = longest;
        if (host_stats != nullptr) {
            host_stats[0] = flags;
            host_stats[1] = total;
            host_stats[2] = longest;
        }
        decide_guard(guard, flags, total, longest);
    }
    store_cu_seqlens(starts, in.batch, total, out);
    pack_warp_rows(in, lengths, starts, out);
}

// The same single launch for batches of more rows than one CTA has warps (up to kOneBlockMaxRows):
// a cooperative grid, a warp per row, two grid-wide barriers instead of kernel boundaries. One CTA
// checks its rows one after another, each a few dependent memory round trips: 28 us for 64 rows of
// 512 on the H100, on the HF-style call's critical path. Every CTA scans all the lengths itself (a
// few KB from L2), so no third barrier waits for one CTA's scan before the pack.
__global__ void __launch_bounds__(kGridThreads) grid_prepare_kernel(PaddedInputs in, int32_t* seqlens,
                                                                   int32_t* stats, int32_t* host_stats,
                                                                   PackedOutputs out) {
    wait_on_producer();
    const cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    __shared__ int flags, longest;
    __shared__ int32_t lengths[kOneBlockMaxRows], starts[kOneBlockMaxRows + 1];
    if (threadIdx.x == 0) {
        flags = longest = 0;
        if (blockIdx.x == 0) stats[0] = stats[1] = stats[2] = 0;  // no CTA adds to them before the barrier
    }
    __syncthreads();
    check_warp_rows(in, seqlens, nullptr, &flags, &longest, nullptr);
    __syncthreads();
    grid.sync();  // every length written, stats zeroed
    if (threadIdx.x == 0) {
        if (flags) atomicOr(&stats[0], flags);
        atomicMax(&stats[2], longest);
    }
    for (int32_t b = threadIdx.x; b < in.batch; b += blockDim.x) lengths[b] = __ldcg(seqlens + b);
    __syncthreads();
    const int total = block_prefix_sum(lengths, in.batch, starts);
    __syncthreads();  // starts complete
    if (blockIdx.x == 0) {
        if (threadIdx.x == 0) stats[1] = total;
        store_cu_seqlens(starts, in.batch, total, out);
    }
    pack_warp_rows(in, lengths, starts, out);
    if (host_stats == nullptr) return;  // uniform over the grid: every CTA skips the barrier alike
    grid.sync();  // every CTA's flags and longest are in stats
    if (blockIdx.x == 0 && threadIdx.x < 3) host_stats[threadIdx.x] = __ldcg(stats + threadIdx.x);
}

// Block per row: copies its ids to cu_seqlens[row] onwards; block 0 also writes the capacity tail.
__global__ void pack_padded_inputs_kernel(PaddedInputs in, const int32_t* seqlens, PackedOutputs out) {
    wait_on_producer();
    if (blockIdx.x == 0)
        for (int32_t b = in.batch + 1 + threadIdx.x; b <= out.cu_capacity; b += blockDim.x)
            out.cu_seqlens[b] = out.cu_seqlens[in.batch];
    for (int32_t row = blockIdx.x; row < in.batch; row += gridDim.x)
        pack_row(in, row, seqlens[row], out.cu_seqlens[row], out, threadIdx.x, blockDim.x);
}

unsigned row_blocks(int32_t batch) { return static_cast<unsigned>(batch < kMaxRowBlocks ? batch : kMaxRowBlocks); }

}  // namespace

PackedOutputs packed_outputs(bool token_types, int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                             int32_t* packed_token_type_ids, int32_t* cu_seqlens) {
    return {cu_capacity, packed_capacity, packed_ids, token_types ? packed_token_type_ids : nullptr, cu_seqlens};
}

// Pinned host memory is mapped under unified addressing (every 64-bit CUDA platform).
int32_t* mapped_host_stats(int32_t* host_stats) {
    void* device = nullptr;
    if (host_stats == nullptr || cudaHostGetDevicePointer(&device, host_stats, 0) != cudaSuccess) {
        cudaGetLastError();  // not mapped (pageable memory): not an error of this call
        return nullptr;
    }
    return static_cast<int32_t*>(device);
}

void launch_padded_input_stats(const void* mask, int mask_bytes, const void* input_ids,
                               const void* token_type_ids, int id_bytes, int32_t batch,
                               int32_t padded_seqlen, int64_t vocab_size, int64_t type_vocab_size,
                               int64_t forbidden_id, int32_t* seqlens, int32_t* stats, int32_t* host_stats,
                               cudaStream_t stream) {
    const PaddedInputs in{mask, mask_bytes, input_ids, token_type_ids, id_bytes, batch, padded_seqlen, vocab_size,
                          type_vocab_size, forbidden_id};
    cudaMemsetAsync(stats, 0, 3 * sizeof(int32_t), stream);
    const unsigned blocks = row_blocks(ceil_div<int32_t>(batch, kWarpsPerStatsBlock));
    launch_kernel(padded_input_stats_kernel, blocks, kWarpsPerStatsBlock * kWarpSize, 0, stream, in, seqlens, stats);
    if (host_stats != nullptr)
        cudaMemcpyAsync(host_stats, stats, 3 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
}

void launch_pack_padded_inputs(const void* input_ids, const void* token_type_ids, int id_bytes,
                               const int32_t* seqlens, int32_t batch, int32_t padded_seqlen,
                               int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                               int32_t* packed_token_type_ids, int32_t* cu_seqlens, cudaStream_t stream) {
    launch_cu_seqlens_from_seqlens(seqlens, batch, cu_seqlens, stream);
    const PaddedInputs in{nullptr, 0, input_ids, token_type_ids, id_bytes, batch, padded_seqlen, 0, 0, -1};
    launch_kernel(pack_padded_inputs_kernel, row_blocks(batch), kRowThreads, 0, stream, in, seqlens,
                  packed_outputs(token_type_ids != nullptr, cu_capacity, packed_capacity, packed_ids,
                                 packed_token_type_ids, cu_seqlens));
}

namespace {

bool one_block_batch(const PaddedInputs& in) {
    return in.batch <= kOneBlockThreads / kWarpSize &&
           static_cast<int64_t>(in.batch) * in.padded_seqlen <= kOneBlockMaxPositions;
}

// The single-launch kernels store host_stats through its mapping: none, and they cannot.
bool unmapped_host_stats(const PrepareArgs& args) {
    return args.host_stats != nullptr && args.host_stats_mapped == nullptr;
}

}  // namespace

void launch_prepare_padded_inputs(const PrepareArgs& args, cudaStream_t stream) {
    const PaddedInputs& in = args.in;
    const PackedOutputs& out = args.out;
    const auto separate_launches = [&] {
        launch_padded_input_stats(in.mask, in.mask_bytes, in.ids, in.types, in.id_bytes, in.batch, in.padded_seqlen,
                                  in.vocab_size, in.type_vocab_size, in.forbidden_id, args.seqlens, args.stats,
                                  args.host_stats, stream);
        launch_pack_padded_inputs(in.ids, in.types, in.id_bytes, args.seqlens, in.batch, in.padded_seqlen,
                                  out.cu_capacity, out.packed_capacity, out.packed_ids, out.packed_types,
                                  out.cu_seqlens, stream);
    };
    if (in.batch > kOneBlockMaxRows || unmapped_host_stats(args)) {
        separate_launches();
        return;
    }
    if (one_block_batch(in)) {
        launch_kernel(one_block_prepare_kernel, 1, kOneBlockThreads, 0, stream, in, args.seqlens, args.stats,
                      args.host_stats_mapped, out, GuardCondition{});
        return;
    }
    // At most one CTA per SM, so that the whole grid is resident (which its barriers need; the
    // cooperative launch checks it). Not PDL: the launch attribute is cooperative alone.
    const int sms = current_device_value<query_sm_count>();
    const int32_t wanted = ceil_div<int32_t>(in.batch, kGridThreads / kWarpSize);
    const unsigned blocks = static_cast<unsigned>(sms > 0 && wanted > sms ? sms : wanted);
    cudaLaunchAttribute cooperative{};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    const cudaLaunchConfig_t config{blocks, kGridThreads, 0, stream, &cooperative, 1};
    if (cudaLaunchKernelEx(&config, grid_prepare_kernel, in, args.seqlens, args.stats, args.host_stats_mapped, out) !=
        cudaSuccess) {
        // refused (no room for the grid: SMs held by other work, MPS limits): the same results in
        // separate launches rather than an error
        cudaGetLastError();
        separate_launches();
    }
}

bool one_block_prepare_node(const PrepareArgs& args, PrepareKernelNode* node) {
    if (!one_block_batch(args.in) || unmapped_host_stats(args)) return false;
    node->in = args.in;
    node->seqlens = args.seqlens;
    node->stats = args.stats;
    node->host_stats_mapped = args.host_stats_mapped;
    node->out = args.out;
    node->args[0] = &node->in;
    node->args[1] = &node->seqlens;
    node->args[2] = &node->stats;
    node->args[3] = &node->host_stats_mapped;
    node->args[4] = &node->out;
    node->guard = GuardCondition{};
    node->args[5] = &node->guard;
    node->params = cudaKernelNodeParams{};
    node->params.func = reinterpret_cast<void*>(one_block_prepare_kernel);
    node->params.gridDim = dim3(1);
    node->params.blockDim = dim3(kOneBlockThreads);
    node->params.kernelParams = node->args;
    return true;
}

}  // namespace padfree
