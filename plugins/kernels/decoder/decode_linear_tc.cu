// A decode step's linear layers for 9 to 64 rows (batch x beams 4x4 to 16x4, 16x1 to 64x1) on tensor
// cores, Hopper and later: the weights read once at close to copy bandwidth, the input's LayerNorm,
// the bias, activation and residual in the same kernel.
//
// Why not cuBLAS here: at 64 rows its GEMMs run a decoder layer's 2-8 MB weights at ~0.5-1 TB/s
// (H100: 4.5 us for NLLB's [64, 1024] x [1024, 1024]), and each pre-LN sublayer adds a LayerNorm
// kernel of ~2.6 us that moves 128 KB. Here:
// - A tile is 64 output features (16 per warp); a cluster of `split` CTAs (1 to 8) shares it, each CTA
//   one slice of in_features, so that even a 1024-wide layer spreads over ~128 SMs. The partial sums
//   are reduced through distributed shared memory in rank order (deterministic), each CTA finishing a
//   share of the tile's rows with the fused epilogue; no workspace, no second kernel.
// - The LayerNorm of x: each CTA holds its slice of every row; the row statistics are the cluster's
//   sums of the slices' partial sums (two passes, float32, as the few-row kernel's), exchanged
//   through distributed shared memory; each CTA normalizes its slice in place.
// - Weights go straight from global memory into mma operands, 16 bytes per lane, kUnroll chunks in
//   flight. mma.m16n8k16's operand layout wants 4-byte pieces, but the dot product does not care which
//   in_features index meets which: a lane's 8 consecutive elements serve as its k slots of two mmas,
//   and the x operand (from shared memory, the same 16 bytes of each row) uses the same assignment.
//   The weight is the mma's A (16 features), x its B (8 rows per n-tile), so rows pad only to 8.
// - Each CTA's first tile of weights is requested into L2 before it waits on its producer (PDL).
#include <cooperative_groups.h>

#include <algorithm>

#include "../attention/attention_ptx.cuh"
#include "common.cuh"
#include "decode_activation.cuh"
#include "decode_linear.h"

namespace padfree {
namespace {

namespace cg = cooperative_groups;
using attention_detail::cp_async_16_full;
using attention_detail::cp_async_commit;
using attention_detail::cp_async_wait;
using attention_detail::MmaOp;
using attention_detail::smem_addr;
using attention_detail::st_shared_zero_16;

constexpr int kFeatureWarps = 4;               // a tile's 64 features: one mma row block of 16 per warp
constexpr int kHalves = 2;                     // and each of those warps' features twice, one half of the slice each
constexpr int kWarps = kFeatureWarps * kHalves;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileFeatures = kFeatureWarps * 16;
constexpr int kChunk = 32;                     // in_features per lane load (4 lanes x 8 elements)
constexpr int kUnroll = 4;                     // chunks of weights in flight per lane
constexpr int kSliceQuantum = kHalves * kChunk;        // a CTA's slice: whole chunks in each half
constexpr int kAhead = kHalves * kChunk * kUnroll;     // the slice a CTA's first batch of loads covers
constexpr int kMaxSplit = 8;                   // CTAs per cluster (the portable cluster size)
constexpr int kRanksInFlight = 2;              // the epilogue's distributed shared memory loads at a time
constexpr int kPartStride = kTileFeatures + 4; // floats per row of partial sums (conflict-free stores)
constexpr int kMaxStageBytes = 128 * 1024;     // one CTA's slice of x

// Sync of the CTAs sharing a tile (the CTA alone when split is 1).
__device__ __forceinline__ void tile_sync(int split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (split > 1) {
        cg::this_cluster().sync();
        return;
    }
#endif
    __syncthreads();
}

// p (this CTA's shared memory) as seen in the cluster's CTA `rank`.
template <typename P>
__device__ __forceinline__ P* at_rank(P* p, int rank, int split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (split > 1) return cg::this_cluster().map_shared_rank(p, rank);
#endif
    return p;
}

__device__ __forceinline__ uint4 load_weight_16(const void* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));  // read once per step: evict-first
}

// A lane's weights for kUnroll chunks of one tile: rows f0 + g and f0 + g + 8 of the tile (rows past N
// read row N - 1, in range, and are never stored), 16 bytes at 8t of each 32-element chunk; k0: where
// the warp's half of the CTA's slice starts.
template <typename T>
struct WeightBatch {
    const T* weight;
    int K, N, k0, row, t;  // row: the lane's first feature within a tile (warp * 16 + g)
    const char* w0 = nullptr;
    const char* w1 = nullptr;
    uint4 a[kUnroll], b[kUnroll];

    __device__ __forceinline__ void start(int tile) {
        const int f = tile * kTileFeatures + row;
        w0 = reinterpret_cast<const char*>(weight + static_cast<int64_t>(min(f, N - 1)) * K + k0 + t * 8);
        w1 = reinterpret_cast<const char*>(weight + static_cast<int64_t>(min(f + 8, N - 1)) * K + k0 + t * 8);
    }
    __device__ __forceinline__ void load(int kc, int kend) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (kc + u * kChunk < kend) {
                a[u] = load_weight_16(w0 + (kc + u * kChunk) * sizeof(T));
                b[u] = load_weight_16(w1 + (kc + u * kChunk) * sizeof(T));
            }
        }
    }
};

// kNTiles: rows padded to 8 x kNTiles (the zero rows past `rows` cost mma slots, not memory).
template <typename T, int kNTiles>
__global__ void __launch_bounds__(kThreads, 2) decode_linear_tc_kernel(DecodeLinearArgs a, int split, int kslice,
                                                                     int xs_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int kRowsPad = kNTiles * 8;
    constexpr int V = vec_size<T>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* part = reinterpret_cast<float*>(smem_raw);   // [kRowsPad][kPartStride] this CTA's partial sums
    float* row_sum = part + kRowsPad * kPartStride;     // [kRowsPad] LayerNorm: the slice's sum
    float* row_sq = row_sum + kRowsPad;                 // [kRowsPad] and its squared deviations
    T* xs = reinterpret_cast<T*>(row_sq + 2 * kRowsPad);  // [kRowsPad][xs_stride] x's slice
    T* ln_params = xs + kRowsPad * xs_stride;           // gamma then beta [kslice] each, with LN

    const int K = a.in_features, N = a.out_features, M = a.rows;
    const int rank = static_cast<int>(blockIdx.x) % split;
    const int cluster_id = static_cast<int>(blockIdx.x) / split;
    const int clusters = static_cast<int>(gridDim.x) / split;
    const int k0 = rank * kslice;
    const int tiles = (N + kTileFeatures - 1) / kTileFeatures;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const int half = kslice / kHalves, kh = warp / kFeatureWarps;  // this warp's half of the slice
    const T* weight = static_cast<const T*>(a.weight);

    // the tile's weights in this CTA's slice past the batches loaded ahead, towards L2
    constexpr int kWarpAhead = kChunk * kUnroll;
    auto prefetch_tile = [&](int tile) {
        if (half <= kWarpAhead) return;
        const int features = min(kTileFeatures, N - tile * kTileFeatures);
        const int lines = ((half - kWarpAhead) * static_cast<int>(sizeof(T)) + 127) / 128;
        for (int i = threadIdx.x; i < kHalves * features * lines; i += kThreads) {
            const int h = i / (features * lines), j = i % (features * lines);
            const T* row = weight + static_cast<int64_t>(tile * kTileFeatures + j / lines) * K + k0 + h * half + kWarpAhead;
            prefetch_l2(reinterpret_cast<const char*>(row) + (j % lines) * 128);
        }
    };
    // The first tile's first kUnroll chunks of weights (all of them up to a 256-wide slice) and the
    // bias this thread's epilogue adds go into registers before the wait: not the producer's output,
    // they are in flight while it finishes. The rest of the tile's weights are requested into L2.
    WeightBatch<T> w{weight, K, N, k0 + kh * half, (warp % kFeatureWarps) * 16 + g, t};
    w.start(cluster_id);  // clusters <= tiles (the launch's grid)
    w.load(0, half);
    // a thread's epilogue vectors share one column group: (rank * kThreads + threadIdx.x) % 8
    const int bias_col = ((rank * kThreads + threadIdx.x) % (kTileFeatures / 8)) * 8;
    auto load_bias = [&](int tile) {
        Vec<T> b{};
        const int n = tile * kTileFeatures + bias_col;
        if (a.bias != nullptr && n < N) b = load_vec_ro(static_cast<const T*>(a.bias) + n);
        return b;
    };
    Vec<T> bias_here = load_bias(cluster_id);
    prefetch_tile(cluster_id);
    const int vecs = kslice / V;
    if (a.ln_gamma != nullptr) {  // parameters, not the producer's output: requested before the wait
        for (int v = threadIdx.x; v < 2 * vecs; v += kThreads) {
            const T* src = static_cast<const T*>(v < vecs ? a.ln_gamma : a.ln_beta) + k0 + (v % vecs) * V;
            cp_async_16_full(smem_addr(ln_params + v * V), src);
        }
    }
    wait_on_producer();

    // x's slice, all of it in flight at once (cp.async: a load-then-store loop would wait for each L2
    // round trip in turn, 8-32 of them per thread)
    const T* x = static_cast<const T*>(a.x);
    for (int i = threadIdx.x; i < kRowsPad * vecs; i += kThreads) {
        const int m = i / vecs, v = i % vecs;
        const uint32_t dst = smem_addr(xs + m * xs_stride + v * V);
        if (m < M) {
            cp_async_16_full(dst, x + static_cast<int64_t>(m) * K + k0 + v * V);
        } else {
            st_shared_zero_16(dst);
        }
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    if (a.ln_gamma != nullptr) {
        // LayerNorm over whole rows, from the cluster's slices: each row's sum, then its squared
        // deviations (float32 two-pass statistics, as the few-row kernel's), each the ranks' partials
        // added in rank order; then each CTA normalizes its slice in place. A group of kThreads /
        // kRowsPad lanes per row: every row's chain of dependent steps runs at once.
        constexpr int kLanesPerRow = kThreads / kRowsPad;
        const int m = threadIdx.x / kLanesPerRow, sub = threadIdx.x % kLanesPerRow;
        auto row_total = [](float v) {
#pragma unroll
            for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
            return v;
        };
        auto cluster_total = [&](float* local) {
            float total = 0.f;
#pragma unroll
            for (int r = 0; r < kMaxSplit; ++r)
                if (r < split) total += at_rank(local, r, split)[m];
            return total;
        };
        const T* row = xs + m * xs_stride;
        float s = 0.f;
        for (int v = sub; v < vecs; v += kLanesPerRow) {
            const Vec<T> xv = load_vec(row + v * V);
#pragma unroll
            for (int e = 0; e < V; ++e) s += to_float(xv.v[e]);
        }
        s = row_total(s);
        if (sub == 0) row_sum[m] = s;
        tile_sync(split);
        const float mean = cluster_total(row_sum) / K;
        float q = 0.f;
        for (int v = sub; v < vecs; v += kLanesPerRow) {
            const Vec<T> xv = load_vec(row + v * V);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = to_float(xv.v[e]) - mean;
                q += d * d;
            }
        }
        q = row_total(q);
        if (sub == 0) row_sq[m] = q;
        tile_sync(split);
        const float rstd = rsqrtf(cluster_total(row_sq) / K + a.eps);
        const T* gamma = ln_params;
        const T* beta = ln_params + kslice;
        // the first cluster also writes LN(x) out (a post-LN sublayer's residual)
        T* side = a.x_norm_out != nullptr && cluster_id == 0 && m < M
                      ? static_cast<T*>(a.x_norm_out) + static_cast<int64_t>(m) * K + k0
                      : nullptr;
        if (m < M) {
            for (int v = sub; v < vecs; v += kLanesPerRow) {
                Vec<T> xv = load_vec(row + v * V);
                const Vec<T> gv = load_vec(gamma + v * V), bv = load_vec(beta + v * V);
#pragma unroll
                for (int e = 0; e < V; ++e)
                    xv.v[e] = from_float<T>((to_float(xv.v[e]) - mean) * rstd * to_float(gv.v[e]) + to_float(bv.v[e]));
                store_vec(xs + m * xs_stride + v * V, xv);
                if (side != nullptr) store_vec(side + v * V, xv);
            }
        }
        __syncthreads();
        // the other CTAs may still read row_sum / row_sq: the tile loop's syncs come before any exit
    }

    allow_consumers();

    const T* residual = static_cast<const T*>(a.residual);
    T* out = static_cast<T*>(a.out);
    // row g of each n-tile, the lane's 8 elements of a chunk in the warp's half
    const T* x_lane = xs + g * xs_stride + kh * half + t * 8;
    for (int tile = cluster_id; tile < tiles; tile += clusters) {
        const int next = tile + clusters;
        if (next < tiles) prefetch_tile(next);
        float acc[kNTiles][4];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
        for (int kc = 0; kc < half; kc += kChunk * kUnroll) {
            if (kc > 0) w.load(kc, half);  // the batch at 0 was loaded ahead (before the wait, or the last epilogue)
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                if (kc + u * kChunk >= half) break;
                // the lane's 8 elements: slots (2t, 2t+1, 2t+8, 2t+9) of the first mma, then of the second
                const uint32_t a0[4] = {w.a[u].x, w.b[u].x, w.a[u].y, w.b[u].y};
                const uint32_t a1[4] = {w.a[u].z, w.b[u].z, w.a[u].w, w.b[u].w};
#pragma unroll
                for (int n = 0; n < kNTiles; ++n) {
                    const uint4 xv = *reinterpret_cast<const uint4*>(x_lane + n * 8 * xs_stride + kc + u * kChunk);
                    MmaOp<T>::run(acc[n], a0, xv.x, xv.y);
                    MmaOp<T>::run(acc[n], a1, xv.z, xv.w);
                }
            }
        }
        // the next tile's first weights and bias in flight while this one finishes
        const Vec<T> bias_v = bias_here;
        if (next < tiles) {
            w.start(next);
            w.load(0, half);
            bias_here = load_bias(next);
        }
        // accumulator (feature f0 + g (+8), rows n*8 + 2t, 2t+1) -> part[row][feature in tile]: the second
        // half's warps store theirs, the first half's add them to their own (a fixed order)
        const int fl = (warp % kFeatureWarps) * 16 + g;
        if (kh == 1) {
#pragma unroll
            for (int n = 0; n < kNTiles; ++n) {
                const int r = n * 8 + 2 * t;
                part[r * kPartStride + fl] = acc[n][0];
                part[(r + 1) * kPartStride + fl] = acc[n][1];
                part[r * kPartStride + fl + 8] = acc[n][2];
                part[(r + 1) * kPartStride + fl + 8] = acc[n][3];
            }
        }
        __syncthreads();
        if (kh == 0) {
#pragma unroll
            for (int n = 0; n < kNTiles; ++n) {
                const int r = n * 8 + 2 * t;
                part[r * kPartStride + fl] += acc[n][0];
                part[(r + 1) * kPartStride + fl] += acc[n][1];
                part[r * kPartStride + fl + 8] += acc[n][2];
                part[(r + 1) * kPartStride + fl + 8] += acc[n][3];
            }
        }
        tile_sync(split);
        // each CTA of the cluster finishes a share of the tile's (row, 8 features) vectors: the ranks'
        // partial sums in rank order, then bias, activation, residual, one rounding
        constexpr int kGroups = kTileFeatures / 8;
        for (int u = rank * kThreads + threadIdx.x; u < M * kGroups; u += split * kThreads) {
            const int m = u / kGroups, c = (u % kGroups) * 8;
            const int n = tile * kTileFeatures + c;
            if (n >= N) continue;  // out_features is a multiple of 8: a vector is whole or absent
            // the ranks' partial sums in rank order, kRanksInFlight ranks' loads at a time
            float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int r0 = 0; r0 < kMaxSplit; r0 += kRanksInFlight) {
                float4 lo[kRanksInFlight], hi[kRanksInFlight];
#pragma unroll
                for (int i = 0; i < kRanksInFlight; ++i) {
                    if (r0 + i < split) {
                        const float4* src =
                            reinterpret_cast<const float4*>(at_rank(part, r0 + i, split) + m * kPartStride + c);
                        lo[i] = src[0];
                        hi[i] = src[1];
                    }
                }
#pragma unroll
                for (int i = 0; i < kRanksInFlight; ++i) {
                    if (r0 + i < split) {
                        y[0] += lo[i].x; y[1] += lo[i].y; y[2] += lo[i].z; y[3] += lo[i].w;
                        y[4] += hi[i].x; y[5] += hi[i].y; y[6] += hi[i].z; y[7] += hi[i].w;
                    }
                }
            }
            if (a.bias != nullptr) {
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] += to_float(bias_v.v[e]);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) y[e] = activate(y[e], a.activation);
            const int64_t at = static_cast<int64_t>(m) * N + n;
            if (residual != nullptr) {
                const Vec<T> r = load_vec(residual + at);  // may be out itself: read before the store
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] += to_float(r.v[e]);
            }
            store_vec(out + at, vec_from_float<T>(y));
        }
        tile_sync(split);  // the partial sums are read before they are overwritten, or the CTAs exit
    }
#endif
}

struct TcPlan {
    int split, kslice, xs_stride, grid;
    size_t smem;
};

// PADFREE_DECODE_LINEAR_MAX_SPLIT=1|2|4 caps the split beyond what a slice needs (A/B runs).
int max_split() {
    static const int value = [] {
        const char* env = std::getenv("PADFREE_DECODE_LINEAR_MAX_SPLIT");
        const int v = env != nullptr ? std::atoi(env) : kMaxSplit;
        return v == 1 || v == 2 || v == 4 ? v : kMaxSplit;
    }();
    return value;
}

// The split of in_features over a cluster: at least until a slice is one register batch (so that a
// tile's weights are all requested before the wait) and fits the stage, then further while the grid
// stays within one wave of one CTA per SM. The grid: one cluster per tile, or where tiles outnumber the
// CTAs that fit (a vocabulary) CTAs looping over tiles with their normalized x staged once.
TcPlan plan_tc(int rows_pad, int K, int N, int element, int sms) {
    const int tiles = (N + kTileFeatures - 1) / kTileFeatures;
    TcPlan p{};
    p.split = 1;
    // a slice the registers' batch covers (so that all of a tile's weights are loaded before the wait),
    // within the staged bytes
    while (p.split < kMaxSplit && K % (p.split * 2 * kSliceQuantum) == 0 &&
           (K / p.split > kAhead || static_cast<int64_t>(rows_pad) * (K / p.split) * element > kMaxStageBytes))
        p.split *= 2;
    // then more CTAs while the grid stays within one wave of one CTA per SM
    while (p.split < max_split() && tiles * p.split * 2 <= sms && K % (p.split * 2 * kSliceQuantum) == 0)
        p.split *= 2;
    p.kslice = K / p.split;
    // a row stride of 64 mod 128 bytes: a quarter warp's 16-byte reads of rows g, g + 1 hit distinct banks
    p.xs_stride = p.kslice + ((p.kslice * element) % 128 == 0 ? 64 / element : 0);
    p.smem = static_cast<size_t>(rows_pad) * (kPartStride + 3) * sizeof(float) +
             (static_cast<size_t>(rows_pad) * p.xs_stride + 2 * p.kslice) * element;
    const int per_sm = std::max(1, std::min(4, static_cast<int>((200 * 1024) / p.smem)));
    const int clusters = p.split > 1 ? tiles : std::min(tiles, std::max(1, sms) * per_sm);
    p.grid = clusters * p.split;
    return p;
}

template <typename T, int kNTiles>
cudaError_t launch_tiles(const DecodeLinearArgs& a, cudaStream_t stream) {
    const TcPlan p = plan_tc(kNTiles * 8, a.in_features, a.out_features, sizeof(T),
                             current_device_value<query_sm_count>());
    if (static_cast<int64_t>(kNTiles) * 8 * p.kslice * static_cast<int64_t>(sizeof(T)) > kMaxStageBytes ||
        p.kslice % kSliceQuantum != 0)
        return cudaErrorInvalidValue;  // outside decode_linear_tc_fits: the C ABI refused it first
    auto kernel = decode_linear_tc_kernel<T, kNTiles>;
    static std::atomic<size_t> opted_in{48 * 1024};  // as decode_linear.cu's (a benign race)
    if (p.smem > opted_in.load(std::memory_order_relaxed)) {
        constexpr int kOptIn = 200 * 1024;
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptIn);
        if (err != cudaSuccess) return err;
        opted_in.store(kOptIn, std::memory_order_relaxed);
    }
    cudaLaunchAttribute attrs[2];
    unsigned count = 0;
    if (p.split > 1) {
        attrs[count].id = cudaLaunchAttributeClusterDimension;
        attrs[count].val.clusterDim.x = static_cast<unsigned>(p.split);
        attrs[count].val.clusterDim.y = 1;
        attrs[count].val.clusterDim.z = 1;
        ++count;
    }
    if (pdl_enabled()) {
        attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[count].val.programmaticStreamSerializationAllowed = 1;
        ++count;
    }
    const cudaLaunchConfig_t config{dim3(p.grid), dim3(kThreads), p.smem, stream, attrs, count};
    return cudaLaunchKernelEx(&config, kernel, a, p.split, p.kslice, p.xs_stride);
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
    if (a.rows <= 16) return launch_tiles<T, 2>(a, stream);
    if (a.rows <= 32) return launch_tiles<T, 4>(a, stream);
    return launch_tiles<T, 8>(a, stream);
}

}  // namespace

bool decode_linear_tc_runs(padfree_dtype dtype) {
    return dtype != PADFREE_FLOAT32 && current_compute_capability() >= 90;
}

cudaError_t launch_decode_linear_tc(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (!decode_linear_tc_runs(dtype)) return cudaErrorNotSupported;
    if (dtype == PADFREE_FLOAT16) return launch_typed<__half>(args, stream);
    return launch_typed<__nv_bfloat16>(args, stream);
}

}  // namespace padfree
