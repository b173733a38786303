// Tensor-core attention for fp16 / bf16 (FlashAttention-2's forward, on packed varlen tokens).
//
// One CTA = one query tile of one head of one sequence; each warp owns 16 or 32 query rows. Per K/V
// tile: S = Q.K^T with mma.sync m16n8k16 into fp32 registers, online softmax in the exp2 domain
// (softmax_scale * log2 e folded into one FMA), then P (rounded to 16 bits, still in registers as
// the A operand) times V. K/V tiles arrive by cp.async, double-buffered, straight from the strided
// QKV rows. With SINGLE_TILE the whole sequence's K/V sits in shared memory and the softmax is
// exact in one pass, with no rescaling.
//
// The QKV bias costs nothing on K and V: q.(k + b_k) = q.k + q.b_k shifts every score of a query
// row by the same constant, which softmax ignores; and since each row of P sums to one,
// P.(V + 1 b_v^T) = P.V + b_v, added once in the epilogue. Only Q's bias is added, on its fragments.
#pragma once

#include <cmath>

#include "attention.h"
#include "attention_ptx.cuh"
#include "common.cuh"

namespace padfree {
namespace attention_detail {

// M_BLOCKS: 16-row blocks per warp. Two let every K/V fragment read from shared memory feed two
// mma instructions, halving shared-memory traffic per FLOP (the limit of 16-row warps), at the
// cost of twice the S and O registers.
template <int HEAD_DIM, int WARPS, int M_BLOCKS, int BLOCK_N, bool SINGLE_TILE>
struct TileConfig {
    static constexpr int kHeadDim = HEAD_DIM;
    static constexpr int kWarps = WARPS;
    static constexpr int kThreads = WARPS * 32;
    static constexpr int kMBlocks = M_BLOCKS;
    static constexpr int kWarpRows = M_BLOCKS * 16;
    static constexpr int kBlockM = WARPS * kWarpRows;
    static constexpr int kBlockN = BLOCK_N;
    static constexpr bool kSingleTile = SINGLE_TILE;
    static constexpr int kStages = SINGLE_TILE ? 1 : 2;
    static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * HEAD_DIM * 2;
    static_assert(HEAD_DIM % 16 == 0 && BLOCK_N % 16 == 0, "mma tiles are 16 wide");
};

// Element offset of (row, col) in a [rows][HEAD_DIM] 16-bit tile whose 16-byte chunks are XOR-
// swizzled by row: the 8 rows one ldmatrix phase reads land in 8 distinct bank groups.
template <int HEAD_DIM>
__device__ __forceinline__ int swizzle(int row, int col) {
    return row * HEAD_DIM + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// rows_load rows of a tile (a multiple of 16, so every ldmatrix reads written memory): the first
// rows_valid copied from global rows `stride` elements apart, the rest zero-filled.
template <int HEAD_DIM, int THREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* src, int64_t stride, int rows_valid,
                                                int rows_load) {
    constexpr int kChunks = HEAD_DIM / 8;
    for (int i = threadIdx.x; i < rows_load * kChunks; i += THREADS) {
        const int row = i / kChunks;
        const int chunk = i % kChunks;
        const bool valid = row < rows_valid;
        const T* from = valid ? src + row * stride + chunk * 8 : src;
        cp_async_16(tile + swizzle<HEAD_DIM>(row, chunk * 8), from, valid);
    }
}

__device__ __forceinline__ int round_up_16(int x) { return (x + 15) & ~15; }

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Grid: (query tiles of the longest sequence, batch, heads).
template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) attention_tc_kernel(AttentionArgs args) {
    using Op = MmaOp<T>;
    constexpr int HD = Cfg::kHeadDim;
    constexpr int BM = Cfg::kBlockM;
    constexpr int BN = Cfg::kBlockN;
    constexpr int KC = HD / 16;  // 16-wide k chunks of Q.K^T
    constexpr int NB = BN / 8;   // 8-key column blocks of S
    constexpr int DB = HD / 8;   // 8-wide column blocks of O
    constexpr int MB = Cfg::kMBlocks;
    constexpr int WR = Cfg::kWarpRows;

    const int batch_index = blockIdx.y;
    const int head = blockIdx.z;
    const int start = args.cu_seqlens[batch_index];
    const int len = args.cu_seqlens[batch_index + 1] - start;
    const int q0 = blockIdx.x * BM;
    if (q0 >= len) return;  // tiles past this sequence's end (and empty sequences) do no work

    extern __shared__ __align__(16) unsigned char smem[];
    T* sQ = reinterpret_cast<T*>(smem);
    T* sK = sQ + BM * HD;
    T* sV = sK + Cfg::kStages * BN * HD;

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
    // Warps whose rows all lie past the sequence's end only help load K/V.
    const bool active = warp * WR < q_rows;
    // Causal: no key past this tile's last query matters to any row of it.
    const int keys_end = args.causal ? min(len, q0 + BM) : len;
    const int n_tiles = Cfg::kSingleTile ? 1 : ceil_div(keys_end, BN);

    load_tile_async<HD, Cfg::kThreads>(sQ, seq + static_cast<int64_t>(q0) * stride + head * HD, stride,
                                       q_rows, round_up_16(q_rows));
    cp_async_commit();
    {
        const int valid = min(BN, keys_end);
        load_tile_async<HD, Cfg::kThreads>(sK, gK, stride, valid, round_up_16(valid));
        cp_async_commit();
        load_tile_async<HD, Cfg::kThreads>(sV, gV, stride, valid, round_up_16(valid));
        cp_async_commit();
    }
    cp_async_wait<2>();
    __syncthreads();

    uint32_t qf[MB][KC][4];
    if (active) {
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) {
            float2 b0 = make_float2(0.f, 0.f), b1 = b0;
            if (bias != nullptr) {
                const T* bq = bias + head * HD + kk * 16 + 2 * t;
                b0 = Op::unpack(*reinterpret_cast<const uint32_t*>(bq));
                b1 = Op::unpack(*reinterpret_cast<const uint32_t*>(bq + 8));
            }
#pragma unroll
            for (int mi = 0; mi < MB; ++mi) {
                ldmatrix_x4(qf[mi][kk], sQ + swizzle<HD>(warp * WR + mi * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
                if (bias != nullptr) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const float2 q = Op::unpack(qf[mi][kk][r]);
                        const float2 b = r < 2 ? b0 : b1;  // regs 0,1: columns 2t; regs 2,3: 8 + 2t
                        qf[mi][kk][r] = Op::pack(q.x + b.x, q.y + b.y);
                    }
                }
            }
        }
    }

    const float sl2 = args.scale_log2;
    // This thread's query rows: row0 + 16 mi + 8 h for m-block mi and accumulator half h (regs
    // 0,1 / 2,3); per-row state is indexed [mi][h].
    const int row0 = q0 + warp * WR + g;
    float o[MB][DB][4];
    float m[MB][2], l[MB][2];  // running row maxima (raw score units) and this thread's row-sum share
#pragma unroll
    for (int mi = 0; mi < MB; ++mi) {
#pragma unroll
        for (int db = 0; db < DB; ++db) o[mi][db][0] = o[mi][db][1] = o[mi][db][2] = o[mi][db][3] = 0.f;
        m[mi][0] = m[mi][1] = -INFINITY;
        l[mi][0] = l[mi][1] = 0.f;
    }

    for (int j = 0; j < n_tiles; ++j) {
        const int kbase = j * BN;
        const int valid = min(BN, keys_end - kbase);
        const int n16 = ceil_div(valid, 16);  // 16-key groups holding any key of this tile
        const T* tK = sK + (j % Cfg::kStages) * BN * HD;
        const T* tV = sV + (j % Cfg::kStages) * BN * HD;

        cp_async_wait<1>();  // K_j has landed; V_j may still be in flight
        __syncthreads();
        if (j + 1 < n_tiles) {  // every warp is past tile j-1, so its K buffer is free
            const int next = min(BN, keys_end - kbase - BN);
            load_tile_async<HD, Cfg::kThreads>(sK + ((j + 1) % Cfg::kStages) * BN * HD,
                                               gK + static_cast<int64_t>(kbase + BN) * stride, stride,
                                               next, round_up_16(next));
            cp_async_commit();
        }

        float s[MB][NB][4];
        if (active) {
#pragma unroll
            for (int mi = 0; mi < MB; ++mi)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) s[mi][nb][0] = s[mi][nb][1] = s[mi][nb][2] = s[mi][nb][3] = 0.f;
#pragma unroll
            for (int p = 0; p < NB / 2; ++p) {
                if (p < n16) {
#pragma unroll
                    for (int kk = 0; kk < KC; ++kk) {
                        uint32_t kb[4];
                        ldmatrix_x4(kb, tK + swizzle<HD>(p * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                         kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
                        for (int mi = 0; mi < MB; ++mi) {
                            Op::run(s[mi][2 * p], qf[mi][kk], kb[0], kb[1]);
                            Op::run(s[mi][2 * p + 1], qf[mi][kk], kb[2], kb[3]);
                        }
                    }
                }
            }
            // Mask keys past the end (zero-filled rows and 16-groups never computed) and, for
            // causal attention, keys after the query.
            const bool needs_mask = valid < BN || (args.causal && kbase + BN - 1 > q0 + warp * WR);
            if (needs_mask) {
#pragma unroll
                for (int mi = 0; mi < MB; ++mi)
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int key = kbase + nb * 8 + 2 * t + (e & 1);
                            const int row = row0 + mi * 16 + (e >= 2 ? 8 : 0);
                            if (key >= keys_end || (args.causal && key > row)) s[mi][nb][e] = -INFINITY;
                        }
            }

#pragma unroll
            for (int mi = 0; mi < MB; ++mi) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = m[mi][h];
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb) mx = fmaxf(mx, fmaxf(s[mi][nb][2 * h], s[mi][nb][2 * h + 1]));
                    // Finite: key 0 of tile 0 is unmasked for every row, so each row has a finite score.
                    mx = quad_max(mx);
                    const float ms = mx * sl2;
                    if (!Cfg::kSingleTile) {
                        const float alpha = exp2f(m[mi][h] * sl2 - ms);  // 0 on the first tile (m = -inf)
                        l[mi][h] *= alpha;
#pragma unroll
                        for (int db = 0; db < DB; ++db) {
                            o[mi][db][2 * h] *= alpha;
                            o[mi][db][2 * h + 1] *= alpha;
                        }
                    }
                    m[mi][h] = mx;
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb) {
                        if (nb / 2 < n16) {
                            s[mi][nb][2 * h] = exp2f(fmaf(s[mi][nb][2 * h], sl2, -ms));
                            s[mi][nb][2 * h + 1] = exp2f(fmaf(s[mi][nb][2 * h + 1], sl2, -ms));
                            l[mi][h] += s[mi][nb][2 * h] + s[mi][nb][2 * h + 1];
                        }
                    }
                }
            }
        }

        if (j + 1 < n_tiles) {
            cp_async_wait<1>();  // V_j has landed; K_{j+1} may still be in flight
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j + 1 < n_tiles) {  // every warp is past P.V of tile j-1
            const int next = min(BN, keys_end - kbase - BN);
            load_tile_async<HD, Cfg::kThreads>(sV + ((j + 1) % Cfg::kStages) * BN * HD,
                                               gV + static_cast<int64_t>(kbase + BN) * stride, stride,
                                               next, round_up_16(next));
            cp_async_commit();
        }

        if (active) {
#pragma unroll
            for (int p = 0; p < NB / 2; ++p) {
                if (p < n16) {
                    // The S accumulators of key blocks 2p, 2p+1 are exactly the A fragment of
                    // keys 16p..16p+15: P never leaves registers.
                    uint32_t pa[MB][4];
#pragma unroll
                    for (int mi = 0; mi < MB; ++mi) {
                        pa[mi][0] = Op::pack(s[mi][2 * p][0], s[mi][2 * p][1]);
                        pa[mi][1] = Op::pack(s[mi][2 * p][2], s[mi][2 * p][3]);
                        pa[mi][2] = Op::pack(s[mi][2 * p + 1][0], s[mi][2 * p + 1][1]);
                        pa[mi][3] = Op::pack(s[mi][2 * p + 1][2], s[mi][2 * p + 1][3]);
                    }
#pragma unroll
                    for (int dp = 0; dp < DB / 2; ++dp) {
                        uint32_t vb[4];
                        ldmatrix_x4_trans(vb, tV + swizzle<HD>(p * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                               dp * 16 + (lane >> 4) * 8));
#pragma unroll
                        for (int mi = 0; mi < MB; ++mi) {
                            Op::run(o[mi][2 * dp], pa[mi], vb[0], vb[1]);
                            Op::run(o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
                        }
                    }
                }
            }
        }
    }

    if (!active) return;
    // Stage the warp's output rows in its own (already consumed) Q rows, then write 16-byte
    // vectors: each output row is one contiguous head_dim span of [T, num_heads, head_dim].
    T* stage = sQ;
#pragma unroll
    for (int mi = 0; mi < MB; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float inv = 1.f / quad_sum(l[mi][h]);
            const int srow = warp * WR + mi * 16 + h * 8 + g;
#pragma unroll
            for (int db = 0; db < DB; ++db) {
                const int d = db * 8 + 2 * t;
                float2 bv = make_float2(0.f, 0.f);
                if (bias != nullptr)
                    bv = Op::unpack(*reinterpret_cast<const uint32_t*>(bias + (2 * nh + head) * HD + d));
                *reinterpret_cast<uint32_t*>(stage + swizzle<HD>(srow, d)) =
                    Op::pack(fmaf(o[mi][db][2 * h], inv, bv.x), fmaf(o[mi][db][2 * h + 1], inv, bv.y));
            }
        }
    }
    __syncwarp();
    constexpr int kChunks = HD / 8;
    T* out = static_cast<T*>(args.out);
    const int64_t out_stride = static_cast<int64_t>(nh) * HD;
#pragma unroll
    for (int i = lane; i < WR * kChunks; i += 32) {
        const int r = i / kChunks;
        const int chunk = i % kChunks;
        const int row = q0 + warp * WR + r;
        if (row < len) {
            *reinterpret_cast<uint4*>(out + (start + row) * out_stride + head * HD + chunk * 8) =
                *reinterpret_cast<const uint4*>(stage + swizzle<HD>(warp * WR + r, chunk * 8));
        }
    }
}

}  // namespace attention_detail
}  // namespace padfree
