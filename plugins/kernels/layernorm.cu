// LayerNorm and skip LayerNorm: memory-bound, so each row is read once with 16-byte loads into
// registers, normalized there (layernorm_row.cuh) and written once.
#include "layernorm.h"

#include "layernorm_row.cuh"

namespace padfree {
namespace {

// kSkip: the row is x + bias + residual (bias and residual may be null: the encoder folds the
// residual into the GEMM's beta = 1 epilogue, leaving one stream to read here); otherwise x. out may
// alias x or residual: every element is read and written by the same thread, reads first.
// kHeld: the parameters in registers before the wait (RowParams), for grids of one wave.
// kLoadsFirst: every x load of a row goes out before any is used (skip LayerNorm; plain LayerNorm has
// no null checks between its loads and the compiler batches them anyway). prefetch: the next GEMMs'
// weights, asked for after the kernel's own early loads so that those do not queue behind it.
template <typename T, int N, bool kBlockRow, bool kSkip, bool kHeld, bool kLoadsFirst>
__device__ __forceinline__ void layernorm_rows(const T* x, const T* residual, const T* bias, const T* gamma,
                                               const T* beta, int64_t rows, int hidden, float eps, T* out,
                                               bool last_first, L2Prefetch prefetch) {
    constexpr int V = Vec<T>::size;
    const int nvec = hidden / V;
    const int lane = threadIdx.x;
    const int threads = blockDim.x;
    const RowParams<T, N, kHeld> params(gamma, beta, kSkip ? bias : nullptr, lane, threads, nvec);
    if constexpr (!kHeld) prefetch_row_params(gamma, beta, kSkip ? bias : nullptr, hidden);
    prefetch_range_l2(prefetch);
    wait_on_producer();
    allow_consumers();
    for (int64_t step = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; step < rows;
         step += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        const int64_t offset = (last_first ? rows - 1 - step : step) * hidden;
        // Held, the residual's loads join the x loads (H100, BERT-base 1x128: the 24 skip LayerNorms
        // 0.090 ms per forward, held 0.074, held with the loads together 0.062); capped at 64
        // registers, the residual is read where it is added.
        const bool with_residual = kSkip && residual != nullptr;
        Vec<T> xs[kLoadsFirst ? N : 1], rs[kHeld ? N : 1];
        if constexpr (kLoadsFirst)
#pragma unroll
            for (int i = 0; i < N; ++i)
                if (lane + i * threads < nvec) xs[i] = load_vec(x + offset + (lane + i * threads) * V);
        if constexpr (kHeld)
            if (with_residual)
#pragma unroll
                for (int i = 0; i < N; ++i)
                    if (lane + i * threads < nvec) rs[i] = load_vec(residual + offset + (lane + i * threads) * V);
        float v[N][V];
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int c = lane + i * threads;
            if (c < nvec) {
                if constexpr (kLoadsFirst)
                    vec_to_float(xs[i], v[i]);
                else
                    vec_to_float(load_vec(x + offset + c * V), v[i]);
                if (with_residual) {
                    if constexpr (kHeld)
                        add_vec(v[i], rs[i]);
                    else
                        add_vec(v[i], load_vec(residual + offset + c * V));
                }
                if (kSkip && bias != nullptr) add_vec(v[i], params.bias_at(i, c));
            }
        }
        layernorm_store_row<T, N, kBlockRow>(v, lane, threads, nvec, hidden, params, eps, out + offset);
    }
}

// Plain LayerNorm keeps the compiler's register choice: capped at 64 it measured slower on the
// H100 ([16384, 768] fp16: 0.86 of copy bandwidth against 0.90 uncapped).
template <typename T, int N, bool kBlockRow, bool kHeld>
__global__ void layernorm_kernel(const T* x, const T*, const T*, const T* gamma, const T* beta, int64_t rows,
                                 int hidden, float eps, T* out, bool last_first, L2Prefetch prefetch) {
    layernorm_rows<T, N, kBlockRow, false, kHeld, kHeld>(x, nullptr, nullptr, gamma, beta, rows, hidden, eps, out,
                                                         last_first, prefetch);
}

// Skip LayerNorm reads two streams and gains from the cap (0.83 -> 0.93 of copy bandwidth); a grid of
// one wave has a block per SM, so its held parameters need no cap.
template <typename T, int N, bool kBlockRow, bool kHeld, bool kLoadsFirst>
__global__ void __launch_bounds__(kRowMaxThreads<kBlockRow>, kHeld ? 1 : kRowMinBlocks<kBlockRow>)
skip_layernorm_kernel(const T* x, const T* residual, const T* bias, const T* gamma, const T* beta, int64_t rows,
                      int hidden, float eps, T* out, bool last_first, L2Prefetch prefetch) {
    layernorm_rows<T, N, kBlockRow, true, kHeld, kHeld || kLoadsFirst>(x, residual, bias, gamma, beta, rows, hidden,
                                                                       eps, out, last_first, prefetch);
}

template <bool kSkip>
void launch(const void* x, const void* residual, const void* bias, const void* gamma, const void* beta,
            int64_t rows, int32_t hidden, float eps, L2Prefetch prefetch, padfree_dtype dtype, void* out,
            cudaStream_t stream) {
    if (rows == 0) return;
    dispatch_dtype(dtype, [&](auto dtype_tag) {
        using T = typename decltype(dtype_tag)::type;
        const RowLaunch shape = row_launch(hidden / vec_size<T>());
        const unsigned grid = row_grid(rows, shape);
        const bool one_wave = fits_waves(grid, 1);
        // Skip LayerNorm's loads first where the rows stream through more than one wave at full
        // occupancy. H100, [21504, 768] fp16 alone 29.4 -> 27.2 us; BERT-base's 24 skip LayerNorms per
        // forward 64x512 0.664 -> 0.609 ms, 128x128 level, but 16x256 (part of a wave) 0.111 -> 0.124.
        // Under the 64-register cap four slots spilled, and so did three in bf16 (30.0 -> 32.5 us).
        const bool streaming = !fits_waves(grid, kRowMinBlocks<false>);
        dispatch_row_launch(shape, [&](auto n, auto block_row) {
            constexpr int kN = decltype(n)::value;
            constexpr bool kBlockRow = decltype(block_row)::value;
            auto kernel = kSkip ? skip_layernorm_kernel<T, kN, kBlockRow, false, false>
                                : layernorm_kernel<T, kN, kBlockRow, false>;
            // a block per row has no registers to spare (512 threads: at most 128 each; held, it spilled)
            if constexpr (!kBlockRow) {
                if (one_wave)
                    kernel = kSkip ? skip_layernorm_kernel<T, kN, false, true, false>
                                   : layernorm_kernel<T, kN, false, true>;
                if constexpr (kSkip && kN <= 3 && !std::is_same_v<T, __nv_bfloat16>)
                    if (streaming) kernel = skip_layernorm_kernel<T, kN, false, false, true>;
            }
            launch_kernel(kernel, grid, shape.block, 0, stream, static_cast<const T*>(x),
                          static_cast<const T*>(residual), static_cast<const T*>(bias), static_cast<const T*>(gamma),
                          static_cast<const T*>(beta), rows, hidden, eps, static_cast<T*>(out),
                          rows_last_first(rows * hidden * static_cast<int64_t>(sizeof(T))), prefetch);
        });
    });
}

}  // namespace

void launch_layernorm(const void* x, const void* gamma, const void* beta, int64_t rows, int32_t hidden,
                      float eps, padfree_dtype dtype, void* out, cudaStream_t stream) {
    launch<false>(x, nullptr, nullptr, gamma, beta, rows, hidden, eps, L2Prefetch{}, dtype, out, stream);
}

void launch_skip_layernorm(const void* x, const void* residual, const void* bias, const void* gamma,
                           const void* beta, int64_t rows, int32_t hidden, float eps, L2Prefetch prefetch,
                           padfree_dtype dtype, void* out, cudaStream_t stream) {
    launch<true>(x, residual, bias, gamma, beta, rows, hidden, eps, prefetch, dtype, out, stream);
}

}  // namespace padfree
