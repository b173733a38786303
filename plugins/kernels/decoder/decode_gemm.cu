// decode_gemm (decode_gemm.h): a decode step's linear layer for up to 256 rows on wgmma, for the steps of
// 17-256 rows (16x4, 64x1, 64x4), whose layers cuBLASLt runs as full dependencies (its kernels start
// nothing before the previous kernel ends), each pre-LN layer behind a LayerNorm kernel.
//
// A block owns 32 output features of 64 rows (a grid row per 64 rows, each reading the weights) and one
// slice of in_features (at most 512: a cluster of 1-8 blocks splits wider inputs). Shared memory holds the
// block's weights whole (32 KB) and x's 64 rows as a ring of four 64-wide chunks (32 KB): ~74 KB, three
// blocks an SM, so that the next kernel's blocks become resident while this one runs.
// - The weights are no kernel's output: thread 0 requests them by tensor copies before the block waits
//   on its producer (PDL), so they stream while the previous kernel runs; the block lets its own
//   consumers launch at once (allow_consumers), so the next layer's weights do the same.
// - After the wait, x's slice arrives chunk by chunk (one 128-byte-swizzled box of 64 rows each, rows
//   past `rows` zero-filled), each stage on its own barrier. A landed chunk is read once, into register
//   fragments (ldmatrix); its four m64n32k16 wgmmas take A from them and the weights from shared memory
//   (K-major, as stored), into four accumulator sets (consecutive wgmmas independent). A stage is
//   refilled once its chunk's products are done and every warp has read it.
// - The LayerNorm is folded (decode_gemm.h), its row statistics taken from the same fragments on
//   mma.sync: each warp its 16 rows, x times ones (the sums) and x times its own transpose (a Gram
//   block, whose diagonal holds the sums of squares), exact products added in float32. No second read
//   of x and no pass of its own; the products need no normalized copy of x.
// - The blocks of a cluster exchange their partial products and statistics by pushing them into each
//   other's shared memory (st.async, counted on the receiver's mbarrier): each block waits for the data
//   it finishes, not for a cluster barrier and then remote loads. It adds them in rank order (the result
//   does not depend on timing) and finishes 1 / split of the outputs with the epilogue (bias, the
//   LayerNorm's two terms, activation, residual).
#include "decode_gemm.h"

#include <cooperative_groups.h>
#include <cuda.h>

#include <atomic>

#include "../attention/attention_ptx.cuh"
#include "../ptx/tma_ptx.cuh"
#include "../ptx/wgmma_ptx.cuh"
#include "common.cuh"
#include "decode_linear.cuh"

namespace padfree {
namespace {

namespace cg = cooperative_groups;
using namespace attention_detail;

constexpr int kRows = kDecodeGemmTileM;
constexpr int kTileN = kDecodeGemmTileN;
constexpr int kChunk = 64;                                // in_features per box: one 128-byte swizzle row
constexpr int kMaxChunks = kDecodeGemmMaxSlice / kChunk;  // 8
constexpr int kThreads = 128;                             // one warpgroup
constexpr int kAcc = kRows * kTileN / kThreads;           // accumulators a thread: 16
constexpr int kSets = 4;                                  // independent accumulator sets (a chunk's k16 steps)
constexpr uint32_t kXChunkBytes = kRows * kChunk * 2;
constexpr uint32_t kWChunkBytes = kTileN * kChunk * 2;
constexpr int kStages = 4;                                // x chunks in flight: a ring of shared buffers
constexpr uint32_t kXBytes = kStages * kXChunkBytes;
constexpr uint32_t kWBytes = kMaxChunks * kWChunkBytes;
constexpr uint32_t kStatBytes = kRows * 8;            // the rows' (sum, sum of squares) over a slice
constexpr uint32_t kBarBytes = (2 + kStages) * 8;    // the weights' barrier, one a stage of x, the peers' pushes
static_assert(kAcc % 2 == 0 && kAcc / kDecodeGemmMaxSplit >= 2, "each block finishes whole column pairs");

// Shared memory of a kSplit cluster's block: x's ring and the weights (1024-byte aligned for the swizzle),
// the peers' partial products of this block's share ([peer slot][thread][pair], a slot per other rank),
// this block's row statistics, the barriers, and with a LayerNorm the peers' row statistics.
template <int kSplit>
struct Smem {
    static constexpr uint32_t kPairs = kAcc / 2 / kSplit;  // column pairs a thread finishes
    static constexpr uint32_t kRecvBytes = (kSplit - 1) * kThreads * kPairs * 8;
    static constexpr uint32_t kRecv = kXBytes + kWBytes, kBars = kRecv + kRecvBytes;
    static constexpr uint32_t kRecvStats = kBars + kBarBytes;
    static constexpr uint32_t bytes(bool ln) { return 1024 + kRecvStats + (ln ? (kSplit - 1) * kStatBytes : 0); }
};

#if defined(PADFREE_WGMMA_DEVICE)  // the kernel's code (sm_90a); other targets compile its body out
// st.async: a store into a peer block's shared memory (a cluster address, mapa) that counts its bytes on
// the peer's mbarrier, so the peer waits for the data itself instead of the cluster for a barrier.
__device__ __forceinline__ uint32_t peer_address(uint32_t local, int rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
}
__device__ __forceinline__ void push_v4(uint32_t remote, float a, float b, float c, float d, uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
                 ::"r"(remote), "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ void push_v2(uint32_t remote, float a, float b, uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
                 ::"r"(remote), "f"(a), "f"(b), "r"(remote_bar) : "memory");
}
#endif

struct Params {
    const void* bias;
    const void* residual;
    const float* ln_colsum;
    void* out;
    int32_t rows;
    int32_t in_features;
    int32_t out_features;
    int32_t chunks;  // 64-wide chunks in a block's slice
    float eps;
    DecodeActivation activation;
};

// Two adjacent 16-bit values as floats and back (MmaOp<T>::unpack / pack: one 32-bit word, rounded to nearest).
template <typename T>
__device__ __forceinline__ float2 load_pair(const void* base, int64_t index) {
    return MmaOp<T>::unpack(*reinterpret_cast<const uint32_t*>(static_cast<const T*>(base) + index));
}

// Accumulator value i of thread (warp, lane) in wgmma's m64nN layout: row warp * 16 + lane / 4 (+ 8 for
// i % 4 >= 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
__device__ __forceinline__ int value_row(int i, int warp, int lane) { return warp * 16 + lane / 4 + (i % 4 >= 2 ? 8 : 0); }
__device__ __forceinline__ int value_col(int i, int lane) { return 8 * (i / 4) + 2 * (lane % 4); }

// kSplit: the blocks of a cluster (in_features split over them; 1: no cluster). kWhole: slices of
// kMaxChunks chunks, the loop unrolled. kTiled: more than 64 rows, a grid row per 64. An instantiation
// of its own, so that the one-tile kernel compiles as it did: with the tile offset in the one kernel
// (a register or two more a thread) NLLB's 64-row steps took 5.5 % longer (H200; docs/KERNELS.md).
template <typename T, int kSplit, bool kWhole, bool kTiled>
__global__ void __launch_bounds__(kThreads, kDecodeGemmBlocksPerSm)
    decode_gemm_kernel(const Params p, const __grid_constant__ CUtensorMap x_map,
                       const __grid_constant__ CUtensorMap w_map) {
#if defined(PADFREE_WGMMA_DEVICE)
    using S = Smem<kSplit>;
    constexpr int kPairs = S::kPairs;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t sx = (raw + 1023u) & ~1023u;  // the 128-byte swizzle's 1024-byte atoms
    unsigned char* base = smem_raw + (sx - raw);
    const uint32_t sw = sx + kXBytes;
    const float2* recv = reinterpret_cast<const float2*>(base + S::kRecv);
    const float2* recv_stats = reinterpret_cast<const float2*>(base + S::kRecvStats);
    const uint32_t w_bar = sx + S::kBars;
    const uint32_t recv_bar = w_bar + 8u * (1 + kStages);

    const int rank = kSplit == 1 ? 0 : static_cast<int>(cg::this_cluster().block_rank());
    const int n0 = static_cast<int>(blockIdx.x) / kSplit * kTileN;
    const int m0 = kTiled ? static_cast<int>(blockIdx.y) * kRows : 0;  // this block's rows: [m0, m0 + 64)
    const int k0 = rank * p.chunks * kChunk;
    const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
    const bool ln = p.ln_colsum != nullptr;

    if (tid == 0) {
        for (int b = 0; b <= kStages + 1; ++b) mbarrier_init(w_bar + 8u * b, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    // The peers push into this block's shared memory once its barriers exist: the cluster barrier's
    // arrival here, its wait before this block's own first push.
    if constexpr (kSplit > 1) asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    if (tid == 0) {
        if constexpr (kSplit > 1)  // what the other ranks push: their partials of this share, their row sums
            mbarrier_expect_bytes(recv_bar, (kSplit - 1) * (kThreads * kPairs * 8 + (ln ? kStatBytes : 0)));
        mbarrier_expect_bytes(w_bar, p.chunks * kWChunkBytes);
        for (int j = 0; j < p.chunks; ++j) tma_load_2d(sw + j * kWChunkBytes, &w_map, k0 + j * kChunk, n0, w_bar);
    }
    // This block's share of the epilogue: values [v0, v0 + 2 kPairs) of every thread, as column pairs
    // (value i, i + 1: columns c, c + 1 of one row); their column parameters are weights too, loaded
    // before the wait.
    const int v0 = rank * 2 * kPairs;
    float2 colsum[kPairs], bias[kPairs];
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
        const int col = n0 + value_col(v0 + 2 * u, lane);
        colsum[u] = ln ? *reinterpret_cast<const float2*>(p.ln_colsum + col) : make_float2(0.f, 0.f);
        bias[u] = p.bias != nullptr ? load_pair<T>(p.bias, col) : make_float2(0.f, 0.f);
    }
    // chunk j of this block's slice of x into its stage of the ring (thread 0)
    auto load_x = [&](int j) {
        const uint32_t bar = w_bar + 8u * (1 + j % kStages);
        mbarrier_expect_bytes(bar, kXChunkBytes);
        tma_load_2d(sx + (j % kStages) * kXChunkBytes, &x_map, k0 + j * kChunk, m0, bar);
    };
    allow_consumers();
    wait_on_producer();

    if (tid == 0) {
        for (int j = 0; j < min(p.chunks, kStages); ++j) load_x(j);
    }
    // the residual (a producer's output) in flight while the products run
    float2 residual[kPairs];
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
        residual[u] = make_float2(0.f, 0.f);
        const int i = v0 + 2 * u, row = m0 + value_row(i, warp, lane);
        if (p.residual != nullptr && row < p.rows)
            residual[u] = load_pair<T>(p.residual, static_cast<int64_t>(row) * p.out_features + n0 + value_col(i, lane));
    }

    // one accumulator set per k16 step of a chunk: consecutive wgmmas are independent, so the tensor
    // cores overlap them instead of waiting out each one's latency (n32 tiles are short)
    float acc[kSets][kAcc];
#pragma unroll
    for (int s = 0; s < kSets; ++s)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[s][i] = 0.f;
    const uint64_t b_desc = swizzled_descriptor<128>(sw, 0);
    // x's chunks reach the tensor cores as register fragments, read from shared memory once for two uses:
    // the products and the row statistics. Why (H200, NLLB's 64-row steps, per-block timestamps): summing
    // the chunks on the CUDA cores from a second read of shared memory held each pre-LN projection's
    // chunk loop 1.1-1.8 us longer than without statistics; statistics on the tensor cores from a second
    // read (mma.sync after ldmatrix, or wgmmas with x as both operands) were no faster, and one read with
    // one fragment set (each chunk's products waited for before the next) gained ~1 %; one read with two
    // fragment sets made the steps 3-4.5 % faster (docs/KERNELS.md).
    // Lane l's ldmatrix row: 16 warp + l % 8 (+ 8 for matrices 1 and 3); its 16-byte unit, swizzled.
    float sums[4] = {0.f, 0.f, 0.f, 0.f}, gram_lo[4] = {0.f, 0.f, 0.f, 0.f}, gram_hi[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t frag_base = sx + (16 * warp + lane % 8 + (lane / 8 % 2) * 8) * 128;
    using Fragments = uint32_t[kChunk / 16][4];  // a chunk's, untouched until its wgmmas complete
    // chunk j: its fragments, its products (committed as one group) and its rows' statistics
    auto issue = [&](int j, Fragments& a) {
        const uint32_t stage = (j % kStages) * kXChunkBytes;
        mbarrier_wait(w_bar + 8u * (1 + j % kStages), (j / kStages) & 1);
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk)
            ldmatrix_x4_addr(a[kk], frag_base + stage + (((2 * kk + lane / 16) ^ (lane % 8)) * 16));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk)
            wgmma_m64n32k16<T, 0>(acc[kk % kSets], a[kk], descriptor_at(b_desc, j * kWChunkBytes + kk * 32), 1);
        wgmma_commit();
        if (ln) {
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk) {
                MmaOp<T>::run(sums, a[kk], MmaOp<T>::kOnePair, MmaOp<T>::kOnePair);
                MmaOp<T>::run(gram_lo, a[kk], a[kk][0], a[kk][2]);
                MmaOp<T>::run(gram_hi, a[kk], a[kk][1], a[kk][3]);
            }
        }
    };
    // chunk j's products are done: its fragments are free, and once every thread has read its stage, the
    // stage takes chunk j + kStages
    auto release = [&](int j, Fragments& a) {
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk) keep_registers(a[kk]);
        if (j + kStages < p.chunks) {
            __syncthreads();
            if (tid == 0) load_x(j + kStages);
        }
    };
    mbarrier_wait(w_bar, 0);
    if constexpr (kWhole) {
        // a whole slice (every projection of Marian and NLLB), unrolled: two fragment sets, so that chunk
        // j + 1 loads while chunk j's products run (register arrays need constant indices, and ptxas
        // serializes the wgmmas of a loop with a data-dependent exit or of a kernel with both loops)
        Fragments even, odd;
#pragma unroll
        for (int j = 0; j < kMaxChunks; ++j) {
            issue(j, j % 2 ? odd : even);
            if (j >= 1) {
                wgmma_wait<1>();
                release(j - 1, j % 2 ? even : odd);
            }
        }
        wgmma_wait<0>();
        release(kMaxChunks - 1, (kMaxChunks - 1) % 2 ? odd : even);
    } else {
        Fragments a;
        for (int j = 0; j < p.chunks; ++j) {
            issue(j, a);
            wgmma_wait<0>();
            release(j, a);
        }
    }
#pragma unroll
    for (int s = 0; s < kSets; ++s) keep_registers(acc[s]);

#pragma unroll
    for (int s = 1; s < kSets; ++s)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[0][i] += acc[s][i];

    // The cluster's exchange: each block pushes every other rank its partial products of that rank's
    // share (its column pairs [q kPairs, (q + 1) kPairs) of every thread) and its rows' statistics
    // (st.async, counted on the receiver's barrier), then waits for what the others push it: no cluster
    // barrier between the products and the epilogue, and no remote loads after one. The receiver keeps a
    // slot per other rank and adds them in rank order, so the result does not depend on timing.
    if constexpr (kSplit > 1) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    auto slot_of = [](int source, int receiver) { return source < receiver ? source : source - 1; };
    if constexpr (kSplit > 1) {
#pragma unroll
        for (int q = 0; q < kSplit; ++q) {
            if (q == rank) continue;
            const uint32_t dst = peer_address(
                sx + S::kRecv + ((slot_of(rank, q) * kThreads + tid) * kPairs) * 8u, q);
            const uint32_t bar = peer_address(recv_bar, q);
#pragma unroll
            for (int u = 0; u < kPairs; u += 2) {
                const int i = 2 * (q * kPairs + u);
                if constexpr (kPairs % 2 == 0)
                    push_v4(dst + 8u * u, acc[0][i], acc[0][i + 1], acc[0][i + 2], acc[0][i + 3], bar);
                else
                    push_v2(dst + 8u * u, acc[0][i], acc[0][i + 1], bar);
            }
        }
    }
    // (sum, sum of squares) of this thread's two rows (value_row: +0, +8, that is 16 warp + lane / 4 and 8
    // more): the sums are in every column of the ones product; row g's square sum is the Gram block's
    // (g, g), which lane 4 g + g / 2 holds as its value g % 2 (of the upper pair for rows 8-15)
    float2 own[2] = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
    if (ln) {
        const int g = lane / 4, holder = 4 * g + g / 2;
        own[0] = make_float2(sums[0], __shfl_sync(0xffffffffu, g % 2 ? gram_lo[1] : gram_lo[0], holder));
        own[1] = make_float2(sums[2], __shfl_sync(0xffffffffu, g % 2 ? gram_hi[3] : gram_hi[2], holder));
        if (lane % 4 == 0) {
#pragma unroll
            for (int r = 0; r < kSplit; ++r) {
                if (r == rank) continue;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = value_row(2 * h, warp, lane);
                    push_v2(peer_address(sx + S::kRecvStats + (slot_of(rank, r) * kRows + row) * 8u, r), own[h].x,
                            own[h].y, peer_address(recv_bar, r));
                }
            }
        }
    }
    float2 y[kPairs][kSplit];
    float2 st[2][kSplit];  // the statistics of this thread's two rows, from each rank
    if constexpr (kSplit > 1) mbarrier_wait(recv_bar, 0);
#pragma unroll
    for (int q = 0; q < kSplit; ++q) {
        const int slot = slot_of(q, rank);
#pragma unroll
        for (int u = 0; u < kPairs; ++u) {
            const int i = 2 * (q * kPairs + u);  // = v0 + 2 u where q is this rank: a constant index
            y[u][q] = q == rank ? make_float2(acc[0][i], acc[0][i + 1]) : recv[(slot * kThreads + tid) * kPairs + u];
        }
        if (ln) {
            st[0][q] = q == rank ? own[0] : recv_stats[slot * kRows + value_row(0, warp, lane)];
            st[1][q] = q == rank ? own[1] : recv_stats[slot * kRows + value_row(2, warp, lane)];
        }
    }

    T* out = static_cast<T*>(p.out);
    const float inv_k = 1.f / static_cast<float>(p.in_features);
    float mean[2] = {0.f, 0.f}, rstd[2] = {1.f, 1.f};
    if (ln) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float2 t = st[h][0];
#pragma unroll
            for (int q = 1; q < kSplit; ++q) t = make_float2(t.x + st[h][q].x, t.y + st[h][q].y);
            mean[h] = t.x * inv_k;
            rstd[h] = rsqrtf(fmaxf(t.y * inv_k - mean[h] * mean[h], 0.f) + p.eps);
        }
    }
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
        const int i = v0 + 2 * u, row = m0 + value_row(i, warp, lane), h = i % 4 >= 2;
        float2 v = y[u][0];
#pragma unroll
        for (int q = 1; q < kSplit; ++q) v = make_float2(v.x + y[u][q].x, v.y + y[u][q].y);  // rank order
        if (ln) {  // selects, not an index: h is a runtime value where kPairs is odd
            const float m = h ? mean[1] : mean[0], r = h ? rstd[1] : rstd[0];
            v.x = r * (v.x - m * colsum[u].x);
            v.y = r * (v.y - m * colsum[u].y);
        }
        v.x = decode_linear_detail::activate(v.x + bias[u].x, p.activation) + residual[u].x;
        v.y = decode_linear_detail::activate(v.y + bias[u].y, p.activation) + residual[u].y;
        if (row < p.rows)
            *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * p.out_features + n0 + value_col(i, lane)) =
                MmaOp<T>::pack(v.x, v.y);
    }
    // No barrier before exit: the peers only write into this block's shared memory, and it has waited for
    // every byte of that.
#endif
}

template <typename T, int kSplit, bool kWhole, bool kTiled>
cudaError_t launch_split(const DecodeGemmArgs& a, padfree_dtype dtype, cudaStream_t stream) {
    CUtensorMap x_map{}, w_map{};
    // x and the weight as 64-column boxes with the 128-byte swizzle wgmma reads (x's rows past `rows` zeros)
    if (!tensor_map_2d(&x_map, a.x, a.rows, a.in_features, kChunk, kRows, CU_TENSOR_MAP_SWIZZLE_128B, dtype) ||
        !tensor_map_2d(&w_map, a.weight, a.out_features, a.in_features, kChunk, kTileN, CU_TENSOR_MAP_SWIZZLE_128B,
                       dtype))
        return cudaErrorNotSupported;
    auto kernel = decode_gemm_kernel<T, kSplit, kWhole, kTiled>;
    const uint32_t smem = Smem<kSplit>::bytes(a.ln_colsum != nullptr);
    static std::atomic<size_t> opted_in{48 * 1024};
    if (const cudaError_t err = decode_linear_detail::opt_in_shared_memory(kernel, smem, opted_in); err != cudaSuccess)
        return err;
    const Params p{a.bias, a.residual, a.ln_colsum, a.out, a.rows, a.in_features, a.out_features,
                   a.in_features / kSplit / kChunk, a.eps, a.activation};
    const dim3 grid(static_cast<unsigned>(a.out_features / kTileN * kSplit),
                    static_cast<unsigned>(ceil_div(a.rows, kRows)));  // y: the 64-row tiles
    return launch_kernel_clustered(kernel, grid, dim3(kThreads), static_cast<unsigned>(kSplit), smem, stream,
                                   p, x_map, w_map);
}

// whole: slices of kMaxChunks chunks (the unrolled loop)
template <typename T, int kSplit>
cudaError_t launch_slices(const DecodeGemmArgs& a, bool whole, padfree_dtype dtype, cudaStream_t stream) {
    if (a.rows > kRows)
        return whole ? launch_split<T, kSplit, true, true>(a, dtype, stream)
                     : launch_split<T, kSplit, false, true>(a, dtype, stream);
    return whole ? launch_split<T, kSplit, true, false>(a, dtype, stream)
                 : launch_split<T, kSplit, false, false>(a, dtype, stream);
}

template <typename T>
cudaError_t launch_typed(const DecodeGemmArgs& a, int32_t split, padfree_dtype dtype, cudaStream_t stream) {
    const bool whole = a.in_features / split == kDecodeGemmMaxSlice;
    switch (split) {
        case 1: return launch_slices<T, 1>(a, whole, dtype, stream);
        case 2: return launch_slices<T, 2>(a, whole, dtype, stream);
        case 4: return launch_slices<T, 4>(a, whole, dtype, stream);
        default: return launch_slices<T, 8>(a, whole, dtype, stream);
    }
}

}  // namespace

bool decode_gemm_supported() { return wgmma_available(); }

cudaError_t launch_decode_gemm(const DecodeGemmArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0 || args.out_features == 0) return cudaSuccess;
    const int32_t split = decode_gemm_split(args.in_features);
    if (args.rows < 0 || args.rows > kDecodeGemmMaxRows || split == 0 || args.out_features % kTileN != 0 ||
        !decode_gemm_supported())
        return cudaErrorInvalidValue;
    switch (dtype) {
        case PADFREE_FLOAT16: return launch_typed<__half>(args, split, dtype, stream);
        case PADFREE_BFLOAT16: return launch_typed<__nv_bfloat16>(args, split, dtype, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace padfree
