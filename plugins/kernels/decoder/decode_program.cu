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

#include "decode_linear.cuh"
#include "decoder_attention.cuh"

namespace padfree {
namespace {

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

// Waits until every CTA of the grid has arrived; what any CTA wrote before it is visible to all after.
// One thread per CTA arrives (an atomic) and polls the generation with volatile loads and a growing
// sleep: cooperative_groups' grid.sync() polls with back-to-back acquire loads, and the grid's ~500
// pollers on one line slowed the phases between the barriers (H100: a 1x4 Marian step took 2.3x
// the per-kernel path's time with it). The last CTA to arrive resets the count and moves the
// generation on, so the state is ready for the next barrier and the next launch.
__device__ __forceinline__ void grid_barrier(DecodeProgramBarrier* barrier) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned int* generation = &barrier->generation;
        const unsigned int seen = *generation;
        __threadfence();  // this CTA's writes (the block barrier ordered them before this thread's) go first
        if (atomicAdd(&barrier->arrived, 1u) == gridDim.x - 1) {
            atomicExch(&barrier->arrived, 0u);
            __threadfence();
            atomicAdd(&barrier->generation, 1u);
        } else {
            unsigned int sleep_ns = 32;
            while (*generation == seen) {
                __nanosleep(sleep_ns);
                sleep_ns = min(2 * sleep_ns, 256u);
            }
        }
        __threadfence();
    }
    __syncthreads();
}

template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads, kProgramBlocksPerSm)
    decode_program_kernel(const __grid_constant__ DecodeProgramOps program, DecodeProgramBarrier* barrier) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ DecodeProgramOp op;  // the phase's operation, out of the parameter bank once per CTA
    if (program.count > 0 && program.ops[0].kind == DecodeProgramOpKind::kLinear)
        prefetch_first_tile<T>(program.ops[0].linear, blockIdx.x);
    for (int i = 0; i < program.count; ++i) {
        if (threadIdx.x == 0) op = program.ops[i];
        __syncthreads();
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
            grid_barrier(barrier);
        }
    }
}

template <typename T, int kRows>
cudaError_t launch_rows(const DecodeProgramOps& program, DecodeProgramBarrier* barrier, cudaStream_t stream) {
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
    return cudaLaunchKernelEx(&config, kernel, program, barrier);
}

template <typename T>
cudaError_t launch_typed(const DecodeProgramOps& program, int rows, DecodeProgramBarrier* barrier,
                         cudaStream_t stream) {
    if (rows <= 1) return launch_rows<T, 1>(program, barrier, stream);
    if (rows <= 2) return launch_rows<T, 2>(program, barrier, stream);
    if (rows <= 4) return launch_rows<T, 4>(program, barrier, stream);
    return launch_rows<T, 8>(program, barrier, stream);
}

}  // namespace

cudaError_t launch_decode_program(const DecodeProgramOps& program, DecodeProgramBarrier* barrier, padfree_dtype dtype,
                                  cudaStream_t stream) {
    if (program.count == 0) return cudaSuccess;
    const DecodeProgramOp& first = program.ops[0];
    const int rows = first.kind == DecodeProgramOpKind::kLinear          ? first.linear.rows
                     : first.kind == DecodeProgramOpKind::kSelfAttention ? first.self_attention.rows
                                                                         : first.cross_attention.rows;
    cudaError_t err = cudaSuccess;
    dispatch_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        err = launch_typed<T>(program, rows, barrier, stream);
    });
    return err;
}

}  // namespace padfree
