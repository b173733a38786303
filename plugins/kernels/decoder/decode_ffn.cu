// A decode step's feed-forward sublayer for a few rows (batch x beams 1x4, 2x4, 8x1) as one kernel:
// LN(x), fc1 with its bias and activation, fc2 with its bias and the residual.
//
// Why one kernel: as two decode_linear launches, fc2's weights (8 MB in NLLB) are requested only once
// fc1's 512 blocks have left room for fc2's beside them, so they stream after fc1 has ended, and each
// layer pays its own wait, staging and LayerNorm chain. Here every block holds a slice of both
// layers' weights in shared memory, both requested by bulk copies before the kernel waits on its
// producer (PDL): the sublayer's 16 MB are in flight while the attention before it still runs. The
// price is one grid barrier between the layers (each fc2 output needs every fc1 feature), which the
// grid can afford because it is one block per SM, all resident at once (a cooperative launch: the
// driver refuses a grid that could not be, rather than let its barrier wait forever).
//
// Layout: block b takes fc1 features [b F1, b F1 + F1) and fc2 features [b F2, b F2 + F2) (F2 =
// hidden / SMs rounded up, F1 = ffn / blocks rounded up). Its 8 warps compute out^T = W x^T on mma.sync
// m16n8k16 (16 weight rows as M, the staged rows, zeros past `rows`, as N: decode_linear_mma.cu's
// fragments, loaded without ldmatrix), each warp one M-tile and a share of k, their partial sums added
// in a fixed order (deterministic). fc1's outputs, rounded to the dtype as a layer's output is, go to
// the workspace h; after the barrier every block stages all of h and computes its fc2 features. Each
// staged row is padded by 64 bytes: lane (g, t) reads 16 bytes at row g, column 8t of a 32-wide chunk,
// and with row strides of 4 mod 8 16-byte units a quarter-warp's eight loads fall on distinct banks.
#include "decode_ffn.h"

#include <cstdlib>
#include <cstring>

#include "../attention/attention_ptx.cuh"
#include "../ptx/tma_ptx.cuh"
#include "common.cuh"
#include "decode_linear.cuh"

namespace padfree {
namespace {

using attention_detail::MmaOp;
constexpr int kWarps = kDecodeFfnThreads / kWarpSize;
constexpr int kRows = kDecodeFfnMaxRows;
constexpr int kChunk = 32;                 // k per step: two mma's
constexpr int kVec = 8;                    // 16-bit values per 16-byte vector
constexpr int kTileFloats = 16 * kRows;    // one warp's partial sums: 16 features x 8 rows
constexpr int kMaxFeatures = kDecodeFfnMaxFc1Features;  // the bias slots of either layer
static_assert(kMaxFeatures == 16 * kWarps && kDecodeFfnMaxFc2Features <= kMaxFeatures, "one M-tile per warp");

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // the kernel's body is sm_90's only

// Warp `warp`'s share of out^T[features, 8] = W[features, K] x^T (W's rows at ws + f ldw, x's at xs + r
// ldx, both in shared memory, K = 32 chunks): M-tile warp % mtiles, k-group warp / mtiles of kWarps /
// mtiles groups; its partial sums into red[warp][16][8]. Weight rows past `features` read the last one
// (their sums are never used).
template <typename T>
__device__ __forceinline__ void partial_products(const T* ws, int ldw, int features, const T* xs, int ldx,
                                                 int chunks, float* red, int warp, int lane) {
    const int mtiles = (features + 15) / 16, groups = kWarps / mtiles;
    if (warp >= mtiles * groups) return;
    const int m = warp % mtiles, q = warp / mtiles;
    const int g = lane / 4, t = lane % 4;
    const int c0 = q * chunks / groups, c1 = (q + 1) * chunks / groups;
    const T* w_lo = ws + min(16 * m + g, features - 1) * ldw + t * kVec;
    const T* w_hi = ws + min(16 * m + g + 8, features - 1) * ldw + t * kVec;
    const T* x_row = xs + g * ldx + t * kVec;
    float acc[4] = {};
#pragma unroll 4
    for (int c = c0; c < c1; ++c) {
        const uint4 lo = *reinterpret_cast<const uint4*>(w_lo + c * kChunk);
        const uint4 hi = *reinterpret_cast<const uint4*>(w_hi + c * kChunk);
        const uint4 xv = *reinterpret_cast<const uint4*>(x_row + c * kChunk);
        const uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t second[4] = {lo.z, hi.z, lo.w, hi.w};
        MmaOp<T>::run(acc, first, xv.x, xv.y);
        MmaOp<T>::run(acc, second, xv.z, xv.w);
    }
    // c0, c1: feature g, rows 2t and 2t + 1; c2, c3: feature g + 8
    float* r = red + warp * kTileFloats;
    *reinterpret_cast<float2*>(r + g * kRows + 2 * t) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2*>(r + (g + 8) * kRows + 2 * t) = make_float2(acc[2], acc[3]);
}

// Feature f's sum for row r: the k-groups' partial sums in group order.
__device__ __forceinline__ float reduced(const float* red, int features, int f, int r) {
    const int mtiles = (features + 15) / 16, groups = kWarps / mtiles;
    const int m = f / 16, fi = f % 16;
    float s = 0.f;
    for (int q = 0; q < groups; ++q) s += red[(q * mtiles + m) * kTileFloats + fi * kRows + r];
    return s;
}

// Every block of the grid arrives before any leaves, its global writes before the barrier visible to
// every block after it. `arrivals` only grows (64 bits: it never wraps): the grid's blocks take values
// [k G, (k + 1) G) of it, so each block knows the count that means all of its grid has arrived, and
// nothing has to put it back (no reset on the barrier's critical path).
__device__ __forceinline__ void grid_barrier(unsigned long long* arrivals) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned long long grid = gridDim.x;
        unsigned long long seen;
        // release: this block's writes (ordered before thread 0 by the block barrier) before its arrival
        asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(seen) : "l"(arrivals) : "memory");
        const unsigned long long all = (seen / grid + 1) * grid;
        unsigned long long now;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(arrivals) : "memory");
        } while (now < all);
    }
    __syncthreads();
}

// `count` rows of `width` elements from global rows (stride width) into shared rows (stride ld), all in
// flight at once; rows [count, kRows) zeroed.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, int ld, const T* src, int width, int count) {
    const int vecs = width / kVec;
    for (int i = threadIdx.x; i < kRows * vecs; i += kDecodeFfnThreads) {
        const int r = i / vecs, v = i % vecs;
        const uint32_t to = attention_detail::smem_addr(dst + r * ld + v * kVec);
        if (r < count) {
            attention_detail::cp_async_16_full(to, src + static_cast<int64_t>(r) * width + v * kVec);
        } else {
            attention_detail::st_shared_zero_16(to);
        }
    }
    attention_detail::cp_async_commit();
    attention_detail::cp_async_wait<0>();
    __syncthreads();
}
#endif

template <typename T>
__global__ void __launch_bounds__(kDecodeFfnThreads, 1) decode_ffn_kernel(DecodeFfnArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int H = a.hidden, I = a.ffn, R = a.rows;
    const int ld1 = H + kDecodeFfnPad, ld2 = I + kDecodeFfnPad;
    const int F1 = a.fc1_features, F2 = a.fc2_features;
    const int n1 = blockIdx.x * F1, n2 = blockIdx.x * F2;  // each layer's first feature here
    // this block's features (the last blocks may hold fewer, fc1 possibly none)
    const int f1 = max(0, min(F1, I - n1)), f2 = max(0, min(F2, H - n2));
    // decode_ffn_plan's layout
    T* w1s = reinterpret_cast<T*>(smem_raw);       // [F1][ld1]
    T* w2s = w1s + F1 * ld1;                       // [F2][ld2]
    T* xs = w2s + F2 * ld2;                        // [8][ld1]: x, then LN(x)
    T* ln_params = xs + kRows * ld1;               // gamma, beta [H]
    T* hs = a.alias_h ? w1s : ln_params + 2 * H;   // [8][ld2]: h, once fc1 is done with its weights
    float* red = reinterpret_cast<float*>(a.alias_h ? ln_params + 2 * H : hs + kRows * ld2);  // [8][16][8]
    float* bias1 = red + kWarps * kTileFloats;     // [kMaxFeatures] each
    float* bias2 = bias1 + kMaxFeatures;
    uint64_t* bars = reinterpret_cast<uint64_t*>(bias2 + kMaxFeatures);
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const uint32_t bar1 = attention_detail::smem_addr(bars), bar2 = bar1 + 8;
    const T* w1 = static_cast<const T*>(a.w1);
    const T* w2 = static_cast<const T*>(a.w2);

    // Weights and parameters are not the producer's output: requested before the wait, each weight row
    // by one bulk copy into its padded row.
    if (threadIdx.x == 0) {
        attention_detail::mbarrier_init(bar1, 1);
        attention_detail::mbarrier_init(bar2, 1);
        attention_detail::fence_mbarrier_init();
        attention_detail::mbarrier_expect_bytes(bar1, static_cast<uint32_t>(f1 * H * sizeof(T)));
        attention_detail::mbarrier_expect_bytes(bar2, static_cast<uint32_t>(f2 * I * sizeof(T)));
    }
    __syncthreads();
    if (warp == 0) {  // W1's rows first: fc1 needs them while W2's still stream
        for (int f = lane; f < f1; f += kWarpSize)
            decode_linear_detail::bulk_load_evict_first(attention_detail::smem_addr(w1s + f * ld1),
                                                        w1 + static_cast<int64_t>(n1 + f) * H,
                                                        static_cast<uint32_t>(H * sizeof(T)), bar1);
        __syncwarp();
        for (int f = lane; f < f2; f += kWarpSize)
            decode_linear_detail::bulk_load_evict_first(attention_detail::smem_addr(w2s + f * ld2),
                                                        w2 + static_cast<int64_t>(n2 + f) * I,
                                                        static_cast<uint32_t>(I * sizeof(T)), bar2);
    }
    const bool ln = a.ln_gamma != nullptr;
    if (ln)
        for (int v = threadIdx.x; v < H / kVec; v += kDecodeFfnThreads) {
            store_vec(ln_params + v * kVec, load_vec(static_cast<const T*>(a.ln_gamma) + v * kVec));
            store_vec(ln_params + H + v * kVec, load_vec(static_cast<const T*>(a.ln_beta) + v * kVec));
        }
    const T* b1 = static_cast<const T*>(a.b1);
    const T* b2 = static_cast<const T*>(a.b2);
    if (threadIdx.x < kMaxFeatures) {
        bias1[threadIdx.x] = b1 != nullptr && threadIdx.x < f1 ? to_float(b1[n1 + threadIdx.x]) : 0.f;
        bias2[threadIdx.x] = b2 != nullptr && threadIdx.x < f2 ? to_float(b2[n2 + threadIdx.x]) : 0.f;
    }
    wait_on_producer();

    // fc2's epilogue item of this thread (f2 x R <= 256 items: one each), its residual requested now
    const int out_f = threadIdx.x % max(f2, 1), out_r = threadIdx.x / max(f2, 1);
    const bool has_out = f2 > 0 && out_r < R;
    const T* residual = static_cast<const T*>(a.residual);
    const T res = has_out && residual != nullptr ? residual[static_cast<int64_t>(out_r) * H + n2 + out_f]
                                                 : from_float<T>(0.f);

    stage_rows(xs, ld1, static_cast<const T*>(a.x), H, R);
    if (ln) {
        decode_linear_detail::layernorm_staged_rows(xs, ld1, R, H, ln_params, ln_params + H, a.eps, static_cast<T*>(nullptr), warp,
                                                    kWarps, lane);
        __syncthreads();
    }
    // every block is resident (one per SM, a cooperative grid): the next kernel may launch and request
    // its weights while this one computes
    allow_consumers();

    // fc1 -> h
    attention_detail::mbarrier_wait(bar1, 0);
    if (f1 > 0) partial_products(w1s, ld1, f1, xs, ld1, H / kChunk, red, warp, lane);
    __syncthreads();
    T* h = static_cast<T*>(a.h);
    for (int i = threadIdx.x; i < f1 * R; i += kDecodeFfnThreads) {
        const int f = i % f1, r = i / f1;
        const float y = decode_linear_detail::activate(reduced(red, f1, f, r) + bias1[f], a.activation);
        h[static_cast<int64_t>(r) * I + n1 + f] = from_float<T>(y);
    }
    grid_barrier(a.barrier);

    // fc2 over all of h -> out
    stage_rows(hs, ld2, static_cast<const T*>(h), I, R);
    attention_detail::mbarrier_wait(bar2, 0);
    if (f2 > 0) partial_products(w2s, ld2, f2, hs, ld2, I / kChunk, red, warp, lane);
    __syncthreads();
    if (has_out) {
        float y = reduced(red, f2, out_f, out_r) + bias2[out_f];
        y += a.residual_normalized ? to_float(xs[out_r * ld1 + n2 + out_f]) : to_float(res);
        static_cast<T*>(a.out)[static_cast<int64_t>(out_r) * H + n2 + out_f] = from_float<T>(y);
    }
#endif
}

}  // namespace

const char* decode_ffn_unsupported(int32_t rows, int32_t hidden, int32_t ffn, padfree_dtype dtype) {
    if (dtype != PADFREE_FLOAT16 && dtype != PADFREE_BFLOAT16) return "it runs float16 or bfloat16 (tensor cores)";
    if (rows < 1 || rows > kDecodeFfnMaxRows) return "it takes 1 to 8 rows";
    if (hidden <= 0 || ffn <= 0 || hidden % kDecodeFfnWidthMultiple != 0 || ffn % kDecodeFfnWidthMultiple != 0)
        return "hidden and ffn must be positive multiples of 32";
    if (current_compute_capability() < 90) return "it needs compute capability 9.0 or newer";
    const DecodeFfnPlan plan = decode_ffn_plan(hidden, ffn, current_device_value<query_sm_count>());
    if (plan.blocks == 0 || plan.fc1_features > kDecodeFfnMaxFc1Features ||
        plan.fc2_features > kDecodeFfnMaxFc2Features)
        return "a block would hold more than 128 fc1 or 32 fc2 features (too wide for this GPU's SM count)";
    if (plan.shared_bytes > current_device_value<query_smem_per_block_optin>())
        return "a block's weight slices and staged rows exceed this GPU's shared memory per block";
    int cooperative = 0, device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess || !cooperative)
        return "this GPU does not take cooperative launches";
    return nullptr;
}

namespace {

template <typename T>
cudaError_t launch_typed(const DecodeFfnArgs& a, size_t smem, int blocks, cudaStream_t stream) {
    auto kernel = decode_ffn_kernel<T>;
    static std::atomic<size_t> opted_in{48 * 1024};  // per instantiation
    if (const cudaError_t err = decode_linear_detail::opt_in_shared_memory(kernel, smem, opted_in); err != cudaSuccess)
        return err;
    cudaLaunchAttribute attrs[2]{};
    unsigned count = 0;
    // cooperative: every block resident at once or the launch refused (a partly resident grid would wait at
    // its barrier forever, e.g. beside another stream's); it costs ~1 us a launch against a plain one
    // (H200). PADFREE_DECODE_FFN_COOPERATIVE=0 launches plainly: compute-sanitizer refuses the cooperative
    // grid as too large (its instrumentation's resources), so the sanitizers run the kernel that way.
    static const bool cooperative = [] {
        const char* env = std::getenv("PADFREE_DECODE_FFN_COOPERATIVE");
        return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    if (cooperative) {
        attrs[count].id = cudaLaunchAttributeCooperative;
        attrs[count++].val.cooperative = 1;
    }
    if (pdl_enabled()) {
        attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[count++].val.programmaticStreamSerializationAllowed = 1;
    }
    const cudaLaunchConfig_t config{dim3(static_cast<unsigned>(blocks)), dim3(kDecodeFfnThreads), smem, stream, attrs,
                                    count};
    return cudaLaunchKernelEx(&config, kernel, a);
}

}  // namespace

cudaError_t launch_decode_ffn(DecodeFfnArgs a, padfree_dtype dtype, cudaStream_t stream) {
    if (decode_ffn_unsupported(a.rows, a.hidden, a.ffn, dtype) != nullptr) return cudaErrorInvalidValue;
    const DecodeFfnPlan plan = decode_ffn_plan(a.hidden, a.ffn, current_device_value<query_sm_count>());
    a.fc1_features = plan.fc1_features;
    a.fc2_features = plan.fc2_features;
    a.alias_h = plan.alias_h;
    const size_t smem = static_cast<size_t>(plan.shared_bytes);
    return dtype == PADFREE_FLOAT16 ? launch_typed<__half>(a, smem, plan.blocks, stream)
                                    : launch_typed<__nv_bfloat16>(a, smem, plan.blocks, stream);
}

}  // namespace padfree
