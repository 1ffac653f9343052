// cuda-optimized: RoPE at the speed of a memory copy.
//
// The kernel and the reasoning behind its shape are in optimized_kernel.cuh;
// how a thread touches its piece of a row (16-byte vectors, or the generic
// strided fallback) is in row_access.cuh. This file is the backend: it picks
// the access path and the size of the frequency table for a Plan, and launches.
#include <memory>

#include "backend_factories.hpp"
#include "check.hpp"
#include "kernel_args.cuh"
#include "optimized_kernel.cuh"
#include "row_access.cuh"

namespace rope {
namespace cuda_detail {
namespace {

/// Frequency-table capacity for rotary_dim <= 128: each launch then carries
/// 256 bytes of table instead of 2 KB, which trims small, latency-bound launches.
constexpr int kSmallCapacity = 64;

template <typename Storage, typename Path, int Capacity>
void launch_path(const Plan& plan, int multiprocessors) {
    launch_optimized<Storage, Path, Path::kRowsInFlight, Capacity, Path::kMinBlocksPerSM>(plan, multiprocessors,
                                                                                       LaunchTuning{});
}

/// Picks the access path for @p plan: 16-byte vectors where the views allow, else generic.
template <typename Storage, int Capacity>
void launch_for_plan(const Plan& plan, int multiprocessors) {
    if (plan.style == Style::half_split && vector_path_fits<Storage, Style::half_split>(plan))
        launch_path<Storage, VectorPath<Storage, Style::half_split>, Capacity>(plan, multiprocessors);
    else if (plan.style == Style::interleaved && vector_path_fits<Storage, Style::interleaved>(plan))
        launch_path<Storage, VectorPath<Storage, Style::interleaved>, Capacity>(plan, multiprocessors);
    else
        launch_path<Storage, GenericPath<Storage>, Capacity>(plan, multiprocessors);
}

class OptimizedCudaBackend final : public Backend {
public:
    std::string name() const override { return "cuda-optimized"; }
    Device device() const override { return Device::cuda; }

    void run(const Plan& plan) override {
        check_rotary_dim(plan);
        if (plan.empty()) return;
        const int multiprocessors = multiprocessors_of_current_device();
        dispatch_dtype(plan.dtype, [&](auto storage) {
            using Storage = decltype(storage);
            if (plan.pairs <= kSmallCapacity)
                launch_for_plan<Storage, kSmallCapacity>(plan, multiprocessors);
            else
                launch_for_plan<Storage, int(kMaxPairs)>(plan, multiprocessors);
        });
    }

private:
    // The SM count of the current device, asked again only when the device changes.
    int multiprocessors_of_current_device() {
        int device = 0;
        check_cuda(cudaGetDevice(&device), "cudaGetDevice");
        if (device != cached_device_) {
            cached_multiprocessors_ = multiprocessor_count(device);
            cached_device_ = device;
        }
        return cached_multiprocessors_;
    }
    int cached_device_ = -1;
    int cached_multiprocessors_ = 0;
};

}  // namespace
}  // namespace cuda_detail

std::unique_ptr<Backend> make_cuda_optimized_backend() {
    return std::make_unique<cuda_detail::OptimizedCudaBackend>();
}

}  // namespace rope
