// The ladder's GPU plumbing: which version to launch, device facts, poisoned
// outputs. Nothing here is RoPE. The timing and the copy ceiling are rope-bench's
// (bench/timing/cuda_timing.hpp), so that the chapter's "% of copy" is the project's.
#include "ladder.cuh"

namespace ladder {
namespace {

void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) rope::fail(call, cudaGetErrorName(status), cudaGetErrorString(status));
}

}  // namespace

void launch(int version, const Problem& p, const Device& device) {
    switch (version) {
        case 1: launch_v1(p, grid_v1(p)); break;
        case 2: launch_v2(p, grid_v2(p)); break;
        case 3: launch_v3(p, grid_v3(p)); break;
        case 4: launch_v4(p, grid_v4(p)); break;
        case 5: launch_cos_sin_per_token(p, grid_v5(p)); break;
        default: launch_v6(p, device); break;
    }
}

Device query_device(std::string& name) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    Device facts;
    check(cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&facts.threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device),
          "cudaDeviceGetAttribute");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    name = properties.name;
    return facts;
}

void poison(void* device_memory, int64_t bytes) {
    check(cudaMemset(device_memory, 0xFF, size_t(bytes)), "cudaMemset");
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace ladder
