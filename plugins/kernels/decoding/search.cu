// The search's bookkeeping in one kernel per step. As torch ops, HF's beam-search update (merge the
// beams' candidates, split finished from running, the pool of finished hypotheses, the gathers of
// sequences, the early-stop heuristic, the stop flag) and the cache-indirection reorder are ~90
// kernels of a few microseconds each: at batch x beams 1 x 4 they cost more than the decoder's
// attention. One block per source does a source's whole update (its hypotheses never read another
// source's rows); the grid's last block folds the per-source flags into the stop flag and advances
// the step, so the step stays a function of device state only (one CUDA graph replays it).
//
// The arithmetic is HF's (transformers 5, GenerationMixin._beam_search on CUDA): scores are float32,
// a score divided by a Python number n ** length_penalty is torch's `a * (1 / float(n ** lp))` (its
// CUDA division by a CPU scalar), -1e9 is added where HF adds it, and ties are broken as HF's
// torch.topk over the flattened (beam, candidate) index breaks them: to the lower index.
#include "search.h"

#include <cmath>

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kThreads = 256;
constexpr float kNeg = -1.0e9f;  // HF's "very large negative"

// Candidates of one sorted-descending row at or above s (or_equal) / strictly above s.
__device__ __forceinline__ int count_above(const float* row, int n, float s, bool or_equal) {
    int lo = 0, hi = n;  // the first index whose score is below s (or not above, strictly)
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        const bool above = or_equal ? row[mid] >= s : row[mid] > s;
        if (above) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Position of entry i among n values in descending order, ties to the lower index.
__device__ __forceinline__ int rank_of(const float* v, int n, int i) {
    const float s = v[i];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += (v[j] > s) || (v[j] == s && j < i);
    return rank;
}

// HF's `scores / (n ** lp)` with n ** lp a Python float: torch on CUDA multiplies by the float32
// reciprocal of a CPU scalar divisor.
__device__ __forceinline__ float reciprocal_length(double n, float lp) {
    return 1.0f / static_cast<float>(pow(n, static_cast<double>(lp)));
}

// The grid's stop condition from the sources' folded flags (any improvable, any pool open, any
// continuation), and the step advanced: HF's rule, decided once per step by one thread.
__device__ __forceinline__ void finish_step(const BeamSearchStepArgs& a, bool any_improvable, bool any_pool_open,
                                            bool any_continuation, int step_read) {
    const bool open = any_pool_open || a.early_stopping != 1;
    if (!(any_improvable && open && any_continuation)) *a.done = 1;
    if (a.advance_step) *a.step = step_read + 1;
}

// Flag: the element type of pool_finished and improvable (uint8_t: torch.bool; int32_t: TensorRT plugins,
// which cannot carry bool or uint8 tensors). rows_in_smem: the source's old rows (kept while the new ones
// are written in place) in dynamic shared memory where they fit (smem_rows_bytes), else in the
// workspace's scratch, whose stores and loads add a round trip.
//
// The step is a chain of dependent round trips, so the kernel is written for as few as it can: every
// input that depends on nothing else (the candidates, the pool's scores, lengths and flags) is requested
// with the step index right after the wait; the old rows (which need the step) before the merge
// computes; a single-source grid decides the stop flag itself, without the grid's atomics.
template <typename Flag>
__global__ void __launch_bounds__(kThreads) beam_search_step_kernel(BeamSearchStepArgs a, bool rows_in_smem,
                                                                    int64_t* seq_scratch, int32_t* indir_scratch,
                                                                    int32_t* counters) {
    Flag* const pool_finished_flags = static_cast<Flag*>(a.pool_finished);
    Flag* const improvable_flags = static_cast<Flag*>(a.improvable);
    extern __shared__ __align__(16) unsigned char smem_rows[];
    __shared__ float cand[kBeamSearchMaxBeams * kBeamSearchMaxKeep];
    __shared__ int cand_token[kBeamSearchMaxBeams * kBeamSearchMaxKeep];
    __shared__ float top_score[kBeamSearchMaxKeep];
    __shared__ int top_parent[kBeamSearchMaxKeep];
    __shared__ int top_token[kBeamSearchMaxKeep];
    __shared__ float running_cand[kBeamSearchMaxKeep];
    __shared__ float merged[kBeamSearchMaxBeams + kBeamSearchMaxKeep];
    __shared__ int next_beam[kBeamSearchMaxBeams];
    __shared__ int best[kBeamSearchMaxBeams];
    __shared__ bool hit[kBeamSearchMaxKeep];
    __shared__ int any_not_hit;
    __shared__ bool source_improvable;
    __shared__ int64_t old_pool_lengths[kBeamSearchMaxBeams];
    __shared__ bool old_pool_finished[kBeamSearchMaxBeams];
    __shared__ bool pool_finished_new[kBeamSearchMaxBeams];
    __shared__ bool last_block;

    wait_on_producer();
    const int src = blockIdx.x;
    const int beams = a.beams, keep = a.keep, L = a.max_length;
    const int n = beams * keep;
    const int tid = threadIdx.x;
    // every input that depends on nothing else, in flight with the step
    const int step_read = *a.step;
    for (int i = tid; i < n; i += kThreads) {
        cand[i] = a.cand_scores[static_cast<int64_t>(src) * n + i];
        cand_token[i] = a.cand_ids[static_cast<int64_t>(src) * n + i];
    }
    if (tid == 0) {
        any_not_hit = 0;
        source_improvable = improvable_flags[src] != 0;
    }
    if (tid < keep) {  // in range even where NaN scores leave a rank unfilled
        top_score[tid] = -CUDART_INF_F;
        top_parent[tid] = 0;
        top_token[tid] = 0;
    }
    if (tid < beams) {
        const int at = src * beams + tid;
        next_beam[tid] = 0;  // in range even where NaN scores leave a rank unfilled
        best[tid] = 0;
        merged[tid] = a.pool_scores[at];
        old_pool_lengths[tid] = a.pool_lengths[at];
        old_pool_finished[tid] = pool_finished_flags[at] != 0;
    }
    // step in [0, max_length - 2]: the runner never runs past it; clamped so nothing is written outside
    const int step = min(max(step_read, 0), L - 2);
    const int cur_len = step + 1;  // tokens so far, the start token included; the new token goes here

    // the source's old rows, read before any is rewritten (their loads in flight while the merge below
    // computes): positions past cur_len hold the fill in every row (set by reset, never written since),
    // so only [0, cur_len] moves
    int64_t* old_running = rows_in_smem ? reinterpret_cast<int64_t*>(smem_rows)
                                        : seq_scratch + static_cast<int64_t>(src) * 2 * beams * L;
    int64_t* old_pool = old_running + static_cast<int64_t>(beams) * L;
    const int64_t* running = a.running + static_cast<int64_t>(src) * beams * L;
    const int64_t* pool = a.pool + static_cast<int64_t>(src) * beams * L;
    for (int i = tid; i < beams * (cur_len + 1); i += kThreads) {
        const int b = i / (cur_len + 1), t = i % (cur_len + 1);
        old_running[b * L + t] = running[b * L + t];
        old_pool[b * L + t] = pool[b * L + t];
    }
    int32_t* old_indir = nullptr;
    if (a.cache_indir != nullptr) {
        old_indir = rows_in_smem ? reinterpret_cast<int32_t*>(old_pool + static_cast<int64_t>(beams) * L)
                                 : indir_scratch + static_cast<int64_t>(src) * beams * a.indir_len;
        const int cols = min(step, a.indir_len);
        for (int i = tid; i < beams * cols; i += kThreads) {
            const int b = i / cols, t = i % cols;
            old_indir[b * a.indir_len + t] = a.cache_indir[(static_cast<int64_t>(src) * beams + b) * a.indir_len + t];
        }
    }
    __syncthreads();

    // 1. merge: the source's `keep` best of beams x keep candidates. Each row is sorted, so a
    //    candidate's rank in (score desc, flat index asc) order is its place in its row plus, per
    //    other row, the entries ahead of it (rows before its own win ties, rows after lose them).
    for (int i = tid; i < n; i += kThreads) {
        const int b = i / keep, j = i % keep;
        const float s = cand[i];
        int rank = j;
        for (int other = 0; other < beams && rank < keep; ++other)
            if (other != b) rank += count_above(cand + other * keep, keep, s, other < b);
        if (rank < keep) {
            top_score[rank] = s;
            top_parent[rank] = b;
            top_token[rank] = cand_token[i];
        }
    }
    __syncthreads();

    // 2. finished candidates (eos, or the last position) and the running beams' candidates
    const float inv_len = reciprocal_length(static_cast<double>(cur_len), a.length_penalty);
    bool pool_full = true;
    for (int b = 0; b < beams; ++b) pool_full &= old_pool_finished[b];
    const bool pool_closed = pool_full && a.early_stopping == 1;
    const bool improvable = source_improvable;
    if (tid < keep) {
        const int token = top_token[tid];
        bool h = cur_len + 1 >= L;
        for (int e = 0; e < a.num_eos; ++e) h |= token == a.eos_ids[e];
        hit[tid] = h;
        if (!h) atomicOr(&any_not_hit, 1);
        running_cand[tid] = top_score[tid] + (h ? kNeg : 0.0f);
        // the pool's candidates: length-penalised, -1e9 where HF adds it (one add per condition)
        float p = top_score[tid] * inv_len;
        if (pool_closed) p += kNeg;
        if (!improvable) p += kNeg;
        if (!(h && tid < beams)) p += kNeg;
        merged[beams + tid] = p;
    }
    __syncthreads();

    // 3. the next running beams (the best `beams` not finished) and the pool's best `beams`
    if (tid < keep) {
        const int r = rank_of(running_cand, keep, tid);
        if (r < beams) next_beam[r] = tid;
    } else if (tid < keep + beams + keep) {
        const int i = tid - keep;
        const int r = rank_of(merged, beams + keep, i);
        if (r < beams) best[r] = i;
    }
    __syncthreads();

    // 4. write the new state
    for (int i = tid; i < beams * (cur_len + 1); i += kThreads) {
        const int b = i / (cur_len + 1), t = i % (cur_len + 1);
        const int c = next_beam[b];
        a.running[(static_cast<int64_t>(src) * beams + b) * L + t] =
            t == cur_len ? top_token[c] : old_running[top_parent[c] * L + t];
        const int m = best[b];
        int64_t v;
        if (m < beams) {
            v = old_pool[m * L + t];
        } else {
            const int cm = m - beams;
            v = t == cur_len ? top_token[cm] : old_running[top_parent[cm] * L + t];
        }
        a.pool[(static_cast<int64_t>(src) * beams + b) * L + t] = v;
    }
    if (tid < beams) {
        const int row = src * beams + tid;
        const int c = next_beam[tid];
        a.running_scores[row] = running_cand[c];
        a.next_tokens[row] = top_token[c];
        a.parents[row] = src * beams + top_parent[c];
        const int m = best[tid];
        a.pool_scores[row] = merged[m];
        a.pool_lengths[row] = m < beams ? old_pool_lengths[m] : cur_len;
        const bool finished = m < beams ? old_pool_finished[m] : (hit[m - beams] && m - beams < beams);
        pool_finished_flags[row] = finished;
        pool_finished_new[tid] = finished;
    }
    if (a.cache_indir != nullptr && step < a.indir_len) {
        // out[r, t] = indir[parent, t] for t < step, out[r, step] = parent (beam_reorder_cache_indir)
        for (int i = tid; i < beams * (step + 1); i += kThreads) {
            const int b = i / (step + 1), t = i % (step + 1);
            const int parent = top_parent[next_beam[b]];
            a.cache_indir[(static_cast<int64_t>(src) * beams + b) * a.indir_len + t] =
                t == step ? src * beams + parent : old_indir[parent * a.indir_len + t];
        }
    }
    __syncthreads();

    // 5. HF's early-stop heuristic at the new length, and this source's share of the stop condition
    if (tid == 0) {
        const float best_running = running_cand[next_beam[0]];
        const double length = a.early_stopping == 2 && a.length_penalty > 0.0f ? static_cast<double>(L - 1)
                                                                                 : static_cast<double>(cur_len);
        const float best_possible = best_running * reciprocal_length(length, a.length_penalty);
        float worst = merged[best[0]];
        for (int b = 1; b < beams; ++b) worst = fminf(worst, merged[best[b]]);
        bool can_improve = false, pool_open = false;
        for (int b = 0; b < beams; ++b) {
            can_improve |= best_possible > (pool_finished_new[b] ? worst : kNeg);
            pool_open |= !pool_finished_new[b];
        }
        const bool now_improvable = improvable && can_improve;
        improvable_flags[src] = now_improvable;
        if (gridDim.x == 1) {
            // the only source decides alone (the counters stay zero): no fence, no atomics' round trips
            finish_step(a, now_improvable, pool_open, any_not_hit != 0, step_read);
        } else {
            if (now_improvable) atomicOr(&counters[1], 1);
            if (pool_open) atomicOr(&counters[2], 1);
            if (any_not_hit) atomicOr(&counters[3], 1);
            __threadfence();
            last_block = atomicAdd(&counters[0], 1) == static_cast<int>(gridDim.x) - 1;
        }
    }
    __syncthreads();
    if (gridDim.x > 1 && last_block && tid == 0) {
        // every other block has published its flags (and read the step): fold, reset, advance
        __threadfence();
        const bool any_improvable = atomicExch(&counters[1], 0) != 0;
        const bool any_pool_open = atomicExch(&counters[2], 0) != 0;
        const bool any_continuation = atomicExch(&counters[3], 0) != 0;
        counters[0] = 0;
        finish_step(a, any_improvable, any_pool_open, any_continuation, step_read);
    }
    allow_consumers();
}

template <typename Flag>
__global__ void __launch_bounds__(kThreads) greedy_step_kernel(GreedyStepArgs a) {
    __shared__ int any_unfinished;
    Flag* const unfinished = static_cast<Flag*>(a.unfinished);
    wait_on_producer();
    const int step = min(max(*a.step, 0), a.max_length - 2);
    const int cur_len = step + 1;
    if (threadIdx.x == 0) any_unfinished = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < a.rows; r += kThreads) {
        int64_t token = a.cand_ids[r];
        if (a.num_eos > 0) {
            const bool running = unfinished[r] != 0;
            if (!running) token = a.pad_token_id;
            bool ended = false;
            for (int e = 0; e < a.num_eos; ++e) ended |= token == a.eos_ids[e];
            ended &= running;
            if (ended) a.generated[r] = cur_len;
            const bool still = running && !ended;
            unfinished[r] = still;
            if (still) any_unfinished = 1;  // benign race: every writer stores 1
        }
        a.sequences[static_cast<int64_t>(r) * a.max_length + cur_len] = token;
        a.next_tokens[r] = token;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (a.num_eos > 0 && a.done != nullptr) *a.done = any_unfinished == 0;
        if (a.advance_step) *a.step = *a.step + 1;
    }
    allow_consumers();
}

// Where the workspace's parts start: the sequence scratch at 0, the indirection scratch, the counters.
struct WorkspaceLayout {
    int64_t indir;
    int64_t counters;
};

// Dynamic shared memory a block takes for its source's old rows (running and pool [beams, max_length]
// int64, the indirection [beams, indir_len] int32), or 0 where that exceeds kSmemRowsMaxBytes (beside
// the kernel's ~10 KB of static shared memory, within the 48 KB a block gets without opting in).
constexpr int64_t kSmemRowsMaxBytes = 36 * 1024;
int64_t smem_rows_bytes(const BeamSearchStepArgs& a) {
    const int64_t bytes = int64_t{a.beams} * a.max_length * 2 * static_cast<int64_t>(sizeof(int64_t)) +
                          (a.cache_indir != nullptr ? int64_t{a.beams} * a.indir_len * static_cast<int64_t>(sizeof(int32_t)) : 0);
    return bytes <= kSmemRowsMaxBytes ? bytes : 0;
}

WorkspaceLayout workspace_layout(int32_t batch, int32_t beams, int32_t max_length, int32_t indir_len) {
    const int64_t indir = round_up_vectors(int64_t{batch} * 2 * beams * max_length * sizeof(int64_t));
    return {indir, indir + round_up_vectors(int64_t{batch} * beams * indir_len * sizeof(int32_t))};
}

}  // namespace

int64_t beam_search_counters_offset(int32_t batch, int32_t beams, int32_t max_length, int32_t indir_len) {
    return workspace_layout(batch, beams, max_length, indir_len).counters;
}

int64_t beam_search_workspace_bytes(int32_t batch, int32_t beams, int32_t max_length, int32_t indir_len) {
    return beam_search_counters_offset(batch, beams, max_length, indir_len) + 16;
}

void launch_beam_search_step(const BeamSearchStepArgs& args, cudaStream_t stream) {
    if (args.batch == 0) return;
    char* ws = static_cast<char*>(args.workspace);
    const WorkspaceLayout layout = workspace_layout(args.batch, args.beams, args.max_length, args.indir_len);
    auto* seq_scratch = reinterpret_cast<int64_t*>(ws);
    auto* indir_scratch = reinterpret_cast<int32_t*>(ws + layout.indir);
    auto* counters = reinterpret_cast<int32_t*>(ws + layout.counters);
    const int64_t smem = smem_rows_bytes(args);
    const bool rows_in_smem = smem > 0;
    if (args.flag_bytes == 4)
        launch_kernel(beam_search_step_kernel<int32_t>, dim3(args.batch), dim3(kThreads), static_cast<size_t>(smem),
                      stream, args, rows_in_smem, seq_scratch, indir_scratch, counters);
    else
        launch_kernel(beam_search_step_kernel<uint8_t>, dim3(args.batch), dim3(kThreads), static_cast<size_t>(smem),
                      stream, args, rows_in_smem, seq_scratch, indir_scratch, counters);
}

void launch_greedy_step(const GreedyStepArgs& args, cudaStream_t stream) {
    if (args.rows == 0) return;
    if (args.flag_bytes == 4)
        launch_kernel(greedy_step_kernel<int32_t>, dim3(1), dim3(kThreads), 0, stream, args);
    else
        launch_kernel(greedy_step_kernel<uint8_t>, dim3(1), dim3(kThreads), 0, stream, args);
}

}  // namespace padfree
