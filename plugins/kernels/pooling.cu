// Sentence pooling (sentence-transformers' Pooling + Normalize) on packed rows, as segment reductions
// bounded by cu_seqlens: nothing [batch, seqlen, hidden] is ever formed.
//
// One CTA per sequence: the sequence's rows are split over groups of threads, each thread of a group
// owning one 16-byte column vector, and a group keeps kRowsInFlight rows' loads in flight before it
// accumulates them (a segment of ~50 rows is otherwise a chain of dependent round trips). Partial
// results of the groups meet in shared memory; the pooled row stays there in fp32 for the norm, so
// normalizing rounds once. Rows wider than one pass of the block's lanes (hidden > 256 vectors) take
// several column passes over the same rows.
#include "pooling.h"

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsInFlight = 8;
constexpr float kNormEps = 1e-12f;  // torch.nn.functional.normalize's default, as sentence-transformers'
constexpr int64_t kMaxGrid = 1 << 20;  // beyond this, blocks loop over sequences

template <typename T>
__global__ void __launch_bounds__(kThreads) sequence_pool_kernel(const T* x, const int32_t* cu_seqlens,
                                                                 int32_t batch, int32_t total_rows, int hidden,
                                                                 int lanes, int mode, bool normalize, T* out) {
    constexpr int V = Vec<T>::size;
    __shared__ float pooled[kPoolMaxHidden];          // the sequence's result, fp32
    __shared__ float partial[kThreads * V];       // one column pass's per-group partials
    wait_on_producer();
    allow_consumers();
    const int nvec = hidden / V;
    const int groups = kThreads / lanes;
    const int lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
    const bool active = group < groups;           // threads past lanes * groups only join the reductions
    const bool is_max = mode == PADFREE_POOL_MAX;
    const float identity = is_max ? -CUDART_INF_F : 0.f;
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        const int32_t start = min(max(cu_seqlens[b], 0), total_rows);
        int32_t end = min(max(cu_seqlens[b + 1], start), total_rows);
        if (mode == PADFREE_POOL_CLS) end = min(end, start + 1);
        const int32_t rows = end - start;
        for (int c0 = 0; c0 < nvec; c0 += lanes) {
            const int c = c0 + lane;
            float acc[V];
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] = identity;
            if (active && c < nvec) {
                const T* column = x + static_cast<int64_t>(start) * hidden + static_cast<int64_t>(c) * V;
                for (int32_t r0 = group; r0 < rows; r0 += groups * kRowsInFlight) {
                    Vec<T> loaded[kRowsInFlight];
#pragma unroll
                    for (int k = 0; k < kRowsInFlight; ++k) {
                        const int32_t r = r0 + k * groups;
                        if (r < rows) loaded[k] = load_vec(column + static_cast<int64_t>(r) * hidden);
                    }
#pragma unroll
                    for (int k = 0; k < kRowsInFlight; ++k) {
                        if (r0 + k * groups < rows) {
#pragma unroll
                            for (int j = 0; j < V; ++j) {
                                const float v = to_float(loaded[k].v[j]);
                                acc[j] = is_max ? fmaxf(acc[j], v) : acc[j] + v;
                            }
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < V; ++j) partial[threadIdx.x * V + j] = acc[j];
            __syncthreads();
            // the first group's threads combine the groups' partials of their column vector
            if (group == 0 && c < nvec) {
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    float v = partial[lane * V + j];
                    for (int g = 1; g < groups; ++g) {
                        const float w = partial[(g * lanes + lane) * V + j];
                        v = is_max ? fmaxf(v, w) : v + w;
                    }
                    // an empty sequence pools to zeros; a mean divides by its row count
                    pooled[c * V + j] = rows == 0 ? 0.f : mode == PADFREE_POOL_MEAN ? v / static_cast<float>(rows) : v;
                }
            }
            __syncthreads();
        }
        float scale = 1.f;
        if (normalize) {
            float squares = 0.f;
            for (int i = threadIdx.x; i < hidden; i += kThreads) squares += pooled[i] * pooled[i];
            // x / max(||x||, eps), as torch.nn.functional.normalize divides
            scale = 1.f / fmaxf(sqrtf(block_sum(squares)), kNormEps);
        }
        T* row = out + b * hidden;
        for (int c = threadIdx.x; c < nvec; c += kThreads) {
            float v[V];
#pragma unroll
            for (int j = 0; j < V; ++j) v[j] = pooled[c * V + j] * scale;
            store_vec(row + c * V, vec_from_float<T>(v));
        }
        __syncthreads();  // pooled is rewritten by the block's next sequence
    }
}

}  // namespace

void launch_sequence_pool(const void* x, const int32_t* cu_seqlens, int32_t batch, int64_t total_tokens,
                          int32_t hidden, int32_t mode, bool normalize, padfree_dtype dtype, void* out,
                          cudaStream_t stream) {
    if (batch == 0) return;
    // cu_seqlens entries are int32, so rows past INT32_MAX are reachable by no sequence
    const int32_t total_rows = static_cast<int32_t>(total_tokens < INT32_MAX ? total_tokens : INT32_MAX);
    const unsigned grid = static_cast<unsigned>(batch < kMaxGrid ? batch : kMaxGrid);
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int nvec = hidden / vec_size<T>();
        // lanes: one column vector per thread, a warp multiple, at most the block; the rest of the
        // block reads other rows of the same columns (768-wide fp16: 96 lanes x 2 groups)
        const int lanes = min(kThreads, ceil_div(nvec, kWarpSize) * kWarpSize);
        launch_kernel(sequence_pool_kernel<T>, grid, kThreads, 0, stream, static_cast<const T*>(x), cu_seqlens, batch,
                      total_rows, hidden, lanes, mode, normalize, static_cast<T*>(out));
    });
}

}  // namespace padfree
