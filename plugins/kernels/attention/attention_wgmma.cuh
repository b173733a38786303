// Tensor-core attention for Hopper (sm_90a): attention_tc.cuh's algorithm (FlashAttention-2's
// forward on packed varlen tokens; Q's bias on its fragments, K's and V's folded away as that file
// says) with both matrix products on wgmma.
//
// One warpgroup (4 warps) per CTA owns a 64-row query tile. Each warp keeps its 16 rows' Q
// fragments, scores and O in registers, in the mma.sync kernel's layout, so the softmax and the
// epilogue are that kernel's (attention_tiles.cuh). Per K/V tile: S = Q.K^T as wgmma m64n64k16 with
// Q from registers and K from shared memory; the online softmax; then O += P.V with P from registers
// (the S accumulators, rounded) and V from shared memory as stored (MN-major). mma.sync needs each
// warp to bring its own K and V fragments through ldmatrix, 4 warps reading every tile 4 times;
// wgmma reads each shared operand once per warpgroup. K/V tiles arrive in wgmma's 128-byte-swizzle
// layout (head_dim 32: its 64-byte swizzle, a row being 64 bytes), double-buffered: at head_dim 32
// and 64 by tensor copies (TMA below), else by cp.async.
#pragma once

#include <cmath>
#include <type_traits>

#include "attention.h"
#include "attention_ptx.cuh"
#include "attention_tiles.cuh"
#include "common.cuh"
#include "ptx/tma_ptx.cuh"
#include "ptx/wgmma_ptx.cuh"

namespace padfree {
namespace attention_detail {

// STAGES = 1: the sequences fit one tile (max_seqlen <= BLOCK_N), whose softmax is exact.
// One warpgroup per CTA: two sharing each K/V tile (128 query rows) measured slower at every BERT
// shape (H100, 16x256 12.2 -> 15.5 us, 64x512 109 -> 115).
// ONE_BARRIER: tile j+1's K and V are both requested at the start of tile j, behind one barrier per
// tile; otherwise V_{j+1} waits for a second barrier after the softmax (H100, one barrier: head_dim
// 64 2-3% faster on long sequences, head_dim 128 7-9% slower).
// TMA: Q, K and V arrive by tensor copies (tma_ptx.cuh) that one thread issues, each tile's K and V
// signalling one mbarrier, instead of every thread's cp.async copies (8 per tile and thread, with
// their addresses, at head_dim 64; an ablation without the loads ran 15% faster at BERT 64x512;
// measured: 64x512 95.5 -> 88.0 us, attention.cu). Rows past a sequence's end arrive as
// the next sequence's rows (past the tensor: zeros): their scores are masked, and the V rows a
// partial tile's P.V reads past the end are zeroed.
// HELD_BIAS: the Q and V bias in registers before the PDL wait (HeadBias): off the critical path of
// one-wave grids, and no bias loads in the epilogue. ptxas fits them in the 128 registers of four
// CTAs per SM (fp16 123, bf16 128).
template <int HEAD_DIM, int BLOCK_N, int STAGES, int MIN_BLOCKS, bool ONE_BARRIER, bool TMA = false,
          bool HELD_BIAS = false>
struct WgmmaConfig {
    static constexpr bool kOneBarrier = ONE_BARRIER;
    static constexpr bool kTma = TMA;
    static constexpr bool kHeldBias = HELD_BIAS;
    static constexpr int kHeadDim = HEAD_DIM;
    static constexpr int kThreads = 128;  // one warpgroup
    static constexpr int kBlockM = 64;    // wgmma's M
    static constexpr int kBlockN = BLOCK_N;
    static constexpr int kStages = STAGES;
    static constexpr bool kSingleTile = STAGES == 1;
    static constexpr int kMinBlocks = MIN_BLOCKS;  // CTAs per SM the registers must allow
    static constexpr int kQBytes = kBlockM * HEAD_DIM * 2;
    static constexpr int kTileBytes = BLOCK_N * HEAD_DIM * 2;
    // + 1024: the swizzle pattern repeats every 1024 bytes and wgmma expects tiles aligned to it;
    // dynamic shared memory is only 16-byte aligned.
    static constexpr int kBarrierBytes = TMA ? 8 * (1 + kStages) : 0;  // Q's mbarrier, one per K/V stage
    static constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + kBarrierBytes + 1024;
    static_assert((HEAD_DIM == 32 || HEAD_DIM % 64 == 0) && BLOCK_N % 64 == 0,
                  "one 32-column panel or 64-column panels, 64-key wgmma blocks");
    // One box per tile (a 128-byte swizzle spans 64 columns, a 64-byte one 32), both of a tile's
    // copies on one barrier.
    static_assert(!TMA || (HEAD_DIM <= 64 && ONE_BARRIER && STAGES == 2), "TMA: head_dim 32 or 64, one barrier");
};

// The shared layout of ROWS rows of a head: 64-byte rows, 64-byte swizzle at head_dim 32;
// 128-byte-swizzled 64-column panels otherwise.
template <int HEAD_DIM, int ROWS>
using WgmmaLayout = std::conditional_t<HEAD_DIM == 32, Panels64<ROWS>, Panels128<ROWS>>;

// The 32 accumulators of one m64n64 product: 8-column blocks [b, b + 8) of a [blocks][4] array
// (b a constant once the loops are unrolled, so the view stays in registers).
template <int R>
__device__ __forceinline__ float (&blocks8(float (&a)[R][4], int b))[32] {
    return *reinterpret_cast<float(*)[32]>(&a[b][0]);
}
template <int R>
__device__ __forceinline__ float (&flat(float (&a)[R][4]))[R * 4] {
    return *reinterpret_cast<float(*)[R * 4]>(&a[0][0]);
}
template <int R>
__device__ __forceinline__ uint32_t (&flat(uint32_t (&a)[R][4]))[R * 4] {
    return *reinterpret_cast<uint32_t(*)[R * 4]>(&a[0][0]);
}

// One key tile's online-softmax step on a warp's scores s (kbase: the tile's first key; warp_q0: the
// warp's first query row), which become P's A fragments pa. A function rather than a generic lambda
// in the kernel: CUDA 13.0's cicc crashed on that lambda called from another.
template <typename T, bool SINGLE_TILE, bool FULL, int BN, int NB, int KG, int DB>
__device__ __forceinline__ void scores_to_p(float (&s)[NB][4], uint32_t (&pa)[KG][4], SoftmaxRows<DB>& rows,
                                            int kbase, int keys_end, bool causal, int warp_q0, int row0, float sl2) {
    const int valid = FULL ? BN : min(BN, keys_end - kbase);
    const int n16 = FULL ? KG : ceil_div(valid, 16);  // 16-key groups holding any key
    if (!FULL && (valid < BN || (causal && kbase + BN - 1 > warp_q0))) mask_scores(s, kbase, keys_end, causal, row0);
    rows.template step<SINGLE_TILE>(s, sl2, FULL ? NB : 2 * n16);
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        if (FULL || nb < 2 * n16) {
            rows.l[0] += s[nb][0] + s[nb][1];
            rows.l[2] += s[nb][2] + s[nb][3];
        }
    }
#pragma unroll
    for (int p = 0; p < KG; ++p)
        if (FULL || p < n16) pack_p_fragment<T>(pa[p], s, p);
}

// Grid: as attention_tc_kernel's. Launched only where the library holds sm_90a code (attention.cu).
// qkv_map: with Cfg::kTma, args.qkv as a [total_rows, 3 * num_heads * HEAD_DIM] tensor in 64-row x
// HEAD_DIM boxes with the layout's swizzle (attention.cu: qkv_tensor_map); unused otherwise.
template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    attention_wgmma_kernel(AttentionArgs args, const __grid_constant__ CUtensorMap qkv_map) {
#if defined(PADFREE_WGMMA_DEVICE)
    constexpr int HD = Cfg::kHeadDim;
    constexpr int BM = Cfg::kBlockM;
    constexpr int BN = Cfg::kBlockN;
    constexpr int KC = HD / 16;  // 16-wide k chunks of Q.K^T
    constexpr int NB = BN / 8;   // 8-key column blocks of S
    constexpr int DB = HD / 8;   // 8-wide column blocks of O
    constexpr int KG = BN / 16;  // 16-key groups: P's A fragments, the k steps of P.V
    using QLayout = WgmmaLayout<HD, BM>;
    using KVLayout = WgmmaLayout<HD, BN>;
    constexpr int KPR = KVLayout::kRowBytes / 32;  // 16-wide k chunks per panel row

    QueryTile tile;
    HeadBias<T, HD, true> held_bias;  // Cfg::kHeldBias only
    if constexpr (Cfg::kHeldBias) {
        if (!locate_query_tile<HD>(args, BM, tile, [&](int head) { held_bias.locate(args, head); })) return;
    } else {
        if (!locate_query_tile<HD>(args, BM, tile)) return;  // tiles past this sequence's end do no work
    }
    auto head_bias = [&]() -> HeadBias<T, HD, Cfg::kHeldBias> {
        if constexpr (Cfg::kHeldBias) return held_bias; else return {args, tile.head};
    };

    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t sQ_addr = (smem_addr(smem) + 1023u) & ~1023u;
    T* sQ = reinterpret_cast<T*>(smem + (sQ_addr - smem_addr(smem)));
    const uint32_t sK_addr = sQ_addr + Cfg::kQBytes;
    const uint32_t sV_addr = sK_addr + Cfg::kStages * Cfg::kTileBytes;

    const int warp = threadIdx.x / 32;
    const int nh = args.num_heads;
    const int64_t stride = 3LL * nh * HD;
    const T* seq = static_cast<const T*>(args.qkv) + static_cast<int64_t>(tile.start) * stride;
    const int q_rows = min(BM, tile.len - tile.q0);
    // Causal: no key past this tile's last query matters to any row of it.
    const int keys_end = args.causal ? min(tile.len, tile.q0 + BM) : tile.len;
    const int n_tiles = Cfg::kSingleTile ? 1 : ceil_div(keys_end, BN);
    const int n_full = (Cfg::kSingleTile || args.causal) ? 0 : min(n_tiles, keys_end / BN);

    const KeyValueTiles<T, HD, Cfg::kThreads, BN, KVLayout> kv(seq, tile.head, nh, stride, n_full, keys_end);
    // TMA: Q's barrier, then one per K/V stage; a tile's K and V are copied by thread 0.
    const uint32_t q_bar = sV_addr + Cfg::kStages * Cfg::kTileBytes;
    auto kv_bar = [&](int j) { return q_bar + 8u * (1 + j % Cfg::kStages); };
    auto tma_key_values = [&](int j) {
        const uint32_t stage = (j % Cfg::kStages) * Cfg::kTileBytes;
        const int32_t row = tile.start + j * BN;
        mbarrier_expect_bytes(kv_bar(j), 2 * Cfg::kTileBytes);
        tma_load_2d(sK_addr + stage, &qkv_map, (nh + tile.head) * HD, row, kv_bar(j));
        tma_load_2d(sV_addr + stage, &qkv_map, (2 * nh + tile.head) * HD, row, kv_bar(j));
    };
    if constexpr (Cfg::kTma) {
        if (threadIdx.x == 0) {
            for (int b = 0; b <= Cfg::kStages; ++b) mbarrier_init(q_bar + 8u * b, 1);
            fence_mbarrier_init();
        }
        __syncthreads();
        if (threadIdx.x == 0) {  // all 64 Q rows (past the sequence: other rows, never stored)
            mbarrier_expect_bytes(q_bar, Cfg::kQBytes);
            tma_load_2d(sQ_addr, &qkv_map, tile.head * HD, tile.start + tile.q0, q_bar);
            tma_key_values(0);
        }
        mbarrier_wait(q_bar, 0);
    } else {
        // All 64 Q rows, the ones past the sequence zero-filled: every warp takes part in each wgmma.
        load_query_rows<T, HD, Cfg::kThreads, BM, QLayout>(sQ_addr, seq, stride, tile, q_rows, BM);
        cp_async_commit();
        kv.load(sK_addr, false, 0);
        kv.load(sV_addr, true, 0);
        cp_async_wait<2>();
        __syncthreads();
    }
    uint32_t qf[KC][4];
    load_q_fragments<T, HD, QLayout>(qf, sQ_addr, warp * 16, head_bias());

    // K is the B operand of Q.K^T as stored (K-major: a key's head_dim is contiguous), one panel per
    // 64 of head_dim; V that of P.V, MN-major, its panels the leading-offset steps of one n64 block
    // (head_dim 32: one n32 block, one panel).
    const uint64_t k_desc = swizzled_descriptor<KVLayout::kSwizzleBytes>(sK_addr, KVLayout::kPanelBytes);
    const uint64_t v_desc = swizzled_descriptor<KVLayout::kSwizzleBytes>(sV_addr, KVLayout::kPanelBytes);
    const float sl2 = args.scale_log2;
    const int row0 = tile.q0 + warp * 16 + (threadIdx.x % 32) / 4;  // this thread's rows: row0, row0 + 8
    // l: row sums of this thread's columns; the quad's are added at the end.
    SoftmaxRows<DB> rows;

    // S = Q.K^T for the K tile at `stage`, its first n64 64-key blocks: committed, not waited for.
    auto issue_scores = [&](float (&s)[NB][4], uint32_t stage, int n64) {
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < BN / 64; ++kb) {
            // Block 0 holds a key in every tile: issued unconditionally, else ptxas serializes the
            // whole wgmma group (C7515; H100, 64-key tiles: 16x256 11.0 -> 10.8 us, with Q's bias
            // 64x512 102-104 -> 95-96 us).
            if (kb == 0 || kb < n64) {
#pragma unroll
                for (int kk = 0; kk < KC; ++kk) {
                    const uint32_t at = stage + (kk / KPR) * KVLayout::kPanelBytes + kb * 64 * KVLayout::kRowBytes +
                                        (kk % KPR) * 32;
                    wgmma_m64n64k16<T, 0>(blocks8(s, 8 * kb), qf[kk], descriptor_at(k_desc, at), kk);
                }
            }
        }
        wgmma_commit();
    };
    // O += P.V for the V tile at `stage`, its first n16 16-key groups: committed, not waited for.
    auto issue_values = [&](uint32_t (&pa)[KG][4], uint32_t stage, int n16) {
        wgmma_fence();
#pragma unroll
        for (int p = 0; p < KG; ++p) {
            if (p < n16) {
                if constexpr (HD == 32) {
                    const uint32_t at = stage + p * 16 * KVLayout::kRowBytes;
                    wgmma_m64n32k16<T, 1>(flat(rows.o), pa[p], descriptor_at(v_desc, at), 1);
                } else {
#pragma unroll
                    for (int dp = 0; dp < HD / 64; ++dp) {
                        const uint32_t at = stage + dp * KVLayout::kPanelBytes + p * 16 * KVLayout::kRowBytes;
                        wgmma_m64n64k16<T, 1>(blocks8(rows.o, 8 * dp), pa[p], descriptor_at(v_desc, at), 1);
                    }
                }
            }
        }
        wgmma_commit();
    };
    auto key_tile = [&](int j, auto full_tag) {
        constexpr bool FULL = decltype(full_tag)::value;
        const int n64 = FULL ? BN / 64 : ceil_div(min(BN, keys_end - j * BN), 64);
        const uint32_t stage = (j % Cfg::kStages) * Cfg::kTileBytes;
        const uint32_t next_stage = ((j + 1) % Cfg::kStages) * Cfg::kTileBytes;

        if constexpr (Cfg::kTma) {
            mbarrier_wait(kv_bar(j), (j / Cfg::kStages) & 1);
            if (!FULL) {  // V rows [valid, 16-row group end) are read, with P = 0: zeros, not the next sequence's
                constexpr int kChunks = HD / 8;  // 16-byte chunks per row: 128 threads cover 16 rows or more
                const int valid = min(BN, keys_end - j * BN);
                const int row = valid + threadIdx.x / kChunks;
                if (row < round_up_16(valid))
                    st_shared_zero_16(sV_addr + stage + 2u * KVLayout::offset(row, (threadIdx.x % kChunks) * 8));
            }
        } else if (Cfg::kOneBarrier) {
            cp_async_wait<0>();
        } else {
            cp_async_wait<1>();  // K_j has landed; V_j may still be in flight
        }
        fence_shared_to_async_proxy();
        __syncthreads();
        // The products of tile j-1 completed before every thread's waits: its K and V buffers are free.
        if (j + 1 < n_tiles) {
            if constexpr (Cfg::kTma) {
                if (threadIdx.x == 0) tma_key_values(j + 1);
            } else {
                kv.load(sK_addr + next_stage, false, j + 1);
                if (Cfg::kOneBarrier) kv.load(sV_addr + next_stage, true, j + 1);
            }
        }

        uint32_t pa[KG][4];  // P's A fragments
        {  // S's registers end with this block
            float s[NB][4];
            issue_scores(s, stage, n64);
            wgmma_wait<0>();
            keep_registers(flat(s));
            scores_to_p<T, Cfg::kSingleTile, FULL, BN>(s, pa, rows, j * BN, keys_end, args.causal, tile.q0 + warp * 16,
                                                       row0, sl2);
        }

        if (!Cfg::kOneBarrier) {
            if (j + 1 < n_tiles) {
                cp_async_wait<1>();  // V_j has landed; K_{j+1} may still be in flight
            } else {
                cp_async_wait<0>();
            }
            fence_shared_to_async_proxy();
            __syncthreads();
            if (j + 1 < n_tiles) kv.load(sV_addr + next_stage, true, j + 1);
        }

        issue_values(pa, stage, FULL ? KG : ceil_div(min(BN, keys_end - j * BN), 16));
        // Waiting here rather than after the next tile's Q.K^T frees P's registers (an overlap
        // that left too few for the accumulators: ptxas serialized the wgmmas and spilled);
        // other CTAs on the SM fill the tensor cores meanwhile.
        wgmma_wait<0>();
        keep_registers(flat(rows.o));
        keep_registers(flat(pa));
    };

    int j = 0;
    for (; j < n_full; ++j) key_tile(j, std::true_type{});
    for (; j < n_tiles; ++j) key_tile(j, std::false_type{});
    allow_consumers();  // only the epilogue is left

#pragma unroll
    for (int r = 0; r < 4; r += 2) {
        rows.l[r] += __shfl_xor_sync(0xffffffffu, rows.l[r], 1);
        rows.l[r] += __shfl_xor_sync(0xffffffffu, rows.l[r], 2);
    }
    store_output_rows<T, HD, QLayout>(rows.o, 1.f / rows.l[0], 1.f / rows.l[2], args, tile, sQ, warp * 16, head_bias());
#else
    __trap();  // attention.cu launches this only where the library holds sm_90a code
#endif
}

}  // namespace attention_detail
}  // namespace padfree
