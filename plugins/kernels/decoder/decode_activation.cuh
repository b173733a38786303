// The activations decode_linear fuses after its bias, in float32, shared by its CUDA-core (few rows)
// and tensor-core (9 to 64 rows) kernels so that both round the same value.
#pragma once

#include "decode_linear.h"

namespace padfree {

__device__ __forceinline__ float activate(float y, DecodeActivation act) {
    switch (act) {
        case DecodeActivation::kRelu: return fmaxf(y, 0.f);
        case DecodeActivation::kGelu: return 0.5f * y * (1.f + erff(y * 0.70710678118654752f));
        case DecodeActivation::kGeluTanh: {
            const float inner = 0.7978845608028654f * (y + 0.044715f * y * y * y);
            return 0.5f * y * (1.f + tanhf(inner));
        }
        case DecodeActivation::kSilu: return y / (1.f + __expf(-y));
        default: return y;
    }
}

}  // namespace padfree
