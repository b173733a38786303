// Bias + log-softmax + processors + top-k over the vocabulary in two stages (two-stage top-k, as
// FasterTransformer's beam search): stage 1 reads each 4096-logit chunk of a row once, keeps its max
// and sum of exp (for the log-softmax, combined as in online softmax) and its k best candidates;
// stage 2 merges a row's candidates. Every selection is an exact radix select on 64-bit keys
// (order-preserving float bits | ~id), so ties go to the smaller id without a sort.
//
// Stage 1 streams the logits: about one wave of CTAs, each looping over chunks of one row. A CTA
// issues the next chunk's loads (logits and bias together, one round trip) into registers before it
// works on the current chunk, so it always has a chunk's loads in flight. One CTA per chunk instead
// put each chunk's round trips and its serial chain of barriers, block reductions and select one
// after the other, with 8 KB of loads per CTA and few CTAs per SM: at 256 NLLB rows (16k CTAs) an
// H100 took 193 us for 131 MB of fp16 logits, 45 us at copy bandwidth.
//
// The processors touch few ids (repetition penalty, banned ids): stage 1 leaves those out of its
// candidates, stage 2 reads them again and adds them with their processed scores, so a penalised id
// can neither displace a candidate nor be lost.
#include "logits.h"

#include <math_constants.h>

#include <cstdint>

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kThreads = 256;
constexpr int kElems = 16;                  // logits per thread in stage 1
constexpr int kChunk = kThreads * kElems;   // logits per stage-1 chunk
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMergeThreads = 512;
constexpr uint32_t kPenalised = 1, kBanned = 2;

// Float order as unsigned order (the usual radix-sort map): negative floats reversed, positive
// floats above them.
__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ unsigned long long full_key(uint32_t value_key, int32_t id) {
    return (static_cast<unsigned long long>(value_key) << 32) | static_cast<uint32_t>(~id);
}

__device__ __forceinline__ int32_t key_id(unsigned long long key) {
    return static_cast<int32_t>(~static_cast<uint32_t>(key));
}

// (max, sum of exp(x - max)) of two parts as one: each sum rescaled to the larger max.
__device__ __forceinline__ float2 merge_max_sum(float2 a, float2 b) {
    const float m = fmaxf(a.x, b.x);
    if (m == -CUDART_INF_F) return make_float2(m, 0.f);
    return make_float2(m, a.y * __expf(a.x - m) + b.y * __expf(b.x - m));
}

// The warp's (max, sum), returned to every lane.
__device__ __forceinline__ float2 warp_max_sum(float2 v) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        v = merge_max_sum(v, make_float2(__shfl_xor_sync(0xffffffffu, v.x, offset),
                                         __shfl_xor_sync(0xffffffffu, v.y, offset)));
    return v;
}

struct SelectShared {
    int hist[256];
    int bin, above, count;
    int emitted;
};

// Emits, through emit(slot, key) with slots 0..min(n, k)-1, the k largest of keys[0..n) (distinct):
// up to one key per thread by ranking (slot = rank), past that unordered, by a radix select on 8-bit digits from the top that stops once the digit's bin holds
// exactly the keys still needed. Every thread of the block calls it.
template <int kBlock, class Emit>
__device__ void block_select(const unsigned long long* keys, int n, int k, SelectShared& s, Emit emit) {
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    if (n <= kBlock) {  // one key per thread: its place is the number of larger keys (sorted for free)
        if (tid < n) {
            const unsigned long long mine = keys[tid];
            int rank = 0;
#pragma unroll 8
            for (int j = 0; j < n; ++j) rank += keys[j] > mine;
            if (rank < k) emit(rank, mine);
        }
        return;
    }
    if (tid == 0) s.emitted = 0;
    __syncthreads();
    unsigned long long prefix = 0, mask = 0;
    if (n > k) {
        int need = k;
        for (int shift = 56; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += kBlock) s.hist[i] = 0;
            __syncthreads();
            for (int i = tid; i < n; i += kBlock) {
                const unsigned long long key = keys[i];
                if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255], 1);
            }
            __syncthreads();
            if (warp == 0) {  // lane l holds bins 255 - 8l ... 248 - 8l: a scan in descending bin order
                int c[8], sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) sum += (c[j] = s.hist[255 - 8 * lane - j]);
                int incl = sum;
#pragma unroll
                for (int offset = 1; offset < kWarpSize; offset *= 2) {
                    const int v = __shfl_up_sync(0xffffffffu, incl, offset);
                    if (lane >= offset) incl += v;
                }
                int running = incl - sum;
                if (running < need && need <= incl) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        if (running < need && need <= running + c[j]) {
                            s.bin = 255 - 8 * lane - j;
                            s.above = running;
                            s.count = c[j];
                        }
                        running += c[j];
                    }
                }
            }
            __syncthreads();
            need -= s.above;
            prefix |= static_cast<unsigned long long>(s.bin) << shift;
            mask |= 0xffull << shift;
            const bool done = s.count == need;  // keys are distinct: true at the last digit at the latest
            __syncthreads();                    // s is rewritten by the next digit
            if (done) break;
        }
    }
    for (int i = tid; i < n; i += kBlock) {
        const unsigned long long key = keys[i];
        if ((key & mask) >= prefix) emit(atomicAdd(&s.emitted, 1), key);
    }
}

// ---- stage 1: CTAs looping over a row's chunks of kChunk logits ------------------------------------

// A chunk's global loads, in registers from the time they are issued until the chunk is staged. Rows
// start anywhere when vocab % VEC != 0 (NLLB's 256206), so the logits are read as the aligned 16-byte
// vectors around the chunk and realigned through shared memory. Whole vectors as vectors; the fewer
// than VEC elements after the last whole one, of the logits and of the bias, one per thread in
// `rest` (threads [0, VEC) and [VEC, 2 VEC)): a vector's registers in every thread for one thread's
// use would cost occupancy.
template <typename T>
struct ChunkLoads {
    static constexpr int kVecs = kChunk / Vec<T>::size / kThreads;  // per thread
    Vec<T> x[kVecs];
    Vec<T> bias[kVecs];
    T rest;
};

// The row as loaded: the aligned vectors from `base` on, whose element shift + id is the logit of id;
// `avail` elements from base are in the tensor (at most INT_MAX: more are never reached).
template <typename T>
struct RowSource {
    const T* base;
    int shift, avail;
};

// A chunk of a row: its ids [e0, e0 + len).
struct ChunkSpan {
    int e0, len;
};

__device__ __forceinline__ ChunkSpan chunk_span(int chunk, int vocab) {
    return {chunk * kChunk, min(kChunk, vocab - chunk * kChunk)};
}

// Where a chunk's whole vectors end: the stage needs elements [0, need) (stage element s is
// base[e0 + s]), whole vectors up to x_rest; the bias's whole vectors end at bias_rest. Fewer than VEC
// elements follow each (need <= row.avail - e0): the tail of the vector after the chunk's
// kChunk / VEC, or of the tensor's last, partial vector; the end of the bias.
template <typename T>
struct ChunkEnds {
    int need, x_rest, bias_rest;
    __device__ __forceinline__ ChunkEnds(ChunkSpan c, const RowSource<T>& row)
        : need(row.shift + c.len),
          x_rest(min(kChunk, (row.avail - c.e0) / Vec<T>::size * Vec<T>::size)),
          bias_rest(c.len / Vec<T>::size * Vec<T>::size) {}
};

// Issues the chunk's loads; nothing waits for them before stage_chunk.
template <typename T>
__device__ __forceinline__ void load_chunk(ChunkLoads<T>& in, ChunkSpan c, const RowSource<T>& row, const T* bias) {
    constexpr int VEC = Vec<T>::size;
    const int tid = threadIdx.x;
    const ChunkEnds<T> end(c, row);
    const T* src = row.base + c.e0;
#pragma unroll
    for (int j = 0; j < ChunkLoads<T>::kVecs; ++j) {
        const int s = (tid + j * kThreads) * VEC;
        if (s < end.need && s < end.x_rest) in.x[j] = load_vec_ro(src + s);
    }
    if (bias != nullptr) {  // bias + e0 is aligned: e0 is a multiple of kChunk
#pragma unroll
        for (int j = 0; j < ChunkLoads<T>::kVecs; ++j) {
            const int p = (tid + j * kThreads) * VEC;
            if (p < end.bias_rest) in.bias[j] = load_vec_ro(bias + c.e0 + p);
        }
    }
    // one load for both: a second load into the register would wait for all loads before it
    const bool logit = tid < VEC;
    const int i = logit ? end.x_rest + tid : end.bias_rest + tid - VEC;
    if (logit ? i < end.need : bias != nullptr && i < c.len) in.rest = logit ? src[i] : bias[c.e0 + i];
}

// Stores the chunk's loads in the stage as they are (converted where they are read): 16-byte stores,
// consecutive threads on consecutive vectors.
template <typename T>
__device__ __forceinline__ void stage_chunk(const ChunkLoads<T>& in, ChunkSpan c, const RowSource<T>& row,
                                            bool has_bias, T* stage_x, T* stage_bias) {
    constexpr int VEC = Vec<T>::size;
    const int tid = threadIdx.x;
    const ChunkEnds<T> end(c, row);
#pragma unroll
    for (int j = 0; j < ChunkLoads<T>::kVecs; ++j) {
        const int s = (tid + j * kThreads) * VEC;
        if (s < end.need && s < end.x_rest) store_vec(stage_x + s, in.x[j]);
    }
    if (has_bias) {
#pragma unroll
        for (int j = 0; j < ChunkLoads<T>::kVecs; ++j) {
            const int p = (tid + j * kThreads) * VEC;
            if (p < end.bias_rest) store_vec(stage_bias + p, in.bias[j]);
        }
    }
    const bool logit = tid < VEC;
    const int i = logit ? end.x_rest + tid : end.bias_rest + tid - VEC;
    if (logit ? i < end.need : has_bias && i < c.len) (logit ? stage_x : stage_bias)[i] = in.rest;
}

// Stage 1's registers are capped for this many CTAs per SM, so that an SM has 32 KB of chunk loads in
// flight (4 x 8 KB for 16-bit types, 2 x 16 KB for fp32, whose loads take twice the registers).
template <typename T>
constexpr int kChunkCtasPerSm = sizeof(T) == 4 ? 2 : 4;

// A candidate's 32-bit key, at least 1: a NaN whose bits map to 0 stays above "no candidate" (0).
__device__ __forceinline__ uint32_t candidate_key(float x) { return max(order_key(x), 1u); }

// CTA (x, r) takes chunks x, x + gridDim.x, ... of row r, and writes each chunk's (max, sum of exp)
// and candidates at [r * nchunks + chunk], as one CTA per chunk would.
template <typename T>
__global__ void __launch_bounds__(kThreads, kChunkCtasPerSm<T>)
    topk_chunks_kernel(LogitsTopkArgs a, int32_t nchunks, float2* stats, float* cand_value, int32_t* cand_id) {
    constexpr int VEC = Vec<T>::size;
    constexpr int kIdsPerThread = kLogitsTopkMaxSpecialIds / kThreads;
    static_assert(kLogitsTopkMaxSpecialIds % kThreads == 0, "the processed ids are loaded in whole rounds");
    __shared__ union {
        struct {
            unsigned long long ranked[kThreads];  // left alone: a ranking select may still read these keys
            uint4 x[kChunk / VEC + 1];            // the chunk as loaded (T)
            uint4 bias[kChunk / VEC];
        } stage;
        unsigned long long keys[kChunk];  // written once the stage is in registers
    } sm;
    __shared__ int32_t special_ids[kLogitsTopkMaxSpecialIds];  // the row's processed ids, read once
    __shared__ uint32_t special_bits[kChunk / 32];
    __shared__ SelectShared select;
    __shared__ uint32_t warp_bound[kWarps];
    __shared__ float2 pair_scratch[kWarps];
    __shared__ int candidates;

    T* const stage_x = reinterpret_cast<T*>(sm.stage.x);
    T* const stage_bias = reinterpret_cast<T*>(sm.stage.bias);
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int r = blockIdx.y;
    const T* bias = static_cast<const T*>(a.bias);
    RowSource<T> row;
    {
        const int64_t row_start = static_cast<int64_t>(r) * a.vocab, total = static_cast<int64_t>(a.rows) * a.vocab;
        row.shift = static_cast<int>(row_start % VEC);  // the same for every chunk: kChunk % VEC == 0
        row.base = static_cast<const T*>(a.logits) + (row_start - row.shift);
        row.avail = static_cast<int>(min(total - (row_start - row.shift), static_cast<int64_t>(INT32_MAX)));
    }
    const int specials = a.num_penalty + a.num_banned;

    // The first chunk's loads go out before the forced check, which they overlap (a forced row wastes them).
    wait_on_producer();
    int chunk = blockIdx.x;
    ChunkLoads<T> in;
    load_chunk(in, chunk_span(chunk, a.vocab), row, bias);
    const int forced = a.forced_ids != nullptr ? a.forced_ids[r] : -1;
    int32_t ids[kIdsPerThread];
#pragma unroll
    for (int j = 0; j < kIdsPerThread; ++j) {
        const int i = tid + j * kThreads;
        if (i < specials)
            ids[j] = i < a.num_penalty ? a.penalty_ids[static_cast<int64_t>(r) * a.num_penalty + i]
                                       : a.banned_ids[static_cast<int64_t>(r) * a.num_banned + i - a.num_penalty];
    }
    if (forced >= 0 && forced < a.vocab) return;  // stage 2 writes a forced row without candidates
#pragma unroll
    for (int j = 0; j < kIdsPerThread; ++j) {
        if (tid + j * kThreads < specials) special_ids[tid + j * kThreads] = ids[j];
    }
    if (tid < kChunk / 32) special_bits[tid] = 0;
    __syncthreads();

    // Per chunk three barriers: the stage written, the stage read (keys may overwrite it), the keys
    // written. The next chunk's stage may be written while this chunk's ranking select still reads
    // keys [0, kThreads), which the stage leaves alone; only the radix select, reading all keys, is
    // waited for.
    while (true) {
        const ChunkSpan span = chunk_span(chunk, a.vocab);
        const int e0 = span.e0, len = span.len;
        // Ids the processors change are no candidates here (stage 2 adds them processed).
        for (int i = tid; i < specials; i += kThreads) {
            const int id = special_ids[i];
            if (id >= e0 && id < e0 + len) atomicOr(&special_bits[(id - e0) / 32], 1u << ((id - e0) % 32));
        }
        stage_chunk(in, span, row, bias != nullptr, stage_x, stage_bias);
        const int next = chunk + static_cast<int>(gridDim.x);
        if (next < nchunks) {  // the next chunk's loads are in flight while this one is worked on
            load_chunk(in, chunk_span(next, a.vocab), row, bias);
        } else {
            allow_consumers();  // the CTA's last chunk
        }
        __syncthreads();

        // Consecutive threads on consecutive elements: no bank conflicts, and each thread's sum of
        // exp adds its elements in the order of one CTA per chunk.
        float x[kElems];
        uint32_t candidate_bits = 0;  // bit j: x[j] is a candidate
        float thread_max = -CUDART_INF_F;
        uint32_t thread_key = 0;  // 0: no candidate
#pragma unroll
        for (int j = 0; j < kElems; ++j) {
            const int p = j * kThreads + tid;
            const bool valid = p < len;
            x[j] = valid ? to_float(stage_x[row.shift + p]) + (bias != nullptr ? to_float(stage_bias[p]) : 0.f)
                         : -CUDART_INF_F;
            if (valid) thread_max = fmaxf(thread_max, x[j]);
            if (valid && (specials == 0 || !((special_bits[j * kWarps + warp] >> lane) & 1u))) {  // bit p of them
                candidate_bits |= 1u << j;
                thread_key = max(thread_key, candidate_key(x[j]));
            }
        }
        if (a.normalize) {  // the chunk's max and sum of exp (online softmax's pairs), combined in stage 2
            float sum = 0.f;
            if (thread_max != -CUDART_INF_F) {
#pragma unroll
                for (int j = 0; j < kElems; ++j) sum += __expf(x[j] - thread_max);
            }
            const float2 ms = warp_max_sum(make_float2(thread_max, sum));
            if (lane == 0) pair_scratch[warp] = ms;
        }
        // A lower bound of the k-th largest candidate key: each warp's ceil(k / warps)-th largest thread
        // maximum (those maxima are distinct elements, at least k of them at or above the smallest bound).
        {
            const int q = ceil_div(a.k, kWarps);
            uint32_t work = thread_key, bound = 0;
            for (int i = 0; i < q; ++i) {
                bound = __reduce_max_sync(0xffffffffu, work);
                if (bound == 0) break;
                const unsigned holders = __ballot_sync(0xffffffffu, work == bound);
                if (lane == __ffs(holders) - 1) work = 0;
            }
            if (lane == 0) warp_bound[warp] = bound;
            if (tid == 0) candidates = 0;
        }
        __syncthreads();  // also: every thread has read the stage and the special bits

        if (a.normalize && tid == 0) {
            float2 ms = pair_scratch[0];
#pragma unroll
            for (int w = 1; w < kWarps; ++w) ms = merge_max_sum(ms, pair_scratch[w]);
            stats[static_cast<int64_t>(r) * nchunks + chunk] = ms;
        }
        if (specials > 0 && tid < kChunk / 32) special_bits[tid] = 0;  // for the next chunk
        uint32_t bound = warp_bound[0];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) bound = min(bound, warp_bound[w]);
        bound = max(bound, 1u);
#pragma unroll
        for (int j = 0; j < kElems; ++j) {
            if ((candidate_bits >> j) & 1u) {
                const uint32_t key = candidate_key(x[j]);
                if (key >= bound) sm.keys[atomicAdd(&candidates, 1)] = full_key(key, e0 + j * kThreads + tid);
            }
        }
        __syncthreads();
        const int n = candidates;
        const int64_t out_base = (static_cast<int64_t>(r) * nchunks + chunk) * a.k;
        block_select<kThreads>(sm.keys, n, a.k, select, [&](int slot, unsigned long long k64) {
            cand_value[out_base + slot] = key_value(static_cast<uint32_t>(k64 >> 32));
            cand_id[out_base + slot] = key_id(k64);
        });
        for (int slot = min(n, a.k) + tid; slot < a.k; slot += kThreads) cand_id[out_base + slot] = -1;
        if (next >= nchunks) break;
        chunk = next;
        if (n > kThreads) __syncthreads();
    }
}

// ---- stage 2: one CTA per row --------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) topk_merge_kernel(LogitsTopkArgs a, int32_t nchunks,
                                                                   int32_t table_size, const float2* stats,
                                                                   const float* cand_value, const int32_t* cand_id) {
    extern __shared__ unsigned long long keys[];  // [nchunks * k + specials], then the table
    __shared__ SelectShared select;
    __shared__ unsigned long long chosen[kLogitsTopkMaxK];
    __shared__ float scratch[kWarpSize];
    __shared__ int count;
    const int tid = threadIdx.x, r = blockIdx.x;
    const int k = a.k;
    wait_on_producer();
    const float beam_score = a.beam_scores != nullptr ? a.beam_scores[r] : 0.f;
    const int forced = a.forced_ids != nullptr ? a.forced_ids[r] : -1;
    if (forced >= 0 && forced < a.vocab) {  // HF's forced token: 0 there, -inf elsewhere
        for (int j = tid; j < k; j += kMergeThreads) {
            a.out_ids[static_cast<int64_t>(r) * k + j] = j == 0 ? forced : (j - 1 < forced ? j - 1 : j);
            a.out_scores[static_cast<int64_t>(r) * k + j] = j == 0 ? beam_score : -CUDART_INF_F;
        }
        return;
    }
    float lse = 0.f;
    if (a.normalize) {
        float m = -CUDART_INF_F;
        for (int c = tid; c < nchunks; c += kMergeThreads) m = fmaxf(m, stats[static_cast<int64_t>(r) * nchunks + c].x);
        m = block_max(m, scratch);
        float sum = 0.f;
        for (int c = tid; c < nchunks; c += kMergeThreads) {
            const float2 st = stats[static_cast<int64_t>(r) * nchunks + c];
            if (st.y > 0.f) sum += st.y * __expf(st.x - m);
        }
        sum = block_sum(sum);
        lse = m + __logf(sum);
    }

    const int specials = a.num_penalty + a.num_banned;
    int32_t* table = reinterpret_cast<int32_t*>(keys + static_cast<int64_t>(nchunks) * k + specials);
    uint32_t* flags = reinterpret_cast<uint32_t*>(table + table_size);
    for (int i = tid; i < table_size; i += kMergeThreads) {
        table[i] = -1;
        flags[i] = 0;
    }
    if (tid == 0) count = 0;
    __syncthreads();
    // The processed ids, deduplicated in an open-addressing table (an id penalised twice is penalised once).
    for (int i = tid; i < specials; i += kMergeThreads) {
        const bool penalised = i < a.num_penalty;
        const int id = penalised ? a.penalty_ids[static_cast<int64_t>(r) * a.num_penalty + i]
                                 : a.banned_ids[static_cast<int64_t>(r) * a.num_banned + i - a.num_penalty];
        if (id < 0 || id >= a.vocab) continue;
        uint32_t h = (static_cast<uint32_t>(id) * 2654435761u) & (table_size - 1);
        while (true) {
            const int prev = atomicCAS(&table[h], -1, id);
            if (prev == -1 || prev == id) break;
            h = (h + 1) & (table_size - 1);
        }
        atomicOr(&flags[h], penalised ? kPenalised : kBanned);
    }
    const int64_t row_cands = static_cast<int64_t>(r) * nchunks * k;
    for (int i = tid; i < nchunks * k; i += kMergeThreads) {
        const int id = cand_id[row_cands + i];
        if (id < 0) continue;
        const float s = cand_value[row_cands + i] - lse + beam_score;
        keys[atomicAdd(&count, 1)] = full_key(order_key(s), id);
    }
    __syncthreads();
    const T* logits = static_cast<const T*>(a.logits);
    const T* bias = static_cast<const T*>(a.bias);
    for (int h = tid; h < table_size; h += kMergeThreads) {
        const int id = table[h];
        if (id < 0) continue;
        float s = to_float(logits[static_cast<int64_t>(r) * a.vocab + id]);
        if (bias != nullptr) s += to_float(bias[id]);
        s -= lse;
        if (flags[h] & kPenalised) s = s < 0.f ? s * a.repetition_penalty : s / a.repetition_penalty;
        if (flags[h] & kBanned) s = -CUDART_INF_F;
        keys[atomicAdd(&count, 1)] = full_key(order_key(s + beam_score), id);
    }
    __syncthreads();
    block_select<kMergeThreads>(keys, count, k, select, [&](int slot, unsigned long long k64) { chosen[slot] = k64; });
    __syncthreads();
    allow_consumers();
    // k <= 64 distinct keys: each one's place is the number of larger ones.
    const int chosen_count = min(count, k);  // k unless ids are missing (none where vocab >= k)
    if (tid < chosen_count) {
        const unsigned long long mine = chosen[tid];
        int rank = 0;
        for (int j = 0; j < chosen_count; ++j) rank += chosen[j] > mine;
        a.out_scores[static_cast<int64_t>(r) * k + rank] = key_value(static_cast<uint32_t>(mine >> 32));
        a.out_ids[static_cast<int64_t>(r) * k + rank] = key_id(mine);
    } else if (tid < k) {
        a.out_scores[static_cast<int64_t>(r) * k + tid] = -CUDART_INF_F;
        a.out_ids[static_cast<int64_t>(r) * k + tid] = -1;
    }
}

int32_t chunks_of(int32_t vocab) { return ceil_div(vocab, kChunk); }

int32_t table_size_of(int32_t specials) {
    int32_t size = 1;
    while (size < 2 * specials) size *= 2;
    return size;
}

size_t merge_smem(const LogitsTopkArgs& args) {
    const int32_t specials = args.num_penalty + args.num_banned;
    return (static_cast<size_t>(chunks_of(args.vocab)) * args.k + specials) * sizeof(unsigned long long) +
           static_cast<size_t>(table_size_of(specials)) * 2 * sizeof(int32_t);
}

// Stage 1's CTAs per SM on the current device (0 where it cannot be read).
template <typename T>
int query_chunk_ctas_per_sm(int /*device: the current one*/) {
    int ctas = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, topk_chunks_kernel<T>, kThreads, 0) == cudaSuccess
               ? ctas
               : 0;
}

// Stage 1's CTAs per row where `slots` CTAs are resident at once. Equal CTAs run in waves of `slots`,
// each CTA taking its chunks one after another plus its first chunk's loads (nothing overlaps those):
// the count with the fewest chunk times, waves * (chunks per CTA + 1). That is one wave of as many
// CTAs as fit (256 rows of 63 chunks on 528 slots: 2 per row), unless that leaves many slots idle or
// a last wave nearly empty (300 rows: 7 CTAs per row of 9 chunks in 4 waves, 40 chunk times, not 1
// of 63 in one, 64). Unknown slots: one CTA per chunk.
int32_t chunk_ctas_per_row(int32_t rows, int32_t nchunks, int64_t slots) {
    if (slots <= 0) return nchunks;
    int32_t best = nchunks;
    int64_t best_time = INT64_MAX;
    for (int32_t ctas = 1;;) {  // each number of chunks per CTA at its fewest CTAs: ~2 sqrt(nchunks) tries
        const int32_t chunks = ceil_div(nchunks, ctas);
        const int64_t time = ceil_div<int64_t>(static_cast<int64_t>(rows) * ctas, slots) * (chunks + 1);
        if (time < best_time) {
            best = ctas;
            best_time = time;
        }
        if (chunks == 1) break;
        ctas = ceil_div(nchunks, chunks - 1);
    }
    return best;
}

}  // namespace

int64_t logits_topk_workspace_bytes(int32_t rows, int32_t vocab, int32_t k) {
    const int64_t chunks = static_cast<int64_t>(rows) * chunks_of(vocab);
    // stats (float2), then values (float) and ids (int32), each rounded up to 16 bytes
    return round_up_vectors(chunks * 8) + 2 * round_up_vectors(chunks * k * 4);
}

cudaError_t launch_logits_topk(const LogitsTopkArgs& args, void* workspace, padfree_dtype dtype,
                               cudaStream_t stream) {
    if (args.rows == 0) return cudaSuccess;
    const int32_t nchunks = chunks_of(args.vocab);
    const int64_t chunks = static_cast<int64_t>(args.rows) * nchunks;
    char* ws = static_cast<char*>(workspace);
    float2* stats = reinterpret_cast<float2*>(ws);
    float* cand_value = reinterpret_cast<float*>(ws + round_up_vectors(chunks * 8));
    int32_t* cand_id =
        reinterpret_cast<int32_t*>(ws + round_up_vectors(chunks * 8) + round_up_vectors(chunks * args.k * 4));
    const size_t smem = merge_smem(args);
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (smem > 48 * 1024) {
            err = cudaFuncSetAttribute(topk_merge_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
            if (err != cudaSuccess) return;
        }
        const int64_t slots = static_cast<int64_t>(current_device_value<query_sm_count>()) *
                              current_device_value<query_chunk_ctas_per_sm<T>>();
        launch_kernel(topk_chunks_kernel<T>, dim3(chunk_ctas_per_row(args.rows, nchunks, slots), args.rows),
                      dim3(kThreads), 0, stream, args, nchunks, stats, cand_value, cand_id);
        launch_kernel(topk_merge_kernel<T>, dim3(args.rows), dim3(kMergeThreads), smem, stream, args, nchunks,
                      table_size_of(args.num_penalty + args.num_banned), stats, cand_value, cand_id);
    });
    return err;
}

}  // namespace padfree
