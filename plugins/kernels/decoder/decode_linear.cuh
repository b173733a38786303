// What decode_linear's kernels share (decode_linear.cu: CUDA cores, up to 8 rows;
// decode_linear_fragments.cu: tensor cores on fragment-ordered weights, up to 8 rows;
// decode_linear_mma.cu: tensor cores, 9 to 64 rows): the fused epilogue's activation, a LayerNorm's
// passes over the x rows a block stages in shared memory, and the opt-in to that shared memory.
#pragma once

#include <atomic>

#include "common.cuh"
#include "decode_linear.h"

namespace padfree {
namespace decode_linear_detail {

__device__ __forceinline__ float activate(float y, DecodeActivation act) {
    switch (act) {
        case DecodeActivation::kRelu: return fmaxf(y, 0.f);
        case DecodeActivation::kGelu: return 0.5f * y * (1.f + erff(y * 0.70710678118654752f));
        case DecodeActivation::kGeluTanh: {
            const float inner = 0.7978845608028654f * (y + 0.044715f * y * y * y);
            return 0.5f * y * (1.f + tanhf(inner));
        }
        case DecodeActivation::kSilu: return y / (1.f + __expf(-y));
        default: return y;
    }
}

// A LayerNorm's two passes over a staged row, as partial sums for the caller to reduce across its
// threads: the sum of the row's vectors first, first + step, ... below vecs, then of their squared
// deviations from the mean (float32, two-pass).
template <typename T>
__device__ __forceinline__ float staged_row_sum(const T* row, int first, int vecs, int step) {
    constexpr int V = vec_size<T>();
    float s = 0.f;
    for (int v = first; v < vecs; v += step) {
        const Vec<T> xv = load_vec(row + v * V);
#pragma unroll
        for (int e = 0; e < V; ++e) s += to_float(xv.v[e]);
    }
    return s;
}

template <typename T>
__device__ __forceinline__ float staged_row_squares(const T* row, int first, int vecs, int step, float mean) {
    constexpr int V = vec_size<T>();
    float q = 0.f;
    for (int v = first; v < vecs; v += step) {
        const Vec<T> xv = load_vec(row + v * V);
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const float d = to_float(xv.v[e]) - mean;
            q += d * d;
        }
    }
    return q;
}

// One vector of a row normalized, scaled and shifted, rounded to T as a LayerNorm's output is.
template <typename T>
__device__ __forceinline__ Vec<T> layernorm_vec(Vec<T> xv, float mean, float rstd, const Vec<T>& gamma,
                                                const Vec<T>& beta) {
#pragma unroll
    for (int e = 0; e < vec_size<T>(); ++e)
        xv.v[e] = from_float<T>((to_float(xv.v[e]) - mean) * rstd * to_float(gamma.v[e]) + to_float(beta.v[e]));
    return xv;
}

// LayerNorm of the staged rows [0, rows) of xs (row stride ld elements) in place: a warp per row.
// side (or null): each normalized row also written there ([rows, K], for a post-LN residual).
template <typename T>
__device__ __forceinline__ void layernorm_staged_rows(T* xs, int64_t ld, int rows, int K, const T* gamma,
                                                      const T* beta, float eps, T* side, int warp, int warps,
                                                      int lane) {
    constexpr int V = vec_size<T>();
    const int kvecs = K / V;
    for (int m = warp; m < rows; m += warps) {
        T* row = xs + static_cast<int64_t>(m) * ld;
        const float mean = warp_sum(staged_row_sum(row, lane, kvecs, kWarpSize)) / K;
        const float rstd = rsqrtf(warp_sum(staged_row_squares(row, lane, kvecs, kWarpSize, mean)) / K + eps);
        T* side_row = side != nullptr ? side + static_cast<int64_t>(m) * K : nullptr;
        for (int v = lane; v < kvecs; v += kWarpSize) {
            const Vec<T> xv =
                layernorm_vec(load_vec(row + v * V), mean, rstd, load_vec(gamma + v * V), load_vec(beta + v * V));
            store_vec(row + v * V, xv);
            if (side_row != nullptr) store_vec(side_row + v * V, xv);
        }
    }
}

// A row's LayerNorm statistics (mean, rstd) from its vectors in a warp's registers (lane l holding vectors
// l, l + 32, ...; K = kVecs * 32 * V elements): float32, two passes, in a fixed order.
template <typename T, int kVecs>
__device__ __forceinline__ float2 row_statistics(const Vec<T> (&v)[kVecs], float eps) {
    constexpr int V = vec_size<T>();
    constexpr int K = kVecs * kWarpSize * V;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
        for (int e = 0; e < V; ++e) s += to_float(v[i].v[e]);
    const float mean = warp_sum(s) / K;
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const float d = to_float(v[i].v[e]) - mean;
            q += d * d;
        }
    return make_float2(mean, rsqrtf(warp_sum(q) / K + eps));
}

// LayerNorm of rows [0, rows) of x ([rows, K] in global memory, K = kVecs * 32 * V) into the staged rows
// of xs (row stride ld): a warp per row, at most kRowsPerWarp rows a warp, every row's vectors loaded into
// registers before any is reduced (one L2 round trip, not a staging pass and three passes over shared
// memory), then the same two-pass float32 arithmetic as layernorm_staged_rows in the same order, so
// the two give identical rows. side (or null): each normalized row also written there ([rows, K]).
// Not layernorm_row.cuh's layernorm_store_row: that one holds the row as float32 (twice the registers
// of these packed 16-bit vectors, which share the fragment kernel's 128 beside its weight ring) and
// reads gamma / beta through the read-only path, where these are staged in shared memory.
template <typename T, int kVecs, int kRowsPerWarp>
__device__ __forceinline__ void layernorm_rows_into(const T* x, T* xs, int64_t ld, int rows, const T* gamma,
                                                    const T* beta, float eps, T* side, int warp, int warps,
                                                    int lane) {
    constexpr int V = vec_size<T>();
    constexpr int K = kVecs * kWarpSize * V;
    Vec<T> v[kRowsPerWarp][kVecs];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
        const int m = warp + j * warps;
        if (m < rows)
#pragma unroll
            for (int i = 0; i < kVecs; ++i) v[j][i] = load_vec(x + static_cast<int64_t>(m) * K + (lane + i * kWarpSize) * V);
    }
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
        const int m = warp + j * warps;
        if (m >= rows) break;
        const float2 st = row_statistics<T, kVecs>(v[j], eps);
        const float mean = st.x, rstd = st.y;
#pragma unroll
        for (int i = 0; i < kVecs; ++i) {
            const int at = (lane + i * kWarpSize) * V;
            const Vec<T> xv = layernorm_vec(v[j][i], mean, rstd, load_vec(gamma + at), load_vec(beta + at));
            store_vec(xs + static_cast<int64_t>(m) * ld + at, xv);
            if (side != nullptr) store_vec(side + static_cast<int64_t>(m) * K + at, xv);
        }
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// `bytes` from global into shared memory by the copy engine (one instruction for a whole tile, no
// registers held while it flies), counted on the mbarrier `bar`, marked evict-first in L2: a step reads
// each weight once. sm_90 and later.
__device__ __forceinline__ void bulk_load_evict_first(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
}
#endif

// Raises `kernel`'s dynamic shared memory limit to smem where a launch needs more than it has opted into
// so far (opted_in: the kernel's own record, raised to the most any launch has needed; a benign race:
// every caller sets a value at least its own).
template <typename Kernel>
cudaError_t opt_in_shared_memory(Kernel kernel, size_t smem, std::atomic<size_t>& opted_in) {
    if (smem <= opted_in.load(std::memory_order_relaxed)) return cudaSuccess;
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    size_t seen = opted_in.load(std::memory_order_relaxed);
    while (seen < smem && !opted_in.compare_exchange_weak(seen, smem, std::memory_order_relaxed)) {
    }
    return cudaSuccess;
}

}  // namespace decode_linear_detail
}  // namespace padfree
