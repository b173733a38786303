// Bias + GELU, elementwise over 16-byte vectors in fp32. Blocks are (column lanes x rows) so the
// bias vector of a thread is fixed per row and no per-element division by cols is needed.
#include "activation.h"

#include "common.cuh"

namespace padfree {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxColumnLanes = 128;

template <int kApproximate>
__device__ __forceinline__ float gelu(float x) {
    if constexpr (kApproximate == PADFREE_GELU_TANH) {
        constexpr float kSqrt2OverPi = 0.7978845608028654f;
        return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    } else {
        constexpr float kRsqrt2 = 0.7071067811865476f;
        return 0.5f * x * (1.f + erff(x * kRsqrt2));
    }
}

// out may alias x: each vector is read, then written, by one thread.
template <typename T, int kApproximate>
__global__ void bias_gelu_kernel(const T* x, const T* bias, int64_t rows, int cols, T* out) {
    wait_on_producer();
    constexpr int V = Vec<T>::size;
    const int nvec = cols / V;
    for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows;
         row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
        const int64_t offset = row * cols;
        for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
            float v[V];
            vec_to_float(load_vec(x + offset + c * V), v);
            if (bias != nullptr) {
                float b[V];
                vec_to_float(load_vec_ro(bias + c * V), b);
#pragma unroll
                for (int j = 0; j < V; ++j) v[j] += b[j];
            }
#pragma unroll
            for (int j = 0; j < V; ++j) v[j] = gelu<kApproximate>(v[j]);
            store_vec(out + offset + c * V, vec_from_float<T>(v));
        }
    }
}

}  // namespace

void launch_bias_gelu(const void* x, const void* bias, int64_t rows, int32_t cols, int32_t approximate,
                      padfree_dtype dtype, void* out, cudaStream_t stream) {
    if (rows == 0) return;
    dispatch_dtype(dtype, [&](auto dtype_tag) {
        using T = typename decltype(dtype_tag)::type;
        const int nvec = cols / vec_size<T>();
        const int lanes = min(kMaxColumnLanes, ceil_div(nvec, kWarpSize) * kWarpSize);
        const dim3 block(lanes, kThreads / lanes);
        constexpr int64_t kMaxGrid = 1 << 20;  // beyond this, blocks loop over rows
        const int64_t blocks = ceil_div<int64_t>(rows, block.y);
        const unsigned grid = static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
        auto kernel = approximate == PADFREE_GELU_TANH ? bias_gelu_kernel<T, PADFREE_GELU_TANH>
                                                       : bias_gelu_kernel<T, PADFREE_GELU_ERF>;
        launch_kernel(kernel, grid, block, 0, stream, static_cast<const T*>(x), static_cast<const T*>(bias), rows,
                      cols, static_cast<T*>(out));
    });
}

}  // namespace padfree
