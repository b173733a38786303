// A decode step's decoder as one kernel: a list of decode_linear / self-attention / cross-attention
// operations (each with the arguments of its own call), run back to back by one cooperative grid with a
// grid barrier between them (arguments validated by capi/decoder_capi.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cross_attention.h"
#include "decode_linear.h"
#include "padfree.h"
#include "self_attention.h"

namespace padfree {

enum class DecodeProgramOpKind : int32_t { kLinear = 0, kSelfAttention = 1, kCrossAttention = 2 };

struct DecodeProgramOp {
    DecodeProgramOpKind kind;
    union {
        DecodeLinearArgs linear;
        SelfAttentionArgs self_attention;
        CrossAttentionArgs cross_attention;
    };
};

// Operations of one program: a 24-layer decoder's 8 per layer and its vocabulary projection fit. The
// program travels as the kernel's parameter (up to 32 KB since CUDA 12.1), so nothing is copied to
// the device first and a captured graph holds it.
constexpr int32_t kDecodeProgramMaxOps = 200;

struct DecodeProgramOps {
    int32_t count;
    DecodeProgramOp ops[kDecodeProgramMaxOps];
};

// The grid barrier's state: zeroed once by the caller, left ready for the next launch by each one.
struct DecodeProgramBarrier {
    unsigned int arrived;
    unsigned int generation;
};

// Every op has the same rows (<= kDecodeLinearMaxRows); attention runs unsplit, with no workspace.
// One barrier serves one program at a time (programs on concurrent streams need one each).
cudaError_t launch_decode_program(const DecodeProgramOps& program, DecodeProgramBarrier* barrier, padfree_dtype dtype,
                                  cudaStream_t stream);

}  // namespace padfree
