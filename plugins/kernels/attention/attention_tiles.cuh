// What the two tensor-core attention kernels share (attention_tc.cuh: mma.sync, sm_80+;
// attention_wgmma.cuh: wgmma, sm_90a): where a CTA's query tile lies, the shared-memory tile layouts
// and the loader that fills them, Q's fragments with its bias, the online-softmax step and the
// epilogue. Both keep a warp's 16 query rows in the m16n8 accumulator layout (thread (g, t) of a
// warp holds rows g and g + 8, columns 2t and 2t + 1 of each 8-column block), which is also the
// layout of wgmma's m64 accumulators per warp, so these helpers serve both.
#pragma once

#include <cmath>

#include "attention.h"
#include "attention_ptx.cuh"
#include "common.cuh"

namespace padfree {
namespace attention_detail {

// [rows][HEAD_DIM] 16-bit tile whose 16-byte chunks are XOR-swizzled by row: the 8 rows one
// ldmatrix phase reads land in 8 distinct bank groups (the mma.sync kernel's layout). A head_dim-32
// row is 64 bytes, half of the 128 bytes the banks serve per cycle, with 4 chunks: rows 2i and
// 2i + 1 share a 128-byte line, so the chunk is XOR-ed with (row >> 1) & 3 instead (the hardware's
// 64-byte swizzle, Panels64: the same bytes, so both kernels load it alike).
template <int HEAD_DIM>
struct RowSwizzled {
    static_assert(HEAD_DIM == 32 || HEAD_DIM % 64 == 0, "rows of 4 or a multiple of 8 16-byte chunks");
    static constexpr int kRowBytes = HEAD_DIM * 2;
    __device__ __forceinline__ static int offset(int row, int col) {
        if constexpr (HEAD_DIM == 32) return row * 32 + ((((col >> 3) ^ ((row >> 1) & 3)) << 3) | (col & 7));
        else return row * HEAD_DIM + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
    }
};

template <int HEAD_DIM>
__device__ __forceinline__ int swizzle(int row, int col) {
    return RowSwizzled<HEAD_DIM>::offset(row, col);
}

// wgmma's 128-byte-swizzle layout: 64-column panels [HEAD_DIM / 64][ROWS][64], each row 128 bytes
// whose 16-byte chunks are XOR-swizzled by row & 7 (for head_dim 64 the same bytes as RowSwizzled).
// A panel's 8-row groups are 1024 bytes apart (a descriptor's stride offset) and the panels ROWS *
// 128 bytes (its leading offset where an operand spans panels).
template <int ROWS>
struct Panels128 {
    static constexpr int kSwizzleBytes = 128;
    static constexpr int kRowBytes = 128;
    static constexpr int kPanelBytes = ROWS * 128;
    __device__ __forceinline__ static int offset(int row, int col) {
        return (col >> 6) * (ROWS * 64) + row * 64 + (((((col >> 3) & 7) ^ (row & 7))) << 3) + (col & 7);
    }
};

// wgmma's 64-byte-swizzle layout, for head_dim 32: [ROWS][32], each row 64 bytes whose 16-byte
// chunks are XOR-swizzled by (row >> 1) & 3 (bits 7-8 of the byte offset XOR-ed into bits 4-5, as
// the hardware swizzles; the same bytes as RowSwizzled<32>). One panel; 8-row groups 512 bytes apart.
// A 128-byte swizzle would need 64-column rows: half of each row padding, twice the shared memory.
template <int ROWS>
struct Panels64 {
    static constexpr int kSwizzleBytes = 64;
    static constexpr int kRowBytes = 64;
    static constexpr int kPanelBytes = ROWS * 64;
    __device__ __forceinline__ static int offset(int row, int col) { return RowSwizzled<32>::offset(row, col); }
};

// A thread's share of copying ROWS x HEAD_DIM tiles, with its addresses computed once: thread i
// always moves 16-byte chunk i % C of rows i / C + k * (THREADS / C). THREADS / C is a multiple of
// 8, so a row's swizzle (row & 7) is the same for all of a thread's rows and the shared offsets
// differ by compile-time constants. Sources are given as this thread's pointer (from()) into a
// tile's first row.
template <int HEAD_DIM, int THREADS, int ROWS, class Layout = RowSwizzled<HEAD_DIM>>
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
        smem = 2u * static_cast<uint32_t>(Layout::offset(row, chunk * 8));
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
            cp_async_16_full(tile + smem + k * kRowStep * Layout::kRowBytes, from);
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
            const uint32_t dst = tile + smem + k * kRowStep * Layout::kRowBytes;
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

// One CTA's query tile: rows [q0, q0 + block_m) of sequence batch_index (rows [start, start + len)
// of the packed tokens), head `head`.
struct QueryTile {
    int head;
    int batch_index;
    int q0;
    int start;
    int len;
};

struct NothingBeforeWait {
    __device__ __forceinline__ void operator()(int) const {}
};

// Where this CTA's tile lies (the grid orders of attention.h). Prefetches the head's Q and V bias
// (only those are added: attention_tc.cuh says why) into L2 before the PDL wait: weights, never the
// producer's output; by one CTA per head (layernorm_row.cuh: prefetch_row_params says why not by
// all). Returns false for a tile past its sequence's end (and for empty sequences): no work.
// before_wait(head) runs before the PDL wait (loads of the head's weights only: HeadBias).
template <int HD, class BeforeWait = NothingBeforeWait>
__device__ __forceinline__ bool locate_query_tile(const AttentionArgs& args, int block_m, QueryTile& tile,
                                                  BeforeWait before_wait = {}) {
    int q_tile;
    bool first_of_head;  // the head's first CTA to be dispatched: its two other grid indices are 0
    switch (args.grid_order) {
        case AttentionGridOrder::kHeadsSequencesLastTileFirst:
            tile.head = blockIdx.x, tile.batch_index = blockIdx.y, q_tile = gridDim.z - 1 - blockIdx.z;
            first_of_head = blockIdx.y == 0 && blockIdx.z == 0;
            break;
        case AttentionGridOrder::kTilesHeadsLastSequenceFirst:
            q_tile = blockIdx.x, tile.head = blockIdx.y, tile.batch_index = gridDim.z - 1 - blockIdx.z;
            first_of_head = blockIdx.x == 0 && blockIdx.z == 0;
            break;
        default:
            q_tile = blockIdx.x, tile.batch_index = blockIdx.y, tile.head = blockIdx.z;
            first_of_head = blockIdx.x == 0 && blockIdx.y == 0;
    }
    constexpr int kLines = (HD * 2 + 127) / 128;  // 128-byte lines of one head's bias (head_dim 32: half of one)
    if (args.qkv_bias != nullptr && first_of_head && threadIdx.x < 2 * kLines) {
        const int part = threadIdx.x / kLines * 2;  // Q (0) or V (2)
        const int line = threadIdx.x % kLines;
        prefetch_l2(static_cast<const char*>(args.qkv_bias) + ((part * args.num_heads + tile.head) * HD) * 2 +
                    line * 128);
    }
    before_wait(tile.head);
    wait_on_producer();
    // Clamped to the packed rows so that no cu_seqlens content reads or writes past them.
    tile.start = min(max(args.cu_seqlens[tile.batch_index], 0), args.total_rows);
    tile.len = min(max(args.cu_seqlens[tile.batch_index + 1], tile.start), args.total_rows) - tile.start;
    tile.q0 = q_tile * block_m;
    return tile.q0 < tile.len;
}

// The query tile's rows [q0, q0 + q_rows) of head `head` into the Layout tile at shared address sq,
// rows past them up to rows_load zero-filled; one cp.async group (committed by the caller).
template <typename T, int HD, int THREADS, int BM, class Layout>
__device__ __forceinline__ void load_query_rows(uint32_t sq, const T* seq, int64_t stride, const QueryTile& tile,
                                                int q_rows, int rows_load) {
    const TileLoader<HD, THREADS, BM, Layout> loader(stride);
    loader.load(sq, loader.from(seq + static_cast<int64_t>(tile.q0) * stride + tile.head * HD), q_rows, rows_load);
}

// The K and V tiles of one head of one sequence (seq: its first QKV row), BN keys each, into Layout
// tiles: tiles below n_full unchecked, a later one with its rows past keys_end zero-filled up to a
// multiple of 16.
template <typename T, int HD, int THREADS, int BN, class Layout>
struct KeyValueTiles {
    TileLoader<HD, THREADS, BN, Layout> loader;
    const T* k_from;
    const T* v_from;
    int64_t stride;
    int n_full;
    int keys_end;

    __device__ __forceinline__ KeyValueTiles(const T* seq, int head, int num_heads, int64_t stride_, int n_full_,
                                             int keys_end_)
        : loader(stride_), stride(stride_), n_full(n_full_), keys_end(keys_end_) {
        k_from = loader.from(seq + static_cast<int64_t>(num_heads + head) * HD);
        v_from = loader.from(seq + static_cast<int64_t>(2 * num_heads + head) * HD);
    }

    // K (or V) rows [jn * BN, jn * BN + BN) into the tile at shared address `tile`: one cp.async group.
    __device__ __forceinline__ void load(uint32_t tile, bool value, int jn) const {
        const T* from = (value ? v_from : k_from) + static_cast<int64_t>(jn * BN) * stride;
        if (jn < n_full) {
            loader.load_full(tile, from);
        } else {
            const int valid = min(BN, keys_end - jn * BN);
            loader.load(tile, from, valid, round_up_16(valid));
        }
        cp_async_commit();
    }
};

// The head's Q and V bias (the two that are added: attention_tc.cuh says why) at this thread's
// columns: pairs 2t, 2t + 1 of every 8 (the mma fragment and accumulator layouts). kHeld: all loaded
// into registers by locate() (before the PDL wait, as a BeforeWait), so that at small grids, where the
// kernel is latency-bound, the loads overlap the producer's tail instead of each costing a round trip
// after it. Otherwise each pair is read where it is used, and the kernels make one right where they
// need it (kept for the whole kernel, it cost the tiled mma.sync kernel a spill).
template <typename T, int HD, bool kHeld>
struct HeadBias {
    const T* bias = nullptr;  // [3 * num_heads * HD], or null (no bias)
    int q_at = 0;             // the head's Q and V bias in it, at this thread's first pair
    int v_at = 0;
    uint32_t held_q[kHeld ? HD / 8 : 1];  // pair i: columns 8 i + 2t, 8 i + 2t + 1
    uint32_t held_v[kHeld ? HD / 8 : 1];

    HeadBias() = default;
    __device__ __forceinline__ HeadBias(const AttentionArgs& args, int head) { locate(args, head); }

    __device__ __forceinline__ void locate(const AttentionArgs& args, int head) {
        bias = static_cast<const T*>(args.qkv_bias);
        q_at = head * HD + 2 * (threadIdx.x % 4);
        v_at = (2 * args.num_heads + head) * HD + 2 * (threadIdx.x % 4);
        if constexpr (kHeld) {
            if (bias == nullptr) return;
#pragma unroll
            for (int i = 0; i < HD / 8; ++i) {
                held_q[i] = *reinterpret_cast<const uint32_t*>(bias + q_at + 8 * i);
                held_v[i] = *reinterpret_cast<const uint32_t*>(bias + v_at + 8 * i);
            }
        }
    }
    __device__ __forceinline__ bool present() const { return bias != nullptr; }
    // columns 8 i + 2t, 8 i + 2t + 1 of Q's (V's) bias
    __device__ __forceinline__ uint32_t q_pair(int i) const {
        if constexpr (kHeld) return held_q[i]; else return *reinterpret_cast<const uint32_t*>(bias + q_at + 8 * i);
    }
    __device__ __forceinline__ uint32_t v_pair(int i) const {
        if constexpr (kHeld) return held_v[i]; else return *reinterpret_cast<const uint32_t*>(bias + v_at + 8 * i);
    }
};

// A warp's Q fragments (its 16 rows from warp_row0, the mma A-operand layout) from the Layout tile
// at shared address sq, with Q's bias added.
template <typename T, int HD, class Layout, class Bias>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[HD / 16][4], uint32_t sq, int warp_row0,
                                                 const Bias& bias) {
    using Op = MmaOp<T>;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        ldmatrix_x4_addr(qf[kk], sq + 2u * Layout::offset(warp_row0 + (lane & 15), kk * 16 + (lane >> 4) * 8));
        if (bias.present()) {
            const float2 b0 = Op::unpack(bias.q_pair(2 * kk));
            const float2 b1 = Op::unpack(bias.q_pair(2 * kk + 1));
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const float2 q = Op::unpack(qf[kk][r]);
                const float2 b = r < 2 ? b0 : b1;  // regs 0,1: columns 2t; regs 2,3: 8 + 2t
                qf[kk][r] = Op::pack(q.x + b.x, q.y + b.y);
            }
        }
    }
}

// Scores of keys at or past keys_end (zero-filled rows and key groups never computed) and, for
// causal attention, of keys after their query become -inf. row0: this thread's first query row.
template <int NB>
__device__ __forceinline__ void mask_scores(float (&s)[NB][4], int kbase, int keys_end, bool causal, int row0) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = kbase + nb * 8 + 2 * t + (e & 1);
            const int row = row0 + (e >= 2 ? 8 : 0);
            if (key >= keys_end || (causal && key > row)) s[nb][e] = -INFINITY;
        }
    }
}

// A warp's running softmax over the key tiles: O (the m16n8 accumulator layout), the row maxima in
// raw score units and the row sums l ([0]: row g, [2]: row g + 8; how they are summed, and what
// [1] and [3] hold, is the kernel's).
template <int DB>
struct SoftmaxRows {
    float o[DB][4];
    float m0 = -INFINITY;
    float m1 = -INFINITY;
    float l[4] = {0.f, 0.f, 0.f, 0.f};

    __device__ __forceinline__ SoftmaxRows() {
#pragma unroll
        for (int db = 0; db < DB; ++db) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.f;
    }

    // One key tile's step on the warp's scores s (raw units, masked ones -inf): the maxima move to
    // the tile's, O and l are rescaled unless this is the sequence's only tile (SINGLE_TILE), and s
    // becomes 2^(s * scale_log2 - max), in the 8-key blocks below nb_end only (the rest are never
    // used).
    template <bool SINGLE_TILE, int NB>
    __device__ __forceinline__ void step(float (&s)[NB][4], float sl2, int nb_end) {
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
        if (!SINGLE_TILE) {
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
            if (nb < nb_end) {
                s[nb][0] = fast_exp2(fmaf(s[nb][0], sl2, -ms0));
                s[nb][1] = fast_exp2(fmaf(s[nb][1], sl2, -ms0));
                s[nb][2] = fast_exp2(fmaf(s[nb][2], sl2, -ms1));
                s[nb][3] = fast_exp2(fmaf(s[nb][3], sl2, -ms1));
            }
        }
    }
};

// P's A fragment for keys 16p .. 16p + 15: the S accumulators of key blocks 2p and 2p + 1 are
// exactly that fragment, so P never leaves registers.
template <typename T, int NB>
__device__ __forceinline__ void pack_p_fragment(uint32_t (&pa)[4], const float (&s)[NB][4], int p) {
    using Op = MmaOp<T>;
    pa[0] = Op::pack(s[2 * p][0], s[2 * p][1]);
    pa[1] = Op::pack(s[2 * p][2], s[2 * p][3]);
    pa[2] = Op::pack(s[2 * p + 1][0], s[2 * p + 1][1]);
    pa[3] = Op::pack(s[2 * p + 1][2], s[2 * p + 1][3]);
}

// The epilogue of a warp's 16 rows (warp_row0 within the tile): O / l plus V's bias, staged in the
// warp's own rows of the Layout tile at `stage` (its Q rows, already consumed), then written as
// 16-byte vectors: each output row is one contiguous head_dim span of [T, num_heads, head_dim].
template <typename T, int HD, class Layout, class Bias>
__device__ __forceinline__ void store_output_rows(const float (&o)[HD / 8][4], float inv0, float inv1,
                                                  const AttentionArgs& args, const QueryTile& tile, T* stage,
                                                  int warp_row0, const Bias& bias) {
    using Op = MmaOp<T>;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int nh = args.num_heads;
    const int srow = warp_row0 + g;
#pragma unroll
    for (int db = 0; db < HD / 8; ++db) {
        const int d = db * 8 + 2 * t;
        float2 bv = make_float2(0.f, 0.f);
        if (bias.present()) bv = Op::unpack(bias.v_pair(db));
        *reinterpret_cast<uint32_t*>(stage + Layout::offset(srow, d)) =
            Op::pack(fmaf(o[db][0], inv0, bv.x), fmaf(o[db][1], inv0, bv.y));
        *reinterpret_cast<uint32_t*>(stage + Layout::offset(srow + 8, d)) =
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
        const int row = tile.q0 + warp_row0 + r;
        if (row < tile.len) {
            *reinterpret_cast<uint4*>(out + (tile.start + row) * out_stride + tile.head * HD + chunk * 8) =
                *reinterpret_cast<const uint4*>(stage + Layout::offset(warp_row0 + r, chunk * 8));
        }
    }
}

}  // namespace attention_detail
}  // namespace padfree
