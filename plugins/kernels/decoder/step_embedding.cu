// The decode step's embedding as one kernel: the token lookup, the scale, the position row of the
// device step, the embedding LayerNorm. As torch ops it was 5-8 kernels per step (two gathers, the
// position arithmetic, a multiply, an add, a LayerNorm), each a few microseconds of a step that at
// 1x4 is a chain of latency-bound kernels.
#include "step_embedding.h"

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kThreads = 128;

// One CTA per row; the row's values stay in shared memory (float) for the LayerNorm's two passes.
template <typename T>
__global__ void __launch_bounds__(kThreads) step_embedding_kernel(StepEmbeddingArgs a) {
    constexpr int VEC = Vec<T>::size;
    extern __shared__ float row_s[];  // [hidden], with the LayerNorm
    const int r = blockIdx.x;
    const int vecs = a.hidden / VEC;
    wait_on_producer();
    const int64_t token = a.tokens[r];
    const int64_t id = min(max(token, int64_t{0}), static_cast<int64_t>(a.vocab - 1));
    int64_t position = a.pad_token >= 0 && token == a.pad_token ? a.pad_position
                                                                  : static_cast<int64_t>(*a.step) + a.position_offset;
    position = min(max(position, int64_t{0}), static_cast<int64_t>(a.num_positions - 1));
    const T* word = static_cast<const T*>(a.word_emb) + id * a.hidden;
    const T* pos = static_cast<const T*>(a.positions) + position * a.hidden;
    T* out = static_cast<T*>(a.out) + static_cast<int64_t>(r) * a.hidden;
    const bool ln = a.ln_gamma != nullptr;
    float sum = 0.f;
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
        const Vec<T> w = load_vec_ro(word + v * VEC), p = load_vec_ro(pos + v * VEC);
        Vec<T> x;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            // rounded after the multiply, as HF's: __fmul_rn keeps float32 from contracting it into an FMA
            const T scaled = from_float<T>(__fmul_rn(to_float(w.v[i]), a.embed_scale));
            x.v[i] = from_float<T>(to_float(scaled) + to_float(p.v[i]));
        }
        if (!ln) {
            store_vec(out + v * VEC, x);
            continue;
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            row_s[v * VEC + i] = to_float(x.v[i]);
            sum += to_float(x.v[i]);
        }
    }
    if (!ln) {
        allow_consumers();
        return;
    }
    const float mean = block_sum(sum) / a.hidden;  // barriers inside: row_s is complete after
    float sq = 0.f;
    for (int i = threadIdx.x; i < a.hidden; i += kThreads) {
        const float d = row_s[i] - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(block_sum(sq) / a.hidden + a.eps);
    allow_consumers();
    const T* gamma = static_cast<const T*>(a.ln_gamma);
    const T* beta = static_cast<const T*>(a.ln_beta);
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
        const Vec<T> g = load_vec_ro(gamma + v * VEC), b = load_vec_ro(beta + v * VEC);
        Vec<T> y;
#pragma unroll
        for (int i = 0; i < VEC; ++i)
            y.v[i] = from_float<T>((row_s[v * VEC + i] - mean) * rstd * to_float(g.v[i]) + to_float(b.v[i]));
        store_vec(out + v * VEC, y);
    }
}

}  // namespace

cudaError_t launch_step_embedding(const StepEmbeddingArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0) return cudaSuccess;
    const size_t smem = args.ln_gamma != nullptr ? static_cast<size_t>(args.hidden) * sizeof(float) : 0;
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        err = launch_kernel(step_embedding_kernel<T>, dim3(args.rows), dim3(kThreads), smem, stream, args);
    });
    return err;
}

}  // namespace padfree
