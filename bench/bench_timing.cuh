// What the standalone CUDA benchmarks (sync_costs.cu, copy_rates.cu) share: CHECK, a call checked and
// reported under the program's name (kBenchName, defined before this is included) that makes the calling
// function return 1, and best_ms, the best of `reps` timed runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#define CHECK(call)                                                                                        \
    do {                                                                                                   \
        const cudaError_t err_ = (call);                                                                   \
        if (err_ != cudaSuccess) {                                                                         \
            std::fprintf(stderr, "%s: %s failed: %s\n", kBenchName, #call, cudaGetErrorString(err_));    \
            return 1;                                                                                      \
        }                                                                                                  \
    } while (0)

// The shortest of `reps` runs of launch() on stream s (CUDA events, ms) into *best, after `warmups`
// untimed ones. Returns nonzero on a CUDA error.
template <typename Launch>
int best_ms(cudaStream_t s, int warmups, int reps, Launch launch, float* best) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int w = 0; w < warmups; ++w) CHECK(launch());
    CHECK(cudaStreamSynchronize(s));
    *best = 1e30f;
    for (int r = 0; r < reps; ++r) {
        CHECK(cudaEventRecord(e0, s));
        CHECK(launch());
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < *best) *best = ms;
    }
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return 0;
}
