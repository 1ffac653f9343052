// The ladder's GPU plumbing: which version to launch, device facts, timing with
// CUDA events, the copy ceiling. Nothing here is RoPE; it is how to measure it.
#include <algorithm>
#include <vector>

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

// CUDA events are timestamps taken by the GPU itself, in stream order: the
// time between two of them is GPU time, free of the CPU's launch overheads
// except where the GPU had to wait for the next launch. One launch of a few
// microseconds is too short for the events' resolution (about half a
// microsecond), so each sample times `repeats` back-to-back calls; the result
// is the median over samples of the time per call.
double time_microseconds(const std::function<void()>& enqueue) {
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    auto sample = [&](int repeats) {
        check(cudaEventRecord(start), "cudaEventRecord");
        for (int r = 0; r < repeats; ++r) enqueue();
        check(cudaEventRecord(stop), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float milliseconds = 0;
        check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
        return 1000.0 * double(milliseconds) / repeats;
    };
    sample(3);  // Warm-up: first launches load the kernel's code onto the GPU.
    // Enough calls per sample for about 200 microseconds of work.
    const int repeats = int(std::clamp(200.0 / std::max(sample(1), 0.1), 1.0, 2000.0));
    std::vector<double> samples;
    for (int s = 0; s < 31; ++s) samples.push_back(sample(repeats));
    std::sort(samples.begin(), samples.end());
    check(cudaEventDestroy(start), "cudaEventDestroy");
    check(cudaEventDestroy(stop), "cudaEventDestroy");
    return samples[samples.size() / 2];
}

void copy_device_to_device(void* destination, const void* source, int64_t bytes) {
    check(cudaMemcpyAsync(destination, source, size_t(bytes), cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
}

void poison(void* device_memory, int64_t bytes) {
    check(cudaMemset(device_memory, 0xFF, size_t(bytes)), "cudaMemset");
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace ladder
