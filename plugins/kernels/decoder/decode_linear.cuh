// A decode step's linear layers for up to 8 rows (batch x beams 1x4, 2x4, 8x1): the weights are read
// once, from DRAM, at close to copy bandwidth, and everything around the GEMM rides along.
//
// Why not cuBLAS here: with 4 rows a [4, 1024] x [1024, 3072] GEMM is a 6 MB weight read, ~2 us at an
// H100's bandwidth, but cuBLAS's small-M kernels take 4-5 us for it, and a decode step has 4-8 of
// them per layer, each followed by a LayerNorm / bias / residual kernel of 2-3 us that moves a few KB.
// Here one kernel does LN(x) (recomputed per block: rows x in_features elements, a few KB), the
// weight-streaming dot products (CUDA cores: each weight element meets `rows` x values, so up to 8
// rows the FMAs keep up with the loads), bias, activation and residual. Weight lines of a block's
// first tile are prefetched into L2 before the kernel waits on its producer (PDL), so with padfree's
// kernels before it the weight stream starts while the previous kernel still runs.
//
// Layout: a block stages the (normalized) x rows in shared memory, then each warp takes 2 output
// features at a time: its lanes stream the two weight rows in 16-byte vectors (evict-first: a step
// reads each weight once) and keep rows x 2 float accumulators; a warp reduction and the fused
// epilogue follow. Blocks stride over tiles of 8 features, the grid capped at 4 blocks per SM so
// that the staging is amortized over many tiles for the vocabulary projection.
#pragma once

#include "decode_linear.h"

#include "common.cuh"

namespace padfree {
namespace decode_linear_detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kFeaturesPerWarp = 2;
constexpr int kTile = kWarps * kFeaturesPerWarp;  // output features per block iteration
constexpr int kUnroll = 8;                         // 16-byte weight vectors in flight per lane and feature
constexpr int kBlocksPerSm = 4;

// Two adjacent elements as floats (one conversion instruction for the half types).
__device__ __forceinline__ float2 pair_to_float2(const float* p) { return make_float2(p[0], p[1]); }
__device__ __forceinline__ float2 pair_to_float2(const __half* p) {
    return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ float2 pair_to_float2(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// Sums each of kCount values over the warp, reduce-scatter style (kCount - 1 + 5 - log2(kCount) shuffles
// instead of 5 per value): afterwards lane l holds the total of value owner_index<kCount>(l) in v[0].
template <int kCount>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[kCount], int lane) {
    int count = kCount;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
        if (count > 1) {
            const int half = count / 2;
            const bool upper = (lane & offset) != 0;
#pragma unroll
            for (int i = 0; i < kCount / 2; ++i) {
                if (i >= half) break;
                const float send = upper ? v[i] : v[i + half];
                const float keep = upper ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
            }
            count = half;
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
        }
    }
}

// The value index whose total lane ends up with: the lane's bits from the top, one per halving.
template <int kCount>
__device__ __forceinline__ int owner_index(int lane) {
    int index = 0, count = kCount;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
        if (count > 1) {
            count /= 2;
            if (lane & offset) index += count;
        }
    }
    return index;
}

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

// A weight vector read once per step: streamed past L1 and marked evict-first in L2.
template <typename T>
__device__ __forceinline__ Vec<T> load_weight_vec(const T* p) {
    Vec<T> r;
    *reinterpret_cast<uint4*>(&r) = __ldcs(reinterpret_cast<const uint4*>(p));
    return r;
}

// Starts moving block `block`'s first weight tile into L2: they are not the producer's output, so this
// runs before the wait on it (the previous kernel, or the previous phase of a decode program).
template <typename T>
__device__ __forceinline__ void prefetch_first_tile(const DecodeLinearArgs& a, int block) {
    const int tiles = (a.out_features + kTile - 1) / kTile;
    if (block < tiles) {
        const int features = min(kTile, a.out_features - block * kTile);
        const char* first = reinterpret_cast<const char*>(static_cast<const T*>(a.weight) +
                                                          static_cast<int64_t>(block) * kTile * a.in_features);
        const int64_t bytes = static_cast<int64_t>(features) * a.in_features * sizeof(T);
        for (int64_t at = threadIdx.x * 128; at < bytes; at += kThreads * 128) prefetch_l2(first + at);
    }
}

// The linear layer's work of block `block` of `blocks` (tiles block, block + blocks, ...), in smem_raw
// (decode_linear_smem bytes). kPdl: a kernel of its own, which waits on its producer after staging
// the LayerNorm parameters and lets its consumer launch once staged; in a decode program the phases'
// grid barrier orders them instead.
// kRows: rows rounded up to a power of two (the accumulators' count); staged rows past `rows` are zero.
template <typename T, int kRows, bool kPdl>
__device__ __forceinline__ void decode_linear_block(const DecodeLinearArgs& a, unsigned char* smem_raw, int block,
                                                    int blocks) {
    constexpr int V = Vec<T>::size;
    const int K = a.in_features, N = a.out_features, M = a.rows;
    T* xs = reinterpret_cast<T*>(smem_raw);  // [kRows][in_features]
    T* ln_params = xs + static_cast<int64_t>(kRows) * K;  // gamma then beta [in_features] each, with LN
    const int kvecs = K / V;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int tiles = (N + kTile - 1) / kTile;
    const T* weight = static_cast<const T*>(a.weight);

    if (a.ln_gamma != nullptr) {  // parameters, not the producer's output: staged before the wait
        for (int v = threadIdx.x; v < kvecs; v += kThreads) {
            store_vec(ln_params + v * V, load_vec(static_cast<const T*>(a.ln_gamma) + v * V));
            store_vec(ln_params + K + v * V, load_vec(static_cast<const T*>(a.ln_beta) + v * V));
        }
    }
    if constexpr (kPdl) wait_on_producer();

    const T* x = static_cast<const T*>(a.x);
    for (int i = threadIdx.x; i < kRows * kvecs; i += kThreads) {
        Vec<T> v;
        if (i < M * kvecs) {
            v = load_vec(x + static_cast<int64_t>(i) * V);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) v.v[e] = from_float<T>(0.f);
        }
        store_vec(xs + static_cast<int64_t>(i) * V, v);
    }
    __syncthreads();

    if (a.ln_gamma != nullptr) {
        // LayerNorm of each row in place (a warp per row, 16-byte vectors, float32 two-pass statistics);
        // block 0 also writes it out for a post-LN residual
        const T* gamma = ln_params;
        const T* beta = ln_params + K;
        for (int m = warp; m < M; m += kWarps) {
            T* row = xs + static_cast<int64_t>(m) * K;
            float s = 0.f;
            for (int v = lane; v < kvecs; v += kWarpSize) {
                const Vec<T> xv = load_vec(row + v * V);
#pragma unroll
                for (int e = 0; e < V; ++e) s += to_float(xv.v[e]);
            }
            const float mean = warp_sum(s) / K;
            float q = 0.f;
            for (int v = lane; v < kvecs; v += kWarpSize) {
                const Vec<T> xv = load_vec(row + v * V);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float d = to_float(xv.v[e]) - mean;
                    q += d * d;
                }
            }
            const float rstd = rsqrtf(warp_sum(q) / K + a.eps);
            T* side = a.x_norm_out != nullptr && block == 0
                          ? static_cast<T*>(a.x_norm_out) + static_cast<int64_t>(m) * K
                          : nullptr;
            for (int v = lane; v < kvecs; v += kWarpSize) {
                Vec<T> xv = load_vec(row + v * V);
                const Vec<T> g = load_vec(gamma + v * V), b = load_vec(beta + v * V);
#pragma unroll
                for (int e = 0; e < V; ++e)
                    xv.v[e] = from_float<T>((to_float(xv.v[e]) - mean) * rstd * to_float(g.v[e]) + to_float(b.v[e]));
                store_vec(row + v * V, xv);
                if (side != nullptr) store_vec(side + v * V, xv);
            }
        }
        __syncthreads();
    }

    // every block of this grid is resident (at most kBlocksPerSm per SM): the next kernel may launch now,
    // and prefetch its own weights while this one streams (it still waits for this grid to finish)
    if constexpr (kPdl) allow_consumers();

    const T* bias = static_cast<const T*>(a.bias);
    const T* residual = static_cast<const T*>(a.residual);
    T* out = static_cast<T*>(a.out);
    for (int tile = block; tile < tiles; tile += blocks) {
        const int n0 = tile * kTile + warp * kFeaturesPerWarp;
        float acc[kFeaturesPerWarp][kRows];
#pragma unroll
        for (int f = 0; f < kFeaturesPerWarp; ++f)
#pragma unroll
            for (int m = 0; m < kRows; ++m) acc[f][m] = 0.f;
        // a feature past N reads row N - 1 (in range) and is never stored
        const T* wrow[kFeaturesPerWarp];
#pragma unroll
        for (int f = 0; f < kFeaturesPerWarp; ++f) wrow[f] = weight + static_cast<int64_t>(min(n0 + f, N - 1)) * K;

        for (int base = lane; base < kvecs; base += kWarpSize * kUnroll) {
            Vec<T> w[kFeaturesPerWarp][kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int idx = base + u * kWarpSize;
#pragma unroll
                for (int f = 0; f < kFeaturesPerWarp; ++f)
                    if (idx < kvecs) w[f][u] = load_weight_vec(wrow[f] + static_cast<int64_t>(idx) * V);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int idx = base + u * kWarpSize;
                if (idx >= kvecs) break;
                float wf[kFeaturesPerWarp][V];
#pragma unroll
                for (int f = 0; f < kFeaturesPerWarp; ++f)
#pragma unroll
                    for (int e = 0; e < V; e += 2) {
                        const float2 p = pair_to_float2(&w[f][u].v[e]);
                        wf[f][e] = p.x;
                        wf[f][e + 1] = p.y;
                    }
#pragma unroll
                for (int m = 0; m < kRows; ++m) {
                    const Vec<T> xv = load_vec(xs + static_cast<int64_t>(m) * K + static_cast<int64_t>(idx) * V);
#pragma unroll
                    for (int e = 0; e < V; e += 2) {
                        const float2 xf = pair_to_float2(&xv.v[e]);
#pragma unroll
                        for (int f = 0; f < kFeaturesPerWarp; ++f) {
                            acc[f][m] = fmaf(wf[f][e], xf.x, acc[f][m]);
                            acc[f][m] = fmaf(wf[f][e + 1], xf.y, acc[f][m]);
                        }
                    }
                }
            }
        }
        constexpr int kCount = kFeaturesPerWarp * kRows;
        float sums[kCount];
#pragma unroll
        for (int f = 0; f < kFeaturesPerWarp; ++f)
#pragma unroll
            for (int m = 0; m < kRows; ++m) sums[f * kRows + m] = acc[f][m];
        warp_reduce_scatter<kCount>(sums, lane);
        // each value's total sits in kWarpSize / kCount lanes: the first of them stores it
        const int index = owner_index<kCount>(lane);
        const bool first = (lane & (kWarpSize / kCount - 1)) == 0;
        const int f = index / kRows, m = index % kRows, n = n0 + f;
        if (first && m < M && n < N) {
            float y = sums[0];
            if (bias != nullptr) y += to_float(bias[n]);
            y = activate(y, a.activation);
            const int64_t at = static_cast<int64_t>(m) * N + n;
            if (residual != nullptr) y += to_float(residual[at]);
            out[at] = from_float<T>(y);
        }
    }
}


// Dynamic shared memory decode_linear_block needs: the staged rows, and the LayerNorm's parameters.
template <typename T, int kRows>
inline size_t decode_linear_smem(const DecodeLinearArgs& a) {
    return static_cast<size_t>(kRows + (a.ln_gamma != nullptr ? 2 : 0)) * a.in_features * sizeof(T);
}

// rows rounded up to the accumulators' count: 1, 2, 4 or 8.
inline int decode_linear_rows_bucket(int rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8; }

}  // namespace decode_linear_detail
}  // namespace padfree
