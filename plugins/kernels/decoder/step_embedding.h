// A decode step's input rows in one kernel: the tokens' embeddings times the embedding scale, plus
// the position row of the step, then the family's embedding LayerNorm where it has one (arguments
// validated by capi/decoder_capi.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "padfree.h"

namespace padfree {

// out[r] = LN(round(round(word_emb[tokens[r]] * embed_scale) + positions[row(r)])), rounding to the
// dtype as the model's own ops do (HF scales and adds in the model dtype); LN only with ln_gamma.
// row(r) = pad_position where tokens[r] == pad_token (pad_token >= 0: fairseq's padding row), else
// *step + position_offset. Tokens and rows are clamped into their tables.
struct StepEmbeddingArgs {
    const int64_t* tokens;  // [rows]
    const int32_t* step;    // device scalar
    const void* word_emb;   // [vocab, hidden]
    const void* positions;  // [num_positions, hidden]
    const void* ln_gamma;   // [hidden] or null
    const void* ln_beta;
    void* out;              // [rows, hidden]
    int32_t rows;
    int32_t hidden;
    int32_t vocab;
    int32_t num_positions;
    int32_t position_offset;
    int32_t pad_token;
    int32_t pad_position;
    float embed_scale;
    float eps;
};

cudaError_t launch_step_embedding(const StepEmbeddingArgs& args, padfree_dtype dtype, cudaStream_t stream);

}  // namespace padfree
