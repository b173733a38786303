// Tensor-core attention for fp16 / bf16 (FlashAttention-2's forward, on packed varlen tokens).
//
// One CTA = one query tile of one head of one sequence; each warp owns 16 query rows. Per K/V
// tile: S = Q.K^T with mma.sync m16n8k16 into fp32 registers, online softmax in the exp2 domain
// (softmax_scale * log2 e folded into one FMA, one MUFU ex2 per probability), then P (rounded to
// 16 bits, still in registers as the A operand) times V, and P times a column of ones for the row
// sums. K/V tiles arrive by cp.async, double-buffered, straight from the strided QKV rows; tiles
// whose keys are all valid run a body with no guards or masks. With SINGLE_TILE the whole
// sequence's K/V sits in shared memory and the softmax is exact in one pass, with no rescaling.
//
// The QKV bias costs nothing on K and V: q.(k + b_k) = q.k + q.b_k shifts every score of a query
// row by the same constant, which softmax ignores; and since each row of P sums to one,
// P.(V + 1 b_v^T) = P.V + b_v, added once in the epilogue. Only Q's bias is added, on its fragments.
#pragma once

#include <cmath>
#include <type_traits>

#include "attention.h"
#include "attention_ptx.cuh"
#include "attention_tiles.cuh"
#include "common.cuh"

namespace padfree {
namespace attention_detail {

template <int HEAD_DIM, int WARPS, int BLOCK_N, bool SINGLE_TILE>
struct TileConfig {
    static constexpr int kHeadDim = HEAD_DIM;
    static constexpr int kWarps = WARPS;
    static constexpr int kThreads = WARPS * 32;
    static constexpr int kBlockM = WARPS * 16;
    static constexpr int kBlockN = BLOCK_N;
    static constexpr bool kSingleTile = SINGLE_TILE;
    static constexpr int kStages = SINGLE_TILE ? 1 : 2;
    static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * HEAD_DIM * 2;
    // CTAs per SM the register allocation must allow: 4 (16 warps) for head_dim 64; 2 for 128,
    // where shared memory allows no more. Head_dim 32: 4 as well (98-118 registers uncapped). A
    // fifth CTA would need <= 96: ptxas fits that but adds ~4% instructions to a key loop that is
    // issue-bound (KERNELS.md), where more warps do not help; a sixth (80) spills.
    static constexpr int kMinBlocks = HEAD_DIM <= 64 ? 4 : 2;
    static_assert(HEAD_DIM % 16 == 0 && BLOCK_N % 16 == 0, "mma tiles are 16 wide");
};

// Grid: (query tiles of the longest sequence, batch, heads) in one of the orders of args.grid_order.
template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) attention_tc_kernel(AttentionArgs args) {
    using Op = MmaOp<T>;
    constexpr int HD = Cfg::kHeadDim;
    constexpr int BM = Cfg::kBlockM;
    constexpr int BN = Cfg::kBlockN;
    constexpr int KC = HD / 16;  // 16-wide k chunks of Q.K^T
    constexpr int NB = BN / 8;   // 8-key column blocks of S
    constexpr int DB = HD / 8;   // 8-wide column blocks of O
    constexpr uint32_t kStageBytes = BN * HD * 2;
    constexpr uint32_t kGroupBytes = 16 * HD * 2;  // 16 keys of a K or V tile

    QueryTile tile;
    if (!locate_query_tile<HD>(args, BM, tile)) return;  // tiles past this sequence's end do no work
    const int start = tile.start;
    const int len = tile.len;
    const int q0 = tile.q0;
    const int head = tile.head;

    extern __shared__ __align__(16) unsigned char smem[];
    T* sQ = reinterpret_cast<T*>(smem);
    const uint32_t sQ_addr = smem_addr(smem);
    const uint32_t sK_addr = sQ_addr + BM * HD * 2;
    const uint32_t sV_addr = sK_addr + Cfg::kStages * kStageBytes;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // accumulator row within the warp's 16 (and g + 8)

    const int nh = args.num_heads;
    const int64_t stride = 3LL * nh * HD;
    const T* seq = static_cast<const T*>(args.qkv) + static_cast<int64_t>(start) * stride;

    const int q_rows = min(BM, len - q0);
    // Warps whose 16 rows all lie past the sequence's end only help load K/V.
    const bool active = warp * 16 < q_rows;
    // Causal: no key past this tile's last query matters to any row of it.
    const int keys_end = args.causal ? min(len, q0 + BM) : len;
    const int n_tiles = Cfg::kSingleTile ? 1 : ceil_div(keys_end, BN);
    // Tiles whose keys are all valid and unmasked run without a guard or mask check; only the last
    // tile of a sequence (and causal attention's tiles) take the guarded body. The single-tile
    // path keeps one body: a second copy would cost registers for a case (length = BN) that the
    // guards barely slow down.
    const int n_full = (Cfg::kSingleTile || args.causal) ? 0 : min(n_tiles, keys_end / BN);

    load_query_rows<T, HD, Cfg::kThreads, BM, RowSwizzled<HD>>(sQ_addr, seq, stride, tile, q_rows,
                                                               round_up_16(q_rows));
    cp_async_commit();
    const KeyValueTiles<T, HD, Cfg::kThreads, BN, RowSwizzled<HD>> kv(seq, head, nh, stride, n_full, keys_end);
    kv.load(sK_addr, false, 0);
    kv.load(sV_addr, true, 0);
    cp_async_wait<2>();
    __syncthreads();

    uint32_t qf[KC][4];
    if (active) load_q_fragments<T, HD, RowSwizzled<HD>>(qf, sQ_addr, warp * 16, HeadBias<T, HD, false>(args, head));

    // ldmatrix addresses of this lane in stage 0; the key group p adds p * kGroupBytes, a
    // compile-time offset. Row & 7 is lane & 7 for every p, so the swizzle XOR folds into the
    // lane's constant: chunk (2 kk + c) ^ (lane & 7) = 2 kk ^ (c ^ (lane & 7)) (head_dim 32's
    // swizzle, (row >> 1) & 3, likewise depends on row & 7 only: RowSwizzled gives it).
    // They are made opaque to the compiler where there are several tiles (see opaque()); with one
    // tile each is used once, and recomputing it there costs nothing and saves registers.
    uint32_t k_addr[KC];      // K as the B operand of Q.K^T, 16-wide k chunk kk
    uint32_t v_addr[DB / 2];  // V^T as the B operand of P.V, 16-wide d chunk dp
    {
        auto keep = [](uint32_t x) { return Cfg::kSingleTile ? x : opaque(x); };
        const int k_row = (lane & 7) + ((lane >> 4) << 3);
        const int k_x = ((lane >> 3) & 1) ^ (lane & 7);
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) {
            if constexpr (HD == 32)
                k_addr[kk] = keep(sK_addr + 2u * RowSwizzled<HD>::offset(k_row, 16 * kk + 8 * ((lane >> 3) & 1)));
            else
                k_addr[kk] = keep(sK_addr + 2u * (k_row * HD + (((2 * kk) ^ k_x) << 3)));
        }
        const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
        const int v_x = (lane >> 4) ^ (lane & 7);
#pragma unroll
        for (int dp = 0; dp < DB / 2; ++dp) {
            if constexpr (HD == 32)
                v_addr[dp] = keep(sV_addr + 2u * RowSwizzled<HD>::offset(v_row, 16 * dp + 8 * (lane >> 4)));
            else
                v_addr[dp] = keep(sV_addr + 2u * (v_row * HD + (((2 * dp) ^ v_x) << 3)));
        }
    }

    const float sl2 = args.scale_log2;
    const int row0 = q0 + warp * 16 + g;  // this thread's query rows: row0 and row0 + 8
    // Row sums of P as one more mma per 16 keys, P . ones: the sum over the whole row lands in every
    // lane of the quad (no shuffles), in l[0] for row g and l[2] for row g + 8 ([1], [3]: copies,
    // left unscaled and unused). It replaces 32 FADD per tile and sums exactly the 16-bit P that
    // multiplies V.
    SoftmaxRows<DB> rows;

    // One K/V tile. FULL: all BN keys valid and unmasked, so the 16-key-group guards and the mask
    // fold away at compile time.
    auto key_tile = [&](int j, auto full_tag) {
        constexpr bool FULL = decltype(full_tag)::value;
        const int kbase = j * BN;
        const int valid = FULL ? BN : min(BN, keys_end - kbase);
        const int n16 = FULL ? NB / 2 : ceil_div(valid, 16);  // 16-key groups holding any key
        const uint32_t stage = (j % Cfg::kStages) * kStageBytes;
        const uint32_t next_stage = ((j + 1) % Cfg::kStages) * kStageBytes;

        cp_async_wait<1>();  // K_j has landed; V_j may still be in flight
        __syncthreads();
        // Every warp is past tile j-1, so its K buffer is free.
        if (j + 1 < n_tiles) kv.load(sK_addr + next_stage, false, j + 1);

        float s[NB][4];
        if (active) {
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
            for (int p = 0; p < NB / 2; ++p) {
                if (FULL || p < n16) {
#pragma unroll
                    for (int kk = 0; kk < KC; ++kk) {
                        uint32_t kb[4];
                        ldmatrix_x4_addr(kb, k_addr[kk] + stage + p * kGroupBytes);
                        Op::run(s[2 * p], qf[kk], kb[0], kb[1]);
                        Op::run(s[2 * p + 1], qf[kk], kb[2], kb[3]);
                    }
                }
            }
            if (!FULL && (valid < BN || (args.causal && kbase + BN - 1 > q0 + warp * 16)))
                mask_scores(s, kbase, keys_end, args.causal, row0);
            rows.step<Cfg::kSingleTile>(s, sl2, FULL ? NB : 2 * n16);
        }

        if (j + 1 < n_tiles) {
            cp_async_wait<1>();  // V_j has landed; K_{j+1} may still be in flight
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        // Every warp is past P.V of tile j-1, so its V buffer is free.
        if (j + 1 < n_tiles) kv.load(sV_addr + next_stage, true, j + 1);

        if (active) {
#pragma unroll
            for (int p = 0; p < NB / 2; ++p) {
                if (FULL || p < n16) {
                    uint32_t pa[4];
                    pack_p_fragment<T>(pa, s, p);
                    Op::run(rows.l, pa, Op::kOnePair, Op::kOnePair);
#pragma unroll
                    for (int dp = 0; dp < DB / 2; ++dp) {
                        uint32_t vb[4];
                        ldmatrix_x4_trans_addr(vb, v_addr[dp] + stage + p * kGroupBytes);
                        Op::run(rows.o[2 * dp], pa, vb[0], vb[1]);
                        Op::run(rows.o[2 * dp + 1], pa, vb[2], vb[3]);
                    }
                }
            }
        }
    };
    int j = 0;
    for (; j < n_full; ++j) key_tile(j, std::true_type{});
    for (; j < n_tiles; ++j) key_tile(j, std::false_type{});
    allow_consumers();  // only the epilogue is left

    if (!active) return;
    store_output_rows<T, HD, RowSwizzled<HD>>(rows.o, 1.f / rows.l[0], 1.f / rows.l[2], args, tile, sQ, warp * 16,
                                              HeadBias<T, HD, false>(args, head));
}

}  // namespace attention_detail
}  // namespace padfree
