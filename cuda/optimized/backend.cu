// cuda-optimized: RoPE at the speed of a memory copy.
// The lesson: tutorials/04_optimized_cuda/chapter.md climbs to this kernel step by step.
//
// The kernel and the reasoning behind its shape are in unit_kernel.cuh; what a
// thread does before and around its first loads in prologue.cuh; what the
// launch knows about the device in device_launch.cuh; how a thread touches its
// chunk of a row (16-byte vectors, or the generic strided fallback) in
// row_access.cuh and vector_layout.hpp; RoPE fused with the KV-cache append
// in kv_append.cu. This file is the backend: it decides
// the regime of a call, once, and picks for it the access path, the batching
// of loads, the launch shape and the capacity of the angle arguments, and
// launches. The choices are the fastest of the lab's sweep: bench/tune.cu
// (rope-tune) times this kernel under other choices; the results are in
// bench/results/ (h200-tune.csv and its notes).
#include <memory>

#include "check.hpp"
#include "kernel_args.cuh"
#include "kv_append.cuh"
#include "kv_append_generic.hpp"
#include "pointer_check.hpp"
#include "rope/detail/backend_factories.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "device_launch.cuh"
#include "row_access.cuh"
#include "to_half.hpp"
#include "unit_kernel.cuh"

namespace rope {
namespace cuda_detail {
namespace {

/// Angle-argument capacity for rotary_dim <= 128: each launch then carries
/// about 600 bytes of frequency table instead of 4.6 KB, which trims small,
/// latency-bound launches.
constexpr int kSmallCapacity = 64;

/// Threads per block in both regimes: small blocks spread a small call over
/// more SMs, and larger ones measured slower on the large calls.
constexpr int kBlockThreads = 128;

/// The bandwidth regime (the work fills the GPU): 8 rows per thread, whatever
/// the dtype, each thread's rows loaded in batches of 4 before use, no software
/// pipeline. More rows per thread, fewer, a pipeline, a register cap and
/// streaming cache hints all measured slower in the lab.
constexpr LaunchShape kBandwidthShape{kBlockThreads, 8};
constexpr int kBandwidthRowsInFlight = 4;

/// The latency regime (small calls): 2 rows per thread, both in flight,
/// pipelined: with the prologue overlapping the previous kernel, a second row
/// costs less than more threads.
constexpr LaunchShape kLatencyShape{kBlockThreads, 2};
constexpr int kLatencyRowsInFlight = 2;

/// Any view the 16-byte path cannot take: the generic path, 4 rows in flight, pipelined.
constexpr int kGenericRowsInFlight = 4;

/// Launches the path for @p plan in the regime the call falls in, decided here and only here
/// (bandwidth_regime: would one thread per chunk of each row fill the GPU?).
template <typename Storage, Style kStyle, int Capacity>
void launch_styled(const Plan& plan, const DeviceInfo& device) {
    if (vector_path_fits<Storage>(plan)) {
        using Path = VectorPath<Storage, kStyle>;
        if (bandwidth_regime(plan, chunks_per_row<Path>(plan), device, kBlockThreads))
            launch_units<Storage, Path, kBandwidthRowsInFlight, false, Capacity>(plan, device, kBandwidthShape);
        else
            launch_units<Storage, Path, kLatencyRowsInFlight, true, Capacity>(plan, device, kLatencyShape);
    } else {
        using Path = GenericPath<Storage, kStyle>;
        const bool bandwidth = bandwidth_regime(plan, chunks_per_row<Path>(plan), device, kBlockThreads);
        launch_units<Storage, Path, kGenericRowsInFlight, true, Capacity>(plan, device,
                                                                          bandwidth ? kBandwidthShape : kLatencyShape);
    }
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
    void run_qk_norm(const QkNormPlan& plan) override { detail::run_qk_norm_cuda_optimized(plan); }  // qk_norm.cu
    void run(const Plan& plan) override {
        check_device_pointers(plan);  // Host or another GPU's memory: a rope::Error, not a fault.
        // HF's DeepSeek order: the shared kernel of its own (to_half.cu), which reads a row's window
        // whole before writing it; the unit kernel's instantiations for the other styles stay as they are.
        if (reorders(plan.style)) return launch_to_half(plan);
        const DeviceInfo device = current_device_info();
        dispatch_dtype(plan.dtype, [&](auto storage) {
            using Storage = decltype(storage);
            if (plan.pairs <= kSmallCapacity)
                launch_for_plan<Storage, kSmallCapacity>(plan, device);
            else
                launch_for_plan<Storage, int(kMaxPairs)>(plan, device);
        });
    }
    // RoPE + KV append: its own 16-byte kernel (kv_append.cu), the generic one for other views.
    void run_kv_append(const KvAppendPlan& plan) override {
        launch_kv_append_optimized(plan, current_device_info());
    }
    // Re-rotation of cached keys: the kernel cuda-naive runs (rerotate_cache.cu).
    void run_rerotate_cache(const KvAppendPlan& plan) override { launch_rerotate_cache(plan); }

private:
    // The current device's SM count and capabilities: attribute queries, which
    // do not synchronise. Asked on every call (cheap host-side reads) rather
    // than cached, so one backend object may serve several threads and devices
    // at once without shared mutable state.
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
