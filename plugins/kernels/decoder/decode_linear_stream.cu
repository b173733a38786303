// decode_linear for a vocabulary-sized projection of 1-16 rows (the step's LM head): the weight in
// nn.Linear's layout streamed through shared memory by bulk copies, the products on tensor cores.
//
// Why a kernel of its own: the LM head is the largest single read of a few-row step (NLLB-600M's
// 256k x 1024 fp16: 525 MB, ~30 % of a 1x4 step) and nothing but a stream. decode_linear.cu's CUDA-core
// loop reaches ~3.6 TB/s on an H200 for it, its lanes converting and multiplying every element against
// x re-read from shared memory; bulk copies of 8-32 KB with ~64 KB in flight an SM stream 4.35 TB/s
// (bench/copy_rates.py). Here the copy engine moves each 16-feature tile (16 whole weight rows: one
// contiguous range, one copy) into shared memory, and the lanes only feed mma.sync from there.
//
// nn.Linear's layout on mma.sync without a fragment-order copy of the weight: a dot product does not
// depend on the order of its k, so each 32-element chunk of k is read as lane (g, t) = (lane / 4,
// lane % 4) taking elements [8t, 8t + 8) of weight rows g and g + 8 and of x row g (three 16-byte
// loads) and feeding two m16n8k16's: elements 8t + {0, 1, 2, 3} as the first's k = {2t, 2t + 1, 2t + 8,
// 2t + 9} and 8t + {4, ..., 7} as the second's. A and B see the same permutation, so the products are
// exact dot products over the chunk.
//
// Up to 8 rows, a block per SM, 8 warps: all 8 stage the rows (normalized on the way where there is a
// LayerNorm, as the fragment kernel does); `consumers` of them then each own a ring of `depth` tile slots
// in shared memory and walk their tiles (warp w of block b: tiles b * consumers + w, then every
// gridDim.x * consumers on), refilling a slot as soon as they have read it. The first tiles are
// requested before the PDL wait (the weight is never a step kernel's output).
//
// 9-16 rows (in_features 512, 768, 1024): all 8 warps take every tile, each its eighth of in_features,
// with its slice of every row (normalized) held in registers as mma B fragments (kRowTiles x
// in_features / 256 x 4 registers), rather than every warp reading whole tiles for its own rows (each
// slot through shared memory once per warp); the slots form one ring for the block, filled by thread 0;
// after a tile the warps' partial sums meet in shared memory (double-buffered, one barrier a tile), where
// 32 lanes a row tile add them in warp order and store the outputs. Built for up to 8 row tiles, it is
// taken up to 2 (16 rows): at 64 rows (8 row tiles, 128 registers of rows a lane) it was slower than
// cuBLAS's GEMM (H200, ms/step: NLLB 16x4 0.713 / 0.709 -> 0.719 / 0.724, Marian 16x4 0.263 / 0.268 ->
// 0.275 / 0.281); not profiled, the likely cause is a tile's 512 mma's and the barrier after them
// outlasting the tile's copy.
#include "decode_linear.h"
#include "decode_linear.cuh"

#include "../attention/attention_ptx.cuh"
#include "../ptx/tma_ptx.cuh"
#include "common.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace padfree {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kFeatures = 16;                  // a tile's output features: an mma's M
constexpr int kRows = 8;                       // an mma's N: the rows it takes at most
constexpr int kXPad = 32;                      // elements past each staged x row: lanes g = 0..7 on distinct banks
constexpr int kMaxSlots = 16;                  // tile slots a block holds at most (their mbarriers)
constexpr size_t kMaxSharedBytes = 220 * 1024;  // of the 227 KB an sm_90 block can opt into

// The block's shared memory: x rows, then consumers x depth tiles of 16 x in_features, then their
// mbarriers (after 128 bytes of alignment slack).
struct StreamLayout {
    int64_t x_bytes, tile_bytes;
    int consumers, depth;
    int64_t bytes() const { return 128 + x_bytes + int64_t{consumers} * depth * tile_bytes + kMaxSlots * 8; }
};

// As many slots as fit (at most kMaxSlots), over at most 8 consumer warps.
StreamLayout stream_layout(int32_t in_features, size_t optin) {
    StreamLayout l{};
    l.x_bytes = int64_t{kRows} * (in_features + kXPad) * 2;
    l.tile_bytes = int64_t{kFeatures} * in_features * 2;
    const int64_t room = static_cast<int64_t>(std::min(kMaxSharedBytes, optin)) - l.bytes();  // before any slot
    const int slots = static_cast<int>(std::min<int64_t>(kMaxSlots, room > 0 ? room / l.tile_bytes : 0));
    l.consumers = std::min(kWarps, slots);
    l.depth = l.consumers > 0 ? slots / l.consumers : 0;
    return l;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Tile `tile` (16 whole weight rows, `bytes` contiguous) into the slot at shared address `slot`, counted on
// the slot's mbarrier `bar` (this thread's arrival: the barrier counts one).
__device__ __forceinline__ void request_tile(uint32_t slot, uint32_t bar, const unsigned char* weight, int tile,
                                             uint32_t bytes) {
    attention_detail::mbarrier_expect_bytes(bar, bytes);
    decode_linear_detail::bulk_load_evict_first(slot, weight + static_cast<int64_t>(tile) * bytes, bytes, bar);
}

// Chunk ch (32 elements of k) of a tile's rows g and g + 8 as two m16n8k16 A fragments, lane (g, t)
// taking elements [8t, 8t + 8) of each row (`w` points at row g, element 8t; rows K apart): the first
// fragment's k = 2t, 2t + 1, 2t + 8, 2t + 9 are elements 8t + 0..3, the second's 8t + 4..7. B (x) must
// be read in the same order.
template <typename T>
__device__ __forceinline__ void chunk_fragments(const T* w, int K, int ch, uint32_t (&f0)[4], uint32_t (&f1)[4]) {
    const uint4 lo = *reinterpret_cast<const uint4*>(w + ch * 32);          // row g
    const uint4 hi = *reinterpret_cast<const uint4*>(w + 8 * K + ch * 32);  // row g + 8
    f0[0] = lo.x, f0[1] = hi.x, f0[2] = lo.y, f0[3] = hi.y;
    f1[0] = lo.z, f1[1] = hi.z, f1[2] = lo.w, f1[3] = hi.w;
}

// A lane's four products of a tile (an m16n8 accumulator: v[0], v[1] feature g at rows m, m + 1; v[2],
// v[3] feature g + 8) plus the bias, stored where the row is below a.rows.
template <typename T>
__device__ __forceinline__ void store_outputs(const DecodeLinearArgs& a, int tile, int g, int m, const float (&v)[4]) {
    const T* bias = static_cast<const T*>(a.bias);
    const int f = tile * kFeatures + g;
    const float b0 = bias != nullptr ? to_float(bias[f]) : 0.f;
    const float b8 = bias != nullptr ? to_float(bias[f + 8]) : 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int row = m + (e & 1);
        if (row < a.rows)
            static_cast<T*>(a.out)[static_cast<int64_t>(row) * a.out_features + f + (e >= 2 ? 8 : 0)] =
                from_float<T>(v[e] + (e >= 2 ? b8 : b0));
    }
}
#endif

template <typename T, int kVecs>
__global__ void __launch_bounds__(kThreads, 1)
    decode_linear_stream_kernel(const DecodeLinearArgs a, const int consumers, const int depth) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace attention_detail;
    using Mma = MmaOp<T>;
    constexpr int V = vec_size<T>();
    constexpr int K = kVecs * kWarpSize * V;
    constexpr int kChunks = K / 32;
    constexpr int ld = K + kXPad;
    constexpr uint32_t kTileBytes = kFeatures * K * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t base = (raw + 127u) & ~127u;
    unsigned char* smem = smem_raw + (base - raw);
    T* xs = reinterpret_cast<T*>(smem);
    const uint32_t tiles_at = base + static_cast<uint32_t>(kRows * ld * 2);
    const uint32_t bars_at = tiles_at + static_cast<uint32_t>(consumers * depth) * kTileBytes;
    const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const int M = a.rows;
    const int tiles = a.out_features / kFeatures;
    const int first = blockIdx.x * consumers + warp, stride = gridDim.x * consumers;
    const bool consumer = warp < consumers;
    const unsigned char* weight = static_cast<const unsigned char*>(a.weight);

    // before the wait: each consumer's first `depth` tiles
    if (consumer && lane == 0) {
        for (int s = 0; s < depth; ++s) {
            const uint32_t bar = bars_at + static_cast<uint32_t>(warp * depth + s) * 8u;
            mbarrier_init(bar, 1);
            fence_mbarrier_init();
            const int tile = first + s * stride;
            if (tile < tiles)
                request_tile(tiles_at + static_cast<uint32_t>(warp * depth + s) * kTileBytes, bar, weight, tile,
                             kTileBytes);
        }
    }
    allow_consumers();
    wait_on_producer();

    // the rows (a warp a row), zeros past M
    const T* x = static_cast<const T*>(a.x);
    if (a.ln_gamma != nullptr) {
        decode_linear_detail::layernorm_rows_into<T, kVecs, 1>(x, xs, ld, M, static_cast<const T*>(a.ln_gamma),
                                                             static_cast<const T*>(a.ln_beta), a.eps,
                                                             blockIdx.x == 0 ? static_cast<T*>(a.x_norm_out) : nullptr,
                                                             warp, kWarps, lane);
    } else if (warp < M) {
#pragma unroll
        for (int i = 0; i < kVecs; ++i) {
            const int at = (lane + i * kWarpSize) * V;
            store_vec(xs + warp * ld + at, load_vec(x + static_cast<int64_t>(warp) * K + at));
        }
    }
    if (warp >= M)
        for (int v = lane; v < K / V; v += kWarpSize) *reinterpret_cast<uint4*>(xs + warp * ld + v * V) = uint4{};
    __syncthreads();
    if (!consumer) return;

    const T* xrow = xs + g * ld + 8 * t;
    int use = 0;  // tiles this warp has taken: slot use % depth, mbarrier parity (use / depth) % 2
    for (int tile = first; tile < tiles; tile += stride, ++use) {
        const int slot = use % depth;
        const uint32_t bar = bars_at + static_cast<uint32_t>(warp * depth + slot) * 8u;
        const uint32_t w_at = tiles_at + static_cast<uint32_t>(warp * depth + slot) * kTileBytes;
        const T* w = reinterpret_cast<const T*>(smem + (w_at - base)) + g * K + 8 * t;
        mbarrier_wait(bar, static_cast<uint32_t>((use / depth) & 1));
        float c0[4] = {}, c1[4] = {};
#pragma unroll 8
        for (int ch = 0; ch < kChunks; ++ch) {
            uint32_t f0[4], f1[4];
            chunk_fragments(w, K, ch, f0, f1);
            const uint4 xv = *reinterpret_cast<const uint4*>(xrow + ch * 32);
            Mma::run(c0, f0, xv.x, xv.y);
            Mma::run(c1, f1, xv.z, xv.w);
        }
        // every lane's reads of the slot are done before it is refilled (by the async proxy)
        __syncwarp();
        const int next = tile + depth * stride;
        if (lane == 0 && next < tiles) {
            fence_shared_to_async_proxy();
            request_tile(w_at, bar, weight, next, kTileBytes);
        }
        const float v[4] = {c0[0] + c1[0], c0[1] + c1[1], c0[2] + c1[2], c0[3] + c1[3]};
        store_outputs<T>(a, tile, g, 2 * t, v);
    }
#endif
}

// ---- 9-16 rows ----------------------------------------------------------------------------------

constexpr int kWideMaxIn = 1024;     // in_features at most (row tiles x in / 256 x 4 B-fragment registers)
constexpr int kWideMaxSlots = 8;
constexpr uint32_t kStatsBytes = 64 * 8;  // the rows' (mean, rstd)

// Shared memory past the 128-byte alignment: slots, two partial-sum buffers, row statistics, mbarriers.
struct WideLayout {
    int64_t tile_bytes, part_bytes;
    int slots;
    int64_t bytes() const {
        return 128 + int64_t{slots} * tile_bytes + 2 * part_bytes + kStatsBytes + kWideMaxSlots * 8;
    }
};

WideLayout wide_layout(int32_t in_features, int row_tiles, size_t optin) {
    WideLayout l{};
    l.tile_bytes = int64_t{kFeatures} * in_features * 2;
    l.part_bytes = int64_t{kWarps} * row_tiles * kWarpSize * 4 * 4;
    const int64_t room = static_cast<int64_t>(std::min(kMaxSharedBytes, optin)) - l.bytes();  // before any slot
    l.slots = static_cast<int>(std::min<int64_t>(kWideMaxSlots, room > 0 ? room / l.tile_bytes : 0));
    return l;
}

template <typename T, int kVecs, int kRowTiles>
__global__ void __launch_bounds__(kThreads, 1)
    decode_linear_stream_rows_kernel(const DecodeLinearArgs a, const int slots) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace attention_detail;
    using Mma = MmaOp<T>;
    constexpr int V = vec_size<T>();
    constexpr int K = kVecs * kWarpSize * V;
    constexpr int kSlice = K / kWarps;          // a warp's in_features
    constexpr int kChunks = kSlice / 32;        // its 32-element chunks
    constexpr uint32_t kTileBytes = kFeatures * K * 2;
    constexpr int kPart = kWarps * kRowTiles * kWarpSize * 4;  // floats in a partial-sum buffer
    static_assert(kSlice % 32 == 0, "a warp's slice is whole chunks");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t base = (raw + 127u) & ~127u;
    unsigned char* smem = smem_raw + (base - raw);
    float* part = reinterpret_cast<float*>(smem + static_cast<int64_t>(slots) * kTileBytes);
    float2* stats = reinterpret_cast<float2*>(part + 2 * kPart);
    const uint32_t bars_at = base + static_cast<uint32_t>(slots) * kTileBytes +
                             static_cast<uint32_t>(2 * kPart * 4 + kStatsBytes);
    const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const int M = a.rows;
    const int tiles = a.out_features / kFeatures;
    const unsigned char* weight = static_cast<const unsigned char*>(a.weight);

    // before the wait: the block's first `slots` tiles
    if (tid == 0) {
        for (int s = 0; s < slots; ++s) {
            const uint32_t bar = bars_at + static_cast<uint32_t>(s) * 8u;
            mbarrier_init(bar, 1);
            fence_mbarrier_init();
            const int tile = blockIdx.x + s * gridDim.x;
            if (tile < tiles) request_tile(base + static_cast<uint32_t>(s) * kTileBytes, bar, weight, tile, kTileBytes);
        }
    }
    allow_consumers();
    wait_on_producer();

    // the rows' LayerNorm statistics (a warp a row, float32, two passes over the row in registers)
    const T* x = static_cast<const T*>(a.x);
    const bool ln = a.ln_gamma != nullptr;
    if (ln)
        for (int m = warp; m < M; m += kWarps) {
            Vec<T> v[kVecs];
#pragma unroll
            for (int i = 0; i < kVecs; ++i) v[i] = load_vec(x + static_cast<int64_t>(m) * K + (lane + i * kWarpSize) * V);
            const float2 st = decode_linear_detail::row_statistics<T, kVecs>(v, a.eps);
            if (lane == 0) stats[m] = st;
        }
    __syncthreads();

    // the warp's slice of every row as B fragments: lane (g, t) holds elements [8t, 8t + 8) of each chunk
    // of row 8j + g (normalized and rounded to T as a LayerNorm's output is; zeros past M)
    const int k0 = warp * kSlice + 8 * t;
    uint4 xb[kRowTiles][kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        Vec<T> gamma, beta;
        if (ln) {
            gamma = load_vec(static_cast<const T*>(a.ln_gamma) + k0 + 32 * c);
            beta = load_vec(static_cast<const T*>(a.ln_beta) + k0 + 32 * c);
        }
#pragma unroll
        for (int j = 0; j < kRowTiles; ++j) {
            const int m = 8 * j + g;
            Vec<T> v;
            if (m < M) {
                v = load_vec(x + static_cast<int64_t>(m) * K + k0 + 32 * c);
                if (ln) {
                    const float2 st = stats[m];
                    v = decode_linear_detail::layernorm_vec(v, st.x, st.y, gamma, beta);
                }
            } else {
                *reinterpret_cast<uint4*>(&v) = uint4{};
            }
            xb[j][c] = *reinterpret_cast<const uint4*>(&v);
        }
    }
    if (blockIdx.x == 0 && a.x_norm_out != nullptr)  // LN(x) for a caller that keeps it (written once)
        for (int i = tid; i < M * (K / V); i += kThreads) {
            const int m = i / (K / V), at = (i % (K / V)) * V;
            const float2 st = stats[m];
            store_vec(static_cast<T*>(a.x_norm_out) + static_cast<int64_t>(m) * K + at,
                      decode_linear_detail::layernorm_vec(load_vec(x + static_cast<int64_t>(m) * K + at), st.x,
                                                          st.y, load_vec(static_cast<const T*>(a.ln_gamma) + at),
                                                          load_vec(static_cast<const T*>(a.ln_beta) + at)));
        }

    int use = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++use) {
        const int slot = use % slots;
        const uint32_t bar = bars_at + static_cast<uint32_t>(slot) * 8u;
        const uint32_t w_at = base + static_cast<uint32_t>(slot) * kTileBytes;
        const T* w = reinterpret_cast<const T*>(smem + (w_at - base)) + g * K + k0;
        mbarrier_wait(bar, static_cast<uint32_t>((use / slots) & 1));
        float c[kRowTiles][4] = {};
#pragma unroll
        for (int ch = 0; ch < kChunks; ++ch) {
            uint32_t f0[4], f1[4];
            chunk_fragments(w, K, ch, f0, f1);
#pragma unroll
            for (int j = 0; j < kRowTiles; ++j) {
                Mma::run(c[j], f0, xb[j][ch].x, xb[j][ch].y);
                Mma::run(c[j], f1, xb[j][ch].z, xb[j][ch].w);
            }
        }
        float* buf = part + (use % 2) * kPart;
#pragma unroll
        for (int j = 0; j < kRowTiles; ++j)
            *reinterpret_cast<float4*>(buf + ((warp * kRowTiles + j) * kWarpSize + lane) * 4) =
                make_float4(c[j][0], c[j][1], c[j][2], c[j][3]);
        __syncthreads();  // every warp has read the slot and written its partial sums
        const int next = tile + slots * gridDim.x;
        if (tid == 0 && next < tiles) {
            fence_shared_to_async_proxy();
            request_tile(w_at, bar, weight, next, kTileBytes);
        }
        // thread (j, lane') adds the warps' sums of lane' (features g', g' + 8; rows 8j + 2t', + 1) in warp order
        if (tid < kRowTiles * kWarpSize) {
            const int j = tid / kWarpSize, l = tid % kWarpSize, fg = l / 4, ft = l % 4;
            float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int src = 0; src < kWarps; ++src) {
                const float4 p = *reinterpret_cast<const float4*>(buf + ((src * kRowTiles + j) * kWarpSize + l) * 4);
                y.x += p.x;
                y.y += p.y;
                y.z += p.z;
                y.w += p.w;
            }
            const float v[4] = {y.x, y.y, y.z, y.w};
            store_outputs<T>(a, tile, fg, 8 * j + 2 * ft, v);
        }
    }
#endif
}

template <typename T, int kVecs, int kRowTiles>
cudaError_t launch_rows_width(const DecodeLinearArgs& a, cudaStream_t stream) {
    constexpr auto kernel = decode_linear_stream_rows_kernel<T, kVecs, kRowTiles>;
    static std::atomic<size_t> opted_in{48 * 1024};
    const WideLayout l =
        wide_layout(a.in_features, kRowTiles, static_cast<size_t>(current_device_value<query_smem_per_block_optin>()));
    const size_t smem = static_cast<size_t>(l.bytes());
    if (const cudaError_t err = decode_linear_detail::opt_in_shared_memory(kernel, smem, opted_in); err != cudaSuccess)
        return err;
    const int tiles = a.out_features / kFeatures;
    const int sms = current_device_value<query_sm_count>();
    const int grid = std::max(1, std::min(sms, tiles));
    return launch_kernel(kernel, dim3(grid), dim3(kThreads), smem, stream, a, l.slots);
}

template <typename T, int kRowTiles>
cudaError_t launch_rows_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
    switch (a.in_features) {
        case 512: return launch_rows_width<T, 2, kRowTiles>(a, stream);
        case 768: return launch_rows_width<T, 3, kRowTiles>(a, stream);
        case 1024: return launch_rows_width<T, 4, kRowTiles>(a, stream);
        default: return cudaErrorInvalidValue;
    }
}


template <typename T, int kVecs>
cudaError_t launch_width(const DecodeLinearArgs& a, const StreamLayout& l, cudaStream_t stream) {
    constexpr auto kernel = decode_linear_stream_kernel<T, kVecs>;
    static std::atomic<size_t> opted_in{48 * 1024};
    const size_t smem = static_cast<size_t>(l.bytes());
    if (const cudaError_t err = decode_linear_detail::opt_in_shared_memory(kernel, smem, opted_in); err != cudaSuccess)
        return err;
    const int tiles = a.out_features / kFeatures;
    const int sms = current_device_value<query_sm_count>();
    const int grid = std::max(1, std::min(sms, (tiles + l.consumers - 1) / l.consumers));
    return launch_kernel(kernel, dim3(grid), dim3(kThreads), smem, stream, a, l.consumers, l.depth);
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, const StreamLayout& l, cudaStream_t stream) {
    switch (a.in_features) {
        case 512: return launch_width<T, 2>(a, l, stream);
        case 768: return launch_width<T, 3>(a, l, stream);
        case 1024: return launch_width<T, 4>(a, l, stream);
        case 1536: return launch_width<T, 6>(a, l, stream);
        case 2048: return launch_width<T, 8>(a, l, stream);
        default: return cudaErrorInvalidValue;
    }
}

// PADFREE_DECODE_LINEAR_STREAM=0 keeps these projections on decode_linear's other kernels (A/B runs, tests).
bool stream_allowed() {
    static const bool allowed = [] {
        const char* env = std::getenv("PADFREE_DECODE_LINEAR_STREAM");
        return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    return allowed;
}

}  // namespace

bool decode_linear_streams(int32_t rows, int32_t in_features, int32_t out_features, padfree_dtype dtype) {
    if (!stream_allowed() || (dtype != PADFREE_FLOAT16 && dtype != PADFREE_BFLOAT16)) return false;
    if (rows < 1 || rows > kDecodeLinearStreamMaxRows || out_features < kDecodeLinearStreamMinOut ||
        out_features % kFeatures != 0)
        return false;
    switch (in_features) {
        case 512: case 768: case 1024: case 1536: case 2048: break;
        default: return false;
    }
    if (rows > kRows && in_features > kWideMaxIn) return false;
    if (current_compute_capability() < 90) return false;
    const size_t optin = static_cast<size_t>(current_device_value<query_smem_per_block_optin>());
    if (rows > kRows) return wide_layout(in_features, 2, optin).slots >= 2;
    const StreamLayout l = stream_layout(in_features, optin);
    return l.consumers >= 2 && l.depth >= 1;
}

bool decode_linear_stream_takes(const DecodeLinearArgs& a, padfree_dtype dtype) {
    return a.residual == nullptr && a.activation == DecodeActivation::kNone &&
           decode_linear_streams(a.rows, a.in_features, a.out_features, dtype);
}

cudaError_t launch_decode_linear_stream(const DecodeLinearArgs& args, padfree_dtype dtype, cudaStream_t stream) {
    if (!decode_linear_stream_takes(args, dtype)) return cudaErrorInvalidValue;
    static_assert(kDecodeLinearStreamMaxRows <= 2 * kRows, "past 8 rows: two row tiles");
    if (args.rows > kRows)
        return dtype == PADFREE_FLOAT16 ? launch_rows_typed<__half, 2>(args, stream)
                                        : launch_rows_typed<__nv_bfloat16, 2>(args, stream);
    const StreamLayout l =
        stream_layout(args.in_features, static_cast<size_t>(current_device_value<query_smem_per_block_optin>()));
    if (dtype == PADFREE_FLOAT16) return launch_typed<__half>(args, l, stream);
    return launch_typed<__nv_bfloat16>(args, l, stream);
}

}  // namespace padfree
