// cuda-optimized: RoPE at the speed of a memory copy.
//
// The kernel and the reasoning behind its shape are in tile_kernel.cuh; how
// the call is cut into tiles is in tiling.hpp; how a thread touches its chunk
// of a row (16-byte vectors, or the generic strided fallback) is in
// row_access.cuh and vector_layout.hpp. This file is the backend: it picks the
// access path and the capacity of the angle arguments for a Plan, and launches.
#include <memory>

#include "check.hpp"
#include "kernel_args.cuh"
#include "rope/detail/backend_factories.hpp"
#include "row_access.cuh"
#include "tile_kernel.cuh"

namespace rope {
namespace cuda_detail {
namespace {

/// Angle-argument capacity for rotary_dim <= 128: each launch then carries
/// about 600 bytes of frequency table instead of 4.6 KB, which trims small,
/// latency-bound launches.
constexpr int kSmallCapacity = 64;

/// Chunks each thread loads before it uses the first (tile_kernel.cuh, 3.).
constexpr int kItemsInFlight = 4;

/// How the 16-byte accesses are issued (row_access.cuh).
using Access = DefaultAccess;

/// Launches the tile kernel for @p plan: 16-byte vectors where the views allow, else one pair at a time.
template <typename Storage, int Capacity, Style kStyle>
void launch_styled(const Plan& plan, const DeviceInfo& device) {
    const TileSettings settings;
    if (vector_path_fits<Storage>(plan))
        launch_tiles<Storage, VectorPath<Storage, kStyle, Access>, kItemsInFlight, Capacity>(plan, device, settings);
    else
        launch_tiles<Storage, GenericPath<Storage, kStyle>, kItemsInFlight, Capacity>(plan, device, settings);
}

template <typename Storage, int Capacity>
void launch_for_plan(const Plan& plan, const DeviceInfo& device) {
    if (plan.style == Style::half_split)
        launch_styled<Storage, Capacity, Style::half_split>(plan, device);
    else
        launch_styled<Storage, Capacity, Style::interleaved>(plan, device);
}

class OptimizedCudaBackend final : public Backend {
public:
    std::string name() const override { return "cuda-optimized"; }
    Device device() const override { return Device::cuda; }
    BackendLimits limits() const override { return cuda_limits(); }
    void run(const Plan& plan) override {
        const DeviceInfo device = current_device_info();
        dispatch_dtype(plan.dtype, [&](auto storage) {
            using Storage = decltype(storage);
            if (plan.pairs <= kSmallCapacity)
                launch_for_plan<Storage, kSmallCapacity>(plan, device);
            else
                launch_for_plan<Storage, int(kMaxPairs)>(plan, device);
        });
    }

private:
    // The current device's SM count and capabilities: attribute queries, which
    // do not synchronise. Asked on every call (a few hundred nanoseconds of host
    // time) rather than cached, so one backend object may serve several
    // threads and devices at once without shared mutable state.
    static DeviceInfo current_device_info() {
        int device = 0;
        check_cuda(cudaGetDevice(&device), "cudaGetDevice");
        return device_info(device);
    }
};

}  // namespace
}  // namespace cuda_detail

std::unique_ptr<Backend> make_cuda_optimized_backend() {
    return std::make_unique<cuda_detail::OptimizedCudaBackend>();
}

}  // namespace rope
