// One query row per hypothesis and head against a list of keys: the kernel shared by the decoder's
// masked self-attention over the K/V cache (kSelf) and its cross-attention over packed encoder rows.
//
// A warp takes one (row, head, split) item and its positions with online softmax (a running max, sum
// and output, rescaled as the max moves), loading each key's K and V vectors in the same round trip:
// a decode step's items are short (tens of positions), so the time is the DRAM latency chain, and one
// round trip per 16 keys (D = 64) is the shortest chain. Where items alone leave the GPU short of warps
// (1x4: 64 items), up to 4 warps of a CTA share an item's positions and combine in shared memory; where
// even that leaves SMs idle and the keys are long, the positions are split over CTAs and combined by a
// second kernel (split-K flash-decoding); where they are more than one wave of resident warps (64x4:
// 4096 items), a variant with two thirds of the registers holds them all at once. Items run
// row-fastest, so a CTA's warps hold neighbouring rows: for cross-attention the beams of one source,
// whose K/V lines one warp brings into L1/L2 for the others.
#pragma once

#include <math_constants.h>

#include <algorithm>
#include <type_traits>

#include "common.cuh"

namespace padfree {
namespace decoder {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * kWarpSize;
constexpr int kUnroll = 4;              // keys per lane group and round trip (K and V vectors in flight)
constexpr int kMinSplitPositions = 64;  // a split covers at least this many positions
constexpr int kMaxSplits = 64;
constexpr int kAttnMinBlocks = 4;       // CTAs per SM the registers must allow (16 warps: busy_warps)
// The variant for more items than one wave of the above holds (64x4: 4096 (row, head) items): twice
// the CTAs per SM (64 registers), so that every item's warp is resident at once, with fewer keys per
// round trip to fit those registers.
constexpr int kAttnWideBlocks = 8;
template <int kMinBlocks>
__host__ __device__ constexpr int attention_unroll() { return kMinBlocks >= kAttnWideBlocks ? 2 : kUnroll; }

struct DecoderAttentionArgs {
    const void* q;       // self: qkv [rows, 3 * hidden]; cross: q [rows, hidden]
    const void* q_bias;  // self: qkv_bias [3 * hidden]; cross: q_bias [hidden]; or null
    int64_t q_row_stride;
    // self-attention: the cache [rows, H, L, D], the indirection [rows, L], the step (device)
    void* k_cache;
    void* v_cache;
    const int32_t* cache_indir;
    const int32_t* step;
    int32_t max_len;
    // cross-attention: packed K | V rows [T, 2 * hidden] and the sources' cu_seqlens
    const void* kv_mem;
    const int32_t* cu_seqlens;
    int32_t batch;
    int32_t total_tokens;
    int32_t max_seqlen;
    int32_t num_beams;
    void* out;       // [rows, hidden]
    float* partial;  // splits > 1: o [rows * H, splits, D], then (max, sum) [rows * H, splits]
    int32_t rows;
    int32_t num_heads;
    int32_t splits;
    int32_t warps_per_item;  // 1, 2 or 4: the warps of a CTA that share one item's positions
    // self-attention: the caller promises that no kernel still running writes the step, the indirection
    // or the cache's positions before the step (a decode step's graph, where the previous replay wrote
    // them), so that they are read before the PDL wait
    bool state_ready;
    float scale_log2;        // softmax_scale * log2(e): scores in base 2 (exp2)
};

// x where kFirst, else y: a reference chosen at compile time.
template <bool kFirst, typename A>
__device__ __forceinline__ A& pick(A& x, A& y) {
    if constexpr (kFirst) return x;
    else return y;
}

// An item's (max, sum, unnormalized output) into the output (unsplit) or its split's partial.
template <typename T, int D>
__device__ __forceinline__ void store_item(const DecoderAttentionArgs& a, int64_t rh, int split, float m, float l,
                                           const float* o, int lane_vec) {
    constexpr int VEC = Vec<T>::size;
    if (a.splits == 1) {
        const float inv = l > 0.f ? 1.f / l : 0.f;  // l == 0: an empty source, zeros
        float v[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = o[i] * inv;
        store_vec(static_cast<T*>(a.out) + rh * D + lane_vec * VEC, vec_from_float<T>(v));
    } else {
        float* po = a.partial + (rh * a.splits + split) * D + lane_vec * VEC;
#pragma unroll
        for (int i = 0; i < VEC; i += 4) *reinterpret_cast<float4*>(po + i) = make_float4(o[i], o[i + 1], o[i + 2], o[i + 3]);
        if (lane_vec == 0) {
            float2* ml = reinterpret_cast<float2*>(a.partial + static_cast<int64_t>(a.rows) * a.num_heads * a.splits * D);
            ml[rh * a.splits + split] = make_float2(m, l);
        }
    }
}

// kEarly: the item's state and its warp's first pass of keys are requested before the PDL wait, so that
// only Q (and for self-attention this step's K and V), the producer's output, is a round trip after it:
// self-attention's step, indirection and cached K / V where the caller promises them (a.state_ready);
// cross-attention's cu_seqlens and encoder K / V always (the C ABI's rule: no kernel still running writes
// them). Without it the code is as it was (its register allocation and schedule unchanged).
template <typename T, int D, bool kSelf, int kMinBlocks, bool kEarly = false>
__global__ void __launch_bounds__(kAttnThreads, kMinBlocks) decoder_attention_kernel(DecoderAttentionArgs a) {
    constexpr int kUnroll = attention_unroll<kMinBlocks>();
    constexpr int VEC = Vec<T>::size;
    constexpr int G = D / VEC;        // lanes per key: one 16-byte vector each
    constexpr int KPW = kWarpSize / G;  // keys per warp and load
    static_assert(G <= kWarpSize && kWarpSize % G == 0, "a key's lanes sit in one warp");
    __shared__ __align__(16) float part_o[kAttnWarps][D];
    __shared__ float2 part_ml[kAttnWarps];
    // self-attention: this step's K and V of each warp's head (not read back from the cache, which
    // another warp writes: attended from here, rounded to T as later steps read them)
    __shared__ Vec<T> step_kv[kSelf ? kAttnWarps : 1][2][G];

    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / G, lane_vec = lane % G;
    const int wpi = a.warps_per_item;
    const int sub = warp % wpi;
    const int64_t items = static_cast<int64_t>(a.rows) * a.num_heads * a.splits;
    const int64_t item = static_cast<int64_t>(blockIdx.x) * (kAttnWarps / wpi) + warp / wpi;
    const bool active = item < items;  // the same for the warps of one item
    const int row = static_cast<int>(item % a.rows);
    const int head = static_cast<int>((item / a.rows) % a.num_heads);
    const int split = static_cast<int>(item / (static_cast<int64_t>(a.rows) * a.num_heads));
    const int64_t rh = static_cast<int64_t>(row) * a.num_heads + head;
    const int hidden = a.num_heads * D;
    if constexpr (!kEarly) wait_on_producer();

    float m = -CUDART_INF_F, l = 0.f, o[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) o[i] = 0.f;
    if (active) {
        int n, step = 0;
        int64_t src_start = 0;
        // kEarly: what is read before the wait is read from L2 (ld.global.cg). An SM's L1 is not coherent:
        // it may still hold a line an earlier kernel read there before the producer wrote it, and only
        // the wait makes this kernel's plain loads see the producer's writes
        auto state = [](const int32_t* p) { return kEarly ? __ldcg(p) : *p; };
        if constexpr (kSelf) {
            step = min(max(state(a.step), 0), a.max_len - 1);  // clamped: a bad step stays inside the cache
            n = step + 1;
        } else {
            const int s = min(row / a.num_beams, a.batch - 1);
            const int start = min(max(state(a.cu_seqlens + s), 0), a.total_tokens);
            const int end = min(max(state(a.cu_seqlens + s + 1), start), a.total_tokens);
            n = min(end - start, a.max_seqlen);
            src_start = start;
        }
        // this warp's positions [w0, w1): its share of the item's split
        auto warp_range = [&]() {
            const int per = ceil_div(n, a.splits);
            const int chunk = max(per, kMinSplitPositions);
            const int t0 = min(split * chunk, n), t1 = min(t0 + chunk, n);
            const int share = ceil_div(t1 - t0, wpi);
            const int w0 = min(t0 + sub * share, t1);
            return make_int2(w0, min(w0 + share, t1));
        };
        // Offset of position t's K vector of this lane (V: + v_offset).
        const T* kv_mem = static_cast<const T*>(a.kv_mem);
        auto key_offset = [&](int t) -> int64_t {
            if constexpr (kSelf) {
                const int src = min(max(state(a.cache_indir + static_cast<int64_t>(row) * a.max_len + t), 0), a.rows - 1);
                return ((static_cast<int64_t>(src) * a.num_heads + head) * a.max_len + t) * D + lane_vec * VEC;
            } else {
                return (src_start + t) * (2 * hidden) + head * D + lane_vec * VEC;
            }
        };
        const T* k_base = kSelf ? static_cast<const T*>(a.k_cache) : kv_mem;
        const T* v_base = kSelf ? static_cast<const T*>(a.v_cache) : kv_mem + hidden;
        int2 range{0, 0};
        // kEarly: one set of key registers for every pass, the first pass's filled here (a set of its own
        // beside the loop's spilled); else each pass declares its own
        Vec<T> early_k[kUnroll], early_v[kUnroll];
        if constexpr (kEarly) {
            range = warp_range();
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = range.x + g + u * KPW;
                if (t < range.y && !(kSelf && t == step)) {
                    const int64_t at = key_offset(t);
                    *reinterpret_cast<uint4*>(&early_k[u]) = __ldcg(reinterpret_cast<const uint4*>(k_base + at));
                    *reinterpret_cast<uint4*>(&early_v[u]) = __ldcg(reinterpret_cast<const uint4*>(v_base + at));
                }
            }
            wait_on_producer();
        }
        // Q (pre-scaled), and for self-attention this step's K and V, which one warp of split 0 stores
        // in the cache
        const T* bias = static_cast<const T*>(a.q_bias);
        const T* qrow = static_cast<const T*>(a.q) + row * a.q_row_stride + head * D + lane_vec * VEC;
        float qv[VEC];
        vec_to_float(load_vec(qrow), qv);
        if (bias != nullptr) add_vec<T>(qv, load_vec_ro(bias + head * D + lane_vec * VEC));
#pragma unroll
        for (int i = 0; i < VEC; ++i) qv[i] *= a.scale_log2;
        if constexpr (kSelf) {
            float kf[VEC], vf[VEC];
            vec_to_float(load_vec(qrow + hidden), kf);
            vec_to_float(load_vec(qrow + 2 * hidden), vf);
            if (bias != nullptr) {
                add_vec<T>(kf, load_vec_ro(bias + hidden + head * D + lane_vec * VEC));
                add_vec<T>(vf, load_vec_ro(bias + 2 * hidden + head * D + lane_vec * VEC));
            }
            const Vec<T> kn = vec_from_float<T>(kf), vn = vec_from_float<T>(vf);
            if (g == 0) {  // the warp's lane group reading position `step` takes them from here
                step_kv[warp][0][lane_vec] = kn;
                step_kv[warp][1][lane_vec] = vn;
                if (split == 0 && sub == 0) {
                    const int64_t at = (rh * a.max_len + step) * D + lane_vec * VEC;
                    store_vec(static_cast<T*>(a.k_cache) + at, kn);
                    store_vec(static_cast<T*>(a.v_cache) + at, vn);
                }
            }
            __syncwarp();
        }

        if constexpr (!kEarly) range = warp_range();
        const int w0 = range.x, w1 = range.y;

        for (int pass = w0; pass < w1; pass += KPW * kUnroll) {  // the same trip count for the whole warp
            const int base = pass + g;
            Vec<T> local_k[kUnroll], local_v[kUnroll];
            auto& kv = pick<kEarly>(early_k, local_k);
            auto& vv = pick<kEarly>(early_v, local_v);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = base + u * KPW;
                if (kSelf && t == step) {
                    kv[u] = step_kv[warp][0][lane_vec];
                    vv[u] = step_kv[warp][1][lane_vec];
                } else if (kEarly && pass == w0) {
                    // requested before the wait
                } else if (t < w1) {
                    const int64_t at = key_offset(t);
                    kv[u] = load_vec(k_base + at);
                    vv[u] = load_vec(v_base + at);
                }
            }
            float s[kUnroll];
            float block_m = -CUDART_INF_F;
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = base + u * KPW;
                float dot = 0.f;
#pragma unroll
                for (int i = 0; i < VEC; ++i) dot += qv[i] * to_float(kv[u].v[i]);
#pragma unroll
                for (int offset = G / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
                s[u] = t < w1 ? dot : -CUDART_INF_F;
                block_m = fmaxf(block_m, s[u]);
            }
#pragma unroll
            for (int offset = kWarpSize / 2; offset >= G; offset /= 2)
                block_m = fmaxf(block_m, __shfl_xor_sync(0xffffffffu, block_m, offset));
            const float m_new = fmaxf(m, block_m);
            if (m_new == -CUDART_INF_F) continue;  // no finite score yet (-inf keys only)
            const float correction = exp2f(m - m_new);  // 0 while m is -inf
            l *= correction;
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] *= correction;
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = base + u * KPW;
                if (t < w1) {
                    const float p = exp2f(s[u] - m_new);
                    l += p;
#pragma unroll
                    for (int i = 0; i < VEC; ++i) o[i] += p * to_float(vv[u].v[i]);
                }
            }
            m = m_new;
        }
        // the lane groups' sums (one running max for the whole warp): a plain sum over the groups
#pragma unroll
        for (int offset = kWarpSize / 2; offset >= G; offset /= 2) {
            l += __shfl_xor_sync(0xffffffffu, l, offset);
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] += __shfl_xor_sync(0xffffffffu, o[i], offset);
        }
    } else if constexpr (kEarly) {
        wait_on_producer();
    }
    allow_consumers();
    if (wpi == 1) {
        if (active && g == 0) store_item<T, D>(a, rh, split, m, l, o, lane_vec);
        return;
    }
    // the item's warps combine: each one's sums rescaled to the common max
    if (g == 0) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) part_o[warp][lane_vec * VEC + i] = o[i];
        if (lane_vec == 0) part_ml[warp] = make_float2(m, l);
    }
    __syncthreads();
    if (!active || sub != 0 || g != 0) return;
    float mc = -CUDART_INF_F;
    for (int w = warp; w < warp + wpi; ++w) mc = fmaxf(mc, part_ml[w].x);
    float lc = 0.f, oc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) oc[i] = 0.f;
    for (int w = warp; w < warp + wpi; ++w) {
        const float2 ml = part_ml[w];
        const float scale = ml.y > 0.f ? exp2f(ml.x - mc) : 0.f;
        lc += ml.y * scale;
#pragma unroll
        for (int i = 0; i < VEC; ++i) oc[i] += part_o[w][lane_vec * VEC + i] * scale;
    }
    store_item<T, D>(a, rh, split, mc, lc, oc, lane_vec);
}

// The splits of one (row, head) into its output: each split's sum of exp2(s - m_i) V, rescaled to the
// common max (online softmax's correction), over the sum of the rescaled denominators.
template <typename T, int D>
__global__ void __launch_bounds__(D) decoder_attention_combine_kernel(const float* partial, int32_t row_heads,
                                                                        int32_t splits, T* out) {
    wait_on_producer();
    const int64_t rh = blockIdx.x;
    const int d = threadIdx.x;
    const float2* ml = reinterpret_cast<const float2*>(partial + static_cast<int64_t>(row_heads) * splits * D) + rh * splits;
    float m = -CUDART_INF_F;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, ml[s].x);
    float l = 0.f, o = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float2 ms = ml[s];
        const float w = ms.y > 0.f ? exp2f(ms.x - m) : 0.f;
        l += ms.y * w;
        o += partial[(rh * splits + s) * D + d] * w;
    }
    allow_consumers();
    out[rh * D + d] = from_float<T>(l > 0.f ? o / l : 0.f);
}

// The SM count the workspace queries assume: at least any GPU's, so that a workspace sized on one
// machine (a TensorRT engine's, declared when it is built, possibly without a GPU) holds the splits
// any GPU picks; it costs little, as only few queries split (1x4 NLLB-size over 1024 positions:
// 270 KB).
constexpr int kWorkspaceSms = 256;

// Warps that keep DRAM busy on `sms` SMs: a quarter of the warp slots (16 of an SM's 64), each with
// ~16 keys' K and V vectors in flight, hold more bytes in flight than DRAM's latency needs.
inline int64_t busy_warps(int sms) { return 16 * static_cast<int64_t>(sms); }

// The current device's SM count (132, an H100's, where it cannot be read).
inline int current_sms() {
    const int sms = current_device_value<query_sm_count>();
    return sms > 0 ? sms : 132;
}

// Splits for `row_heads` items over up to `positions` positions on `sms` SMs: where the items' CTAs
// (4 warps each) fall short of busy_warps, the positions are split over more CTAs, each split at
// least kMinSplitPositions long (a split costs a combine kernel: only where the warps are that few).
inline int32_t choose_splits(int64_t row_heads, int32_t positions, int sms) {
    const int64_t warps = row_heads * kAttnWarps, busy = busy_warps(sms);
    int64_t splits = warps >= busy ? 1 : ceil_div<int64_t>(busy, warps);
    splits = std::min<int64_t>(splits, ceil_div<int64_t>(positions, kMinSplitPositions));
    splits = std::min<int64_t>(splits, kMaxSplits);
    return static_cast<int32_t>(std::max<int64_t>(splits, 1));
}

// Warps per item: as many (up to 4) as keep the grid within one wave of `wave_blocks` resident CTAs,
// shortening each warp's chain of round trips; one where even that takes more than a wave.
inline int32_t choose_warps_per_item(int64_t items, int64_t wave_blocks) {
    if (items <= wave_blocks) return kAttnWarps;
    return ceil_div<int64_t>(items, 2) <= wave_blocks ? 2 : 1;
}

inline int64_t partial_bytes(int64_t row_heads, int32_t splits, int32_t head_dim) {
    return splits > 1 ? row_heads * splits * (head_dim + 2) * static_cast<int64_t>(sizeof(float)) : 0;
}

// Workspace for rows x num_heads queries over up to `positions` positions at the most splits any GPU
// picks (the *_workspace_bytes queries of both attentions): the same on every machine.
inline int64_t workspace_bytes(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t positions) {
    const int64_t row_heads = static_cast<int64_t>(rows) * num_heads;
    return partial_bytes(row_heads, choose_splits(row_heads, positions, kWorkspaceSms), head_dim);
}

// The most splits (up to what this GPU's choose_splits picks) that `workspace_bytes` holds: 1 needs none.
inline int32_t fitting_splits(int64_t row_heads, int32_t positions, int32_t head_dim, int64_t workspace_bytes) {
    int32_t splits = choose_splits(row_heads, positions, current_sms());
    while (splits > 1 && partial_bytes(row_heads, splits, head_dim) > workspace_bytes) --splits;
    return splits;
}

// Launches the attention (and the combine where split): a.splits set by the caller.
template <bool kSelf>
cudaError_t launch_decoder_attention(DecoderAttentionArgs a, int32_t head_dim, padfree_dtype dtype, cudaStream_t stream) {
    const int64_t items = static_cast<int64_t>(a.rows) * a.num_heads * a.splits;
    const int sms = current_sms();
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        auto go = [&](auto dim) {
            constexpr int D = decltype(dim)::value;
            // CTAs an SM holds (registers), once per instantiation
            auto resident = [](auto kernel, int fallback) {
                int n = 0;
                return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kAttnThreads, 0) == cudaSuccess && n > 0
                           ? n : fallback;
            };
            // the narrow kernel's early variant wherever its state may be read before the wait: always for
            // cross-attention, for self-attention where the caller promises it (its registers a little
            // above the plain kernel's: each its own occupancy)
            auto narrow = decoder_attention_kernel<T, D, kSelf, kAttnMinBlocks, true>;
            static const int early_per_sm = resident(narrow, kAttnMinBlocks);
            int narrow_per_sm = early_per_sm;
            if constexpr (kSelf) {
                if (!a.state_ready) {
                    narrow = decoder_attention_kernel<T, D, true, kAttnMinBlocks>;
                    static const int plain_per_sm = resident(narrow, kAttnMinBlocks);
                    narrow_per_sm = plain_per_sm;
                }
            }
            auto wide = decoder_attention_kernel<T, D, kSelf, kAttnWideBlocks>;
            static const int wide_per_sm = resident(wide, kAttnWideBlocks);
            const bool use_wide =
                items > static_cast<int64_t>(sms) * narrow_per_sm * kAttnWarps && wide_per_sm > narrow_per_sm;
            const int per_sm = use_wide ? wide_per_sm : narrow_per_sm;
            a.warps_per_item = choose_warps_per_item(items, static_cast<int64_t>(sms) * per_sm);
            const int64_t blocks = ceil_div<int64_t>(items, kAttnWarps / a.warps_per_item);
            err = launch_kernel(use_wide ? wide : narrow, dim3(static_cast<unsigned>(blocks)), dim3(kAttnThreads), 0,
                                stream, a);
            if (err == cudaSuccess && a.splits > 1)
                err = launch_kernel(decoder_attention_combine_kernel<T, D>, dim3(a.rows * a.num_heads), dim3(D), 0,
                                    stream, static_cast<const float*>(a.partial), a.rows * a.num_heads, a.splits,
                                    static_cast<T*>(a.out));
        };
        if (head_dim == 64) go(std::integral_constant<int, 64>{});
        else go(std::integral_constant<int, 128>{});
    });
    return err;
}

}  // namespace decoder
}  // namespace padfree
