// Embedding + LayerNorm on packed tokens: each token's sequence comes from a binary search over
// cu_seqlens (no token -> sequence map in memory), its three table rows are summed in registers and
// normalized there (layernorm_row.cuh), so the [T, H] sum never goes to memory. Without gamma and
// beta (Marian, M2M100: no LayerNorm after the embedding) the sum itself is stored.
#include "embedding.h"

#include "layernorm_row.cuh"

namespace padfree {
namespace {

struct EmbeddingTables {
    const void* word;
    const void* position;
    const void* type;
    int32_t vocab_size;
    int32_t max_positions;
    int32_t type_vocab_size;
    int32_t position_offset;
};

__device__ __forceinline__ int32_t clamp_index(int32_t i, int32_t size) { return min(max(i, 0), size - 1); }

// The sequence holding token t: the last b with cu_seqlens[b] <= t, in [0, batch - 1]. Zero-length
// sequences (repeated offsets) are skipped because the search takes the last such b.
__device__ __forceinline__ int32_t sequence_of(const int32_t* cu_seqlens, int32_t batch, int64_t t) {
    int32_t lo = 0, hi = batch - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// kHeld: gamma and beta in registers before the wait (RowParams), for grids of one wave, as the
// LayerNorms hold theirs (never with gamma NULL: there is nothing to hold).
// gamma NULL: no LayerNorm, the fp32 sum rounded once to T. A branch on a value uniform over the grid
// rather than a template flag: the lookups, the sum and the rounding are the same code either way, and
// it adds no instantiations (each dtype x row shape x held is compiled once).
template <typename T, int N, bool kBlockRow, bool kHeld>
__global__ void __launch_bounds__(kRowMaxThreads<kBlockRow>, kHeld ? 1 : kRowMinBlocks<kBlockRow>)
embedding_layernorm_kernel(const int32_t* input_ids, const int32_t* token_type_ids,
                                           const int32_t* cu_seqlens, int32_t batch, int64_t total_tokens,
                                           EmbeddingTables tables, const T* gamma, const T* beta, int hidden,
                                           float eps, T* out, L2Prefetch prefetch) {
    constexpr int V = Vec<T>::size;
    const int nvec = hidden / V;
    const int lane = threadIdx.x;
    const int threads = blockDim.x;
    const RowParams<T, N, kHeld> params(gamma, beta, nullptr, lane, threads, nvec);
    prefetch_range_l2(prefetch);
    wait_on_producer();
    allow_consumers();
    const T* word = static_cast<const T*>(tables.word);
    const T* position = static_cast<const T*>(tables.position);
    const T* type = static_cast<const T*>(tables.type);
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; t < total_tokens;
         t += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        // the ids go out beside the search's first load rather than after its last
        const int32_t id = input_ids[t];
        const int32_t token_type = type != nullptr && token_type_ids != nullptr ? token_type_ids[t] : 0;
        const int32_t b = sequence_of(cu_seqlens, batch, t);
        const int64_t pos = tables.position_offset + (t - cu_seqlens[b]);
        const int32_t p = static_cast<int32_t>(min(max(pos, int64_t{0}), int64_t{tables.max_positions - 1}));
        const T* word_row = word + static_cast<int64_t>(clamp_index(id, tables.vocab_size)) * hidden;
        const T* position_row = position + static_cast<int64_t>(p) * hidden;
        const T* type_row = nullptr;
        if (type != nullptr)
            type_row = type + static_cast<int64_t>(clamp_index(token_type, tables.type_vocab_size)) * hidden;
        float v[N][V];
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int c = lane + i * threads;
            if (c < nvec) {
                float e[V];
                vec_to_float(load_vec_ro(word_row + c * V), v[i]);
                vec_to_float(load_vec_ro(position_row + c * V), e);
#pragma unroll
                for (int j = 0; j < V; ++j) v[i][j] += e[j];
                if (type_row != nullptr) {
                    vec_to_float(load_vec_ro(type_row + c * V), e);
#pragma unroll
                    for (int j = 0; j < V; ++j) v[i][j] += e[j];
                }
            }
        }
        if (gamma == nullptr) {
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const int c = lane + i * threads;
                if (c < nvec) store_vec(out + t * hidden + c * V, vec_from_float<T>(v[i]));
            }
        } else {
            layernorm_store_row<T, N, kBlockRow>(v, lane, threads, nvec, hidden, params, eps, out + t * hidden);
        }
    }
}

}  // namespace

void launch_embedding_layernorm(const int32_t* input_ids, const int32_t* token_type_ids,
                                const int32_t* cu_seqlens, int32_t batch, int64_t total_tokens,
                                const void* word_emb, int32_t vocab_size, const void* position_emb,
                                int32_t max_positions, int32_t position_offset, const void* type_emb,
                                int32_t type_vocab_size, const void* gamma, const void* beta,
                                int32_t hidden, float eps, L2Prefetch prefetch, padfree_dtype dtype, void* out,
                                cudaStream_t stream) {
    if (total_tokens == 0) return;
    const EmbeddingTables tables{word_emb, position_emb, type_emb, vocab_size, max_positions,
                                 type_vocab_size, position_offset};
    dispatch_dtype(dtype, [&](auto dtype_tag) {
        using T = typename decltype(dtype_tag)::type;
        const RowLaunch shape = row_launch(hidden / vec_size<T>());
        const unsigned grid = row_grid(total_tokens, shape);
        const bool one_wave = fits_waves(grid, 1);
        dispatch_row_launch(shape, [&](auto n, auto block_row) {
            constexpr int kN = decltype(n)::value;
            constexpr bool kBlockRow = decltype(block_row)::value;
            auto kernel = embedding_layernorm_kernel<T, kN, kBlockRow, false>;
            if constexpr (!kBlockRow)  // as in layernorm.cu: a block per row has no registers to spare
                if (one_wave && gamma != nullptr) kernel = embedding_layernorm_kernel<T, kN, false, true>;
            launch_kernel(kernel, grid, shape.block, 0, stream, input_ids, token_type_ids, cu_seqlens, batch,
                          total_tokens, tables, static_cast<const T*>(gamma), static_cast<const T*>(beta), hidden,
                          eps, static_cast<T*>(out), prefetch);
        });
    });
}

}  // namespace padfree
