// A decode step's linear layers for up to 16 rows in float16 / bfloat16 on tensor cores, with the weight
// laid out once, at load time, in the order an mma.sync's A fragments are read (decode_linear's fusions:
// the input's LayerNorm, bias, activation, residual; the weights requested before the PDL wait).
//
// Why a second layout: at 1-8 rows a step's linear layer is a weight stream with a little arithmetic per
// byte, and what bounds it (KERNELS.md) is the instructions around the stream and the round trips after
// the wait. In nn.Linear's layout a lane's m16n8k16 A fragment is four 4-byte pieces from two weight
// rows: either CUDA cores (a conversion and `rows` FMAs per element; decode_linear.cu at 1-4 rows) or
// copies and permutes around each mma. In fragment order ([out / 16][in / 16][32 lanes][8 elements]:
// each lane's fragment contiguous) one 16-byte load and one mma cover 256 weights for any row count up
// to 8 (mma's N; rows past `rows` are zeros), two mma's up to 16. H200, the 72 projections of an
// NLLB-600M-size step as one CUDA graph (bench/decode_linear_phases.py's chain, this kernel's
// prototype), us: 1 row 243 -> 234, 2 rows 271 -> 247, 4 rows 313 -> 274 against decode_linear.cu;
// steps in KERNELS.md.
//
// A block: 8 warps on 16 output features, each warp an eighth of in_features (in_features / 128 mma
// steps); its first kPre fragments are loaded before the wait, the rest as those are consumed. After the
// wait the rows are staged in shared memory (padded rows: the B-fragment loads of 8 rows fall on
// distinct banks), a LayerNorm'd input normalized on its way there from registers, the warps multiply,
// and their partial sums meet in shared memory in warp order (no timing in the sum) for the epilogue,
// one output per thread. Rows 9-16 take
// a second row tile: each fragment meets rows g and g + 8 of the lane.
//
// 17-64 rows (sm_90): a cluster of 2 or 4 blocks shares the rows. Staged whole by every block of 16
// features, 64 rows are 4x a 1024-wide layer's weights in L2 reads, and the measured kernel took 3x
// cuBLAS's time (H200, NLLB's QKV at 64 rows 31.4 us against 9.8, KERNELS.md). Here each block of the
// cluster stages 16 of the rows, LayerNorms them, and writes them into its peers' shared memory
// (distributed shared memory: the rows cross L2 once per cluster, and each row is normalized once per
// cluster rather than by every block), then computes 32 features (two fragment rows a warp, each x
// fragment meeting both) over all the rows.
#include "decode_linear.h"
#include "decode_linear.cuh"

#include "../attention/attention_ptx.cuh"
#include "common.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

namespace padfree {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kFeatures = 16;  // output features per block: an mma's M
constexpr int kStep = 16;      // in_features per mma
constexpr int kPre = 16;       // fragments (16 bytes each) a lane holds in flight
constexpr int kPad = 8;        // elements past each staged row
// up to 16 rows every width built fits what an sm_80 block may opt into (16 rows of 4096 with a
// LayerNorm); past 16 rows, where the device has room (decode_linear_fragments_fits)
static_assert(decode_linear_fragments_shared_bytes(16, 4096, true) <= 163 * 1024);

// W [N, K] -> [N / 16][K / 16][32][8]: lane (g, t) = (lane / 4, lane % 4) of an m16n8k16's A fragment
// holds features g, g + 8 of the tile at k = 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9 (2, 3).
__global__ void fragment_layout_kernel(const uint16_t* w, uint16_t* out, int N, int K) {
    wait_on_producer();  // the weight may be the previous kernel's output (a cast)
    const int64_t total = static_cast<int64_t>(N) * K;
    const int steps = K / kStep;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int j = static_cast<int>(i % 8), lane = static_cast<int>(i / 8 % 32);
        const int64_t fragment = i / 256;  // tile * steps + step
        const int step = static_cast<int>(fragment % steps);
        const int64_t tile = fragment / steps;
        const int g = lane / 4, t = lane % 4, reg = j / 2;
        const int f = g + (reg % 2) * 8, k = 2 * t + (reg / 2) * 8 + j % 2;
        out[i] = w[(tile * kFeatures + f) * K + step * kStep + k];
    }
}

// Lane (g, t)'s B fragment (x^T) of row tile `tile` at mma step s, from the staged rows: row 8 tile + g at
// k = 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1), xrow being the lane's row g at 2t of its warp's first
// step; zeros for a row past the launch's (`in` false).
template <typename T>
__device__ __forceinline__ void x_fragment(const T* xrow, int ld, int tile, int s, bool in, uint32_t& b0,
                                           uint32_t& b1) {
    b0 = in ? *reinterpret_cast<const uint32_t*>(xrow + 8 * tile * ld + s * kStep) : 0u;
    b1 = in ? *reinterpret_cast<const uint32_t*>(xrow + 8 * tile * ld + s * kStep + 8) : 0u;
}

// kSteps: a warp's mma steps (in_features / 128), a compile-time count so that the loop below unrolls
// whole: with a runtime count the compiler loaded each refill into a spare register and moved it into
// its slot after the step's mma, and that move waited for the load, one DRAM round trip per step (NLLB's
// fc2, 32 steps: 11 us against decode_linear's 4.6, H200).
// kRowTiles: 1 (up to 8 rows) or 2 (9-16 rows). kW: the block's warps, 8, or 4 for launches of up to 4 rows
// (four_warp_blocks: half the registers a block, so that two blocks an SM leave room for the next call's).
template <typename T, int kSteps, int kRowTiles, int kW = kWarps>
__global__ void __launch_bounds__(kW * kWarpSize, 16 / kW) decode_linear_fragments_kernel(DecodeLinearArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    static_assert(kW == kWarps || (kW == 4 && kRowTiles == 1), "4-warp blocks take up to 4 rows");
    constexpr int kThreads = kW * kWarpSize;
    constexpr int kWarps = kW;
    // rows a warp normalizes: the 4-warp launch takes at most 4 rows (launch_decode_linear_fragments)
    constexpr int kRowsPerWarp = kW == 8 ? kRowTiles : 1;
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int V = vec_size<T>();
    constexpr int steps = kSteps;
    const int K = a.in_features, M = a.rows, ld = K + kPad, kvecs = K / V;
    T* xs = reinterpret_cast<T*>(smem);                                                 // [M][ld]
    float* part = reinterpret_cast<float*>(smem + static_cast<size_t>(M) * ld * sizeof(T));  // [kWarps][32][tiles][4]
    T* ln_params = reinterpret_cast<T*>(part + kWarps * kWarpSize * 4 * kRowTiles);     // gamma, beta [K] each
    const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
    const int g = lane / 4, t = lane % 4, tile = blockIdx.x;
    const int64_t fragment0 = static_cast<int64_t>(tile) * (K / kStep) + static_cast<int64_t>(warp) * steps;
    const uint4* wp = static_cast<const uint4*>(a.weight) + fragment0 * kWarpSize + lane;  // this warp's first

    // the weights and the LayerNorm's parameters are not the producer's output: requested before the wait
    uint4 ring[kPre];
#pragma unroll
    for (int u = 0; u < kPre; ++u)
        if (u < steps) ring[u] = __ldcs(wp + u * kWarpSize);  // read once a step: evict-first
    if (a.ln_gamma != nullptr)
        for (int v = tid; v < kvecs; v += kThreads) {
            store_vec(ln_params + v * V, load_vec(static_cast<const T*>(a.ln_gamma) + v * V));
            store_vec(ln_params + K + v * V, load_vec(static_cast<const T*>(a.ln_beta) + v * V));
        }
    // this thread's output (feature f of the tile, row m) and what its epilogue adds, requested now so
    // that neither is a round trip after the products: the bias (a parameter: before the wait) and the
    // residual (after it), kept unconverted until the epilogue so that nothing waits for them here
    const bool outputs = tid < kFeatures * M;
    const int f_out = tid / M, m_out = tid % M, n_out = tile * kFeatures + f_out;
    const int64_t at = static_cast<int64_t>(m_out) * a.out_features + n_out;
    T bias = from_float<T>(0.f), residual = from_float<T>(0.f);
    if (outputs && a.bias != nullptr) bias = static_cast<const T*>(a.bias)[n_out];
    // The next kernel may launch as soon as every block of this grid is resident, before this one's own
    // wait: its blocks prefetch their weights while this kernel's producer still runs (H200, NLLB 1x4
    // 0.52 -> 0.50 ms/step, Marian 1x4 0.19 -> 0.175). Safe because no decode-step kernel reads anything
    // but parameters before its wait, and its wait (griddepcontrol.wait) returns only once this grid
    // has completed, which is after this grid's own producer has.
    allow_consumers();
    wait_on_producer();

    const T* x = static_cast<const T*>(a.x);
    // A LayerNorm'd input is normalized on its way into shared memory where a warp's rows fit in registers
    // beside the weight ring (16-byte vectors a lane together: at most 20 in float16, 14 in bfloat16, whose
    // conversions take more registers; ptxas spills past that); otherwise, and without a LayerNorm, the
    // rows are staged by cp.async first.
    constexpr int kLnVecs = steps * kStep * kWarps / (kWarpSize * 8);  // a row's 16-byte vectors a lane
    constexpr int kLnBudget = std::is_same_v<T, __half> ? 20 : 14;
    constexpr bool kLnInRegisters = (steps * kStep * kWarps) % (kWarpSize * 8) == 0 &&
                                    (steps < kPre ? steps : kPre) + kLnVecs * kRowsPerWarp <= kLnBudget &&
                                    vec_size<T>() == 8;
    if (kLnInRegisters && a.ln_gamma != nullptr) {
        __syncthreads();  // gamma and beta, staged by every thread, are read by each row's warp
        if (outputs && a.residual != nullptr) residual = static_cast<const T*>(a.residual)[at];
        // block 0 also writes the normalized rows out for a post-LN residual
        decode_linear_detail::layernorm_rows_into<T, kLnVecs, kRowsPerWarp>(
            x, xs, ld, M, ln_params, ln_params + K, a.eps, tile == 0 ? static_cast<T*>(a.x_norm_out) : nullptr,
            warp, kWarps, lane);
        __syncthreads();
    } else {
        // the rows, all in flight at once, then the residual
        for (int i = tid; i < M * kvecs; i += kThreads) {
            const int r = i / kvecs, v = i % kvecs;
            attention_detail::cp_async_16_full(attention_detail::smem_addr(xs + r * ld + v * V),
                                               x + static_cast<int64_t>(i) * V);
        }
        attention_detail::cp_async_commit();
        if (outputs && a.residual != nullptr) residual = static_cast<const T*>(a.residual)[at];
        attention_detail::cp_async_wait<0>();
        __syncthreads();
        if (a.ln_gamma != nullptr) {
            decode_linear_detail::layernorm_staged_rows(xs, ld, M, K, ln_params, ln_params + K, a.eps,
                                                        tile == 0 ? static_cast<T*>(a.x_norm_out) : nullptr,
                                                        warp, kWarps, lane);
            __syncthreads();
        }
    }

    // B = x^T: lane (g, t) reads rows g (and g + 8) at k = 2t, 2t + 1 and 2t + 8, 2t + 9 of each step.
    // Two accumulators per row tile alternate, so that consecutive mma's do not wait on each other.
    float c[kRowTiles][2][4] = {};
    const T* xrow = xs + g * ld + warp * steps * kStep + 2 * t;
#pragma unroll
    for (int s = 0; s < steps; ++s) {
        const uint4 w = ring[s % kPre];
        if (s + kPre < steps) ring[s % kPre] = __ldcs(wp + (s + kPre) * kWarpSize);
        const uint32_t frag[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < kRowTiles; ++j) {
            uint32_t b0, b1;
            x_fragment(xrow, ld, j, s, g + 8 * j < M, b0, b1);
            attention_detail::MmaOp<T>::run(c[j][s % 2], frag, b0, b1);
        }
    }
    // c[j][.][0], [1]: feature g, rows 8j + 2t and + 1; [2], [3]: feature g + 8
#pragma unroll
    for (int j = 0; j < kRowTiles; ++j)
        *reinterpret_cast<float4*>(part + ((warp * kWarpSize + lane) * kRowTiles + j) * 4) =
            make_float4(c[j][0][0] + c[j][1][0], c[j][0][1] + c[j][1][1], c[j][0][2] + c[j][1][2],
                        c[j][0][3] + c[j][1][3]);
    __syncthreads();
    if (outputs) {
        const int mm = m_out % 8;
        const int src = (((f_out % 8) * 4 + mm / 2) * kRowTiles + m_out / 8) * 4 + (f_out >= 8 ? 2 : 0) + mm % 2;
        float y = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) y += part[w * kWarpSize * 4 * kRowTiles + src];
        y = decode_linear_detail::activate(y + to_float(bias), a.activation);
        if (a.residual != nullptr) y += to_float(residual);
        static_cast<T*>(a.out)[at] = from_float<T>(y);
    }
#endif
}

// kCluster (2 or 4): the blocks that share the rows, 16 each (17-32 and 33-64 rows). A block computes
// 32 features; the grid is padded to whole clusters, and a block past the features still stages its
// rows for its peers.
template <typename T, int kSteps, int kCluster>
__global__ void __launch_bounds__(kThreads, 1) decode_linear_fragments_cluster_kernel(DecodeLinearArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int V = vec_size<T>();
    constexpr int steps = kSteps;
    constexpr int kTiles = 2;                      // fragment rows (16 features each) a warp multiplies
    constexpr int kRowTiles = 2 * kCluster;        // row tiles of 8
    constexpr int kFrags = kTiles * steps;         // a lane's fragments, tile-fastest
    constexpr int kRing = kFrags < kPre ? kFrags : kPre;
    constexpr int kOutputs = kTiles * kFeatures * kRowTiles * 8 / kThreads;  // a thread's, at most
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    const int K = a.in_features, M = a.rows, N = a.out_features, ld = K + kPad, kvecs = K / V;
    const int r0 = rank * 16, own = max(0, min(16, M - r0));  // this block's rows
    T* xs = reinterpret_cast<T*>(smem);                        // [16 * kCluster][ld]
    float* part = reinterpret_cast<float*>(smem);              // after the products, in place of xs
    T* ln_params = reinterpret_cast<T*>(smem + decode_linear_fragments_cluster_rows_bytes(kCluster, K));
    const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const int tile0 = blockIdx.x * kTiles, tiles = max(0, min(kTiles, N / kFeatures - tile0));
    const int64_t tile_frags = K / kStep;  // fragments per fragment row
    const uint4* wp = static_cast<const uint4*>(a.weight) +
                      (static_cast<int64_t>(tile0) * tile_frags + static_cast<int64_t>(warp) * steps) * kWarpSize +
                      lane;
    auto weight_at = [&](int u) {  // fragment u: tile u % kTiles, step u / kTiles (zeros past the features)
        const int j = u % kTiles;
        return j < tiles ? __ldcs(wp + (j * tile_frags + u / kTiles) * kWarpSize) : make_uint4(0u, 0u, 0u, 0u);
    };

    // a block writes into its peers' shared memory only once they run: this arrival, and the wait
    // before the first remote store, overlap with everything between
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    // before the wait: the weights, the LayerNorm's parameters and the bias
    uint4 ring[kRing];
#pragma unroll
    for (int u = 0; u < kRing; ++u) ring[u] = weight_at(u);
    if (a.ln_gamma != nullptr)
        for (int v = tid; v < kvecs; v += kThreads) {
            store_vec(ln_params + v * V, load_vec(static_cast<const T*>(a.ln_gamma) + v * V));
            store_vec(ln_params + K + v * V, load_vec(static_cast<const T*>(a.ln_beta) + v * V));
        }
    // this thread's outputs: feature f_out of the block, rows 8i + m_lo (a warp: 4 features x 8 rows)
    const int f_out = tid / 8 % (kTiles * kFeatures), m_lo = tid % 8;
    const int n_out = tile0 * kFeatures + f_out;
    const bool feature_in = f_out < tiles * kFeatures;
    T bias = from_float<T>(0.f);
    if (feature_in && a.bias != nullptr) bias = static_cast<const T*>(a.bias)[n_out];
    wait_on_producer();

    // this block's rows, then their residual elements, then (LayerNorm) the rows normalized in place;
    // the first cluster writes them out for a post-LN residual
    const T* x = static_cast<const T*>(a.x) + static_cast<int64_t>(r0) * K;
    for (int i = tid; i < own * kvecs; i += kThreads) {
        const int r = i / kvecs, v = i % kvecs;
        attention_detail::cp_async_16_full(attention_detail::smem_addr(xs + (r0 + r) * ld + v * V),
                                           x + static_cast<int64_t>(i) * V);
    }
    attention_detail::cp_async_commit();
    T residual[kOutputs];
#pragma unroll
    for (int i = 0; i < kOutputs; ++i) {
        const int m = 8 * i + m_lo;
        residual[i] = feature_in && m < M && a.residual != nullptr
                          ? static_cast<const T*>(a.residual)[static_cast<int64_t>(m) * N + n_out]
                          : from_float<T>(0.f);
    }
    attention_detail::cp_async_wait<0>();
    __syncthreads();
    if (a.ln_gamma != nullptr) {
        T* side = blockIdx.x < kCluster && a.x_norm_out != nullptr
                      ? static_cast<T*>(a.x_norm_out) + static_cast<int64_t>(r0) * K : nullptr;
        decode_linear_detail::layernorm_staged_rows(xs + r0 * ld, ld, own, K, ln_params, ln_params + K, a.eps, side,
                                                    warp, kWarps, lane);
        __syncthreads();
    }
    // into the peers' shared memory, each vector read once and written to every peer; the cluster
    // barrier (release / acquire) makes every block's rows visible to all
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    for (int i = tid; i < own * kvecs; i += kThreads) {
        const int r = i / kvecs, v = i % kvecs;
        const int at = (r0 + r) * ld + v * V;
        const Vec<T> xv = load_vec(xs + at);
#pragma unroll
        for (int q = 1; q < kCluster; ++q) store_vec(cluster.map_shared_rank(xs, (rank + q) % kCluster) + at, xv);
    }
    cluster.sync();
    allow_consumers();

    // B = x^T as in the kernel above; each x fragment meets both fragment rows
    float c[kTiles][kRowTiles][4] = {};
    const T* xrow = xs + g * ld + warp * steps * kStep + 2 * t;
#pragma unroll
    for (int s = 0; s < steps; ++s) {
        uint32_t frag[kTiles][4];
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
            const int u = s * kTiles + j;
            const uint4 w = ring[u % kRing];
            if (u + kRing < kFrags) ring[u % kRing] = weight_at(u + kRing);
            frag[j][0] = w.x, frag[j][1] = w.y, frag[j][2] = w.z, frag[j][3] = w.w;
        }
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt) {
            uint32_t b0, b1;
            x_fragment(xrow, ld, rt, s, g + 8 * rt < M, b0, b1);
#pragma unroll
            for (int j = 0; j < kTiles; ++j) attention_detail::MmaOp<T>::run(c[j][rt], frag[j], b0, b1);
        }
    }
    // the partial sums over the rows' space (every warp is past its reads of it): [warp][lane][tile][row
    // tile][4], a lane's run padded by 4 floats so that the epilogue's reads spread over the banks
    constexpr int kLaneFloats = kTiles * kRowTiles * 4 + 4;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt)
            *reinterpret_cast<float4*>(part + (warp * kWarpSize + lane) * kLaneFloats + (j * kRowTiles + rt) * 4) =
                make_float4(c[j][rt][0], c[j][rt][1], c[j][rt][2], c[j][rt][3]);
    __syncthreads();
    if (feature_in) {
        const int j = f_out / kFeatures, f = f_out % kFeatures;
#pragma unroll
        for (int i = 0; i < kOutputs; ++i) {
            const int m = 8 * i + m_lo;
            if (m >= M) break;
            // c[.][i][0], [1]: feature g, rows 2t and + 1 of row tile i; [2], [3]: feature g + 8
            const int src = ((f % 8) * 4 + m_lo / 2) * kLaneFloats + (j * kRowTiles + i) * 4 + (f >= 8 ? 2 : 0) +
                            m_lo % 2;
            float y = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) y += part[w * kWarpSize * kLaneFloats + src];
            y = decode_linear_detail::activate(y + to_float(bias), a.activation);
            if (a.residual != nullptr) y += to_float(residual[i]);
            static_cast<T*>(a.out)[static_cast<int64_t>(m) * N + n_out] = from_float<T>(y);
        }
    }
#endif
}

// The launch's shared memory, which kKernel opts into above 48 KB (once per instantiation and new
// maximum: the record is kKernel's own, a static of this template's instantiation for it; keyed by the
// kernel's type instead, every instantiation would share one, and bf16 launches after fp16 ones failed).
template <auto kKernel>
cudaError_t opt_in(const DecodeLinearArgs& a, size_t& smem) {
    static std::atomic<size_t> opted_in{48 * 1024};
    smem = static_cast<size_t>(decode_linear_fragments_shared_bytes(a.rows, a.in_features, a.ln_gamma != nullptr));
    return decode_linear_detail::opt_in_shared_memory(kKernel, smem, opted_in);
}

// 17-64 rows: a block per 32 output features, whole clusters.
template <typename T, int kSteps, int kCluster>
cudaError_t launch_cluster(const DecodeLinearArgs& a, cudaStream_t stream) {
    constexpr auto kernel = decode_linear_fragments_cluster_kernel<T, kSteps, kCluster>;
    size_t smem = 0;
    if (const cudaError_t err = opt_in<kernel>(a, smem); err != cudaSuccess) return err;
    const int blocks = ceil_div(ceil_div(a.out_features, 2 * kFeatures), kCluster) * kCluster;
    return launch_kernel_clustered(kernel, dim3(blocks), dim3(kThreads), kCluster, smem, stream, a);
}

// Up to 16 rows: a block per 16 output features, of kW warps.
template <typename T, int kSteps, int kRowTiles, int kW = kWarps>
cudaError_t launch_tiles(const DecodeLinearArgs& a, cudaStream_t stream) {
    constexpr auto kernel = decode_linear_fragments_kernel<T, kSteps, kRowTiles, kW>;
    size_t smem = 0;
    if (const cudaError_t err = opt_in<kernel>(a, smem); err != cudaSuccess) return err;
    return launch_kernel(kernel, dim3(a.out_features / kFeatures), dim3(kW * kWarpSize), smem, stream, a);
}

// Whether a launch of up to 4 rows runs 4-warp blocks: where its 8-warp blocks (two an SM, 128 registers a
// thread) would take over three quarters of the GPU's block slots, so that the next call's blocks (fc2's
// after fc1's) find no register file free and start, and request their weights, only as these end. The
// 4-warp blocks at the same registers leave half of each SM to them. NLLB's fc1 at 1x4 (256 tiles on 132
// SMs, H200): 0.4393 -> 0.4347 ms a step, medians of three alternating rounds; its QKV (192 tiles, whose
// 8-warp blocks leave room for the attention after it) measured slower as 4-warp blocks, 0.4400.
bool four_warp_blocks(const DecodeLinearArgs& a) {
    const int tiles = a.out_features / kFeatures;
    return a.rows <= 4 && 4 * tiles > 3 * 2 * current_device_value<query_sm_count>();
}

template <typename T, int kSteps>
cudaError_t launch_steps(const DecodeLinearArgs& a, cudaStream_t stream) {
    if (a.rows <= 8) return launch_tiles<T, kSteps, 1>(a, stream);
    if (a.rows <= 16) return launch_tiles<T, kSteps, 2>(a, stream);
    // the clusters' rows fit an sm_90 block's 227 KB up to 3072 wide (32 rows) and 1536 (64 rows): the
    // wider ones are not built (decode_linear_fragments_fits refuses them first)
    constexpr int kWidth = kSteps * kStep * kWarps;
    constexpr int64_t kSm90Bytes = 227 * 1024;
    if (a.rows <= 32) {
        if constexpr (decode_linear_fragments_shared_bytes(32, kWidth, true) <= kSm90Bytes)
            return launch_cluster<T, kSteps, 2>(a, stream);
    } else if constexpr (decode_linear_fragments_shared_bytes(64, kWidth, true) <= kSm90Bytes) {
        return launch_cluster<T, kSteps, 4>(a, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace

bool decode_linear_fragments_supported() { return current_compute_capability() >= 80; }

bool decode_linear_fragments_fits(int32_t rows, int32_t in_features, bool layernorm) {
    if (rows > 16 && current_compute_capability() < 90) return false;  // thread-block clusters
    return decode_linear_fragments_shared_bytes(rows, in_features, layernorm) <=
           current_device_value<query_smem_per_block_optin>();
}

cudaError_t launch_decode_linear_fragment_layout(const void* weight, void* out, int32_t out_features,
                                                 int32_t in_features, cudaStream_t stream) {
    if (out_features == 0) return cudaSuccess;
    const int64_t total = static_cast<int64_t>(out_features) * in_features;
    const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
    return launch_kernel(fragment_layout_kernel, dim3(blocks), dim3(256), 0, stream,
                         static_cast<const uint16_t*>(weight), static_cast<uint16_t*>(out), out_features, in_features);
}

cudaError_t launch_decode_linear_fragments(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0 || args.out_features == 0) return cudaSuccess;
    auto typed = [&](auto tag) -> cudaError_t {
        using T = typename decltype(tag)::type;
        if (four_warp_blocks(args)) {
            switch (args.in_features / (kStep * 4)) {
                case 8: return launch_tiles<T, 8, 1, 4>(args, stream);
                case 16: return launch_tiles<T, 16, 1, 4>(args, stream);
                case 24: return launch_tiles<T, 24, 1, 4>(args, stream);
                case 32: return launch_tiles<T, 32, 1, 4>(args, stream);
                default: break;  // the 8-warp blocks below
            }
        }
        switch (args.in_features / (kStep * kWarps)) {
            case 4: return launch_steps<T, 4>(args, stream);
            case 6: return launch_steps<T, 6>(args, stream);
            case 8: return launch_steps<T, 8>(args, stream);
            case 12: return launch_steps<T, 12>(args, stream);
            case 16: return launch_steps<T, 16>(args, stream);
            case 24: return launch_steps<T, 24>(args, stream);
            case 32: return launch_steps<T, 32>(args, stream);
            default: return cudaErrorInvalidValue;  // decode_linear_fragments_takes (the C ABI checks it)
        }
    };
    if (dtype == PADFREE_FLOAT16) return typed(TypeTag<__half>{});
    if (dtype == PADFREE_BFLOAT16) return typed(TypeTag<__nv_bfloat16>{});
    return cudaErrorInvalidValue;
}

}  // namespace padfree
