// Cross-attention for the beams of each source together, on tensor cores (16-bit types, head_dim 64).
//
// Why: the beams of one source attend over the same keys, so per (source, head) the step is a tiny
// GEMM pair, S = Q K^T ([beams x n]) and O = softmax(S) V ([beams x 64]), with the beams as the mma's
// M (up to 16). decoder_attention_kernel gives every (row, head) item a warp that walks the keys on
// CUDA cores (dot products by shuffles, one exp per key): at 64x4 (4096 items over ~36 keys) that is
// ~1000 instructions a warp, and the kernel ran 12 us a layer for ~9 MB (H200), issue-bound. Here a
// warp takes a source and head: it stages up to 64 keys' K and V rows in shared memory (cp.async),
// multiplies with mma.sync m16n8k16 (32 for S, 32 for O per 64 keys), and keeps an online softmax per
// beam as the flash-attention kernels do (the probabilities become the second mma's A operand in
// registers). The sources' keys are read once per head instead of once per beam.
#pragma once

#include <math_constants.h>

#include "../attention/attention_ptx.cuh"
#include "common.cuh"
#include "cross_attention.h"

namespace padfree {
namespace decoder {

constexpr int kBeamsD = 64;                  // head_dim
constexpr int kBeamsWarps = 2;               // (source, head) items a CTA
constexpr int kBeamsChunk = 64;              // keys a pass
constexpr int kBeamsLd = kBeamsD + 8;        // padded smem row: ldmatrix's 8 rows fall on distinct banks
constexpr int kBeamsMaxBeams = 16;           // the mma's M

template <typename T>
__global__ void __launch_bounds__(kBeamsWarps * kWarpSize) cross_attention_beams_kernel(CrossAttentionArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using namespace attention_detail;
    using Mma = MmaOp<T>;
    constexpr int D = kBeamsD, C = kBeamsChunk, ld = kBeamsLd;
    __shared__ __align__(16) T kv_s[kBeamsWarps][2][C * ld];
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const int64_t item = static_cast<int64_t>(blockIdx.x) * kBeamsWarps + warp;
    if (item >= static_cast<int64_t>(a.batch) * a.num_heads) {
        wait_on_producer();
        return;
    }
    const int s = static_cast<int>(item / a.num_heads), head = static_cast<int>(item % a.num_heads);
    const int hidden = a.num_heads * D, B = a.num_beams;
    const float scale_log2 = a.softmax_scale * kLog2e;
    T* k_s = kv_s[warp][0];
    T* v_s = kv_s[warp][1];

    // The encoder's K/V and cu_seqlens are read before the wait on the previous kernel (PDL; the C ABI
    // states the rule: no kernel still running writes them), so the first chunk's round trip overlaps the
    // kernel computing Q (NLLB 16x4 on an H200: 0.763 -> 0.742 ms a step).
    const int start = min(max(a.cu_seqlens[s], 0), a.total_tokens);
    const int n = min(min(max(a.cu_seqlens[s + 1], start), a.total_tokens) - start, a.max_seqlen);
    const T* kv = static_cast<const T*>(a.kv_mem) + static_cast<int64_t>(start) * 2 * hidden + head * D;

    // A chunk's K and V rows into shared memory (16 bytes a copy, 8 a row), rows past the source zeroed:
    // their probabilities are 0, and 0 * garbage could be NaN. The first chunk is requested before Q, so
    // that its round trip and Q's overlap.
    auto stage = [&](int c0) {
        const int keys = min(C, n - c0);
        for (int i = lane; i < C * (D / 8); i += kWarpSize) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8;
            const uint32_t ks = smem_addr(k_s + r * ld + c), vs = smem_addr(v_s + r * ld + c);
            if (r < keys) {
                const T* src = kv + static_cast<int64_t>(c0 + r) * 2 * hidden + c;
                cp_async_16_full(ks, src);
                cp_async_16_full(vs, src + hidden);
            } else {
                st_shared_zero_16(ks);
                st_shared_zero_16(vs);
            }
        }
        cp_async_commit();
    };
    if (n > 0) stage(0);
    wait_on_producer();

    // Q of beams g and g + 8 as A fragments (pre-scaled into base 2, bias added, rounded to T): for k-step
    // kk, registers (row g, dims 16kk + 2t, +1), (row g + 8, same), (row g, + 8), (row g + 8, + 8)
    uint32_t qa[D / 16][4];
    {
        const T* bias = static_cast<const T*>(a.q_bias);
        const T* q = static_cast<const T*>(a.q);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int beam = g + 8 * half;
            const bool in = beam < B;
            const T* row = q + (static_cast<int64_t>(s) * B + beam) * hidden + head * D;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    const int d = 16 * kk + 2 * t + 8 * hi;
                    float2 v = make_float2(0.f, 0.f);
                    if (in) {
                        v = Mma::unpack(*reinterpret_cast<const uint32_t*>(row + d));
                        if (bias != nullptr) {
                            const float2 b = Mma::unpack(*reinterpret_cast<const uint32_t*>(bias + head * D + d));
                            v.x += b.x;
                            v.y += b.y;
                        }
                    }
                    qa[kk][half + 2 * hi] = Mma::pack(v.x * scale_log2, v.y * scale_log2);
                }
            }
        }
    }
    allow_consumers();

    // per-lane ldmatrix row addresses: K (B of S = Q K^T, not transposed): matrix lane / 8 = dims
    // 8 (lane / 8) of keys lane % 8; V (B of O = P V, transposed): matrices (keys 0-7, 8-15) x (dims d, d + 8)
    const uint32_t k_addr = smem_addr(k_s + (lane % 8) * ld + 8 * (lane / 8));
    const uint32_t v_addr = smem_addr(v_s + ((lane % 8) + 8 * ((lane / 8) % 2)) * ld + 8 * (lane / 16));

    float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};
    float o[D / 8][4] = {};
    for (int c0 = 0; c0 < n; c0 += C) {
        const int keys = min(C, n - c0);
        if (c0 > 0) {
            __syncwarp();  // every lane is done with the previous chunk
            stage(c0);
        }
        cp_async_wait<0>();
        __syncwarp();

        // S = Q K^T over the chunk's 8 key tiles; keys past the source masked
        float sc[C / 8][4];
#pragma unroll
        for (int nt = 0; nt < C / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk += 2) {
                uint32_t b[4];
                ldmatrix_x4_addr(b, k_addr + (nt * 8 * ld + 16 * kk) * sizeof(T));
                Mma::run(sc[nt], qa[kk], b[0], b[1]);
                Mma::run(sc[nt], qa[kk + 1], b[2], b[3]);
            }
            const int key = nt * 8 + 2 * t;
            if (key >= keys) sc[nt][0] = sc[nt][2] = -CUDART_INF_F;
            if (key + 1 >= keys) sc[nt][1] = sc[nt][3] = -CUDART_INF_F;
        }
        // online softmax per beam row (g: registers 0, 1; g + 8: 2, 3), the row's 4 lanes combined
        float scale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int nt = 0; nt < C / 8; ++nt) mx = fmaxf(mx, fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            scale[h] = fast_exp2(m[h] - mx);  // m = -inf (first chunk): 0
            m[h] = mx;
            l[h] *= scale[h];
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][0] *= scale[0];
            o[dt][1] *= scale[0];
            o[dt][2] *= scale[1];
            o[dt][3] *= scale[1];
        }
        // O += P V, 16 keys a k-step: P's A fragment is the S accumulators of key tiles 2kk and 2kk + 1
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) {
            float p[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                p[j][0] = fast_exp2(sc[2 * kk + j][0] - m[0]);
                p[j][1] = fast_exp2(sc[2 * kk + j][1] - m[0]);
                p[j][2] = fast_exp2(sc[2 * kk + j][2] - m[1]);
                p[j][3] = fast_exp2(sc[2 * kk + j][3] - m[1]);
                l[0] += p[j][0] + p[j][1];
                l[1] += p[j][2] + p[j][3];
            }
            const uint32_t pa[4] = {Mma::pack(p[0][0], p[0][1]), Mma::pack(p[0][2], p[0][3]),
                                    Mma::pack(p[1][0], p[1][1]), Mma::pack(p[1][2], p[1][3])};
#pragma unroll
            for (int dt = 0; dt < D / 8; dt += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans_addr(b, v_addr + (kk * 16 * ld + dt * 8) * sizeof(T));
                Mma::run(o[dt], pa, b[0], b[1]);
                Mma::run(o[dt + 1], pa, b[2], b[3]);
            }
        }
    }

    // out = O / l (an empty source: l = 0, zeros); beam g from registers 0, 1, beam g + 8 from 2, 3
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = l[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const int beam = g + 8 * h;
        if (beam >= B) continue;
        T* row = static_cast<T*>(a.out) + (static_cast<int64_t>(s) * B + beam) * hidden + head * D + 2 * t;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
            *reinterpret_cast<uint32_t*>(row + dt * 8) = Mma::pack(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
#endif
}

// Whether the beams kernel takes this call, and launches it: 16-bit types, head_dim 64, 2-16 beams of
// every source in consecutive rows. `forced`: PADFREE_CROSS_ATTENTION_PATH=beams (A/B runs, tests),
// else where there are enough (source, head) items to fill the GPU at a warp each, or from 32 rows with
// 64 items (Marian-base 8x4 and 16x4, 64 and 128 items, H200 steps 0.270 -> 0.261 ms against the rows
// kernel).
inline bool cross_attention_beams_takes(const CrossAttentionArgs& args, padfree_dtype dtype, int sms, bool forced) {
    if (dtype != PADFREE_FLOAT16 && dtype != PADFREE_BFLOAT16) return false;
    if (args.head_dim != kBeamsD || args.num_beams < 2 || args.num_beams > kBeamsMaxBeams) return false;
    if (static_cast<int64_t>(args.batch) * args.num_beams != args.rows || current_compute_capability() < 80) return false;
    const int64_t items = static_cast<int64_t>(args.batch) * args.num_heads;
    return forced || items >= sms || (args.rows >= 32 && items >= 64);
}

inline cudaError_t launch_cross_attention_beams(const CrossAttentionArgs& args, padfree_dtype dtype,
                                                cudaStream_t stream) {
    const int64_t items = static_cast<int64_t>(args.batch) * args.num_heads;
    const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(items, kBeamsWarps)));
    if (dtype == PADFREE_FLOAT16)
        return launch_kernel(cross_attention_beams_kernel<__half>, grid, dim3(kBeamsWarps * kWarpSize), 0, stream, args);
    return launch_kernel(cross_attention_beams_kernel<__nv_bfloat16>, grid, dim3(kBeamsWarps * kWarpSize), 0, stream, args);
}

}  // namespace decoder
}  // namespace padfree
