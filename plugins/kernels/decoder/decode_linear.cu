// The decode_linear kernel (decode_linear.cuh: the layer's work, shared with the decode program).
#include "decode_linear.cuh"

namespace padfree {
namespace {

using namespace decode_linear_detail;

template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads) decode_linear_kernel(DecodeLinearArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    prefetch_first_tile<T>(a, blockIdx.x);
    decode_linear_block<T, kRows, true>(a, smem_raw, blockIdx.x, gridDim.x);
}

template <typename T, int kRows>
cudaError_t launch_rows(const DecodeLinearArgs& a, cudaStream_t stream) {
    const size_t smem = decode_linear_smem<T, kRows>(a);
    auto kernel = decode_linear_kernel<T, kRows>;
    // above 48 KB the kernel must opt in; raised once per instantiation and process (a benign race:
    // every caller sets a value at least its own)
    static std::atomic<size_t> opted_in{48 * 1024};
    if (smem > opted_in.load(std::memory_order_relaxed)) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(kDecodeLinearMaxStageBytes));
        if (err != cudaSuccess) return err;
        opted_in.store(kDecodeLinearMaxStageBytes, std::memory_order_relaxed);
    }
    const int tiles = (a.out_features + kTile - 1) / kTile;
    const int sms = current_device_value<query_sm_count>();
    const int grid = sms > 0 ? min(tiles, sms * kBlocksPerSm) : tiles;
    return launch_kernel(kernel, dim3(grid), dim3(kThreads), smem, stream, a);
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
    if (a.rows <= 1) return launch_rows<T, 1>(a, stream);
    if (a.rows <= 2) return launch_rows<T, 2>(a, stream);
    if (a.rows <= 4) return launch_rows<T, 4>(a, stream);
    return launch_rows<T, 8>(a, stream);
}

}  // namespace

cudaError_t launch_decode_linear(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (args.rows == 0 || args.out_features == 0) return cudaSuccess;
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        err = launch_typed<T>(args, stream);
    });
    return err;
}

}  // namespace padfree
