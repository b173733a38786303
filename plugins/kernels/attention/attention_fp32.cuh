// CUDA-core attention for fp32 inputs: the accuracy path (fp32 checks of whole encoders), kept
// simple rather than fast. One CTA = 16 queries of one head of one sequence, 4 warps of 4 queries;
// K/V tiles of 32 keys pass through shared memory with the bias added; lane = key for Q.K^T,
// lane = head-dim column for P.V; online softmax across tiles (expf, fp32 throughout).
#pragma once

#include <cmath>

#include "attention.h"
#include "common.cuh"

namespace padfree {
namespace attention_detail {

constexpr int kFp32BlockM = 16;
constexpr int kFp32BlockN = 32;
constexpr int kFp32Threads = 128;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// rows x HEAD_DIM floats from rows `stride` apart, plus bias; zeros for rows >= rows_valid.
template <int HEAD_DIM, int LD>
__device__ __forceinline__ void load_rows_fp32(float* tile, int rows, const float* src, int64_t stride,
                                               int rows_valid, const float* bias) {
    for (int i = threadIdx.x; i < rows * HEAD_DIM; i += kFp32Threads) {
        const int row = i / HEAD_DIM;
        const int col = i % HEAD_DIM;
        float v = 0.f;
        if (row < rows_valid) v = src[row * stride + col] + (bias != nullptr ? bias[col] : 0.f);
        tile[row * LD + col] = v;
    }
}

// Grid: (query tiles of kFp32BlockM, batch, heads).
template <int HEAD_DIM>
__global__ void __launch_bounds__(kFp32Threads) attention_fp32_kernel(AttentionArgs args) {
    constexpr int QPW = kFp32BlockM / (kFp32Threads / 32);  // queries per warp
    constexpr int DPL = HEAD_DIM / 32;                       // output columns per lane
    __shared__ float sQ[kFp32BlockM * HEAD_DIM];
    __shared__ float sK[kFp32BlockN * (HEAD_DIM + 1)];  // +1: lane = key reads hit distinct banks
    __shared__ float sV[kFp32BlockN * HEAD_DIM];

    wait_on_producer();
    const int batch_index = blockIdx.y;
    const int head = blockIdx.z;
    // Clamped to the packed rows so that no cu_seqlens content reads or writes past them.
    const int start = min(max(args.cu_seqlens[batch_index], 0), args.total_rows);
    const int len = min(max(args.cu_seqlens[batch_index + 1], start), args.total_rows) - start;
    const int q0 = blockIdx.x * kFp32BlockM;
    if (q0 >= len) return;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int nh = args.num_heads;
    const int64_t stride = 3LL * nh * HEAD_DIM;
    const float* seq = static_cast<const float*>(args.qkv) + static_cast<int64_t>(start) * stride;
    const float* bias = static_cast<const float*>(args.qkv_bias);
    const float* bq = bias != nullptr ? bias + head * HEAD_DIM : nullptr;
    const float* bk = bias != nullptr ? bias + (nh + head) * HEAD_DIM : nullptr;
    const float* bv = bias != nullptr ? bias + (2 * nh + head) * HEAD_DIM : nullptr;

    load_rows_fp32<HEAD_DIM, HEAD_DIM>(sQ, kFp32BlockM, seq + static_cast<int64_t>(q0) * stride + head * HEAD_DIM,
                                       stride, len - q0, bq);
    const int keys_end = args.causal ? min(len, q0 + kFp32BlockM) : len;

    float m[QPW], l[QPW], o[QPW][DPL];
#pragma unroll
    for (int qi = 0; qi < QPW; ++qi) {
        m[qi] = -INFINITY;
        l[qi] = 0.f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) o[qi][e] = 0.f;
    }

    for (int kbase = 0; kbase < keys_end; kbase += kFp32BlockN) {
        __syncthreads();  // the previous tile is fully consumed (and sQ written, first time)
        const int valid = min(kFp32BlockN, keys_end - kbase);
        load_rows_fp32<HEAD_DIM, HEAD_DIM + 1>(
            sK, kFp32BlockN, seq + static_cast<int64_t>(kbase) * stride + (nh + head) * HEAD_DIM, stride, valid, bk);
        load_rows_fp32<HEAD_DIM, HEAD_DIM>(
            sV, kFp32BlockN, seq + static_cast<int64_t>(kbase) * stride + (2 * nh + head) * HEAD_DIM, stride, valid, bv);
        __syncthreads();

        const int key = kbase + lane;
#pragma unroll
        for (int qi = 0; qi < QPW; ++qi) {
            const int qrow = warp * QPW + qi;
            const int query = q0 + qrow;
            float score = 0.f;
#pragma unroll 16
            for (int d = 0; d < HEAD_DIM; ++d) score = fmaf(sQ[qrow * HEAD_DIM + d], sK[lane * (HEAD_DIM + 1) + d], score);
            const bool keep = key < keys_end && !(args.causal && key > query);
            score = keep ? score * args.softmax_scale : -INFINITY;
            // Finite: key 0 (tile 0) is kept for every query, so m is finite from the first tile on.
            const float m_new = fmaxf(m[qi], warp_max(score));
            const float p = keep ? expf(score - m_new) : 0.f;
            const float alpha = expf(m[qi] - m_new);
            l[qi] = l[qi] * alpha + warp_sum(p);
            m[qi] = m_new;
#pragma unroll
            for (int e = 0; e < DPL; ++e) o[qi][e] *= alpha;
            for (int k = 0; k < valid; ++k) {
                const float pk = __shfl_sync(0xffffffffu, p, k);
#pragma unroll
                for (int e = 0; e < DPL; ++e) o[qi][e] = fmaf(pk, sV[k * HEAD_DIM + lane + 32 * e], o[qi][e]);
            }
        }
    }

    allow_consumers();  // only the epilogue is left
    float* out = static_cast<float*>(args.out);
    const int64_t out_stride = static_cast<int64_t>(nh) * HEAD_DIM;
#pragma unroll
    for (int qi = 0; qi < QPW; ++qi) {
        const int query = q0 + warp * QPW + qi;
        if (query >= len) continue;
        const float inv = 1.f / l[qi];
#pragma unroll
        for (int e = 0; e < DPL; ++e)
            out[(start + query) * out_stride + head * HEAD_DIM + lane + 32 * e] = o[qi][e] * inv;
    }
}

}  // namespace attention_detail
}  // namespace padfree
