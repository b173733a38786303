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
    // where shared memory allows no more.
    static constexpr int kMinBlocks = HEAD_DIM == 64 ? 4 : 2;
    static_assert(HEAD_DIM % 16 == 0 && BLOCK_N % 16 == 0, "mma tiles are 16 wide");
};

// Element offset of (row, col) in a [rows][HEAD_DIM] 16-bit tile whose 16-byte chunks are XOR-
// swizzled by row: the 8 rows one ldmatrix phase reads land in 8 distinct bank groups.
template <int HEAD_DIM>
__device__ __forceinline__ int swizzle(int row, int col) {
    return row * HEAD_DIM + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// A thread's share of copying ROWS x HEAD_DIM tiles, with its addresses computed once: thread i
// always moves 16-byte chunk i % C of rows i / C + k * (THREADS / C). THREADS / C is a multiple of
// 8, so a row's swizzle (row & 7) is the same for all of a thread's rows and the shared offsets
// differ by compile-time constants. Sources are given as this thread's pointer (from()) into a
// tile's first row.
template <int HEAD_DIM, int THREADS, int ROWS>
struct TileLoader {
    static constexpr int kChunks = HEAD_DIM / 8;
    static constexpr int kRowStep = THREADS / kChunks;
    static_assert(kRowStep % 8 == 0, "the row step must keep row & 7");
    int row;           // first row
    uint32_t smem;     // byte offset of (row, chunk) in a swizzled tile
    int64_t gmem;      // element offset of (row, chunk) in the strided source
    int64_t gstep;     // element offset of kRowStep rows

    __device__ __forceinline__ TileLoader(int64_t stride) {
        row = threadIdx.x / kChunks;
        const int chunk = threadIdx.x % kChunks;
        smem = 2u * static_cast<uint32_t>(swizzle<HEAD_DIM>(row, chunk * 8));
        gmem = row * stride + chunk * 8;
        gstep = kRowStep * stride;
    }

    template <typename T>
    __device__ __forceinline__ const T* from(const T* tile_src) const { return tile_src + gmem; }

    // A tile all ROWS of which are valid: no row checks.
    template <typename T>
    __device__ __forceinline__ void load_full(uint32_t tile, const T* from) const {
#pragma unroll
        for (int k = 0; k < ROWS / kRowStep; ++k) {
            cp_async_16_full(tile + smem + k * kRowStep * HEAD_DIM * 2, from);
            from += gstep;
        }
    }

    // rows_load rows (a multiple of 16, so every ldmatrix reads written memory): the first
    // rows_valid copied, the rest zero-filled by plain shared stores (published by the same
    // barrier that publishes the copies). Zeros keep masked scores finite and make padded V rows
    // contribute nothing.
    template <typename T>
    __device__ __forceinline__ void load(uint32_t tile, const T* from, int rows_valid, int rows_load) const {
#pragma unroll
        for (int k = 0; k < ROWS / kRowStep; ++k) {
            const int r = row + k * kRowStep;
            const uint32_t dst = tile + smem + k * kRowStep * HEAD_DIM * 2;
            if (r < rows_valid) cp_async_16_full(dst, from);
            else if (r < rows_load) st_shared_zero_16(dst);
            from += gstep;
        }
    }
};

__device__ __forceinline__ int round_up_16(int x) { return (x + 15) & ~15; }

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Grid: (query tiles of the longest sequence, batch, heads), or with args.tiles_last_first (heads, batch, tiles).
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

    const int batch_index = blockIdx.y;
    const int head = args.tiles_last_first ? blockIdx.x : blockIdx.z;
    const int q_tile = args.tiles_last_first ? gridDim.z - 1 - blockIdx.z : blockIdx.x;
    // the head's Q and V bias (only those are added, see above): weights, so before the wait; by one
    // CTA per head (layernorm_row.cuh: prefetch_row_params says why not by all)
    if (args.qkv_bias != nullptr && q_tile == 0 && batch_index == 0 && threadIdx.x < 2 * HD * 2 / 128) {
        const int part = threadIdx.x / (HD * 2 / 128) * 2;  // Q (0) or V (2)
        const int line = threadIdx.x % (HD * 2 / 128);
        prefetch_l2(static_cast<const char*>(args.qkv_bias) + ((part * args.num_heads + head) * HD) * 2 + line * 128);
    }
    wait_on_producer();
    // Clamped to the packed rows so that no cu_seqlens content reads or writes past them.
    const int start = min(max(args.cu_seqlens[batch_index], 0), args.total_rows);
    const int len = min(max(args.cu_seqlens[batch_index + 1], start), args.total_rows) - start;
    const int q0 = q_tile * BM;
    if (q0 >= len) return;  // tiles past this sequence's end (and empty sequences) do no work

    extern __shared__ __align__(16) unsigned char smem[];
    T* sQ = reinterpret_cast<T*>(smem);
    const uint32_t sQ_addr = smem_addr(smem);
    const uint32_t sK_addr = sQ_addr + BM * HD * 2;
    const uint32_t sV_addr = sK_addr + Cfg::kStages * kStageBytes;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;  // accumulator row within the warp's 16 (and g + 8)
    const int t = lane % 4;  // accumulator column pair

    const int nh = args.num_heads;
    const int64_t stride = 3LL * nh * HD;
    const T* seq = static_cast<const T*>(args.qkv) + static_cast<int64_t>(start) * stride;
    const T* gK = seq + static_cast<int64_t>(nh + head) * HD;
    const T* gV = seq + static_cast<int64_t>(2 * nh + head) * HD;
    const T* bias = static_cast<const T*>(args.qkv_bias);

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

    {
        const TileLoader<HD, Cfg::kThreads, BM> q_loader(stride);
        q_loader.load(sQ_addr, q_loader.from(seq + static_cast<int64_t>(q0) * stride + head * HD), q_rows,
                      round_up_16(q_rows));
    }
    cp_async_commit();
    const TileLoader<HD, Cfg::kThreads, BN> kv_loader(stride);
    const T* k_from = kv_loader.from(gK);
    const T* v_from = kv_loader.from(gV);
    // K or V rows [jn * BN, jn * BN + BN) into the stage buffer at `tile`.
    auto load_kv = [&](uint32_t tile, const T* from, int jn) {
        from += static_cast<int64_t>(jn * BN) * stride;
        if (jn < n_full) {
            kv_loader.load_full(tile, from);
        } else {
            const int valid = min(BN, keys_end - jn * BN);
            kv_loader.load(tile, from, valid, round_up_16(valid));
        }
        cp_async_commit();
    };
    load_kv(sK_addr, k_from, 0);
    load_kv(sV_addr, v_from, 0);
    cp_async_wait<2>();
    __syncthreads();

    uint32_t qf[KC][4];
    if (active) {
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) {
            ldmatrix_x4(qf[kk], sQ + swizzle<HD>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
            if (bias != nullptr) {
                const T* bq = bias + head * HD + kk * 16 + 2 * t;
                const float2 b0 = Op::unpack(*reinterpret_cast<const uint32_t*>(bq));
                const float2 b1 = Op::unpack(*reinterpret_cast<const uint32_t*>(bq + 8));
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float2 q = Op::unpack(qf[kk][r]);
                    const float2 b = r < 2 ? b0 : b1;  // regs 0,1: columns 2t; regs 2,3: 8 + 2t
                    qf[kk][r] = Op::pack(q.x + b.x, q.y + b.y);
                }
            }
        }
    }

    // ldmatrix addresses of this lane in stage 0; the key group p adds p * kGroupBytes, a
    // compile-time offset. Row & 7 is lane & 7 for every p, so the swizzle XOR folds into the
    // lane's constant: chunk (2 kk + c) ^ (lane & 7) = 2 kk ^ (c ^ (lane & 7)).
    // They are made opaque to the compiler where there are several tiles (see opaque()); with one
    // tile each is used once, and recomputing it there costs nothing and saves registers.
    uint32_t k_addr[KC];      // K as the B operand of Q.K^T, 16-wide k chunk kk
    uint32_t v_addr[DB / 2];  // V^T as the B operand of P.V, 16-wide d chunk dp
    {
        auto keep = [](uint32_t x) { return Cfg::kSingleTile ? x : opaque(x); };
        const int k_row = (lane & 7) + ((lane >> 4) << 3);
        const int k_x = ((lane >> 3) & 1) ^ (lane & 7);
#pragma unroll
        for (int kk = 0; kk < KC; ++kk)
            k_addr[kk] = keep(sK_addr + 2u * (k_row * HD + (((2 * kk) ^ k_x) << 3)));
        const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
        const int v_x = (lane >> 4) ^ (lane & 7);
#pragma unroll
        for (int dp = 0; dp < DB / 2; ++dp)
            v_addr[dp] = keep(sV_addr + 2u * (v_row * HD + (((2 * dp) ^ v_x) << 3)));
    }

    const float sl2 = args.scale_log2;
    const int row0 = q0 + warp * 16 + g;  // this thread's query rows: row0 and row0 + 8
    float o[DB][4];
#pragma unroll
    for (int db = 0; db < DB; ++db) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY;  // running row maxima, in raw score units
    // Row sums of P as one more mma per 16 keys, P . ones: the sum over the whole row lands in every
    // lane of the quad (no shuffles), in [0] for row g and [2] for row g + 8 ([1], [3]: copies, left
    // unscaled and unused). It replaces 32 FADD per tile and sums exactly the 16-bit P that
    // multiplies V.
    float l[4] = {0.f, 0.f, 0.f, 0.f};

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
        if (j + 1 < n_tiles) load_kv(sK_addr + next_stage, k_from, j + 1);

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
            // Mask keys past the end (zero-filled rows and 16-groups never computed) and, for
            // causal attention, keys after the query.
            if (!FULL && (valid < BN || (args.causal && kbase + BN - 1 > q0 + warp * 16))) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = kbase + nb * 8 + 2 * t + (e & 1);
                        const int row = row0 + (e >= 2 ? 8 : 0);
                        if (key >= keys_end || (args.causal && key > row)) s[nb][e] = -INFINITY;
                    }
                }
            }

            float mx0 = m0, mx1 = m1;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
            }
            // Finite: key 0 of tile 0 is unmasked for every row, so each row has a finite score.
            mx0 = quad_max(mx0);
            mx1 = quad_max(mx1);
            const float ms0 = mx0 * sl2;
            const float ms1 = mx1 * sl2;
            if (!Cfg::kSingleTile) {
                const float alpha0 = fast_exp2(m0 * sl2 - ms0);  // 0 on the first tile (m = -inf)
                const float alpha1 = fast_exp2(m1 * sl2 - ms1);
                l[0] *= alpha0;
                l[2] *= alpha1;
#pragma unroll
                for (int db = 0; db < DB; ++db) {
                    o[db][0] *= alpha0;
                    o[db][1] *= alpha0;
                    o[db][2] *= alpha1;
                    o[db][3] *= alpha1;
                }
            }
            m0 = mx0;
            m1 = mx1;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                if (FULL || nb / 2 < n16) {
                    s[nb][0] = fast_exp2(fmaf(s[nb][0], sl2, -ms0));
                    s[nb][1] = fast_exp2(fmaf(s[nb][1], sl2, -ms0));
                    s[nb][2] = fast_exp2(fmaf(s[nb][2], sl2, -ms1));
                    s[nb][3] = fast_exp2(fmaf(s[nb][3], sl2, -ms1));
                }
            }
        }

        if (j + 1 < n_tiles) {
            cp_async_wait<1>();  // V_j has landed; K_{j+1} may still be in flight
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        // Every warp is past P.V of tile j-1, so its V buffer is free.
        if (j + 1 < n_tiles) load_kv(sV_addr + next_stage, v_from, j + 1);

        if (active) {
#pragma unroll
            for (int p = 0; p < NB / 2; ++p) {
                if (FULL || p < n16) {
                    // The S accumulators of key blocks 2p, 2p+1 are exactly the A fragment of
                    // keys 16p..16p+15: P never leaves registers.
                    const uint32_t pa[4] = {Op::pack(s[2 * p][0], s[2 * p][1]),
                                            Op::pack(s[2 * p][2], s[2 * p][3]),
                                            Op::pack(s[2 * p + 1][0], s[2 * p + 1][1]),
                                            Op::pack(s[2 * p + 1][2], s[2 * p + 1][3])};
                    Op::run(l, pa, Op::kOnePair, Op::kOnePair);
#pragma unroll
                    for (int dp = 0; dp < DB / 2; ++dp) {
                        uint32_t vb[4];
                        ldmatrix_x4_trans_addr(vb, v_addr[dp] + stage + p * kGroupBytes);
                        Op::run(o[2 * dp], pa, vb[0], vb[1]);
                        Op::run(o[2 * dp + 1], pa, vb[2], vb[3]);
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
    const float inv0 = 1.f / l[0];
    const float inv1 = 1.f / l[2];
    // Stage the warp's 16 output rows in its own (already consumed) Q rows, then write 16-byte
    // vectors: each output row is one contiguous head_dim span of [T, num_heads, head_dim].
    T* stage = sQ;
    const int srow = warp * 16 + g;
#pragma unroll
    for (int db = 0; db < DB; ++db) {
        const int d = db * 8 + 2 * t;
        float2 bv = make_float2(0.f, 0.f);
        if (bias != nullptr)
            bv = Op::unpack(*reinterpret_cast<const uint32_t*>(bias + (2 * nh + head) * HD + d));
        *reinterpret_cast<uint32_t*>(stage + swizzle<HD>(srow, d)) =
            Op::pack(fmaf(o[db][0], inv0, bv.x), fmaf(o[db][1], inv0, bv.y));
        *reinterpret_cast<uint32_t*>(stage + swizzle<HD>(srow + 8, d)) =
            Op::pack(fmaf(o[db][2], inv1, bv.x), fmaf(o[db][3], inv1, bv.y));
    }
    __syncwarp();
    constexpr int kChunks = HD / 8;
    T* out = static_cast<T*>(args.out);
    const int64_t out_stride = static_cast<int64_t>(nh) * HD;
#pragma unroll
    for (int i = lane; i < 16 * kChunks; i += 32) {
        const int r = i / kChunks;
        const int chunk = i % kChunks;
        const int row = q0 + warp * 16 + r;
        if (row < len) {
            *reinterpret_cast<uint4*>(out + (start + row) * out_stride + head * HD + chunk * 8) =
                *reinterpret_cast<const uint4*>(stage + swizzle<HD>(warp * 16 + r, chunk * 8));
        }
    }
}

}  // namespace attention_detail
}  // namespace padfree
