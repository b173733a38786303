// Library-wide entries of the C ABI: versions, status strings and the last error.
#include <string>

#include "capi_util.h"

#ifndef PADFREE_VERSION_STRING
#define PADFREE_VERSION_STRING "0.0.0"
#endif

namespace padfree {
namespace {
thread_local std::string last_error;
}

void set_last_error(const std::string& message) { last_error = message; }

padfree_status cuda_failure(const char* what, cudaError_t err) {
    cudaGetLastError();
    return fail(PADFREE_ERROR_CUDA, what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

padfree_status check_launch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? PADFREE_OK : cuda_failure(what, err);
}

}  // namespace padfree

extern "C" {

int padfree_abi_version(void) { return PADFREE_ABI_VERSION; }

const char* padfree_version(void) { return PADFREE_VERSION_STRING; }

const char* padfree_last_error(void) { return padfree::last_error.c_str(); }

const char* padfree_status_string(padfree_status status) {
    switch (status) {
        case PADFREE_OK: return "ok";
        case PADFREE_ERROR_INVALID_ARGUMENT: return "invalid argument";
        case PADFREE_ERROR_UNSUPPORTED: return "unsupported";
        case PADFREE_ERROR_CUDA: return "CUDA error";
    }
    return "unknown status";
}

padfree_status padfree_stream_synchronize(padfree_stream stream) {
    const cudaError_t err = cudaStreamSynchronize(padfree::as_cuda_stream(stream));
    if (err == cudaSuccess) return PADFREE_OK;
    return padfree::fail(PADFREE_ERROR_CUDA, "stream_synchronize: ", cudaGetErrorName(err), ": ",
                         cudaGetErrorString(err));
}

}  // extern "C"
