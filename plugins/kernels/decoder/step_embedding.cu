// The decode step's embedding as one kernel: the token lookup, the scale, the position row of the
// device step, the embedding LayerNorm. As torch ops it was 5-8 kernels per step (two gathers, the
// position arithmetic, a multiply, an add, a LayerNorm), each a few microseconds of a step that at
// 1x4 is a chain of latency-bound kernels. Rows map onto threads and are normalized in registers as
// the encoder's embedding does (layernorm_row.cuh).
#include "step_embedding.h"

#include "layernorm_row.cuh"

namespace padfree {
namespace {

// No register cap (the LayerNorm kernels' kRowMinBlocks): a step has few rows (batch x beams), so
// occupancy is moot, and under the cap a variant spilled.
template <typename T, int N, bool kBlockRow>
__global__ void __launch_bounds__(kRowMaxThreads<kBlockRow>) step_embedding_kernel(StepEmbeddingArgs a) {
    constexpr int V = Vec<T>::size;
    const int nvec = a.hidden / V;
    const int lane = threadIdx.x, threads = blockDim.x;
    wait_on_producer();
    allow_consumers();
    const int64_t step = *a.step;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < a.rows;
         r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        const int64_t token = a.tokens[r];
        const int64_t id = min(max(token, int64_t{0}), static_cast<int64_t>(a.vocab - 1));
        int64_t position = a.pad_token >= 0 && token == a.pad_token ? a.pad_position : step + a.position_offset;
        position = min(max(position, int64_t{0}), static_cast<int64_t>(a.num_positions - 1));
        const T* word = static_cast<const T*>(a.word_emb) + id * a.hidden;
        const T* pos = static_cast<const T*>(a.positions) + position * a.hidden;
        T* out = static_cast<T*>(a.out) + r * a.hidden;
        RowRegisters<T, N> x;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int v = lane + i * threads;
            if (v >= nvec) continue;
            const Vec<T> w = load_vec_ro(word + v * V), p = load_vec_ro(pos + v * V);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                // rounded after the multiply and after the add, as HF's ops in the model dtype;
                // __fmul_rn keeps float32 from contracting the two into an FMA
                const T scaled = from_float<T>(__fmul_rn(to_float(w.v[j]), a.embed_scale));
                x[i][j] = to_float(from_float<T>(to_float(scaled) + to_float(p.v[j])));
            }
        }
        if (a.ln_gamma != nullptr) {  // the same for the whole block: its barriers are reached by all
            const RowParams<T, N, false> params(static_cast<const T*>(a.ln_gamma), static_cast<const T*>(a.ln_beta),
                                                nullptr, lane, threads, nvec);
            layernorm_store_row<T, N, kBlockRow>(x, lane, threads, nvec, a.hidden, params, a.eps, out);
            continue;
        }
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int v = lane + i * threads;
            if (v < nvec) store_vec(out + v * V, vec_from_float<T>(x[i]));  // already the dtype's values
        }
    }
}

}  // namespace

cudaError_t launch_step_embedding(const StepEmbeddingArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0) return cudaSuccess;
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const RowLaunch launch = row_launch(args.hidden / vec_size<T>());
        dispatch_row_launch(launch, [&](auto n, auto block_row) {
            err = launch_kernel(step_embedding_kernel<T, decltype(n)::value, decltype(block_row)::value>,
                                dim3(row_grid(args.rows, launch)), launch.block, 0, stream, args);
        });
    });
    return err;
}

}  // namespace padfree
