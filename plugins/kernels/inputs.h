// A right-padded batch of integer model inputs (input_ids, attention_mask, token_type_ids as a
// tokenizer hands them over, on the GPU) -> validated, packed int32 inputs, without the host ever
// reading the padded tensors: one pass measures and checks, the host reads back only the totals it
// needs to pick a CUDA graph, a second pass packs. Launchers over device pointers; capi/inputs_capi.cpp
// checks the arguments.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "graphs/graph_guard.h"

namespace padfree {

// seqlens[b] = ones in mask row b (padded_seqlen where mask is null); stats[0] = OR of the
// PADFREE_INPUT_* flags over all rows, stats[1] = sum of seqlens, stats[2] = max of seqlens (stats
// zeroed first). Ids are range-checked at valid positions only: padding may hold anything.
// mask_bytes in {1, 4, 8} (bool/uint8, int32, int64), id_bytes in {4, 8} for ids and types.
// batch >= 1, padded_seqlen >= 1, batch * padded_seqlen <= INT32_MAX. host_stats (may be null): host
// memory that gets a stream-ordered copy of stats.
void launch_padded_input_stats(const void* mask, int mask_bytes, const void* input_ids,
                               const void* token_type_ids, int id_bytes, int32_t batch,
                               int32_t padded_seqlen, int64_t vocab_size, int64_t type_vocab_size,
                               int64_t forbidden_id, int32_t* seqlens, int32_t* stats, int32_t* host_stats,
                               cudaStream_t stream);

// cu_seqlens [cu_capacity + 1] = prefix sum of seqlens, entries past batch repeating the total;
// packed_ids (and packed_token_type_ids where both type pointers are set) [total] = each row's first
// seqlens[b] ids as int32, no position at or past packed_capacity written. seqlens as
// launch_padded_input_stats writes them (negative counts as 0, above padded_seqlen as padded_seqlen).
void launch_pack_padded_inputs(const void* input_ids, const void* token_type_ids, int id_bytes,
                               const int32_t* seqlens, int32_t batch, int32_t padded_seqlen,
                               int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                               int32_t* packed_token_type_ids, int32_t* cu_seqlens, cudaStream_t stream);

// host_stats' device address (kernels store to it directly), or null where it is not mapped
// (pageable memory). Pinned memory keeps its mapping for its lifetime: callers may keep the result.
int32_t* mapped_host_stats(int32_t* host_stats);

// The padded inputs as the kernels read them.
struct PaddedInputs {
    const void* mask;  // null: every position is a token
    int mask_bytes;
    const void* ids;
    const void* types;  // may be null
    int id_bytes;
    int32_t batch;
    int32_t padded_seqlen;
    int64_t vocab_size;
    int64_t type_vocab_size;
    int64_t forbidden_id;  // an id no valid position may hold (-1: none): PADFREE_INPUT_FORBIDDEN_ID
};

// Where the packed inputs go.
struct PackedOutputs {
    int32_t cu_capacity;      // cu_seqlens has cu_capacity + 1 entries
    int32_t packed_capacity;  // packed_ids (and packed_types) length
    int32_t* packed_ids;
    int32_t* packed_types;    // null: types are not packed
    int32_t* cu_seqlens;
};

// packed_token_type_ids where there are token types to pack, else null.
PackedOutputs packed_outputs(bool token_types, int32_t cu_capacity, int32_t packed_capacity, int32_t* packed_ids,
                             int32_t* packed_token_type_ids, int32_t* cu_seqlens);

// The arguments of the whole prepare step: the two launchers' above, and host_stats' device address
// (mapped_host_stats(host_stats)).
struct PrepareArgs {
    PaddedInputs in;
    int32_t* seqlens;
    int32_t* stats;
    int32_t* host_stats;
    int32_t* host_stats_mapped;
    PackedOutputs out;  // packed_types null where in.types is
};

// Both of the above, same results (cu_seqlens written, host_stats filled when the stream gets there),
// in one launch for up to 2048 rows, which stores to host_stats through host_stats_mapped: one CTA
// measures, sums, scans and packs batches of up to 32 rows and 32K positions, a cooperative grid
// larger ones. Past 2048 rows, or where host_stats is not mapped, the five operations of the two
// calls above.
void launch_prepare_padded_inputs(const PrepareArgs& args, cudaStream_t stream);

// The one-CTA launch above as a CUDA graph's kernel node, for a graph that starts with the prepare
// step and is launched again with other inputs (cudaGraphExecKernelNodeSetParams): one graph launch
// instead of a kernel launch and a graph launch. Made by one_block_prepare_node, which says whether
// the batch is one of the one-CTA kind; params.kernelParams point into the node, so it stays put.
// `guard`, one of the kernel's arguments: a guarded graph's condition, decided from the totals
// (launch_guarded_graph_behind enables it).
struct PrepareKernelNode {
    cudaKernelNodeParams params{};
    PaddedInputs in{};
    int32_t* seqlens = nullptr;
    int32_t* stats = nullptr;
    int32_t* host_stats_mapped = nullptr;
    PackedOutputs out{};
    GuardCondition guard{};
    void* args[6] = {};

    PrepareKernelNode() = default;
    PrepareKernelNode(const PrepareKernelNode&) = delete;
    PrepareKernelNode& operator=(const PrepareKernelNode&) = delete;
};

bool one_block_prepare_node(const PrepareArgs& args, PrepareKernelNode* node);

}  // namespace padfree
