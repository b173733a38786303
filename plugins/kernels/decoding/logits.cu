// Bias + log-softmax + processors + top-k over the vocabulary in two stages (two-stage top-k, as
// FasterTransformer's beam search): stage 1 reads each 4096-logit chunk of a row once, keeps its max
// and sum of exp (for the log-softmax, combined as in online softmax) and its k best candidates;
// stage 2 merges a row's candidates. Every selection is an exact radix select on 64-bit keys
// (order-preserving float bits | ~id), so ties go to the smaller id without a sort.
//
// The processors touch few ids (repetition penalty, banned ids): stage 1 leaves those out of its
// candidates, stage 2 reads them again and adds them with their processed scores, so a penalised id
// can neither displace a candidate nor be lost.
#include "logits.h"

#include <math_constants.h>

#include <type_traits>

#include "../attention/attention_ptx.cuh"
#include "common.cuh"

namespace padfree {
namespace {

constexpr int kChunk = 4096;               // logits per stage-1 CTA (a row's chunk)
// Stage 1's CTA: 256 threads x 16 logits where a step has few rows (more CTAs in flight for a grid
// short of the SMs), 128 x 32 from kWideRows rows on: a CTA's fixed work (the block's max and sum,
// the candidate bound, barriers, the selection) is then shared by twice the logits per thread, and
// the kernel is issue-bound there (NLLB's 256 x 256k logits).
constexpr int kNarrowThreads = 256, kWideThreads = 128;
constexpr int32_t kWideRows = 8;
constexpr int kMergeThreads = 512;
constexpr int kMergeKept = 512;             // stage 2's keys past its bound, where they fit
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

struct SelectShared {
    int hist[256];
    int bin, above, count;
    int emitted;
};

// Emits, through emit(slot, key) with slots 0..min(n, k)-1, the k largest of keys[0..n) (distinct):
// up to one key per thread by ranking (slot = rank), past that unordered, by a radix select on 8-bit
// digits from the top that stops once the digit's bin holds exactly the keys still needed. Every
// thread of the block calls it.
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

// The q-th largest of the warp's values (distinct holders; 0 where fewer than q are nonzero): each
// round takes the warp's max and zeroes one holder's. Every lane returns it.
__device__ __forceinline__ uint32_t warp_qth_largest(uint32_t work, int q, int lane) {
    uint32_t value = 0;
    for (int i = 0; i < q; ++i) {
        value = __reduce_max_sync(0xffffffffu, work);
        if (value == 0) break;
        const unsigned holders = __ballot_sync(0xffffffffu, work == value);
        if (lane == __ffs(holders) - 1) work = 0;
    }
    return value;
}

// x[j] for an index known only at run time, as a tree of selects on j's bits (N - 1 selects): an
// indexed read of a register array would put the array in local memory.
template <int N>
__device__ __forceinline__ float pick(const float (&x)[N], int j) {
    if constexpr (N == 1) {
        return x[0];
    } else {
        static_assert((N & (N - 1)) == 0, "a power of two");
        constexpr int kHalf = N / 2;
        const float(&low)[kHalf] = *reinterpret_cast<const float(*)[kHalf]>(&x[0]);
        const float(&high)[kHalf] = *reinterpret_cast<const float(*)[kHalf]>(&x[kHalf]);
        return (j & kHalf) ? pick<kHalf>(high, j) : pick<kHalf>(low, j);
    }
}

// ---- stage 1: one CTA per (chunk of kChunk logits, row) --------------------------------------------

// The step's offset into the banned / forced tables (0 where they are this step's lists): read after
// the producer's wait, as the step counter is a step kernel's output.
__device__ __forceinline__ int64_t step_row(const LogitsTopkArgs& a) {
    return a.step == nullptr ? 0 : min(max(*a.step, 0), a.num_steps - 1);
}

__device__ __forceinline__ const int32_t* banned_of(const LogitsTopkArgs& a, int64_t s, int r) {
    return a.banned_ids + (s * a.rows + r) * a.num_banned;
}

__device__ __forceinline__ int forced_of(const LogitsTopkArgs& a, int64_t s, int r) {
    return a.forced_ids != nullptr ? a.forced_ids[s * a.rows + r] : -1;
}

// Ids the processors change are no candidates in stage 1 (stage 2 adds them processed): a bit per
// logit of the chunk [e0, e1), and how many list entries fall in it (an id listed twice counts twice:
// an overcount only lowers the candidate bound). Bits and count zeroed and a barrier passed before.
__device__ __forceinline__ void mark_specials(const LogitsTopkArgs& a, const int32_t* banned, int r, int e0, int e1,
                                              uint32_t* bits, int* count) {
    const int specials = a.num_penalty + a.num_banned;
    int mine = 0;
    for (int i = threadIdx.x; i < specials; i += blockDim.x) {
        const int id = i < a.num_penalty ? a.penalty_ids[static_cast<int64_t>(r) * a.num_penalty + i]
                                         : banned[i - a.num_penalty];
        if (id >= e0 && id < e1) {
            atomicOr(&bits[(id - e0) / 32], 1u << ((id - e0) % 32));
            ++mine;
        }
    }
    if (mine != 0) atomicAdd(count, mine);
}

__device__ __forceinline__ bool is_special(const uint32_t* bits, int p) { return (bits[p / 32] >> (p % 32)) & 1u; }

// kAligned (vocab a multiple of the 16-byte vector, so every row starts aligned: the decode step's
// padded vocabularies): each thread loads its vectors of logits and bias straight into registers.
// Otherwise the chunk is realigned through shared memory. The aligned path exists for instruction
// count: stage 1 is issue-bound (NLLB's 256 x 256k fp16 logits, H200: 83 instructions per logit,
// 85 % of issue slots busy, 11 % of DRAM bandwidth), and the staging's stores, reloads and 64-bit
// index arithmetic were most of them.
template <typename T, bool kAligned, int kThreads>
__global__ void __launch_bounds__(kThreads) topk_chunks_kernel(LogitsTopkArgs a, float2* stats, float* cand_value,
                                                               int32_t* cand_id) {
    constexpr int kElems = kChunk / kThreads;  // logits per thread
    constexpr int kWarps = kThreads / kWarpSize;
    static_assert(kElems <= 32, "a thread's candidates are the bits of one word");
    constexpr int VEC = Vec<T>::size;
    constexpr int kStageVecs = kChunk / VEC + 1;
    __shared__ union {
        struct {
            float x[kChunk + VEC];
            float bias[kChunk];
        } stage;
        unsigned long long keys[kChunk];
    } sm;
    __shared__ uint32_t special_bits[kChunk / 32];
    __shared__ SelectShared select;
    __shared__ uint32_t warp_bound[kWarps], warp_max_key[kWarps];
    __shared__ float warp_total[kWarps];
    __shared__ float chunk_max;
    __shared__ int candidates, special_count;

    const int tid = threadIdx.x;
    const int chunk = blockIdx.x, r = blockIdx.y;
    const int nchunks = gridDim.x;
    wait_on_producer();
    const int64_t srow = step_row(a);
    if (a.forced_ids != nullptr) {
        const int forced = forced_of(a, srow, r);
        if (forced >= 0 && forced < a.vocab) return;  // stage 2 writes a forced row without candidates
    }
    const int32_t* banned = a.num_banned > 0 ? banned_of(a, srow, r) : nullptr;
    const int64_t vocab = a.vocab;
    const int e0 = chunk * kChunk;
    const int e1 = static_cast<int>(min(static_cast<int64_t>(e0) + kChunk, vocab));
    const T* logits = static_cast<const T*>(a.logits);
    const T* bias = static_cast<const T*>(a.bias);
    const int specials = a.num_penalty + a.num_banned;
    // Per thread: its logits x, which of them are valid (a bit each) and their max (NaN ignored: a lower
    // bound of the largest key, which is all the warp bound below needs). Keys are formed only for the
    // few logits past that bound. The processed ids stay off this per-logit path (the kernel's cost;
    // with them on it every step of a min_new_tokens call, whose eos ban is one, paid a flag test and a
    // second maximum per logit): they raise the bound's rank by their count in the chunk and are
    // dropped from the few logits past it.
    float x[kElems];
    uint32_t cand = 0;
    float thread_max = -CUDART_INF_F;
    if constexpr (kAligned) {
        constexpr int kVecs = kElems / VEC;
        const int n = e1 - e0;  // a multiple of VEC
        const T* row = logits + static_cast<int64_t>(r) * vocab + e0;
        Vec<T> lv[kVecs], bv[kVecs];
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
            const int at = (j * kThreads + tid) * VEC;  // consecutive threads, consecutive vectors
            if (at < n) {
                lv[j] = load_vec_ro(row + at);
                if (bias != nullptr) bv[j] = load_vec_ro(bias + e0 + at);
            }
        }
        if (specials > 0) {  // the same for the whole block
            if (tid < kChunk / 32) special_bits[tid] = 0;
            if (tid == 0) special_count = 0;
            __syncthreads();
            mark_specials(a, banned, r, e0, e1, special_bits, &special_count);
            __syncthreads();
        }
        // Every chunk but a row's last is full: no validity test.
        auto consume = [&](auto full_chunk) {
            constexpr bool kFull = decltype(full_chunk)::value;
#pragma unroll
            for (int j = 0; j < kVecs; ++j) {
                const int at = (j * kThreads + tid) * VEC;
                const bool valid = kFull || at < n;
                float f[VEC];
                vec_to_float(lv[j], f);
                if (bias != nullptr) add_vec<T>(f, bv[j]);
#pragma unroll
                for (int i = 0; i < VEC; ++i) {
                    const int e = j * VEC + i;
                    x[e] = kFull || valid ? f[i] : -CUDART_INF_F;
                    thread_max = fmaxf(thread_max, x[e]);
                }
                cand |= (valid ? (1u << VEC) - 1u : 0u) << (j * VEC);
            }
        };
        if (n == kChunk) {
            consume(std::true_type{});
        } else {
            consume(std::false_type{});
        }
    } else {
        // Rows start anywhere when vocab % VEC != 0 (NLLB's 256206): the chunk is read as the aligned
        // 16-byte vectors around it and realigned through shared memory.
        const int64_t g0 = r * vocab + e0, g1 = r * vocab + e1;
        const int64_t va = g0 / VEC, vb = ceil_div<int64_t>(g1, VEC);
        const int64_t total = static_cast<int64_t>(a.rows) * vocab, full_vecs = total / VEC;
        const int shift = static_cast<int>(g0 - va * VEC);
        if (tid < kChunk / 32) special_bits[tid] = 0;
        if (tid == 0) special_count = 0;
        {
            Vec<T> raw[kStageVecs / kThreads + 1];
#pragma unroll
            for (int j = 0; j < kStageVecs / kThreads + 1; ++j) {
                const int64_t vi = va + tid + j * kThreads;
                if (vi < vb && vi < full_vecs) raw[j] = load_vec_ro(logits + vi * VEC);
            }
#pragma unroll
            for (int j = 0; j < kStageVecs / kThreads + 1; ++j) {
                const int64_t vi = va + tid + j * kThreads;
                if (vi >= vb) continue;
                float f[VEC];
                if (vi < full_vecs) {
                    vec_to_float(raw[j], f);
                } else {  // the tensor's last, partial vector
#pragma unroll
                    for (int i = 0; i < VEC; ++i) f[i] = vi * VEC + i < total ? to_float(logits[vi * VEC + i]) : 0.f;
                }
#pragma unroll
                for (int i = 0; i < VEC; ++i) sm.stage.x[(vi - va) * VEC + i] = f[i];
            }
            if (bias != nullptr) {  // bias + e0 is aligned: e0 is a multiple of kChunk
                for (int p = tid * VEC; p < e1 - e0; p += kThreads * VEC) {
                    float f[VEC];
                    if (e0 + p + VEC <= vocab) {
                        vec_to_float(load_vec_ro(bias + e0 + p), f);
                    } else {
#pragma unroll
                        for (int i = 0; i < VEC; ++i) f[i] = e0 + p + i < vocab ? to_float(bias[e0 + p + i]) : 0.f;
                    }
#pragma unroll
                    for (int i = 0; i < VEC; ++i) sm.stage.bias[p + i] = f[i];
                }
            }
        }
        __syncthreads();
        if (specials > 0) {  // the same for the whole block
            mark_specials(a, banned, r, e0, e1, special_bits, &special_count);
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < kElems; ++j) {
            const int p = j * kThreads + tid;  // consecutive threads, consecutive words: no bank conflicts
            const bool valid = p < e1 - e0;
            x[j] = valid ? sm.stage.x[shift + p] + (bias != nullptr ? sm.stage.bias[p] : 0.f) : -CUDART_INF_F;
            if (valid) thread_max = fmaxf(thread_max, x[j]);
            cand |= static_cast<uint32_t>(valid) << j;
        }
    }

    // One barrier for the block's max (the log-softmax's shift) and the candidate bound: each warp's
    // max as an integer max of order keys (one instruction), and each warp's q-th largest thread
    // maximum, q = ceil(k / warps) + the chunk's processed ids. A lower bound of the k-th largest
    // candidate key is the smallest of those: of a warp's q threads at or above its bound, at most
    // one per processed id has a processed id as its maximum, so at least ceil(k / warps) hold a
    // candidate there (distinct elements, at least k in all).
    const int lane = tid % kWarpSize, warp = tid / kWarpSize;
    {
        if (a.normalize) {
            const uint32_t warp_max = __reduce_max_sync(0xffffffffu, order_key(thread_max));
            if (lane == 0) warp_max_key[warp] = warp_max;
        }
        const uint32_t work = cand != 0 ? max(order_key(thread_max), 1u) : 0u;  // 0: no valid logit
        // past a warp's 32 holders the q-th largest is "none" (0): every valid logit passes
        const int q = ceil_div(a.k, kWarps) + (specials > 0 ? min(special_count, kWarpSize) : 0);
        const uint32_t bound = warp_qth_largest(work, q, lane);
        if (lane == 0) warp_bound[warp] = bound;
        if (tid == 0) candidates = 0;
    }
    __syncthreads();  // also: every thread has read the stage before keys (its alias) is written
    uint32_t bound = warp_bound[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) bound = min(bound, warp_bound[w]);
    bound = max(bound, 1u);
    if (a.normalize) {  // the chunk's max and sum of exp (online softmax's pairs), combined in stage 2
        uint32_t max_key = warp_max_key[0];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) max_key = max(max_key, warp_max_key[w]);
        const float m = key_value(max_key);
        float sum = 0.f;
        if (m != -CUDART_INF_F) {  // ex2.approx.ftz: exp2f's denormal handling was 3 of ~22 instructions a logit
            const float shift = -m * CUDART_L2E_F;
#pragma unroll
            for (int j = 0; j < kElems; ++j) sum += attention_detail::fast_exp2(fmaf(x[j], CUDART_L2E_F, shift));
        }
        sum = warp_sum(sum);
        if (lane == 0) warp_total[warp] = sum;
        if (tid == 0) chunk_max = m;
    }
    // key >= bound as a float comparison: every such logit passes (NaNs too; key 1's value is a NaN,
    // which lets all pass); the few extra (-0 beside a +0 bound) only cost block_select a key. A
    // thread has few (a CTA ~10-30 in all): one atomic per thread, and each one's value picked out of
    // the registers by its index (a select tree) instead of a branch per logit.
    const float bound_value = key_value(bound);
    uint32_t pass = 0;
#pragma unroll
    for (int j = 0; j < kElems; ++j) pass |= static_cast<uint32_t>(!(x[j] < bound_value)) << j;
    pass &= cand;
    if (specials > 0) {  // the processed ids among the few past the bound are dropped (stage 2 adds them)
        for (uint32_t rest = pass; rest != 0; rest &= rest - 1) {
            const int j = __ffs(rest) - 1;
            const int p = kAligned ? ((j / VEC) * kThreads + tid) * VEC + j % VEC : j * kThreads + tid;
            if (is_special(special_bits, p)) pass &= ~(1u << j);
        }
    }
    if (pass != 0) {
        int slot = atomicAdd(&candidates, __popc(pass));
        do {
            const int j = __ffs(pass) - 1;
            pass &= pass - 1;
            const int p = kAligned ? ((j / VEC) * kThreads + tid) * VEC + j % VEC : j * kThreads + tid;
            // key 1: a NaN's, still above "none"
            sm.keys[slot++] = full_key(max(order_key(pick(x, j)), 1u), e0 + p);
        } while (pass != 0);
    }
    __syncthreads();
    if (a.normalize && tid == 0) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total += warp_total[w];
        stats[static_cast<int64_t>(r) * nchunks + chunk] = make_float2(chunk_max, total);
    }
    const int n = candidates;
    const int64_t out_base = (static_cast<int64_t>(r) * nchunks + chunk) * a.k;
    block_select<kThreads>(sm.keys, n, a.k, select, [&](int slot, unsigned long long k64) {
        cand_value[out_base + slot] = key_value(static_cast<uint32_t>(k64 >> 32));
        cand_id[out_base + slot] = key_id(k64);
    });
    allow_consumers();
    for (int slot = min(n, a.k) + tid; slot < a.k; slot += kThreads) cand_id[out_base + slot] = -1;
}

// ---- stage 2: one CTA per row --------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) topk_merge_kernel(LogitsTopkArgs a, int32_t nchunks,
                                                                   int32_t table_size, const float2* stats,
                                                                   const float* cand_value, const int32_t* cand_id) {
    extern __shared__ unsigned long long keys[];  // [nchunks * k + specials], then the table
    __shared__ SelectShared select;
    __shared__ unsigned long long chosen[kLogitsTopkMaxK];
    __shared__ unsigned long long kept_keys[kMergeKept];
    __shared__ uint32_t merge_bound[kMergeThreads / kWarpSize];
    __shared__ float scratch[kWarpSize];
    __shared__ int count, kept;
    const int tid = threadIdx.x, r = blockIdx.x;
    const int k = a.k;
    wait_on_producer();
    const float beam_score = a.beam_scores != nullptr ? a.beam_scores[r] : 0.f;
    const int64_t srow = step_row(a);
    const int forced = forced_of(a, srow, r);
    const int32_t* banned = a.num_banned > 0 ? banned_of(a, srow, r) : nullptr;
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
                                 : banned[i - a.num_penalty];
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
    // block_select ranks up to a key per thread by comparing it with all of them: O(n^2) shared-memory
    // reads, ~5 us for NLLB's 63 chunks x 8 candidates. So the keys are first cut to those at or above
    // a bound of the k-th largest (as stage 1's: the smallest warp's ceil(k / warps)-th largest thread
    // maximum), a few dozen, where they fit the buffer; all of them otherwise (ties, or fewer keys).
    const unsigned long long* select_keys = keys;
    int select_count = count;
    if (count > kMergeThreads / 4) {
        constexpr int kMergeWarps = kMergeThreads / kWarpSize;
        const int lane = tid % kWarpSize, warp = tid / kWarpSize;
        uint32_t work = 0;  // the thread's largest value key (at least 1: 0 is "none")
        for (int i = tid; i < count; i += kMergeThreads)
            work = max(work, max(static_cast<uint32_t>(keys[i] >> 32), 1u));
        const uint32_t warp_bound = warp_qth_largest(work, ceil_div(k, kMergeWarps), lane);
        if (lane == 0) merge_bound[warp] = warp_bound;
        if (tid == 0) kept = 0;
        __syncthreads();
        uint32_t bound = merge_bound[0];
#pragma unroll
        for (int w = 1; w < kMergeWarps; ++w) bound = min(bound, merge_bound[w]);
        for (int i = tid; i < count; i += kMergeThreads) {
            const unsigned long long key = keys[i];
            if (max(static_cast<uint32_t>(key >> 32), 1u) >= bound) {
                const int slot = atomicAdd(&kept, 1);
                if (slot < kMergeKept) kept_keys[slot] = key;
            }
        }
        __syncthreads();
        if (kept <= kMergeKept) {
            select_keys = kept_keys;
            select_count = kept;
        }
    }
    block_select<kMergeThreads>(select_keys, select_count, k, select,
                                [&](int slot, unsigned long long k64) { chosen[slot] = k64; });
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

}  // namespace

int64_t logits_topk_workspace_bytes(int32_t rows, int32_t vocab, int32_t k) {
    const int64_t blocks = static_cast<int64_t>(rows) * chunks_of(vocab);
    // stats (float2), then values (float) and ids (int32), each rounded up to 16 bytes
    return round_up_vectors(blocks * 8) + 2 * round_up_vectors(blocks * k * 4);
}

cudaError_t launch_logits_topk(const LogitsTopkArgs& args, void* workspace, padfree_dtype dtype,
                               cudaStream_t stream) {
    if (args.rows == 0) return cudaSuccess;
    const int32_t nchunks = chunks_of(args.vocab);
    const int64_t blocks = static_cast<int64_t>(args.rows) * nchunks;
    char* ws = static_cast<char*>(workspace);
    float2* stats = reinterpret_cast<float2*>(ws);
    float* cand_value = reinterpret_cast<float*>(ws + round_up_vectors(blocks * 8));
    int32_t* cand_id =
        reinterpret_cast<int32_t*>(ws + round_up_vectors(blocks * 8) + round_up_vectors(blocks * args.k * 4));
    const size_t smem = merge_smem(args);
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (smem > 48 * 1024) {
            err = cudaFuncSetAttribute(topk_merge_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
            if (err != cudaSuccess) return;
        }
        const bool aligned = args.vocab % vec_size<T>() == 0;
        auto launch_chunks = [&](auto threads) {
            constexpr int kThreads = decltype(threads)::value;
            launch_kernel(aligned ? topk_chunks_kernel<T, true, kThreads> : topk_chunks_kernel<T, false, kThreads>,
                          dim3(nchunks, args.rows), dim3(kThreads), 0, stream, args, stats, cand_value, cand_id);
        };
        if (args.rows >= kWideRows) {
            launch_chunks(std::integral_constant<int, kWideThreads>{});
        } else {
            launch_chunks(std::integral_constant<int, kNarrowThreads>{});
        }
        launch_kernel(topk_merge_kernel<T>, dim3(args.rows), dim3(kMergeThreads), smem, stream, args, nchunks,
                      table_size_of(args.num_penalty + args.num_banned), stats, cand_value, cand_id);
    });
    return err;
}

}  // namespace padfree
