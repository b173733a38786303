// The Hopper bulk-copy instructions the wgmma kernels (the attention's TMA variant, decode_gemm) load
// with: a 2D tensor copy (cp.async.bulk.tensor) from global into shared memory that signals an mbarrier
// with its byte count, and the mbarrier's init, expect and wait. sm_90 and later; call them from code
// compiled under PADFREE_WGMMA_DEVICE (wgmma_ptx.cuh), where the kernel that uses them is. On the host,
// the tensor map such a copy reads.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "../graphs/driver_entry.h"
#include "padfree.h"

namespace padfree {

// `tensor` [rows, cols] of 16-bit values (rows of cols * 2 bytes) as boxes of box_cols x box_rows with
// `swizzle`, the layout the kernel's shared memory reads; rows past the end read as zeros. False where
// the driver cannot make the map.
inline bool tensor_map_2d(CUtensorMap* map, const void* tensor, uint64_t rows, uint64_t cols, uint32_t box_cols,
                          uint32_t box_rows, CUtensorMapSwizzle swizzle, padfree_dtype dtype) {
    static const auto encode = driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
    if (encode == nullptr) return false;
    const cuuint64_t dims[2] = {cols, rows};
    const cuuint64_t row_bytes[1] = {cols * 2};
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUtensorMapDataType type =
        dtype == PADFREE_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode(map, type, 2, const_cast<void*>(tensor), dims, row_bytes, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace attention_detail {

// count arrivals complete a phase (one thread arrives with the bytes it expects).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// The initialized barriers visible to the async proxy (the copies that will signal them); a block
// barrier then publishes them to the other threads.
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Orders this thread's ordinary shared-memory accesses before the async proxy's that follow them: its
// stores and cp.async copies become visible to the tensor cores' reads after the next barrier, and the
// reads of a buffer (this thread's, and a warp's or block's after a barrier) are done before a bulk copy
// it then issues refills that buffer.
__device__ __forceinline__ void fence_shared_to_async_proxy() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// This thread's arrival, and the bytes the current phase waits for besides.
__device__ __forceinline__ void mbarrier_expect_bytes(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Returns once the phase of the given parity has completed: its copies' bytes have landed and are
// visible to this thread.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

// The box of `map` at (column, row) element coordinates into shared memory at `dst` (laid out as the
// map's swizzle says), counted on `bar`. Rows past the tensor's end arrive as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t column, int32_t row,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(bar)
        : "memory");
}

}  // namespace attention_detail
}  // namespace padfree
