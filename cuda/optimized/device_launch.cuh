#pragma once
/// @file device_launch.cuh
/// @brief What cuda-optimized's launches know about the device and decide from it
/// (internal to the CUDA backends): the SM count, the regime of a call, and
/// programmatic dependent launch (prologue.cuh has the kernels' side of it).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "rope/detail/plan.hpp"

namespace rope::cuda_detail {

/// Thread slots of one SM on every GPU since Volta.
inline constexpr int64_t kThreadSlotsPerSM = 2048;

/// @brief What a launch needs to know about the current device.
struct DeviceInfo {
    int multiprocessors = 0;           ///< Streaming multiprocessors.
    bool programmatic_launch = false;  ///< Compute capability >= 9.0: programmatic dependent launch.
};

/// @brief Reads DeviceInfo for CUDA device @p device (attribute queries only: no synchronisation).
inline DeviceInfo device_info(int device) {
    DeviceInfo info;
    check_cuda(cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    int major = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
    info.programmatic_launch = major >= 9;
    return info;
}

/// @brief A launch configuration that lets the kernel start during the previous kernel's
/// tail where the device allows it (the kernels call PreviousGrid::wait before any memory access).
///
/// The attribute lives in the returned object; launch with its `config`.
struct ProgrammaticLaunch {
    cudaLaunchAttribute attribute{};  ///< Programmatic stream serialisation allowed.
    cudaLaunchConfig_t config{};      ///< Grid, block, stream, and the attribute where supported.

    /// @brief Builds the configuration for @p grid x @p block threads on @p stream.
    ProgrammaticLaunch(dim3 grid, dim3 block, cudaStream_t stream, const DeviceInfo& device) {
        config = launch_config(grid, block, stream);
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        config.attrs = &attribute;
        config.numAttrs = device.programmatic_launch ? 1 : 0;
    }
    ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;  // config points at attribute.
    ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;
};

/// @brief The bandwidth regime: one thread per chunk of each row, in blocks of
/// @p block_threads, would already fill every thread slot of the GPU. Else the latency regime.
/// @param plan the call.
/// @param chunks chunks per row (chunks_per_row).
/// @param device the current device.
/// @param block_threads threads per block in that regime.
inline bool bandwidth_regime(const Plan& plan, int64_t chunks, const DeviceInfo& device, int64_t block_threads) {
    const int64_t block_x = std::min<int64_t>(chunks, block_threads);
    const int64_t rows = plan.q.in_geometry.heads + plan.k.in_geometry.heads;
    return plan.batch * plan.seq * rows * block_x >= int64_t(device.multiprocessors) * kThreadSlotsPerSM;
}

}  // namespace rope::cuda_detail
