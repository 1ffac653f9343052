#pragma once
/// @file check.hpp
/// @brief Kernel launches whose refusal becomes a rope::Error (internal to the CUDA backends).
///
/// Every CUDA runtime call returns a status, and so does every kernel launch
/// made through cudaLaunchKernelEx (a bad configuration, a missing kernel
/// image). An unchecked status is a silent wrong answer later on, so every
/// call goes through rope::check_cuda (rope/cuda_check.hpp) and every launch
/// through launch_kernel.

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "rope/cuda_check.hpp"

namespace rope::cuda_detail {

/// @brief A launch configuration: grid, block, stream, dynamic shared memory, no attributes.
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, cudaStream_t stream, size_t shared_bytes = 0) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.stream = stream;
    config.dynamicSmemBytes = shared_bytes;
    return config;
}

/// @brief The configuration of a grid-stride launch over @p items work items: @p threads
/// a block and one thread an item, the blocks clamped to INT_MAX.
/// @pre items > 0
///
/// A grid holds at most 2^31 - 1 blocks in x; past that the kernel's grid-stride loop
/// (`item += gridDim.x * blockDim.x`) covers the rest, so the clamp loses no item.
inline cudaLaunchConfig_t grid_stride_config(int64_t items, int threads, cudaStream_t stream) {
    const int64_t blocks = (items + threads - 1) / threads;
    return launch_config(dim3(static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX))), dim3(unsigned(threads)),
                         stream);
}

/// @brief Launches @p kernel as `kernel<<<grid, block, 0, stream>>>(args...)` would, and
/// throws rope::Error with CUDA's text if this launch was refused.
/// @param name the kernel's name, for the message
///
/// Why not `<<<...>>>` followed by cudaGetLastError: that reads the calling
/// thread's last error, which may be left over from an unrelated earlier call
/// (a failed cudaMalloc, say) and would be blamed on this kernel.
/// cudaLaunchKernelEx returns the status of this launch alone, at no extra
/// cost and without synchronising. Faults that happen while the kernel runs
/// surface at the next synchronising call, as CUDA always reports them.
template <typename... Params, typename... Args>
void launch_kernel(const char* name, const cudaLaunchConfig_t& config, void (*kernel)(Params...), Args&&... args) {
    check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

}  // namespace rope::cuda_detail
