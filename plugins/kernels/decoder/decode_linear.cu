// A decode step's linear layers for up to 8 rows (batch x beams 1x4, 2x4, 8x1): the weights are read
// once, from DRAM, at close to copy bandwidth, and everything around the GEMM rides along.
//
// Why not cuBLAS here: with 4 rows a [4, 1024] x [1024, 3072] GEMM is a 6 MB weight read, ~2 us at an
// H100's bandwidth, but cuBLAS's small-M kernels take 4-5 us for it, and a decode step has 4-8 of
// them per layer, each followed by a LayerNorm / bias / residual kernel of 2-3 us that moves a few KB.
// Here one kernel does LN(x) (recomputed per block: rows x in_features elements, a few KB), the
// weight-streaming dot products (CUDA cores up to 4 rows; 5-8 rows in 16-bit types on tensor cores,
// mma_detail below, where the FMAs and conversions bounded the kernel), bias, activation and residual.
// A block's first tile of weights is requested before the kernel waits on its producer (PDL): its
// first chunk into registers, the rest into L2, so with padfree's kernels before it the weight stream
// starts while the previous kernel still runs.
//
// Layout (CUDA cores): a block stages the (normalized) x rows in shared memory, then each warp takes 2
// output features at a time: its lanes stream the two weight rows in 16-byte vectors (evict-first: a step
// reads each weight once) and keep rows x 2 float accumulators; a warp reduction and the fused
// epilogue follow. Blocks stride over tiles of 8 features, the grid capped at 4 blocks per SM so
// that the staging is amortized over many tiles for the vocabulary projection.
#include "decode_linear.h"
#include "decode_linear.cuh"

#include "../attention/attention_ptx.cuh"
#include "../ptx/tma_ptx.cuh"
#include "common.cuh"

#include <algorithm>

namespace padfree {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kFeaturesPerWarp = 2;
constexpr int kTile = kWarps * kFeaturesPerWarp;  // output features per block iteration
constexpr int kUnroll = 8;                         // 16-byte weight vectors in flight per lane and feature
constexpr int kBlocksPerSm = 4;
// The first tile goes through shared memory from this size on (below it, registers: KERNELS.md).
constexpr int kBulkTileMinBytes = 16 * 1024;
// Shared memory a block may take with the bulk tile (of the 227 KB an sm_90 block can opt into; less
// where the device allows less).
constexpr size_t kBulkMaxSharedBytes = 200 * 1024;

// Two adjacent elements as floats (one conversion instruction for the half types).
__device__ __forceinline__ float2 pair_to_float2(const float* p) { return make_float2(p[0], p[1]); }
__device__ __forceinline__ float2 pair_to_float2(const __half* p) {
    return __half22float2(*reinterpret_cast<const __half2*>(p));
}
// bf16 is a float's upper half: the conversion is a shift and a mask (the intrinsic's form took the
// kernel to 216+ registers, past 4 blocks per SM)
__device__ __forceinline__ float2 pair_to_float2(const __nv_bfloat16* p) {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PADFREE_DECODE_LINEAR_MMA 1  // mma.sync m16n8k16 (float16 / bfloat16)
constexpr bool kArchMma = true;
#else
constexpr bool kArchMma = false;  // the CUDA-core loop serves every instantiation
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PADFREE_DECODE_LINEAR_BULK 1

#endif

// A weight vector read once per step: streamed past L1 and marked evict-first in L2.
template <typename T>
__device__ __forceinline__ Vec<T> load_weight_vec(const T* p) {
    Vec<T> r;
    *reinterpret_cast<uint4*>(&r) = __ldcs(reinterpret_cast<const uint4*>(p));
    return r;
}

// The first chunk (kUnroll vectors per lane) of a warp's kFeaturesPerWarp weight rows from feature n0:
// what the tile loop's first iteration reads, loaded ahead of it.
template <typename T>
__device__ __forceinline__ void load_weight_chunk(Vec<T> (&w)[kFeaturesPerWarp][kUnroll], const T* weight, int n0,
                                                  int N, int K, int lane) {
    constexpr int V = vec_size<T>();
    const int kvecs = K / V;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int idx = lane + u * kWarpSize;
#pragma unroll
        for (int f = 0; f < kFeaturesPerWarp; ++f)
            if (idx < kvecs)
                w[f][u] = load_weight_vec(weight + static_cast<int64_t>(min(n0 + f, N - 1)) * K +
                                          static_cast<int64_t>(idx) * V);
    }
}

// The fused epilogue of output (m, n), either path: bias, activation, residual, rounded to T.
template <typename T>
__device__ __forceinline__ void store_output(const DecodeLinearArgs& a, float y, int m, int n) {
    const T* bias = static_cast<const T*>(a.bias);
    const T* residual = static_cast<const T*>(a.residual);
    if (bias != nullptr) y += to_float(bias[n]);
    y = decode_linear_detail::activate(y, a.activation);
    const int64_t at = static_cast<int64_t>(m) * a.out_features + n;
    if (residual != nullptr) y += to_float(residual[at]);
    static_cast<T*>(a.out)[at] = from_float<T>(y);
}

// The products on tensor cores (5-8 rows, 16-bit types): the block's 8 features are an mma.sync
// m16n8k16's M (rows 8-15 repeat them and are dropped) and the staged rows its N; the warps split
// in_features, 32 at a time (two mma's), and add their partial sums through shared memory in warp
// order. On CUDA cores every weight element costs each warp its conversion and `rows` FMAs, and every x
// element one conversion per warp and feature pair: at 8 rows, with four blocks an SM, that instruction
// stream, not the bytes, bounded a call. At 1-4 rows the CUDA cores stay faster (KERNELS.md). Lane (g, t)
// loads 16 bytes of weight row g and of x row g at 32c + 8t: taking each 32-wide chunk's k in the order
// (8t, 8t+1 | 8t+2, 8t+3) for the first mma and (8t+4 ... 8t+7) for the second makes those the
// fragments (the same permutation of k for both operands leaves the sums as they are).
namespace mma_detail {

constexpr int kChunk = 32;  // in_features per pair of mma's
constexpr int kGroup = 8;   // chunks a warp loads before it multiplies them (16 bytes each a lane)
// tile_products()'s partial sums
constexpr size_t kStaticSharedBytes = sizeof(float) * kWarps * kTile * 8;

// lane (g, t)'s 16 bytes of the row at chunk c (zeros past in_features, a multiple of 8)
template <typename T>
__device__ __forceinline__ uint4 chunk_at(const T* row, int c, int t, int K, bool global) {
    const int k = c * kChunk + t * 8;
    if (k >= K) return make_uint4(0u, 0u, 0u, 0u);
    const uint4* p = reinterpret_cast<const uint4*>(row + k);
    return global ? __ldcs(p) : *p;
}

// chunks warp, warp + kWarps, ... (kGroup of them from c0) of a weight row
template <typename T>
__device__ __forceinline__ void load_group(uint4 (&wv)[kGroup], const T* row, int c0, int t, int K, bool global) {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) wv[j] = chunk_at(row, c0 + j * kWarps, t, K, global);
}

template <typename T, int kRows>
__device__ __forceinline__ void tile_products(const DecodeLinearArgs& a, const T* xs, const T* wtile,
                                              uint64_t* bar, const uint4 (&pre)[kGroup], bool preloaded,
                                              bool from_smem, int warp, int lane, int tiles) {
#if defined(PADFREE_DECODE_LINEAR_MMA)
    __shared__ float part[kWarps][kTile][8];  // each warp's sums: feature x staged row (kStaticSharedBytes)
    const int K = a.in_features, N = a.out_features, M = a.rows;
    const int g = lane / 4, t = lane % 4;
    const int chunks = (K + kChunk - 1) / kChunk;
    const T* weight = static_cast<const T*>(a.weight);
    const T* x_row = xs + static_cast<int64_t>(g < kRows ? g : 0) * K;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int n0 = tile * kTile, features = min(kTile, N - n0);
        const T* w_row = from_smem ? wtile + static_cast<int64_t>(min(g, features - 1)) * K
                                   : weight + static_cast<int64_t>(min(n0 + g, N - 1)) * K;
#if defined(PADFREE_DECODE_LINEAR_BULK)
        if (from_smem) attention_detail::mbarrier_wait(attention_detail::smem_addr(bar), 0);
#endif
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c0 = warp; c0 < chunks; c0 += kWarps * kGroup) {
            uint4 wv[kGroup];
            if (preloaded) {
#pragma unroll
                for (int j = 0; j < kGroup; ++j) wv[j] = pre[j];
                preloaded = false;
            } else {
                load_group<T>(wv, w_row, c0, t, K, !from_smem);
            }
#pragma unroll
            for (int j = 0; j < kGroup; ++j) {
                const int c = c0 + j * kWarps;
                if (c >= chunks) break;
                // staged rows past kRows: zero (mma's N is 8)
                const uint4 xv = g < kRows ? chunk_at(x_row, c, t, K, false) : make_uint4(0u, 0u, 0u, 0u);
                const uint32_t first[4] = {wv[j].x, wv[j].x, wv[j].y, wv[j].y};
                const uint32_t second[4] = {wv[j].z, wv[j].z, wv[j].w, wv[j].w};
                attention_detail::MmaOp<T>::run(acc, first, xv.x, xv.y);
                attention_detail::MmaOp<T>::run(acc, second, xv.z, xv.w);
            }
        }
        from_smem = false;
        // c0, c1: feature g, rows 2t and 2t + 1 (c2, c3: the repeated features)
        *reinterpret_cast<float2*>(&part[warp][g][2 * t]) = make_float2(acc[0], acc[1]);
        __syncthreads();
        if (threadIdx.x < kTile * kRows) {
            const int f = threadIdx.x / kRows, m = threadIdx.x % kRows, n = n0 + f;
            if (m < M && n < N) {
                float y = part[0][f][m];
#pragma unroll
                for (int q = 1; q < kWarps; ++q) y += part[q][f][m];  // in warp order: no timing in the sum
                store_output<T>(a, y, m, n);
            }
        }
        __syncthreads();  // part is the next tile's
    }
#endif
}

}  // namespace mma_detail

// Tensor cores at 5-8 rows of the 16-bit types, where the CUDA cores' instructions bound a call; at 1-4
// rows the same loop measured slower than the CUDA cores (KERNELS.md).
template <typename T, int kRows>
constexpr bool uses_tensor_cores() { return sizeof(T) == 2 && kRows == 8; }

// kRows: rows rounded up to a power of two (the accumulators' count); staged rows past `rows` are zero.
// bulk_tile (sm_90, where the launcher found room): the first tile through shared memory. Bounded at
// 128 registers: 4 blocks per SM, every block of a capped grid resident. Where uses_tensor_cores (and
// compiled for sm_80+) the products run on tensor cores (mma_detail::tile_products).
template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    decode_linear_kernel(DecodeLinearArgs a, int bulk_tile) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr bool kTensorCores = uses_tensor_cores<T, kRows>() && kArchMma;
    constexpr int V = vec_size<T>();
    const int K = a.in_features, N = a.out_features, M = a.rows;
    T* xs = reinterpret_cast<T*>(smem_raw);  // [kRows][in_features]
    T* ln_params = xs + static_cast<int64_t>(kRows) * K;  // gamma then beta [in_features] each, with LN
    T* wtile = ln_params + (a.ln_gamma != nullptr ? 2 * K : 0);  // [kTile][in_features], with bulk_tile
    uint64_t* bar = reinterpret_cast<uint64_t*>(wtile + static_cast<int64_t>(kTile) * K);
    const int kvecs = K / V;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int tiles = (N + kTile - 1) / kTile;
    const T* weight = static_cast<const T*>(a.weight);

    // The first tile's weights are not the producer's output: they are requested before the wait. With
    // PDL this block is resident while the producer still streams its own weights, so a layer whose
    // blocks each hold one tile (every layer of a 1x4 NLLB step) has its weights in flight before the
    // producer ends, and after the wait only x, the LayerNorm and the arithmetic remain on the critical
    // path. On sm_90 one thread bulk-copies the whole tile into shared memory; otherwise its first chunk
    // is loaded into registers and the rest started towards L2.
    Vec<T> w[kFeaturesPerWarp][kUnroll];
    uint4 pre[mma_detail::kGroup];  // kTensorCores: the warp's first group of weight chunks
    bool preloaded = false, from_smem = false;
#if defined(PADFREE_DECODE_LINEAR_BULK)
    if (bulk_tile && blockIdx.x < tiles) {
        from_smem = true;
        if (threadIdx.x == 0) {
            const int features = min(kTile, N - static_cast<int>(blockIdx.x) * kTile);
            const uint32_t b = attention_detail::smem_addr(bar);
            const uint32_t bytes = static_cast<uint32_t>(features) * K * sizeof(T);
            attention_detail::mbarrier_init(b, 1);
            attention_detail::fence_mbarrier_init();  // published to the block by the barrier after staging x
            attention_detail::mbarrier_expect_bytes(b, bytes);
            decode_linear_detail::bulk_load_evict_first(attention_detail::smem_addr(wtile),
                                                        weight + static_cast<int64_t>(blockIdx.x) * kTile * K, bytes,
                                                        b);
        }
    } else
#endif
    if (blockIdx.x < tiles) {
        if constexpr (kTensorCores) {
            const int row = min(static_cast<int>(blockIdx.x) * kTile + lane / 4, N - 1);  // lane (g, t)'s
            mma_detail::load_group<T>(pre, weight + static_cast<int64_t>(row) * K, warp, lane % 4, K, /*global=*/true);
        } else {
            load_weight_chunk<T>(w, weight, blockIdx.x * kTile + warp * kFeaturesPerWarp, N, K, lane);
        }
        preloaded = true;
        const int features = min(kTile, N - static_cast<int>(blockIdx.x) * kTile);
        const char* first = reinterpret_cast<const char*>(weight + static_cast<int64_t>(blockIdx.x) * kTile * K);
        const int64_t bytes = static_cast<int64_t>(features) * K * sizeof(T);
        // lines of each weight row past what the registers above hold (a 4096-wide row: 4 chunks)
        constexpr int64_t kHeld = kTensorCores ? int64_t{mma_detail::kGroup} * kWarps * mma_detail::kChunk
                                               : int64_t{kWarpSize} * kUnroll * V;
        const int64_t chunk_bytes = kHeld * static_cast<int64_t>(sizeof(T));
        for (int64_t at = threadIdx.x * 128; at < bytes; at += kThreads * 128)
            if (at % (static_cast<int64_t>(K) * sizeof(T)) >= chunk_bytes) prefetch_l2(first + at);
    }
    if (a.ln_gamma != nullptr) {  // parameters, not the producer's output: staged before the wait
        for (int v = threadIdx.x; v < kvecs; v += kThreads) {
            store_vec(ln_params + v * V, load_vec(static_cast<const T*>(a.ln_gamma) + v * V));
            store_vec(ln_params + K + v * V, load_vec(static_cast<const T*>(a.ln_beta) + v * V));
        }
    }
    wait_on_producer();

    // the x rows, all in flight at once (cp.async: a load-then-store loop would wait for each L2 round
    // trip in turn, up to 16 of them per thread for a 4096-wide input)
    const T* x = static_cast<const T*>(a.x);
    for (int i = threadIdx.x; i < kRows * kvecs; i += kThreads) {
        const uint32_t dst = attention_detail::smem_addr(xs + static_cast<int64_t>(i) * V);
        if (i < M * kvecs) {
            attention_detail::cp_async_16_full(dst, x + static_cast<int64_t>(i) * V);
        } else {
            attention_detail::st_shared_zero_16(dst);
        }
    }
    attention_detail::cp_async_commit();
    attention_detail::cp_async_wait<0>();
    __syncthreads();

    if (a.ln_gamma != nullptr) {
        // each row normalized in place; block 0 also writes it out for a post-LN residual
        decode_linear_detail::layernorm_staged_rows(
            xs, K, M, K, ln_params, ln_params + K, a.eps,
            blockIdx.x == 0 ? static_cast<T*>(a.x_norm_out) : nullptr, warp, kWarps, lane);
        __syncthreads();
    }

    // every block of this grid is resident (at most kBlocksPerSm per SM): the next kernel may launch now,
    // and prefetch its own weights while this one streams (it still waits for this grid to finish)
    allow_consumers();

    if constexpr (kTensorCores) {
        mma_detail::tile_products<T, kRows>(a, xs, wtile, bar, pre, preloaded, from_smem, warp, lane, tiles);
    } else {  // CUDA cores
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
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
            const T* wsmem[kFeaturesPerWarp];  // the same rows in the bulk-copied tile
#pragma unroll
            for (int f = 0; f < kFeaturesPerWarp; ++f)
                wsmem[f] = wtile + static_cast<int64_t>(min(n0 + f, N - 1) - tile * kTile) * K;
#if defined(PADFREE_DECODE_LINEAR_BULK)
            if (from_smem) attention_detail::mbarrier_wait(attention_detail::smem_addr(bar), 0);
#endif

            for (int base = lane; base < kvecs; base += kWarpSize * kUnroll) {
                if (!preloaded && !from_smem) {
#pragma unroll
                    for (int u = 0; u < kUnroll; ++u) {
                        const int idx = base + u * kWarpSize;
#pragma unroll
                        for (int f = 0; f < kFeaturesPerWarp; ++f)
                            if (idx < kvecs) w[f][u] = load_weight_vec(wrow[f] + static_cast<int64_t>(idx) * V);
                    }
                }
                preloaded = false;
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const int idx = base + u * kWarpSize;
                    if (idx >= kvecs) break;
                    float wf[kFeaturesPerWarp][V];
#pragma unroll
                    for (int f = 0; f < kFeaturesPerWarp; ++f) {
                        if (from_smem) w[f][u] = load_vec(wsmem[f] + static_cast<int64_t>(idx) * V);
#pragma unroll
                        for (int e = 0; e < V; e += 2) {
                            const float2 p = pair_to_float2(&w[f][u].v[e]);
                            wf[f][e] = p.x;
                            wf[f][e + 1] = p.y;
                        }
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
            from_smem = false;
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
            if (first && m < M && n < N) store_output<T>(a, sums[0], m, n);
        }
    }
}

template <typename T, int kRows>
cudaError_t launch_rows(const DecodeLinearArgs& a, cudaStream_t stream) {
    size_t smem = static_cast<size_t>(kRows + (a.ln_gamma != nullptr ? 2 : 0)) * a.in_features * sizeof(T);
    const size_t tile_bytes = static_cast<size_t>(kTile) * a.in_features * sizeof(T);
    const size_t optin = static_cast<size_t>(current_device_value<query_smem_per_block_optin>());
    const int bulk = current_compute_capability() >= 90 && tile_bytes >= kBulkTileMinBytes &&
                     smem + tile_bytes + sizeof(uint64_t) <= std::min(kBulkMaxSharedBytes, optin);
    if (bulk) smem += tile_bytes + sizeof(uint64_t);
    auto kernel = decode_linear_kernel<T, kRows>;
    // above 48 KB the kernel must opt in (once per instantiation and new maximum)
    static std::atomic<size_t> opted_in{48 * 1024};
    if (const cudaError_t err = decode_linear_detail::opt_in_shared_memory(kernel, smem, opted_in); err != cudaSuccess)
        return err;
    // every block resident: at most kBlocksPerSm per SM, fewer where their shared memory does not fit
    // (each block also takes 1 KB the runtime reserves, and the tensor-core loop its static partial sums)
    const int tiles = (a.out_features + kTile - 1) / kTile;
    const int sms = current_device_value<query_sm_count>();
    const size_t smem_per_sm = static_cast<size_t>(current_device_value<query_smem_per_sm>());
    const size_t block_smem = smem + 1024 + (uses_tensor_cores<T, kRows>() ? mma_detail::kStaticSharedBytes : 0);
    const int per_sm = smem_per_sm > 0
                           ? std::max(1, std::min(kBlocksPerSm, static_cast<int>(smem_per_sm / block_smem)))
                           : kBlocksPerSm;
    const int grid = sms > 0 ? std::min(tiles, sms * per_sm) : tiles;
    return launch_kernel(kernel, dim3(grid), dim3(kThreads), smem, stream, a, bulk);
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
    if (a.rows <= 1) return launch_rows<T, 1>(a, stream);
    if (a.rows <= 2) return launch_rows<T, 2>(a, stream);
    if (a.rows <= 4) return launch_rows<T, 4>(a, stream);
    return launch_rows<T, 8>(a, stream);
}

}  // namespace

cudaError_t launch_decode_linear(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0 || args.out_features == 0) return cudaSuccess;
    if (decode_linear_stream_takes(args, dtype)) return launch_decode_linear_stream(args, dtype, stream);
    if (args.rows > kDecodeLinearMaxRows) return launch_decode_linear_mma(args, dtype, stream);
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        err = launch_typed<T>(args, stream);
    });
    return err;
}

}  // namespace padfree
