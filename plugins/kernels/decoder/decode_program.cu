// The decode program: one cooperative grid runs a decode step's operations in order, a grid barrier
// between them.
//
// Why: at 1x4 a decode step is latency, not bandwidth. NLLB-600M's 12 layers take 8 kernels each
// (6 decode_linear, 2 attention), each a few microseconds of launch, ramp and drain for 2-8 MB of
// weights, so the step runs at ~3x its bytes' time. Inside one grid a phase boundary is a grid
// barrier instead, and every CTA starts its next weight tile towards L2 before it waits there (the
// weights never depend on the phase before), so the weight stream runs through the boundaries.
// Each phase is the same device code as its own kernel (decode_linear.cuh: decode_linear_block,
// decoder_attention.cuh: attend_block): results are bit-identical to the per-kernel path.
#include "decode_program.h"

#include <cooperative_groups.h>

#include "decode_linear.cuh"
#include "decoder_attention.cuh"

namespace padfree {
namespace {

namespace cg = cooperative_groups;
using decode_linear_detail::decode_linear_block;
using decode_linear_detail::decode_linear_smem;
using decode_linear_detail::prefetch_first_tile;
constexpr int kThreads = decode_linear_detail::kThreads;
static_assert(kThreads == decoder::kAttnThreads, "the phases share one block size");
// decode_linear's CTAs per SM, which its weight stream needs in flight (decode_linear.cuh)
constexpr int kProgramBlocksPerSm = decode_linear_detail::kBlocksPerSm;

// An attention phase: the grid strides over the attention's CTAs (items, kAttnWarps warps each).
// Phases are calls, not inlined: each is register-allocated on its own, as its own kernel is (inlined
// into one body, the attention's and the linear layer's live ranges spilled at 4 CTAs per SM).
template <typename T, int D, bool kSelf>
__device__ __noinline__ void attention_phase(decoder::DecoderAttentionArgs a) {
    a.warps_per_item = decoder::choose_warps_per_item(static_cast<int64_t>(a.rows) * a.num_heads, gridDim.x);
    const int64_t blocks = decoder::attention_blocks(a);
    for (int64_t block = blockIdx.x; block < blocks; block += gridDim.x) {
        decoder::attend_block<T, D, kSelf, false>(a, block);
        __syncthreads();  // the next item reuses the block's shared memory
    }
}

template <typename T, int kRows>
__device__ __noinline__ void linear_phase(const DecodeLinearArgs& a, unsigned char* smem_raw) {
    decode_linear_block<T, kRows, false>(a, smem_raw, blockIdx.x, gridDim.x);
}

template <typename T, bool kSelf, class Args>
__device__ void attention_op(const Args& args) {
    if (args.head_dim == 64) attention_phase<T, 64, kSelf>(decoder::attention_args(args));
    else attention_phase<T, 128, kSelf>(decoder::attention_args(args));
}

template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads, kProgramBlocksPerSm) decode_program_kernel(const __grid_constant__ DecodeProgramOps program) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    cg::grid_group grid = cg::this_grid();
    if (program.count > 0 && program.ops[0].kind == DecodeProgramOpKind::kLinear)
        prefetch_first_tile<T>(program.ops[0].linear, blockIdx.x);
    for (int i = 0; i < program.count; ++i) {
        const DecodeProgramOp& op = program.ops[i];
        switch (op.kind) {
            case DecodeProgramOpKind::kLinear:
                linear_phase<T, kRows>(op.linear, smem_raw);
                break;
            case DecodeProgramOpKind::kSelfAttention: attention_op<T, true>(op.self_attention); break;
            case DecodeProgramOpKind::kCrossAttention: attention_op<T, false>(op.cross_attention); break;
        }
        if (i + 1 < program.count) {
            // the next phase's first weight tile is not this phase's output: on its way before the barrier
            const DecodeProgramOp& next = program.ops[i + 1];
            if (next.kind == DecodeProgramOpKind::kLinear) prefetch_first_tile<T>(next.linear, blockIdx.x);
            grid.sync();
        }
    }
}

template <typename T, int kRows>
cudaError_t launch_rows(const DecodeProgramOps& program, cudaStream_t stream) {
    size_t smem = 0;
    for (int i = 0; i < program.count; ++i)
        if (program.ops[i].kind == DecodeProgramOpKind::kLinear)
            smem = std::max(smem, decode_linear_smem<T, kRows>(program.ops[i].linear));
    auto kernel = decode_program_kernel<T, kRows>;
    if (smem > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(smem));
        if (err != cudaSuccess) return err;
    }
    // a cooperative grid: every CTA resident at once (the barrier waits for all of them)
    int per_sm = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
    if (err != cudaSuccess) return err;
    if (per_sm == 0) return cudaErrorCooperativeLaunchTooLarge;
    const int sms = current_device_value<query_sm_count>();
    cudaLaunchAttribute cooperative{};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    const cudaLaunchConfig_t config{dim3(static_cast<unsigned>((sms > 0 ? sms : 1) * per_sm)), dim3(kThreads), smem,
                                    stream, &cooperative, 1};
    return cudaLaunchKernelEx(&config, kernel, program);
}

template <typename T>
cudaError_t launch_typed(const DecodeProgramOps& program, int rows, cudaStream_t stream) {
    if (rows <= 1) return launch_rows<T, 1>(program, stream);
    if (rows <= 2) return launch_rows<T, 2>(program, stream);
    if (rows <= 4) return launch_rows<T, 4>(program, stream);
    return launch_rows<T, 8>(program, stream);
}

}  // namespace

cudaError_t launch_decode_program(const DecodeProgramOps& program, padfree_dtype dtype, cudaStream_t stream) {
    if (program.count == 0) return cudaSuccess;
    const DecodeProgramOp& first = program.ops[0];
    const int rows = first.kind == DecodeProgramOpKind::kLinear          ? first.linear.rows
                     : first.kind == DecodeProgramOpKind::kSelfAttention ? first.self_attention.rows
                                                                         : first.cross_attention.rows;
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        err = launch_typed<T>(program, rows, stream);
    });
    return err;
}

}  // namespace padfree
