// Helpers shared by the kernel families: dtype traits, 16-byte vectors, reductions, the one runtime
// dtype dispatch and the launch helper (PDL). Header-only and free of the C ABI plumbing
// (capi_util.h) so that any kernels/*.cu may include it. Keep this API stable: other families build on it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "l2_prefetch.h"
#include "padfree.h"

namespace padfree {

constexpr int kWarpSize = 32;
constexpr int kVectorBytes = 16;  // one LDG.128 / STG.128 per thread: the widest global access

// ---- dtype traits ------------------------------------------------------------------------------

template <typename T>
struct DTypeTraits;

template <>
struct DTypeTraits<float> {
    static constexpr padfree_dtype code = PADFREE_FLOAT32;
    __host__ __device__ static float to_float(float x) { return x; }
    __host__ __device__ static float from_float(float x) { return x; }
};

template <>
struct DTypeTraits<__half> {
    static constexpr padfree_dtype code = PADFREE_FLOAT16;
    __device__ static float to_float(__half x) { return __half2float(x); }
    __device__ static __half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct DTypeTraits<__nv_bfloat16> {
    static constexpr padfree_dtype code = PADFREE_BFLOAT16;
    __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

template <typename T>
__device__ __forceinline__ float to_float(T x) {
    return DTypeTraits<T>::to_float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
    return DTypeTraits<T>::from_float(x);
}

// ---- 16-byte vectors ---------------------------------------------------------------------------

// kVectorBytes of T: 4 floats or 8 halves / bfloat16s.
template <typename T>
struct alignas(kVectorBytes) Vec {
    static constexpr int size = kVectorBytes / static_cast<int>(sizeof(T));
    T v[size];
};

template <typename T>
constexpr int vec_size() {
    return Vec<T>::size;
}

// p must be 16-byte aligned. Plain (coherent) load: the data may be written by the same kernel
// elsewhere (out aliasing x), so the read-only path is not assumed.
template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
    Vec<T> r;
    *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
    return r;
}

// For parameters no kernel writes (gamma, beta, bias, embedding tables): the read-only cache path.
template <typename T>
__device__ __forceinline__ Vec<T> load_vec_ro(const T* p) {
    Vec<T> r;
    *reinterpret_cast<uint4*>(&r) = __ldg(reinterpret_cast<const uint4*>(p));
    return r;
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& v) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
}

template <typename T>
__device__ __forceinline__ void vec_to_float(const Vec<T>& v, float (&out)[Vec<T>::size]) {
#pragma unroll
    for (int i = 0; i < Vec<T>::size; ++i) out[i] = to_float(v.v[i]);
}

// v += a, in fp32.
template <typename T>
__device__ __forceinline__ void add_vec(float (&v)[Vec<T>::size], const Vec<T>& a) {
#pragma unroll
    for (int i = 0; i < Vec<T>::size; ++i) v[i] += to_float(a.v[i]);
}

template <typename T>
__device__ __forceinline__ Vec<T> vec_from_float(const float (&in)[Vec<T>::size]) {
    Vec<T> r;
#pragma unroll
    for (int i = 0; i < Vec<T>::size; ++i) r.v[i] = from_float<T>(in[i]);
    return r;
}

__host__ __device__ __forceinline__ bool is_aligned(const void* p, int bytes) {
    return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

template <typename I>
__host__ __device__ constexpr I ceil_div(I a, I b) {
    return (a + b - 1) / b;
}

// bytes rounded up to a whole number of 16-byte vectors: where a workspace's next part starts.
__host__ __device__ constexpr int64_t round_up_vectors(int64_t bytes) {
    return ceil_div<int64_t>(bytes, kVectorBytes) * kVectorBytes;
}

// Softmax kernels work in base 2 (exp2 is one instruction): exp(x) = exp2(x * log2 e), so scores
// are scaled by softmax_scale * kLog2e once.
constexpr float kLog2e = 1.4426950408889634f;

// ---- reductions --------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the whole (one-dimensional) block, returned to every thread. blockDim.x must be a
// multiple of 32. Safe to call repeatedly: the leading barrier keeps a call from overwriting
// scratch that the previous call's threads may still be reading.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float scratch[kWarpSize];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? scratch[lane] : 0.f);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Max over the whole (one-dimensional) block, returned to every thread; `scratch` is 32 floats of
// shared memory (the caller's, so that kernels sizing their shared memory by hand can place it).
// blockDim.x must be a multiple of 32. Barriers on both sides of the scratch write, as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_max(lane < static_cast<int>(blockDim.x / kWarpSize) ? scratch[lane] : -CUDART_INF_F);
}

// Inclusive scan over the block (Hillis-Steele within warps, then over warp totals). Returns the
// block's total in *total; `warp_totals` is 32 ints of shared memory.
__device__ __forceinline__ int block_inclusive_scan(int v, int* warp_totals, int* total) {
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize;
#pragma unroll
    for (int offset = 1; offset < kWarpSize; offset *= 2) {
        const int n = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += n;
    }
    if (lane == kWarpSize - 1) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int t = lane < warps ? warp_totals[lane] : 0;
#pragma unroll
        for (int offset = 1; offset < kWarpSize; offset *= 2) {
            const int n = __shfl_up_sync(0xffffffffu, t, offset);
            if (lane >= offset) t += n;
        }
        warp_totals[lane] = t;
    }
    __syncthreads();
    if (warp > 0) v += warp_totals[warp - 1];
    *total = warp_totals[warps - 1];
    __syncthreads();  // the next call rewrites warp_totals
    return v;
}

// cu_seqlens[1 + i] = sum of max(lengths[0..i], 0) and cu_seqlens[0] = 0, by the whole (one-dimensional)
// block looping over chunks of blockDim.x; returns the total to every thread. Negative lengths count
// as 0 so that cu_seqlens never decreases (memory safety downstream). lengths may alias cu_seqlens + 1
// (each thread reads its element before any thread of the chunk writes).
__device__ __forceinline__ int block_prefix_sum(const int32_t* lengths, int32_t batch, int32_t* cu_seqlens) {
    __shared__ int warp_totals[kWarpSize];
    int carry = 0;
    for (int32_t base = 0; base < batch; base += blockDim.x) {
        const int32_t i = base + static_cast<int32_t>(threadIdx.x);
        int chunk_total;
        const int inclusive = block_inclusive_scan(i < batch ? max(lengths[i], 0) : 0, warp_totals, &chunk_total);
        if (i < batch) cu_seqlens[i + 1] = carry + inclusive;
        carry += chunk_total;
    }
    if (threadIdx.x == 0) cu_seqlens[0] = 0;
    return carry;
}

// ---- runtime dtype dispatch --------------------------------------------------------------------

template <typename T>
struct TypeTag {
    using type = T;
};

// The one place a runtime padfree_dtype becomes a template type:
//   dispatch_dtype(dtype, [&](auto tag) { using T = typename decltype(tag)::type; launch<T>(...); });
// Returns false (calling nothing) for an unknown dtype; the C ABI checks dtype before this.
template <typename F>
bool dispatch_dtype(padfree_dtype dtype, F&& f) {
    switch (dtype) {
        case PADFREE_FLOAT32: f(TypeTag<float>{}); return true;
        case PADFREE_FLOAT16: f(TypeTag<__half>{}); return true;
        case PADFREE_BFLOAT16: f(TypeTag<__nv_bfloat16>{}); return true;
    }
    return false;
}

// ---- programmatic dependent launch (PDL, sm_90+) -----------------------------------------------

// Every kernel launched through launch_kernel calls this before its first global access: with PDL
// its grid may be resident while the previous kernel still runs, and this returns only once that
// kernel has completed and its writes are visible.
__device__ __forceinline__ void wait_on_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Starts moving p's 128-byte line into L2, for weights read after wait_on_producer: they are never
// the previous kernel's output, and a forward streams ~170 MB of GEMM weights (BERT-base), so its
// LayerNorm parameters and biases are rarely still cached; at small batches those DRAM round trips
// sit on a latency-bound kernel's critical path, and prefetching overlaps them with the producer.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Spreads `range` over the grid's threads, one prefetch.global.L2 per 128-byte line. H100, BERT-base:
// requested this way before the wait, the LayerNorms' prefetches cost them less
// than they save the GEMMs after; as 16 KB bulk prefetches (cp.async.bulk.prefetch.L2) each
// LayerNorm ran ~7 us longer, as if its blocks waited for their bulk requests before exiting.
__device__ __forceinline__ void prefetch_range_l2(L2Prefetch range) {
    if (range.bytes <= 0) return;
    constexpr uint64_t kLine = 128;
    // the line holding a valid byte is mapped memory: the range's first and last lines are safe whole
    const uint64_t first = reinterpret_cast<uint64_t>(range.ptr) & ~(kLine - 1);
    const uint64_t end = reinterpret_cast<uint64_t>(range.ptr) + static_cast<uint64_t>(range.bytes);
    // consecutive lines on consecutive blocks: each SM's share of the requests as even as it gets
    const uint64_t blocks = uint64_t{gridDim.x} * gridDim.y * gridDim.z;
    const uint64_t thread = threadIdx.x + blockDim.x * (threadIdx.y + uint64_t{blockDim.y} * threadIdx.z);
    const uint64_t block = blockIdx.x + gridDim.x * (blockIdx.y + uint64_t{gridDim.y} * blockIdx.z);
    const uint64_t stride = blocks * blockDim.x * blockDim.y * blockDim.z * kLine;
    for (uint64_t at = first + (thread * blocks + block) * kLine; at < end; at += stride)
        prefetch_l2(reinterpret_cast<const void*>(at));
}

// A hint that the next kernel may be scheduled now (else it is when this grid's CTAs exit). Safe
// anywhere: the next kernel's wait_on_producer still waits for this whole grid.
__device__ __forceinline__ void allow_consumers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// query(device) for the current device, cached per device (0 where it cannot be read): kernel
// choices that depend on the device sit on the host's launch path.
template <int (*query)(int device)>
inline int current_device_value() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    constexpr int kMaxDevices = 64;
    static std::atomic<int> known[kMaxDevices];  // 0: not queried yet
    int value = device < kMaxDevices ? known[device].load(std::memory_order_relaxed) : 0;
    if (value == 0) {
        value = query(device);
        if (device < kMaxDevices) known[device].store(value, std::memory_order_relaxed);
    }
    return value;
}

inline int query_compute_capability(int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return 0;
    return 10 * major + minor;
}

// One device attribute (0 where it cannot be read), a query for current_device_value.
template <cudaDeviceAttr kAttribute>
inline int query_attribute(int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, kAttribute, device) == cudaSuccess ? value : 0;
}
constexpr auto query_sm_count = query_attribute<cudaDevAttrMultiProcessorCount>;
constexpr auto query_smem_per_sm = query_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>;
constexpr auto query_smem_per_block_optin = query_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>;
constexpr auto query_l2_bytes = query_attribute<cudaDevAttrL2CacheSize>;

// The current device's compute capability as 10 * major + minor (0 where it cannot be read).
inline int current_compute_capability() { return current_device_value<query_compute_capability>(); }

// Whether the library's wgmma kernels run on the current device: the library holds sm_90a code
// (CMakeLists.txt defines PADFREE_HAS_SM90A only when it holds no plain sm_90 code the driver could
// load instead) and the device is compute capability 9.0 (wgmma is not in later chips' instruction sets).
inline bool wgmma_available() {
#if defined(PADFREE_HAS_SM90A)
    return current_compute_capability() == 90;
#else
    return false;
#endif
}

// Whether a grid of `ctas` takes at most `waves` waves of ctas_per_sm CTAs on every SM of the current
// device (false where the SM count cannot be read).
inline bool fits_waves(int64_t ctas, int ctas_per_sm, double waves = 1.0) {
    const int sms = current_device_value<query_sm_count>();
    return sms > 0 && static_cast<double>(ctas) <= waves * sms * ctas_per_sm;
}

// Whether a kernel that reads `bytes` of its producer's output row by row should take the rows last
// first. A producer (a GEMM, or another padfree kernel going forward) writes its rows roughly first
// to last; where the tensor does not fit in half the L2, its first rows have been evicted by the time
// the consumer starts and its last rows are still there. Going last first, the consumer reads those
// from L2 before they are evicted too, and the rows it writes last (its first ones) are in L2 for
// the next consumer, which goes first to last. (H100, BERT-base 64x512: the 24 skip LayerNorms 0.72
// -> 0.67 ms per forward.) PADFREE_ROW_ORDER=forward|reverse forces either, for A/B runs.
inline bool rows_last_first(int64_t bytes) {
    static const int forced = [] {
        const char* env = std::getenv("PADFREE_ROW_ORDER");
        if (env == nullptr) return 0;
        return std::strcmp(env, "reverse") == 0 ? 1 : std::strcmp(env, "forward") == 0 ? -1 : 0;
    }();
    if (forced != 0) return forced > 0;
    const int64_t l2 = current_device_value<query_l2_bytes>();
    return l2 > 0 && bytes > l2 / 2;
}

// PDL needs compute capability 9.0+; PADFREE_PDL=0 turns it off (to compare, or to rule it out).
inline bool pdl_enabled() {
    static const bool allowed = [] {
        const char* env = std::getenv("PADFREE_PDL");
        return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    return allowed && current_compute_capability() >= 90;
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where enabled, in thread-block clusters of
// cluster_x blocks along x where cluster_x > 1 (sm_90+). The arguments convert to the kernel's parameter
// types (cudaLaunchKernelEx's template). A launch error is returned and, as for <<<>>>, also left for
// cudaGetLastError (the C ABI's check_launch).
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, unsigned cluster_x,
                                    size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attrs[2]{};
    unsigned count = 0;
    if (pdl_enabled()) {
        attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[count++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attrs[count].id = cudaLaunchAttributeClusterDimension;
        attrs[count].val.clusterDim.x = cluster_x;
        attrs[count].val.clusterDim.y = 1;
        attrs[count++].val.clusterDim.z = 1;
    }
    const cudaLaunchConfig_t config{grid, block, smem, stream, attrs, count};
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args&&... args) {
    return launch_kernel_clustered(kernel, grid, block, 1, smem, stream, std::forward<Args>(args)...);
}

}  // namespace padfree
