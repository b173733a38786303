// A decode step's linear layers for 9 to 64 rows in float16 / bfloat16 on sm_90+: what
// decode_linear.cu does for up to 8 rows (the input's LayerNorm, bias, activation and residual in one
// kernel; the weights requested before the kernel waits on its producer), on tensor cores, where
// CUDA-core FMAs would bound it (each weight element meets every row). The generation step uses it for
// the layers it beats cuBLAS on (ops.decoder.decode_linear_pays: up to 16 rows x 3072 features;
// KERNELS.md has the measurements): there a layer's [16, 1024] x [1024, N] GEMM reads 2-8 MB of
// weights, under 2 us at an H200's bandwidth, while cuBLASLt's kernels for it take 4.5-7.5 us, start
// their weight stream only once the previous kernel has ended, and leave the LayerNorm to a kernel of
// its own.
//
// Why a cluster: every block needs every row of x for the features it computes; staged whole by each
// block, x cost more than the weights. Here in_features is split over a cluster of 4 or 8 blocks
// (decode_linear_mma_split): each stages its slice of the rows and of 64, 128 or 256 features' weights
// (decode_linear_mma_features), the LayerNorm's row statistics are summed across the cluster through
// distributed shared memory (two exchanges: the mean, then the squared deviations, as the one-block
// kernel computes them), and the blocks' partial products are added across the cluster in a fixed
// order (the result does not depend on timing), each block finishing a share of the outputs with the
// epilogue.
//
// Products: the operands swapped (out^T = W x^T), so that a warp's 16 features are an mma.sync
// m16n8k16's M and the rows its N, 8 rows per mma. Lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of
// weight rows g and g + 8 and of x row g at 8t of each 32-wide chunk: those are the fragments of two
// mma's once the chunk's k is taken in the order (8t, 8t+1 | 8t+2, 8t+3) for the first and (8t+4,
// 8t+5 | 8t+6, 8t+7) for the second (one permutation of k for both operands leaves the sums as they
// are), with no ldmatrix; each row of both staged operands is padded by 16 bytes, so that these loads
// fall on distinct banks.
#include "decode_linear.h"
#include "decode_linear.cuh"

#include <cooperative_groups.h>

#include "../attention/attention_ptx.cuh"
#include "common.cuh"

namespace padfree {
namespace {

namespace cg = cooperative_groups;
using attention_detail::MmaOp;

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // the kernel's body is sm_90's only
constexpr int kChunk = 32;                           // in_features per step: two mma's k
constexpr int kVec = 8;                              // 16-bit values per 16-byte vector
constexpr int kMinSplit = 4, kMaxSplit = 8;
constexpr int kMaxStagedRows = kDecodeLinearMmaMaxRows;  // the row statistics' room (decode_linear_mma_bytes)

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// The sum over the cluster's blocks (rank order) of the value at `p` in each block's shared memory: every
// remote load issued before the first add (a loop over a runtime count would wait for each in turn).
template <typename V>
__device__ __forceinline__ V cluster_sum(cg::cluster_group& cluster, V* p, int split) {
    V v[kMaxSplit];
#pragma unroll
    for (int q = 0; q < kMaxSplit; ++q) v[q] = q < split ? *cluster.map_shared_rank(p, q) : V{};
    V sum = v[0];
#pragma unroll
    for (int q = 1; q < kMaxSplit; ++q) sum = add(sum, v[q]);
    return sum;
}
#endif

// kRowTiles: the staged rows / 8 (2, 4 or 8); rows past a.rows are zero and never stored. kWarps: 4, 8
// or 16, each 16 of the block's features (decode_linear_mma_features); 128 registers at most.
template <typename T, int kRowTiles, int kWarps>
__global__ void __launch_bounds__(kWarps * kWarpSize, 16 / kWarps) decode_linear_mma_kernel(DecodeLinearArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int kThreads = kWarps * kWarpSize;
    constexpr int kFeatures = 16 * kWarps;  // a warp's 16 features: one mma's M
    constexpr int kRows = 8 * kRowTiles;
    constexpr int kMaxGroups = ceil_div(kFeatures * kRows / 4 / kMinSplit, kThreads);  // a thread's at most
    cg::cluster_group cluster = cg::this_cluster();
    const int split = static_cast<int>(cluster.num_blocks());
    const int rank = static_cast<int>(cluster.block_rank());  // this block's slice of in_features
    const int K = a.in_features, N = a.out_features, M = a.rows;
    const int slice = K / split, k0 = rank * slice;
    const int ld = slice + kVec;  // padded row stride of both staged operands
    const int vecs = slice / kVec;
    const int f0 = blockIdx.y * kFeatures;
    const bool ln = a.ln_gamma != nullptr;
    T* wt = reinterpret_cast<T*>(smem_raw);                      // weights [kFeatures][ld]
    T* xs = wt + kFeatures * ld;                                 // x [kRows][ld]
    T* ln_params = xs + kRows * ld;                              // gamma, beta [slice] each, with LN
    float* part = reinterpret_cast<float*>(ln_params + (ln ? 2 * slice : 0));  // [kFeatures][kRows]
    // per staged row (64 at most): the slice's sum and squared deviations (exchanged across the
    // cluster), then the row's mean and rstd
    float* row_sum = part + kFeatures * kRows;
    float* row_squares = row_sum + kMaxStagedRows;
    float* row_mean = row_squares + kMaxStagedRows;
    float* row_rstd = row_mean + kMaxStagedRows;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    // A thread's place in the staging loops: vector column tv of rows tr, tr + rows_step, ... (one
    // division here instead of one per vector; the shared-memory bound keeps vecs <= kThreads; where
    // vecs does not divide kThreads, the last threads stage nothing)
    const int rows_step = kThreads / vecs, tv = threadIdx.x % vecs, tr = threadIdx.x / vecs;
    const bool stager = tr < rows_step;

    // The weights are not the producer's output: their slice is requested before the wait, 16 bytes per
    // copy (rows past N copy row N - 1 and are never stored). A bulk copy per feature row instead (64
    // of slice x 2 bytes each) took several times longer: the copy engine handles small requests slowly.
    {
        const T* weight = static_cast<const T*>(a.weight) + k0 + tv * kVec;
        if (stager)
            for (int f = tr; f < kFeatures; f += rows_step)
                attention_detail::cp_async_16_full(attention_detail::smem_addr(wt + f * ld + tv * kVec),
                                                   weight + static_cast<int64_t>(min(f0 + f, N - 1)) * K);
        attention_detail::cp_async_commit();
    }
    if (ln) {  // parameters, not the producer's output: staged before the wait
        for (int v = threadIdx.x; v < vecs; v += kThreads) {
            store_vec(ln_params + v * kVec, load_vec(static_cast<const T*>(a.ln_gamma) + k0 + v * kVec));
            store_vec(ln_params + slice + v * kVec, load_vec(static_cast<const T*>(a.ln_beta) + k0 + v * kVec));
        }
    }
    wait_on_producer();

    // this block's slice of the x rows, all in flight at once
    const T* x = static_cast<const T*>(a.x) + k0 + tv * kVec;
    if (stager)
        for (int r = tr; r < kRows; r += rows_step) {
            const uint32_t dst = attention_detail::smem_addr(xs + r * ld + tv * kVec);
            if (r < M) {
                attention_detail::cp_async_16_full(dst, x + static_cast<int64_t>(r) * K);
            } else {
                attention_detail::st_shared_zero_16(dst);
            }
        }
    attention_detail::cp_async_commit();
    // the outputs this block finishes: a 1/split share of its features x kRows rows in groups of 4
    // rows of one feature (one 16-byte load of each block's partial sums), and their bias and residual,
    // loaded while x arrives
    const int groups = kFeatures * kRows / 4 / split;
    const int group0 = rank * groups;
    // group u of this thread: feature f (output column n) x rows m0 .. m0 + 3; `in`: this block has it
    struct OutputGroup { int f, m0, n; bool in; };
    auto output_group = [&](int u) {
        const int gi = group0 + threadIdx.x + u * kThreads, f = gi / (kRows / 4);
        return OutputGroup{f, gi % (kRows / 4) * 4, f0 + f, threadIdx.x + u * kThreads < groups && f0 + f < N};
    };
    const T* bias = static_cast<const T*>(a.bias);
    const T* residual = static_cast<const T*>(a.residual);
    // (kept as loaded until the epilogue: converted here, each would wait for its load)
    T bias_in[kMaxGroups], residual_in[kMaxGroups][4];
#pragma unroll
    for (int u = 0; u < kMaxGroups; ++u) {
        const OutputGroup o = output_group(u);
        bias_in[u] = o.in && bias != nullptr ? bias[o.n] : from_float<T>(0.f);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            residual_in[u][e] = o.in && residual != nullptr && o.m0 + e < M
                                    ? residual[static_cast<int64_t>(o.m0 + e) * N + o.n]
                                    : from_float<T>(0.f);
    }
    attention_detail::cp_async_wait<0>();
    __syncthreads();

    if (ln) {
        // the rows' statistics over all of in_features: each block's partial sums (kTpr threads per
        // staged row, all rows at once; zero rows past M), added across the cluster in rank order (every
        // block gets the same mean and rstd), float32 two-pass
        constexpr int kTpr = kThreads / kRows;
        const int m = threadIdx.x / kTpr, j = threadIdx.x % kTpr;
        const T* row = xs + m * ld;
        float s = decode_linear_detail::staged_row_sum(row, j, vecs, kTpr);
#pragma unroll
        for (int o = kTpr / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (j == 0) row_sum[m] = s;
        cluster.sync();
        if (threadIdx.x < kRows) row_mean[threadIdx.x] = cluster_sum(cluster, row_sum + threadIdx.x, split) / K;
        __syncthreads();
        s = decode_linear_detail::staged_row_squares(row, j, vecs, kTpr, row_mean[m]);
#pragma unroll
        for (int o = kTpr / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (j == 0) row_squares[m] = s;
        cluster.sync();
        if (threadIdx.x < kRows)
            row_rstd[threadIdx.x] = rsqrtf(cluster_sum(cluster, row_squares + threadIdx.x, split) / K + a.eps);
        __syncthreads();
        // the slice normalized in place, rounded to T; the first cluster also writes it out for a
        // post-LN residual
        T* side = blockIdx.y == 0 ? static_cast<T*>(a.x_norm_out) : nullptr;
        if (stager) {
            const Vec<T> gv = load_vec(ln_params + tv * kVec), bv = load_vec(ln_params + slice + tv * kVec);
            for (int r = tr; r < M; r += rows_step) {
                const Vec<T> xv = decode_linear_detail::layernorm_vec(load_vec(xs + r * ld + tv * kVec),
                                                                      row_mean[r], row_rstd[r], gv, bv);
                store_vec(xs + r * ld + tv * kVec, xv);
                if (side != nullptr) store_vec(side + static_cast<int64_t>(r) * K + k0 + tv * kVec, xv);
            }
        }
        __syncthreads();
    }
    // every block is past its wait: the next kernel may launch and request its own weights
    allow_consumers();

    // the products over this slice (the weights arrived with x): warp w's features 16w..16w+15 against
    // every staged row
    float acc[kRowTiles][4] = {};
    const T* w_lo = wt + (warp * 16 + g) * ld + t * kVec;
    const T* w_hi = w_lo + 8 * ld;
    const T* x_row = xs + g * ld + t * kVec;
#pragma unroll 4
    for (int c = 0; c < slice; c += kChunk) {
        const uint4 lo = *reinterpret_cast<const uint4*>(w_lo + c);
        const uint4 hi = *reinterpret_cast<const uint4*>(w_hi + c);
        const uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t second[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int j = 0; j < kRowTiles; ++j) {
            const uint4 xv = *reinterpret_cast<const uint4*>(x_row + 8 * j * ld + c);
            MmaOp<T>::run(acc[j], first, xv.x, xv.y);
            MmaOp<T>::run(acc[j], second, xv.z, xv.w);
        }
    }
    // c0, c1: feature 16w + g, rows 8j + 2t and + 1; c2, c3: feature 16w + g + 8
#pragma unroll
    for (int j = 0; j < kRowTiles; ++j) {
        *reinterpret_cast<float2*>(part + (warp * 16 + g) * kRows + 8 * j + 2 * t) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(part + (warp * 16 + g + 8) * kRows + 8 * j + 2 * t) =
            make_float2(acc[j][2], acc[j][3]);
    }
    cluster.sync();

    // this block's share of the outputs: the blocks' partial sums in rank order, then the epilogue
    T* out = static_cast<T*>(a.out);
#pragma unroll
    for (int u = 0; u < kMaxGroups; ++u) {
        const OutputGroup o = output_group(u);
        if (!o.in) continue;
        const float4 y4 = cluster_sum(cluster, reinterpret_cast<float4*>(part + o.f * kRows + o.m0), split);
        const float y[4] = {y4.x, y4.y, y4.z, y4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (o.m0 + e < M)
                out[static_cast<int64_t>(o.m0 + e) * N + o.n] = from_float<T>(
                    decode_linear_detail::activate(y[e] + to_float(bias_in[u]), a.activation) + to_float(residual_in[u][e]));
    }
    // no block exits while another still reads its shared memory: the reads are done (their values were
    // added above), so the arrival need not wait for this block's stores (a release arrival did: a
    // tenth of the kernel's stall samples)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
#endif
}

template <typename T, int kRowTiles, int kWarps>
cudaError_t launch_tiles(const DecodeLinearArgs& a, size_t smem, cudaStream_t stream) {
    auto kernel = decode_linear_mma_kernel<T, kRowTiles, kWarps>;
    static std::atomic<size_t> opted_in{48 * 1024};
    if (const cudaError_t err = decode_linear_detail::opt_in_shared_memory(kernel, smem, opted_in); err != cudaSuccess)
        return err;
    const unsigned split = static_cast<unsigned>(decode_linear_mma_split(a.in_features));
    const dim3 grid(split, static_cast<unsigned>(ceil_div(a.out_features, 16 * kWarps)));
    return launch_kernel_clustered(kernel, grid, dim3(kWarps * kWarpSize), split, smem, stream, a);
}

template <typename T, int kRowTiles>
cudaError_t launch_rows(const DecodeLinearArgs& a, cudaStream_t stream) {
    const bool ln = a.ln_gamma != nullptr;
    const int features = decode_linear_mma_features(a.rows, a.in_features, a.out_features, ln);
    const size_t smem = static_cast<size_t>(decode_linear_mma_bytes(features, a.rows, a.in_features, ln));
    switch (features) {
        case 256: return launch_tiles<T, kRowTiles, 16>(a, smem, stream);
        case 128: return launch_tiles<T, kRowTiles, 8>(a, smem, stream);
        default: return launch_tiles<T, kRowTiles, 4>(a, smem, stream);
    }
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
    switch (decode_linear_mma_staged_rows(a.rows)) {
        case 16: return launch_rows<T, 2>(a, stream);
        case 32: return launch_rows<T, 4>(a, stream);
        default: return launch_rows<T, 8>(a, stream);
    }
}

}  // namespace

bool decode_linear_mma_supported() { return current_compute_capability() >= 90; }

cudaError_t launch_decode_linear_mma(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0 || args.out_features == 0) return cudaSuccess;
    if (args.rows > kDecodeLinearMmaMaxRows || args.in_features % kDecodeLinearMmaInMultiple != 0 ||
        args.in_features / decode_linear_mma_split(args.in_features) > kDecodeLinearMmaMaxSlice ||
        !decode_linear_mma_supported())
        return cudaErrorInvalidValue;
    switch (dtype) {
        case PADFREE_FLOAT16: return launch_typed<__half>(args, stream);
        case PADFREE_BFLOAT16: return launch_typed<__nv_bfloat16>(args, stream);
        default: return cudaErrorInvalidValue;  // float32: no tensor-core path (the C ABI refuses it)
    }
}

}  // namespace padfree
