#pragma once
/// @file cuda_timing.hpp
/// @brief GPU timing for rope-bench: CUDA events around back-to-back work on one stream.
///
/// Built only when rope has CUDA (ROPE_HAVE_CUDA). The timing uses only the
/// CUDA runtime's host API, so it is plain C++ and needs no nvcc.

#include <cstddef>
#include <cstdint>
#include <functional>

namespace rope_bench {

/// @brief Median time of one call, in microseconds, measured with CUDA events.
///
/// Each repetition records an event, issues @p calls_per_rep calls of
/// @p launch back to back on the default stream (launch receives a running
/// call index, e.g. to rotate among buffers), records a second event and
/// divides the elapsed time by @p calls_per_rep. Back-to-back issue keeps the
/// GPU busy, so a call as short as a launch's latency is still measured.
/// @param warmup_calls calls issued (and synchronised) before timing
double cuda_median_us(const std::function<void(int64_t call)>& launch, int reps, int64_t calls_per_rep,
                      int64_t warmup_calls);

/// @brief Picks calls_per_rep so one repetition lasts about @p target_us (at least 1).
int64_t cuda_calls_per_rep(const std::function<void(int64_t call)>& launch, double target_us);

/// @brief Issues a device-to-device cudaMemcpyAsync of @p bytes on the default stream.
void cuda_copy_async(void* dst, const void* src, std::size_t bytes);

/// @brief Size of the current device's L2 cache in bytes.
std::size_t cuda_l2_bytes();

/// @brief Name of the current CUDA device, e.g. "NVIDIA H200".
const char* cuda_device_name();

}  // namespace rope_bench
