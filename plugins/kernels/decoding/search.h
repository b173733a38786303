// The search's bookkeeping after a decoding step's top-k (kernels/decoding/logits.h): beam search with
// Hugging Face's rules, and greedy search, each one kernel per step (arguments validated by
// capi/decoding_capi.cpp). Every array lives on the device; the step index is a device int32 the
// kernels read and advance, so one captured CUDA graph replays every step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace padfree {

// HF's _beam_search step (transformers 5) for `batch` sources of `beams` hypotheses, given each row's
// `keep` best candidates (scores with the row's running score added, descending, ties to the smaller
// id). Sequences are [batch, beams, max_length] int64; the pool holds each source's finished
// hypotheses. See padfree.h (padfree_beam_search_step) for the exact contract.
struct BeamSearchStepArgs {
    const float* cand_scores;  // [batch * beams, keep]
    const int32_t* cand_ids;   // [batch * beams, keep]
    const int32_t* eos_ids;    // [num_eos]
    int64_t* running;          // [batch, beams, max_length]
    float* running_scores;     // [batch, beams]
    int64_t* pool;             // [batch, beams, max_length]
    float* pool_scores;        // [batch, beams]
    int64_t* pool_lengths;     // [batch, beams]
    void* pool_finished;       // [batch, beams] flags of flag_bytes each (0/1)
    void* improvable;          // [batch] flags of flag_bytes each
    uint8_t* done;             // [1], sticky
    int64_t* next_tokens;      // [batch * beams]: the token each hypothesis feeds the next step
    int32_t* parents;          // [batch * beams]: the row each hypothesis continues
    int32_t* cache_indir;      // [batch * beams, indir_len] or null: reordered in place
    int32_t* step;             // [1]
    void* workspace;           // beam_search_workspace_bytes, counters zeroed before the first step
    int32_t batch;
    int32_t beams;
    int32_t keep;
    int32_t num_eos;
    int32_t max_length;
    int32_t indir_len;
    float length_penalty;
    int32_t early_stopping;  // 0: False, 1: True, 2: "never"
    int32_t flag_bytes;      // 1: uint8 flags (torch.bool), 4: int32 flags (TensorRT)
    bool advance_step;
};

constexpr int32_t kBeamSearchMaxBeams = 16;
constexpr int32_t kBeamSearchMaxKeep = 64;  // = kLogitsTopkMaxK

// Per-source scratch (the rows a block rewrites in place) plus the grid's reduction counters.
int64_t beam_search_workspace_bytes(int32_t batch, int32_t beams, int32_t max_length, int32_t indir_len);
// The counters' offset in the workspace: callers zero these 16 bytes once, the kernel keeps them zero.
int64_t beam_search_counters_offset(int32_t batch, int32_t beams, int32_t max_length, int32_t indir_len);

void launch_beam_search_step(const BeamSearchStepArgs& args, cudaStream_t stream);

// HF's _sample step without sampling: token = cand_ids[r] (the top-1), rows that finished emit pad;
// sequences [rows, max_length] int64 get the token at step + 1, generated[r] the new-token count
// where the row emits eos, unfinished and done the flags; the step advances when advance_step.
struct GreedyStepArgs {
    const int32_t* cand_ids;  // [rows] (top-1 ids)
    const int32_t* eos_ids;   // [num_eos] or null (num_eos 0: no eos, rows never finish)
    int64_t* sequences;       // [rows, max_length]
    int64_t* next_tokens;     // [rows]
    int64_t* generated;       // [rows]
    void* unfinished;         // [rows] flags of flag_bytes each (0/1)
    uint8_t* done;            // [1], or null: not reported
    int32_t* step;            // [1]
    int32_t rows;
    int32_t num_eos;
    int32_t max_length;
    int64_t pad_token_id;
    int32_t flag_bytes;  // 1: uint8 flags (torch.bool), 4: int32 flags (TensorRT)
    bool advance_step;
};

void launch_greedy_step(const GreedyStepArgs& args, cudaStream_t stream);

}  // namespace padfree
