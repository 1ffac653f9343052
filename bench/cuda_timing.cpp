// GPU timing for rope-bench. Host-side CUDA runtime calls only: compiled by
// the C++ compiler and linked against cudart.
#include "cuda_timing.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "rope/error.hpp"

namespace rope_bench {
namespace {

// A failed CUDA call ends the benchmark with CUDA's own error text.
void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) rope::fail(call, cudaGetErrorName(status), cudaGetErrorString(status));
}

// Owns a pair of events for the lifetime of one measurement.
struct EventPair {
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    EventPair() {
        check(cudaEventCreate(&start), "cudaEventCreate");
        check(cudaEventCreate(&stop), "cudaEventCreate");
    }
    ~EventPair() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;

    // Milliseconds between the two events for calls [first, first + count) of launch.
    float time_ms(const std::function<void(int64_t)>& launch, int64_t first, int64_t count) {
        check(cudaEventRecord(start, nullptr), "cudaEventRecord");
        for (int64_t call = first; call < first + count; ++call) launch(call);
        check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        check(cudaGetLastError(), "kernel launch");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        return ms;
    }
};

}  // namespace

double cuda_median_us(const std::function<void(int64_t call)>& launch, int reps, int64_t calls_per_rep,
                      int64_t warmup_calls) {
    for (int64_t call = 0; call < warmup_calls; ++call) launch(call);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EventPair events;
    std::vector<double> per_call_us;
    int64_t call = warmup_calls;
    for (int rep = 0; rep < reps; ++rep) {
        const float ms = events.time_ms(launch, call, calls_per_rep);
        call += calls_per_rep;
        per_call_us.push_back(1000.0 * ms / double(calls_per_rep));
    }
    std::nth_element(per_call_us.begin(), per_call_us.begin() + reps / 2, per_call_us.end());
    return per_call_us[size_t(reps / 2)];
}

int64_t cuda_calls_per_rep(const std::function<void(int64_t call)>& launch, double target_us) {
    EventPair events;
    events.time_ms(launch, 0, 1);  // First call: module loading and clocks ramping up.
    const double one_call_us = 1000.0 * events.time_ms(launch, 1, 4) / 4.0;
    return std::clamp<int64_t>(int64_t(target_us / std::max(one_call_us, 0.1)), 1, 10000);
}

void cuda_copy_async(void* dst, const void* src, std::size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
}

std::size_t cuda_l2_bytes() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    int bytes = 0;
    check(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
    return std::size_t(bytes);
}

const char* cuda_device_name() {
    static std::string name;
    if (name.empty()) {
        int device = 0;
        check(cudaGetDevice(&device), "cudaGetDevice");
        cudaDeviceProp properties{};
        check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
        name = properties.name;
    }
    return name.c_str();
}

}  // namespace rope_bench
