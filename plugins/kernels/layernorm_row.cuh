// LayerNorm of one row held in registers, shared by kernels/layernorm.cu and kernels/embedding.cu.
// A row of `hidden` elements is `nvec` 16-byte vectors; thread `lane` of the row's `threads` holds
// vectors lane, lane + threads, ... (N of them, as floats). Small rows take one warp each (no
// barriers), large rows one block each. Statistics are fp32 and two-pass over the registers, which
// avoids the cancellation of E[x^2] - E[x]^2 at no memory cost.
#pragma once

#include <type_traits>

#include "common.cuh"

namespace padfree {

template <typename T, int N>
using RowRegisters = float[N][Vec<T>::size];

template <bool kBlockRow>
__device__ __forceinline__ float row_sum(float v) {
    if constexpr (kBlockRow) {
        return block_sum(v);
    } else {
        return warp_sum(v);
    }
}

// Up to three [hidden] parameter rows (null ones skipped) into L2 before wait_on_producer
// (common.cuh: prefetch_l2), by the first warp of the grid only: every row reads the same lines, and
// one prefetch per line is all the DRAM latency needs. Issued by every warp, the prefetches (which
// skip L1) hammered those few L2 lines: skip LayerNorm ran 2.5-3x slower at 2.6K-21K rows (H100).
template <typename T>
__device__ __forceinline__ void prefetch_row_params(const T* a, const T* b, const T* c, int hidden) {
    if (blockIdx.x != 0 || threadIdx.y != 0) return;
    const int lines = (hidden * static_cast<int>(sizeof(T)) + 127) / 128;
    for (int line = threadIdx.x; line < lines; line += blockDim.x)
        for (const T* p : {a, b, c})
            if (p != nullptr) prefetch_l2(reinterpret_cast<const char*>(p) + line * 128);
}

// gamma, beta and (skip LayerNorm) bias at this thread's vectors of a row. kHeld: all loaded into
// registers when made, which a kernel does before wait_on_producer where its grid is one wave with a
// block per SM (small batches: latency-bound, registers to spare), so that the loads overlap the
// producer's tail instead of lengthening the kernel. Otherwise each is read where it is used, leaving
// the registers to more rows in flight (measured: 128 registers, 16x256's skip LayerNorms 0.119 ->
// 0.160 ms per forward on the H100).
template <typename T, int N, bool kHeld>
struct RowParams {
    static constexpr int V = Vec<T>::size;
    static constexpr int kSlots = kHeld ? N : 1;
    const T* gamma;
    const T* beta;
    const T* bias;  // may be null
    Vec<T> held_gamma[kSlots], held_beta[kSlots], held_bias[kSlots];

    __device__ __forceinline__ RowParams(const T* gamma_, const T* beta_, const T* bias_, int lane, int threads,
                                         int nvec)
        : gamma(gamma_), beta(beta_), bias(bias_) {
        if constexpr (kHeld) {
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const int v = lane + i * threads;
                if (v < nvec) {
                    held_gamma[i] = load_vec_ro(gamma + v * V);
                    held_beta[i] = load_vec_ro(beta + v * V);
                    if (bias != nullptr) held_bias[i] = load_vec_ro(bias + v * V);
                }
            }
        }
    }
    // slot i of this thread holds vector v = lane + i * threads
    __device__ __forceinline__ Vec<T> gamma_at(int i, int v) const {
        if constexpr (kHeld) return held_gamma[i]; else return load_vec_ro(gamma + v * V);
    }
    __device__ __forceinline__ Vec<T> beta_at(int i, int v) const {
        if constexpr (kHeld) return held_beta[i]; else return load_vec_ro(beta + v * V);
    }
    __device__ __forceinline__ Vec<T> bias_at(int i, int v) const {
        if constexpr (kHeld) return held_bias[i]; else return load_vec_ro(bias + v * V);
    }
};

// x holds the row (slots past nvec are ignored); writes LayerNorm(x) * gamma + beta to out_row.
template <typename T, int N, bool kBlockRow, class Params>
__device__ __forceinline__ void layernorm_store_row(RowRegisters<T, N>& x, int lane, int threads, int nvec,
                                                    int hidden, const Params& params, float eps, T* out_row) {
    constexpr int V = Vec<T>::size;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i)
        if (lane + i * threads < nvec)
#pragma unroll
            for (int j = 0; j < V; ++j) sum += x[i][j];
    const float mean = row_sum<kBlockRow>(sum) / static_cast<float>(hidden);
    float squares = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i)
        if (lane + i * threads < nvec)
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const float d = x[i][j] - mean;
                squares += d * d;
            }
    const float rstd = rsqrtf(row_sum<kBlockRow>(squares) / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int v = lane + i * threads;
        if (v < nvec) {
            float g[V], b[V], y[V];
            vec_to_float(params.gamma_at(i, v), g);
            vec_to_float(params.beta_at(i, v), b);
#pragma unroll
            for (int j = 0; j < V; ++j) y[j] = (x[i][j] - mean) * rstd * g[j] + b[j];
            store_vec(out_row + v * V, vec_from_float<T>(y));
        }
    }
}

// How rows map onto threads: blockDim = (threads per row, rows per block).
struct RowLaunch {
    int vecs_per_thread;  // N
    bool block_row;
    dim3 block;
};

constexpr int kWarpRowsPerBlock = 4;
constexpr int kBlockRowVecs = 4;

// Up to 4 vectors per lane a warp takes the row (hidden <= 1024 in fp16, 512 in fp32); past that a
// block of ceil(nvec / 4) threads, rounded to whole warps (at most 512 for hidden 8192 in fp32).
// Three per lane is BERT-base's row (768 in fp16): held in four slots, the empty fourth still cost
// its bound checks and registers.
inline RowLaunch row_launch(int nvec) {
    for (int n = 1; n <= 4; ++n)
        if (nvec <= n * kWarpSize) return {n, false, dim3(kWarpSize, kWarpRowsPerBlock)};
    const int threads = ceil_div(ceil_div(nvec, kBlockRowVecs), kWarpSize) * kWarpSize;
    return {kBlockRowVecs, true, dim3(threads, 1)};
}

// Register cap for the row kernels that read several streams (skip LayerNorm, embeddings): 64
// registers, so an SM holds 32 warps (1024 threads), with no spills at N = 4 (checked with -Xptxas
// -v). Uncapped, the compiler takes about 95 and the SM holds 20 warps.
template <bool kBlockRow>
constexpr int kRowMaxThreads = kBlockRow ? 512 : kWarpSize * kWarpRowsPerBlock;
template <bool kBlockRow>
constexpr int kRowMinBlocks = 1024 / kRowMaxThreads<kBlockRow>;

inline unsigned row_grid(int64_t rows, const RowLaunch& launch) {
    constexpr int64_t kMaxGrid = 1 << 20;  // beyond this, each block loops over rows
    const int64_t blocks = ceil_div<int64_t>(rows, launch.block.y);
    return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// Calls f(std::integral_constant<int, N>, std::bool_constant<block_row>) for the launch's shape:
// the few instantiations every row-wise family compiles.
template <typename F>
void dispatch_row_launch(const RowLaunch& launch, F&& f) {
    if (launch.block_row) {
        f(std::integral_constant<int, kBlockRowVecs>{}, std::true_type{});
    } else if (launch.vecs_per_thread == 1) {
        f(std::integral_constant<int, 1>{}, std::false_type{});
    } else if (launch.vecs_per_thread == 2) {
        f(std::integral_constant<int, 2>{}, std::false_type{});
    } else if (launch.vecs_per_thread == 3) {
        f(std::integral_constant<int, 3>{}, std::false_type{});
    } else {
        f(std::integral_constant<int, 4>{}, std::false_type{});
    }
}

}  // namespace padfree
