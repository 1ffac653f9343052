// cuda-optimized: RoPE at the speed of a memory copy.
//
// The kernel and the reasoning behind its shape are in optimized_kernel.cuh;
// how a thread touches its piece of a row (16-byte vectors, or the generic
// strided fallback) is in row_access.cuh. This file is the backend: it picks
// the access path and the size of the frequency table for a Plan, and launches.
#include <memory>

#include "check.hpp"
#include "rope/detail/backend_factories.hpp"
#include "kernel_args.cuh"
#include "pointer_check.hpp"
#include "kernel.cuh"
#include "row_access.cuh"

namespace rope {
namespace cuda_detail {
namespace {

/// Frequency-table capacity for rotary_dim <= 128: each launch then carries
/// 256 bytes of table instead of 2 KB, which trims small, latency-bound launches.
constexpr int kSmallCapacity = 64;

/// The 16-byte path per regime (row_access.cuh; chosen with
/// rope-cuda-self-check --tune on the H200).
/// Bandwidth regime: streaming hints (evict first), measured 0.5-1% ahead of
/// plain accesses; a software pipeline for fp32, whose arithmetic is light,
/// and bigger batches without one for the 2-byte types, whose conversions
/// make more live registers (a pipeline there cost 1-3%).
/// Latency regime: single 128-bit instructions through the cache-operator
/// intrinsics, and the pipeline (a thread has two rows, nothing else to overlap).
template <typename Storage, Style kStyle>
using BandwidthPath = VectorPath<Storage, kStyle, StreamingAccess, /*Pipelined=*/sizeof(Storage) == 4>;
template <typename Storage, Style kStyle>
using LatencyPath = VectorPath<Storage, kStyle, CachedAccess, /*Pipelined=*/true>;

/// Launches the kernel for @p plan with the given access path.
template <typename Storage, typename Path, int Capacity>
void launch_path(const Plan& plan, const DeviceInfo& device) {
    launch_optimized<Storage, Path, Path::kRowsInFlight, Capacity, Path::kMinBlocksPerSM>(plan, device, LaunchTuning{});
}

/// The 16-byte path for @p plan's style, with the access flavour measured best for its regime.
template <typename Storage, Style kStyle, int Capacity>
void launch_vector(const Plan& plan, const DeviceInfo& device) {
    if (bandwidth_bound(plan, chunks_per_row<VectorPath<Storage, kStyle>>(plan), device, LaunchTuning{}))
        launch_path<Storage, BandwidthPath<Storage, kStyle>, Capacity>(plan, device);
    else
        launch_path<Storage, LatencyPath<Storage, kStyle>, Capacity>(plan, device);
}

/// Picks the access path for @p plan: 16-byte vectors where the views allow, else generic.
template <typename Storage, int Capacity>
void launch_for_plan(const Plan& plan, const DeviceInfo& device) {
    if (plan.style == Style::half_split && vector_path_fits<Storage, Style::half_split>(plan))
        launch_vector<Storage, Style::half_split, Capacity>(plan, device);
    else if (plan.style == Style::interleaved && vector_path_fits<Storage, Style::interleaved>(plan))
        launch_vector<Storage, Style::interleaved, Capacity>(plan, device);
    else
        launch_path<Storage, GenericPath<Storage>, Capacity>(plan, device);
}

class OptimizedCudaBackend final : public Backend {
public:
    std::string name() const override { return "cuda-optimized"; }
    Device device() const override { return Device::cuda; }
    BackendLimits limits() const override { return cuda_limits(); }
    void run(const Plan& plan) override {
        check_device_pointers(plan);  // Host or another GPU's memory: a rope::Error, not a fault.
        const DeviceInfo& device = current_device_info();
        dispatch_dtype(plan.dtype, [&](auto storage) {
            using Storage = decltype(storage);
            if (plan.pairs <= kSmallCapacity)
                launch_for_plan<Storage, kSmallCapacity>(plan, device);
            else
                launch_for_plan<Storage, int(kMaxPairs)>(plan, device);
        });
    }

private:
    // What the launch needs to know about the current device, asked again only when the device changes.
    const DeviceInfo& current_device_info() {
        int device = 0;
        check_cuda(cudaGetDevice(&device), "cudaGetDevice");
        if (device != cached_device_) {
            cached_info_ = device_info(device);
            cached_device_ = device;
        }
        return cached_info_;
    }
    int cached_device_ = -1;
    DeviceInfo cached_info_;
};

}  // namespace
}  // namespace cuda_detail

std::unique_ptr<Backend> make_cuda_optimized_backend() {
    return std::make_unique<cuda_detail::OptimizedCudaBackend>();
}

}  // namespace rope
