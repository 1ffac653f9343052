// cuda-optimized: RoPE at the speed of a memory copy.
//
// The kernel and the reasoning behind its shape are in unit_kernel.cuh; what a
// thread does before and around its first loads in prologue.cuh; what the
// launch knows about the device in device_launch.cuh; how a thread touches its
// chunk of a row (16-byte vectors, or the generic strided fallback) in
// row_access.cuh and vector_layout.hpp. This file is the backend: it picks,
// for a Plan, the access path, the batching of loads and the capacity of the
// angle arguments, as measured best on the H200 with bench/tune.cu
// (rope-tune), and launches.
#include <memory>

#include "check.hpp"
#include "kernel_args.cuh"
#include "pointer_check.hpp"
#include "rope/detail/backend_factories.hpp"
#include "device_launch.cuh"
#include "row_access.cuh"
#include "unit_kernel.cuh"

namespace rope {
namespace cuda_detail {
namespace {

/// Angle-argument capacity for rotary_dim <= 128: each launch then carries
/// about 600 bytes of frequency table instead of 4.6 KB, which trims small,
/// latency-bound launches.
constexpr int kSmallCapacity = 64;

/// The launch, per regime, as measured best by rope-tune on the H200
/// (2026-12-02 to 2026-12-04; bench/results/h200-tune.csv):
/// - bandwidth regime: batches of 4 rows loaded before use, no software
///   pipeline, default caching (streaming hints and the pipeline measured
///   0.5-3 points slower), 128-thread blocks; 8 rows per thread, whatever the
///   dtype (for the 2-byte types 16 rows share each sincosf twice as widely,
///   but two sweeps measured 8 ahead by 0.7-1.9 points on bshd, out of place
///   and on [4,32,2048,128], and level with 16 elsewhere);
///   units laid over q's memory order (RowOrder::memory: neighbouring heads of
///   a token for bshd and thd, measured 2-4 points faster there than
///   neighbouring tokens; neighbouring tokens for bhsd); no register cap
///   (a cap of 3 or 4 blocks of 256 threads per SM spills: 10-40 points slower);
/// - latency regime: 2 rows in flight, pipelined, 2 rows per thread;
/// - any view the 16-byte path cannot take: the generic path, 4 rows in flight.
template <typename Storage, Style kStyle, int Capacity>
void launch_vector(const Plan& plan, const DeviceInfo& device) {
    const LaunchSettings settings;
    using Path = VectorPath<Storage, kStyle, DefaultAccess>;
    if (bandwidth_regime(plan, chunks_per_row<Path>(plan), device, settings.block_threads))
        launch_units<Storage, Path, 4, false, 1, Capacity>(plan, device, settings);
    else
        launch_units<Storage, Path, 2, true, 1, Capacity>(plan, device, settings);
}

template <typename Storage, Style kStyle, int Capacity>
void launch_styled(const Plan& plan, const DeviceInfo& device) {
    if (vector_path_fits<Storage>(plan))
        launch_vector<Storage, kStyle, Capacity>(plan, device);
    else
        launch_units<Storage, GenericPath<Storage, kStyle>, 4, true, 1, Capacity>(plan, device, LaunchSettings{});
}

template <typename Storage, int Capacity>
void launch_for_plan(const Plan& plan, const DeviceInfo& device) {
    if (plan.style == Style::half_split)
        launch_styled<Storage, Style::half_split, Capacity>(plan, device);
    else
        launch_styled<Storage, Style::interleaved, Capacity>(plan, device);
}

class OptimizedCudaBackend final : public Backend {
public:
    std::string name() const override { return "cuda-optimized"; }
    Device device() const override { return Device::cuda; }
    BackendLimits limits() const override { return cuda_limits(); }
    void run(const Plan& plan) override {
        check_device_pointers(plan);  // Host or another GPU's memory: a rope::Error, not a fault.
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
    // do not synchronise. Asked on every call (well under a microsecond of host
    // time) rather than cached, so one backend object may serve several threads
    // and devices at once without shared mutable state.
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
