// The Hopper instructions the wgmma kernels are built from (the attention kernel, decode_gemm): warpgroup
// matrix multiply (wgmma.mma_async, A in registers or shared memory, B from shared memory through a
// descriptor) and the fences and waits around it. They exist on sm_90a only: call them from code
// compiled under PADFREE_WGMMA_DEVICE.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PADFREE_WGMMA_DEVICE 1
#endif

namespace padfree {
namespace attention_detail {

// Orders this thread's register and shared-memory accesses before the warpgroup's next wgmma
// (needed before the first one and after other instructions wrote its accumulators or A fragments).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most N committed wgmma groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// wgmma reads its A registers and writes its accumulators asynchronously, which the compiler does
// not know: after the wait that completes them, this redefines each register, so that no use of the
// results is scheduled before the wait and no A register is reused while the tensor cores read it.
template <int N>
__device__ __forceinline__ void keep_registers(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void keep_registers(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Shared-memory matrix descriptor of an operand swizzled in SWIZZLE_BYTES-byte rows (128:
// attention_tiles.cuh's Panels128, 64: Panels64): start address, leading byte offset (between
// panels, where the operand spans them), stride byte offset (between 8-row groups: 8 rows), layout
// type in bits 62-63 (1: 128-byte swizzle, 2: 64-byte). Offsets added to a descriptor move its start.
template <int SWIZZLE_BYTES>
__device__ __forceinline__ uint64_t swizzled_descriptor(uint32_t smem, uint32_t leading_bytes) {
    static_assert(SWIZZLE_BYTES == 128 || SWIZZLE_BYTES == 64, "128- or 64-byte swizzle");
    constexpr uint64_t kStrideBytes = 8 * SWIZZLE_BYTES;
    constexpr uint64_t kLayoutType = SWIZZLE_BYTES == 128 ? 1 : 2;
    return static_cast<uint64_t>((smem & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
           ((kStrideBytes >> 4) << 32) | (kLayoutType << 62);
}
__device__ __forceinline__ uint64_t descriptor_at(uint64_t desc, uint32_t byte_offset) {
    return desc + (byte_offset >> 4);
}

#define PADFREE_WGMMA_D32                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define PADFREE_WGMMA_D32_OPERANDS(d)                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),    \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),       \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),     \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),     \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PADFREE_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define PADFREE_WGMMA_D16_OPERANDS(d)                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),    \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),       \
        "+f"(d[15])
#define PADFREE_WGMMA_M64N64K16_RS(TYPE)                                                               \
    asm volatile(                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                   \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " PADFREE_WGMMA_D32              \
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                              \
        : PADFREE_WGMMA_D32_OPERANDS(d)                                                                \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(TRANS_B))

// d[64 x 64] (+)= a[64 x 16] . b[16 x 64] over the warpgroup, fp32 accumulators: a in registers
// (each warp its 16 rows, the mma.sync A-fragment layout), b from shared memory, K-major (b^T rows
// contiguous, TRANS_B = 0) or MN-major (TRANS_B = 1). d: each warp's 16 x 64 block in the m16n8
// accumulator layout, 8-column block nb in d[4 nb .. 4 nb + 3]. accumulate = 0 overwrites d.
template <typename T, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                int accumulate) {
    if constexpr (std::is_same_v<T, __half>) {
        PADFREE_WGMMA_M64N64K16_RS("f16");
    } else {
        PADFREE_WGMMA_M64N64K16_RS("bf16");
    }
}

#define PADFREE_WGMMA_M64N32K16_RS(TYPE)                                                               \
    asm volatile(                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                   \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " " PADFREE_WGMMA_D16              \
        ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"                                              \
        : PADFREE_WGMMA_D16_OPERANDS(d)                                                                \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate), "n"(TRANS_B))

// d[64 x 32] (+)= a[64 x 16] . b[16 x 32]: wgmma_m64n64k16's contract at half the width (head_dim
// 32's P.V, decode_gemm's x chunks); d: each warp's 16 x 32 block, 8-column block nb in d[4 nb .. 4 nb + 3].
template <typename T, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc,
                                                int accumulate) {
    if constexpr (std::is_same_v<T, __half>) {
        PADFREE_WGMMA_M64N32K16_RS("f16");
    } else {
        PADFREE_WGMMA_M64N32K16_RS("bf16");
    }
}

#define PADFREE_WGMMA_M64N32K16_SS(TYPE)                                                               \
    asm volatile(                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                   \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " " PADFREE_WGMMA_D16              \
        ", %16, %17, p, 1, 1, 0, 0;\n}\n"                                                               \
        : PADFREE_WGMMA_D16_OPERANDS(d)                                                                \
        : "l"(a_desc), "l"(b_desc), "r"(accumulate))

// d[64 x 32] (+)= a[64 x 16] . b[16 x 32] with both operands in shared memory, K-major (a's rows and
// b^T's rows contiguous along k): decode_gemm's x rows and weight rows as stored. d as above.
template <typename T>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t a_desc, uint64_t b_desc, int accumulate) {
    if constexpr (std::is_same_v<T, __half>) {
        PADFREE_WGMMA_M64N32K16_SS("f16");
    } else {
        PADFREE_WGMMA_M64N32K16_SS("bf16");
    }
}

#undef PADFREE_WGMMA_M64N32K16_SS
#undef PADFREE_WGMMA_M64N32K16_RS
#undef PADFREE_WGMMA_M64N64K16_RS
#undef PADFREE_WGMMA_D16_OPERANDS
#undef PADFREE_WGMMA_D16
#undef PADFREE_WGMMA_D32_OPERANDS
#undef PADFREE_WGMMA_D32

}  // namespace attention_detail
}  // namespace padfree
