// One query row per hypothesis and head against a list of keys: the kernel shared by the decoder's
// masked self-attention over the K/V cache (kSelf) and its cross-attention over packed encoder rows.
// A CTA takes one (row, head, split) and a contiguous range of positions; where rows * heads leave
// SMs idle the positions are split over CTAs and combined afterwards (split-K flash-decoding: each
// split keeps its own max and sum, the combine rescales them, as in online softmax).
#pragma once

#include <math_constants.h>

#include <algorithm>
#include <type_traits>

#include "common.cuh"

namespace padfree {
namespace decoder {

constexpr int kAttnThreads = 128;
constexpr int kUnroll = 4;              // key vectors a thread has in flight
constexpr int kMinSplitPositions = 64;  // a split covers at least this many positions
constexpr int kMaxSplits = 64;
constexpr int kMaxChunkPositions = 8192;  // one CTA's scores in shared memory (32 KB)

struct DecoderAttentionArgs {
    const void* q;       // self: qkv [rows, 3 * hidden]; cross: q [rows, hidden]
    const void* q_bias;  // self: qkv_bias [3 * hidden]; cross: q_bias [hidden]; or null
    int64_t q_row_stride;
    // self-attention: the cache [rows, H, L, D], the indirection [rows, L], the step (device)
    void* k_cache;
    void* v_cache;
    const int32_t* cache_indir;
    const int32_t* step;
    int32_t max_len;
    // cross-attention: packed K | V rows [T, 2 * hidden] and the sources' cu_seqlens
    const void* kv_mem;
    const int32_t* cu_seqlens;
    int32_t batch;
    int32_t total_tokens;
    int32_t max_seqlen;
    int32_t num_beams;
    void* out;       // [rows, hidden]
    float* partial;  // splits > 1: o [rows * H, splits, D], then (max, sum) [rows * H, splits]
    int32_t rows;
    int32_t num_heads;
    int32_t splits;
    int32_t chunk_cap;  // positions one CTA may take: the scores' shared-memory size
    float scale_log2;   // softmax_scale * log2(e): scores in base 2 (exp2)
};

template <typename T, int D, bool kSelf>
__global__ void __launch_bounds__(kAttnThreads) decoder_attention_kernel(DecoderAttentionArgs a) {
    constexpr int VEC = Vec<T>::size;
    constexpr int G = D / VEC;             // threads per key: one 16-byte vector each
    constexpr int KPI = kAttnThreads / G;  // keys per pass of the CTA
    static_assert(G <= kWarpSize && kWarpSize % G == 0, "a key's threads sit in one warp");
    extern __shared__ float scores[];  // [chunk_cap]
    __shared__ __align__(16) float q_s[D];
    __shared__ __align__(16) float kn_s[D];
    __shared__ __align__(16) float vn_s[D];
    __shared__ __align__(16) float red[KPI][D];
    __shared__ float scratch[kWarpSize];

    const int row = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x;
    const int hidden = a.num_heads * D;
    const T* bias = static_cast<const T*>(a.q_bias);
    wait_on_producer();

    int n, step = 0;
    int64_t src_start = 0;
    if constexpr (kSelf) {
        step = min(max(*a.step, 0), a.max_len - 1);  // clamped: a bad step stays inside the cache
        n = step + 1;
    } else {
        const int s = min(row / a.num_beams, a.batch - 1);
        const int start = min(max(a.cu_seqlens[s], 0), a.total_tokens);
        const int end = min(max(a.cu_seqlens[s + 1], start), a.total_tokens);
        n = min(end - start, a.max_seqlen);
        src_start = start;
    }

    // Q (pre-scaled), and for self-attention this step's K and V, which split 0 stores in the cache.
    const T* qrow = static_cast<const T*>(a.q) + row * a.q_row_stride + head * D;
    const int part = tid / G, lane_vec = tid % G;
    if (part < (kSelf ? 3 : 1)) {
        float v[VEC];
        vec_to_float(load_vec(qrow + part * hidden + lane_vec * VEC), v);
        if (bias != nullptr) add_vec<T>(v, load_vec_ro(bias + part * hidden + head * D + lane_vec * VEC));
        if (part == 0) {
#pragma unroll
            for (int i = 0; i < VEC; ++i) q_s[lane_vec * VEC + i] = v[i] * a.scale_log2;
        } else if constexpr (kSelf) {
            // the cache holds T: attend to the rounded value, as later steps will
            const Vec<T> stored = vec_from_float<T>(v);
            float* dst = part == 1 ? kn_s : vn_s;
#pragma unroll
            for (int i = 0; i < VEC; ++i) dst[lane_vec * VEC + i] = to_float(stored.v[i]);
            if (split == 0) {
                T* cache = static_cast<T*>(part == 1 ? a.k_cache : a.v_cache);
                const int64_t at = ((static_cast<int64_t>(row) * a.num_heads + head) * a.max_len + step) * D;
                store_vec(cache + at + lane_vec * VEC, stored);
            }
        }
    }
    __syncthreads();

    const int per = ceil_div(n, a.splits);
    const int chunk = min(max(per, kMinSplitPositions), a.chunk_cap);
    const int t0 = min(split * chunk, n);
    const int t1 = min(t0 + chunk, n);

    // Pointer to position t's K (or V at + v_offset) vector of this thread.
    const T* kv_mem = static_cast<const T*>(a.kv_mem);
    auto key_ptr = [&](const void* base, int t) -> const T* {
        if constexpr (kSelf) {
            const int src = min(max(a.cache_indir[static_cast<int64_t>(row) * a.max_len + t], 0), a.rows - 1);
            return static_cast<const T*>(base) +
                   ((static_cast<int64_t>(src) * a.num_heads + head) * a.max_len + t) * D + lane_vec * VEC;
        } else {
            return static_cast<const T*>(base) + (src_start + t) * (2 * hidden) + head * D + lane_vec * VEC;
        }
    };
    const void* k_base = kSelf ? static_cast<const void*>(a.k_cache) : static_cast<const void*>(kv_mem);
    const void* v_base = kSelf ? static_cast<const void*>(a.v_cache) : static_cast<const void*>(kv_mem + hidden);

    // ---- scores: each group of G threads takes one key, kUnroll keys in flight ----
    float qv[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) qv[i] = q_s[lane_vec * VEC + i];
    const int g = part;
    float local_max = -CUDART_INF_F;
    for (int pass = t0; pass < t1; pass += KPI * kUnroll) {  // the same trip count in every warp
        const int base = pass + g;
        Vec<T> kv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = base + u * KPI;
            if (t < t1 && (!kSelf || t != step)) kv[u] = load_vec(key_ptr(k_base, t));
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = base + u * KPI;
            float dot = 0.f;
            if (t < t1) {
                if (kSelf && t == step) {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) dot += qv[i] * kn_s[lane_vec * VEC + i];
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) dot += qv[i] * to_float(kv[u].v[i]);
                }
            }
#pragma unroll
            for (int offset = G / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
            if (t < t1) {
                if (lane_vec == 0) scores[t - t0] = dot;
                local_max = fmaxf(local_max, dot);
            }
        }
    }
    const float m = block_max(local_max, scratch);  // barriers inside: scores are visible after
    float sum = 0.f;
    for (int i = tid; i < t1 - t0; i += kAttnThreads) {
        const float p = exp2f(scores[i] - m);
        scores[i] = p;
        sum += p;
    }
    const float l = block_sum(sum);  // barriers inside: the probabilities are visible after

    // ---- P V: group g sums its positions' V vectors; the groups are then summed over ----
    float acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
    for (int pass = t0; pass < t1; pass += KPI * kUnroll) {  // the same trip count in every warp
        const int base = pass + g;
        Vec<T> vv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = base + u * KPI;
            if (t < t1 && (!kSelf || t != step)) vv[u] = load_vec(key_ptr(v_base, t));
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = base + u * KPI;
            if (t < t1) {
                const float p = scores[t - t0];
                if (kSelf && t == step) {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) acc[i] += p * vn_s[lane_vec * VEC + i];
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) acc[i] += p * to_float(vv[u].v[i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) red[g][lane_vec * VEC + i] = acc[i];
    __syncthreads();
    allow_consumers();
    if (tid < G) {
        float o[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] = 0.f;
#pragma unroll 4
        for (int j = 0; j < KPI; ++j) {
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] += red[j][tid * VEC + i];
        }
        const int64_t rh = static_cast<int64_t>(row) * a.num_heads + head;
        if (a.splits == 1) {
            const float inv = l > 0.f ? 1.f / l : 0.f;  // l == 0: an empty source, zeros
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] *= inv;
            store_vec(static_cast<T*>(a.out) + rh * D + tid * VEC, vec_from_float<T>(o));
        } else {
            float* po = a.partial + (rh * a.splits + split) * D + tid * VEC;
#pragma unroll
            for (int i = 0; i < VEC; i += 4) *reinterpret_cast<float4*>(po + i) = make_float4(o[i], o[i + 1], o[i + 2], o[i + 3]);
            if (tid == 0) {
                float2* ml = reinterpret_cast<float2*>(a.partial + static_cast<int64_t>(a.rows) * a.num_heads * a.splits * D);
                ml[rh * a.splits + split] = make_float2(t1 > t0 ? m : -CUDART_INF_F, l);
            }
        }
    }
}

// The splits of one (row, head) into its output: each split's sum of exp2(s - m_i) V, rescaled to the
// common max (online softmax's correction), over the sum of the rescaled denominators.
template <typename T, int D>
__global__ void __launch_bounds__(D) decoder_attention_combine_kernel(const float* partial, int32_t row_heads,
                                                                        int32_t splits, T* out) {
    wait_on_producer();
    const int64_t rh = blockIdx.x;
    const int d = threadIdx.x;
    const float2* ml = reinterpret_cast<const float2*>(partial + static_cast<int64_t>(row_heads) * splits * D) + rh * splits;
    float m = -CUDART_INF_F;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, ml[s].x);
    float l = 0.f, o = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float2 ms = ml[s];
        const float w = ms.y > 0.f ? exp2f(ms.x - m) : 0.f;
        l += ms.y * w;
        o += partial[(rh * splits + s) * D + d] * w;
    }
    allow_consumers();
    out[rh * D + d] = from_float<T>(l > 0.f ? o / l : 0.f);
}

// Splits for `row_heads` CTAs over up to `positions` positions: enough CTAs for two per SM, each split
// at least kMinSplitPositions long, at most kMaxChunkPositions per CTA.
inline int32_t choose_splits(int64_t row_heads, int32_t positions) {
    const int sms = current_device_value<query_sm_count>();
    const int64_t target = 2 * static_cast<int64_t>(sms > 0 ? sms : 132);
    int64_t splits = row_heads >= target ? 1 : ceil_div<int64_t>(target, row_heads);
    splits = std::min<int64_t>(splits, ceil_div<int64_t>(positions, kMinSplitPositions));
    splits = std::min<int64_t>(splits, kMaxSplits);
    splits = std::max<int64_t>(splits, ceil_div<int64_t>(positions, kMaxChunkPositions));
    return static_cast<int32_t>(std::max<int64_t>(splits, 1));
}

inline int64_t partial_bytes(int64_t row_heads, int32_t splits, int32_t head_dim) {
    return splits > 1 ? row_heads * splits * (head_dim + 2) * static_cast<int64_t>(sizeof(float)) : 0;
}

// Workspace for rows x num_heads queries over up to `positions` positions at the splits
// choose_splits picks (the *_workspace_bytes queries of both attentions).
inline int64_t workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t positions) {
    const int64_t row_heads = static_cast<int64_t>(rows) * num_heads;
    return partial_bytes(row_heads, choose_splits(row_heads, positions), head_dim);
}

// The most splits `workspace_bytes` holds, and at least those shared memory needs; 0 if it holds fewer.
inline int32_t fitting_splits(int64_t row_heads, int32_t positions, int32_t head_dim, int64_t workspace_bytes) {
    int32_t splits = choose_splits(row_heads, positions);
    const int32_t needed = ceil_div(positions, kMaxChunkPositions);
    while (splits > 1 && partial_bytes(row_heads, splits, head_dim) > workspace_bytes) --splits;
    return splits < needed ? 0 : splits;
}

// Launches the attention (and the combine where split): a.splits and a.chunk_cap set by the caller.
template <bool kSelf>
cudaError_t launch_decoder_attention(DecoderAttentionArgs a, int32_t head_dim, padfree_dtype dtype, cudaStream_t stream) {
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        auto go = [&](auto dim) {
            constexpr int D = decltype(dim)::value;
            const dim3 grid(a.rows, a.num_heads, a.splits);
            const size_t smem = static_cast<size_t>(a.chunk_cap) * sizeof(float);
            err = launch_kernel(decoder_attention_kernel<T, D, kSelf>, grid, dim3(kAttnThreads), smem, stream, a);
            if (err == cudaSuccess && a.splits > 1)
                err = launch_kernel(decoder_attention_combine_kernel<T, D>, dim3(a.rows * a.num_heads), dim3(D), 0,
                                    stream, static_cast<const float*>(a.partial), a.rows * a.num_heads, a.splits,
                                    static_cast<T*>(a.out));
        };
        if (head_dim == 64) go(std::integral_constant<int, 64>{});
        else go(std::integral_constant<int, 128>{});
    });
    return err;
}

}  // namespace decoder
}  // namespace padfree
