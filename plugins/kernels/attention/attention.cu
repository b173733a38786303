// Kernel choice for fused varlen attention: the one place runtime sizes become template arguments.
// Instantiations: {fp16, bf16} x {32, 64, 128} x {resident, tiled, wgmma (four for head_dim 32 and
// 64)} + fp32 x {32, 64, 128}.
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "attention.h"
#include "attention_fp32.cuh"
#include "attention_tc.cuh"
#include "attention_wgmma.cuh"
#include "common.cuh"

namespace padfree {
namespace {

using attention_detail::attention_tc_kernel;
using attention_detail::attention_wgmma_kernel;
using attention_detail::TileConfig;
using attention_detail::WgmmaConfig;

// Up to this length a sequence's whole K/V fits one 128-key tile: one exact softmax, no rescaling.
// Longer sequences take the tiled online-softmax path. Both use 64-row query tiles (4 warps of 16
// rows): measured against 128-row tiles (8 warps) they were as fast on long sequences and faster
// on short ones (more CTAs, fewer rows wasted past each sequence's end).
constexpr int kResidentMaxSeqlen = 128;

// kWgmmaTmaHeld: kWgmmaTma with the Q and V bias in registers before the PDL wait (WgmmaConfig's
// HELD_BIAS), the default at head_dim 32 and 64 (choose_path).
enum class Path { kResident, kTiled, kWgmma, kWgmmaTma, kWgmmaTmaHeld, kFp32 };

// CTAs per SM the wgmma kernel's registers must allow at head_dim 32 and 64 (WgmmaConfig's
// MIN_BLOCKS): four, the budget of KERNELS.md. Head_dim 32 takes 98-110 registers uncapped (64:
// 122-128), still four CTAs; a fifth needs <= 96, where ptxas spills and serializes the wgmmas (C7512).
constexpr int kWgmmaMinBlocks = 4;

template <int HD>
using HeldBiasConfig = WgmmaConfig<HD, 64, 2, kWgmmaMinBlocks, true, true, true>;

// PADFREE_ATTENTION_PATH=resident|tiled|wgmma|tma|held overrides the choice, so that a benchmark can
// time every path on one build ("resident" only where the sequences fit it; "wgmma", "tma" and "held"
// where they run: the wgmma kernel loading by cp.async, or at head_dim 32 and 64 by tensor copies,
// the default, with its bias read where used or held).
bool forced_path(int32_t max_seqlen, Path* path) {
    const char* name = std::getenv("PADFREE_ATTENTION_PATH");
    if (name == nullptr) return false;
    if (std::strcmp(name, "resident") == 0 && max_seqlen <= kResidentMaxSeqlen) *path = Path::kResident;
    else if (std::strcmp(name, "tiled") == 0) *path = Path::kTiled;
    else if (std::strcmp(name, "wgmma") == 0 && wgmma_available()) *path = Path::kWgmma;
    else if (std::strcmp(name, "tma") == 0 && wgmma_available()) *path = Path::kWgmmaTma;
    else if (std::strcmp(name, "held") == 0 && wgmma_available()) *path = Path::kWgmmaTmaHeld;
    else return false;
    return true;
}

// The CTAs of a tensor-core kernel's grid: a query tile per sequence and head.
int64_t tile_ctas(int32_t tiles, int32_t batch, int32_t num_heads) {
    return static_cast<int64_t>(tiles) * batch * num_heads;
}

Path choose_path(int32_t max_seqlen, padfree_dtype dtype) {
    if (dtype == PADFREE_FLOAT32) return Path::kFp32;
    Path path;
    if (forced_path(max_seqlen, &path)) return path;
    // TMA where it applies (launch_wgmma), the bias held: first for one-wave grids (H100, BERT-base in
    // the encoder: attention 0.059 -> 0.051 ms per forward at 1x128, 0.060 -> 0.054 at 4x128), at every
    // size since its registers fit four CTAs per SM as the other configuration's do (attention per
    // forward, the other / held as the default, two processes each: 16x256 0.132 -> 0.117 ms, 128x128
    // 0.412-0.421 -> 0.379, 64x512 1.32-1.36 -> 1.29-1.36).
    if (wgmma_available()) return Path::kWgmmaTmaHeld;
    return max_seqlen <= kResidentMaxSeqlen ? Path::kResident : Path::kTiled;
}

// A CTA's work grows with its sequence's length, and most of a grid of a few waves is its last wave:
// there, CTAs of long sequences dispatched last leave the other SMs idle at the end. Dispatching the
// query tiles from the last one first (only sequences longer than a tile's start have that tile) gives
// roughly longest-first order at no per-CTA cost (a computed order, sorted by length, cost more than
// it saved): H100, BERT 16x256 (~1.5 waves) 13.8 -> 12.4 us, 8x512 22.2 -> 19.9. With many
// waves the default order keeps a sequence's tiles side by side, sharing its K/V in L2: tiles first
// took 64x512 (~11 waves) from 127 to 171 us.
constexpr double kTilesLastFirstMaxWaves = 3.0;

// Past a few waves, where the QKV rows do not fit in half the L2 (common.cuh: rows_last_first), the
// sequences go last first, all heads of one at a time: each CTA set reads whole rows the QKV GEMM
// wrote last (still in L2) instead of one head's 128-byte slice of every row, and the rows it writes
// last are the out-projection's first. H100, BERT-base in the encoder: attention 1.180 -> 1.151 ms
// per forward at 64x512, 0.419 -> 0.416 at 128x128; alone (us) 64x512 87.6 / 87.9, 128x128 31.3 /
// 30.3, 32x1024 119.4 / 120.3.
AttentionGridOrder grid_order(int32_t tiles, int32_t batch, int32_t num_heads, int ctas_per_sm, int64_t qkv_bytes) {
    if (const char* order = std::getenv("PADFREE_ATTENTION_ORDER")) {  // for A/B runs
        if (std::strcmp(order, "tiles") == 0) return AttentionGridOrder::kHeadsSequencesLastTileFirst;
        if (std::strcmp(order, "heads") == 0) return AttentionGridOrder::kTilesSequencesHeads;
        if (std::strcmp(order, "sequences") == 0) return AttentionGridOrder::kTilesHeadsLastSequenceFirst;
    }
    if (tiles > 1 && fits_waves(tile_ctas(tiles, batch, num_heads), ctas_per_sm, kTilesLastFirstMaxWaves))
        return AttentionGridOrder::kHeadsSequencesLastTileFirst;
    return rows_last_first(qkv_bytes) ? AttentionGridOrder::kTilesHeadsLastSequenceFirst
                                      : AttentionGridOrder::kTilesSequencesHeads;
}

// Either tensor-core kernel (attention_tc_kernel or attention_wgmma_kernel, whose extra parameter is
// its tensor map) with its configuration.
template <class Cfg, class... Extra>
cudaError_t launch_tiles(void (*kernel)(AttentionArgs, Extra...), AttentionArgs args, int32_t batch,
                         int32_t max_seqlen, cudaStream_t stream, const Extra&... extra) {
    if (Cfg::kSmemBytes > 48 * 1024) {
        const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
        if (err != cudaSuccess) return err;
    }
    const int32_t tiles = ceil_div<int32_t>(max_seqlen, Cfg::kBlockM);
    constexpr int64_t kElementBytes = 2;  // both tensor-core kernels take fp16 or bf16
    const int64_t qkv_bytes =
        static_cast<int64_t>(args.total_rows) * 3 * args.num_heads * Cfg::kHeadDim * kElementBytes;
    args.grid_order = grid_order(tiles, batch, args.num_heads, Cfg::kMinBlocks, qkv_bytes);
    const dim3 grid = args.grid_order == AttentionGridOrder::kHeadsSequencesLastTileFirst
                          ? dim3(args.num_heads, batch, tiles)
                      : args.grid_order == AttentionGridOrder::kTilesHeadsLastSequenceFirst
                          ? dim3(tiles, args.num_heads, batch)
                          : dim3(tiles, batch, args.num_heads);
    launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, args, extra...);  // errors: cudaGetLastError
    return cudaSuccess;
}

// args.qkv as the TMA source of the wgmma kernel at head_dim HD (32 or 64): [total_rows, 3 *
// num_heads * HD] in boxes of 64 rows x HD columns, with the swizzle of its shared layout (HD 64:
// 128-byte, Panels128; HD 32: 64-byte, Panels64), rows past the end read as zeros. False where the
// driver cannot make one.
template <int HD>
bool qkv_tensor_map(const AttentionArgs& args, padfree_dtype dtype, CUtensorMap* map) {
    static_assert(HD == 32 || HD == 64, "one box row spans one swizzle row");
    if (args.total_rows <= 0) return false;
    constexpr CUtensorMapSwizzle kSwizzle = HD == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
    return tensor_map_2d(map, args.qkv, static_cast<uint64_t>(args.total_rows),
                         3ull * static_cast<uint64_t>(args.num_heads) * HD, HD, 64, kSwizzle, dtype);
}

// Head_dim 64: sequences that fit one 128-key tile take a single-buffered configuration (40 KB of
// shared memory, exact softmax); longer ones 64-key tiles, double-buffered (40 KB), four CTAs per SM
// (H100, BERT shapes: 128-key tiles there, at two CTAs per SM by registers, were 10-35% slower;
// 64-key tiles on short sequences 10-30% slower). Head_dim 128: 64-key tiles, double-buffered
// (80 KB: two CTAs per SM), for every length. ONE_BARRIER: WgmmaConfig says where it pays.
// tma: head_dim 64 takes the 64-key configuration loading by tensor copies for every length, where
// the driver makes the tensor map (else as without). H100, attention alone with Q/V bias, us, two
// rounds, cp.async -> TMA: 16x256 10.9 -> 10.4, 64x512
// 95.5-95.9 -> 88.0-88.3, 128x128 (there against the single-tile configuration) 32.6 -> 31.4,
// 32x1024 133 -> 121, 8x4096 658-696 -> 581-589.
// Head_dim 32 takes head_dim 64's configurations, tiles and choices (64-row query tiles, 64-key
// tiles): its per-key work halves and none of the reasons behind them (one warpgroup per tile,
// 64-key tiles at short lengths, tensor copies instead of per-thread copies) depends on head_dim.
// Its shared memory halves too (Q 4 KB, K/V 16 KB; ~21 KB per CTA), so registers alone set how
// many CTAs share an SM (kWgmmaMinBlocks). Not yet measured at head_dim 32: 128-key tiles (twice
// the scores' registers, but 8 fewer for Q and 16 fewer for O than at head_dim 64).
template <typename T, int HD>
cudaError_t launch_wgmma(const AttentionArgs& args, int32_t batch, int32_t max_seqlen, padfree_dtype dtype, Path path,
                         cudaStream_t stream) {
    CUtensorMap map{};  // unused by the configurations without TMA
    if constexpr (HD <= 64) {
        if (path != Path::kWgmma && qkv_tensor_map<HD>(args, dtype, &map)) {
            if (path == Path::kWgmmaTmaHeld)
                return launch_tiles<HeldBiasConfig<HD>>(attention_wgmma_kernel<T, HeldBiasConfig<HD>>, args, batch,
                                                        max_seqlen, stream, map);
            using Cfg = WgmmaConfig<HD, 64, 2, kWgmmaMinBlocks, true, true>;
            return launch_tiles<Cfg>(attention_wgmma_kernel<T, Cfg>, args, batch, max_seqlen, stream, map);
        }
        using SingleTile = WgmmaConfig<HD, 128, 1, kWgmmaMinBlocks, false>;
        if (max_seqlen <= SingleTile::kBlockN)
            return launch_tiles<SingleTile>(attention_wgmma_kernel<T, SingleTile>, args, batch, max_seqlen, stream,
                                            map);
        using Cfg = WgmmaConfig<HD, 64, 2, kWgmmaMinBlocks, true>;
        return launch_tiles<Cfg>(attention_wgmma_kernel<T, Cfg>, args, batch, max_seqlen, stream, map);
    } else {
        using Cfg = WgmmaConfig<HD, 64, 2, 2, false>;
        return launch_tiles<Cfg>(attention_wgmma_kernel<T, Cfg>, args, batch, max_seqlen, stream, map);
    }
}

template <typename T, int HD>
cudaError_t launch_head_dim(const AttentionArgs& args, int32_t batch, int32_t max_seqlen,
                            padfree_dtype dtype, cudaStream_t stream) {
    if constexpr (std::is_same_v<T, float>) {
        const dim3 grid(ceil_div<int32_t>(max_seqlen, attention_detail::kFp32BlockM), batch, args.num_heads);
        launch_kernel(attention_detail::attention_fp32_kernel<HD>, grid, attention_detail::kFp32Threads, 0, stream,
                      args);
        return cudaSuccess;
    } else {
        const Path path = choose_path(max_seqlen, dtype);
        switch (path) {
            case Path::kResident: {
                using Cfg = TileConfig<HD, 4, kResidentMaxSeqlen, true>;
                return launch_tiles<Cfg>(attention_tc_kernel<T, Cfg>, args, batch, max_seqlen, stream);
            }
            case Path::kWgmma:
            case Path::kWgmmaTma:
            case Path::kWgmmaTmaHeld:
                return launch_wgmma<T, HD>(args, batch, max_seqlen, dtype, path, stream);
            default: {
                using Cfg = TileConfig<HD, 4, 64, false>;
                return launch_tiles<Cfg>(attention_tc_kernel<T, Cfg>, args, batch, max_seqlen, stream);
            }
        }
    }
}

}  // namespace

bool attention_head_dim_supported(int32_t head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

cudaError_t launch_attention_varlen(AttentionArgs args, int32_t batch, int32_t max_seqlen,
                                    int32_t head_dim, padfree_dtype dtype, cudaStream_t stream) {
    args.scale_log2 = args.softmax_scale * kLog2e;
    cudaError_t result = cudaErrorInvalidValue;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        switch (head_dim) {
            case 32: result = launch_head_dim<T, 32>(args, batch, max_seqlen, dtype, stream); break;
            case 64: result = launch_head_dim<T, 64>(args, batch, max_seqlen, dtype, stream); break;
            default: result = launch_head_dim<T, 128>(args, batch, max_seqlen, dtype, stream);
        }
    });
    return result;
}

}  // namespace padfree
