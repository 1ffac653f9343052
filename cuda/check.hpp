#pragma once
/// @file check.hpp
/// @brief Turns CUDA runtime failures into rope::Error (internal to the CUDA backends).
///
/// Every CUDA runtime call returns a status, and a kernel launch reports its
/// own failures (a bad configuration, a missing kernel image) only through
/// cudaGetLastError. An unchecked status is a silent wrong answer later on, so
/// every call goes through check_cuda and every launch through check_launch.

#include <cuda_runtime_api.h>

#include "rope/error.hpp"

namespace rope::cuda_detail {

/// @brief Throws rope::Error if @p status is not cudaSuccess.
/// @param status what the runtime returned
/// @param call the call as the user would recognise it, e.g. "cudaMalloc"
///
/// The message has rope's usual form, `call = cudaErrorName: CUDA's own text`,
/// e.g. `rope::Error: cudaMalloc = cudaErrorMemoryAllocation: out of memory`.
inline void check_cuda(cudaError_t status, const char* call) {
    if (status != cudaSuccess) fail(call, cudaGetErrorName(status), cudaGetErrorString(status));
}

/// @brief Checks that the kernel launch just issued was accepted.
/// @param kernel name of the kernel, for the message
///
/// cudaGetLastError reads (and clears) the error of the most recent launch on
/// this thread without waiting for the kernel to run: it costs no
/// synchronisation. Faults that happen while the kernel runs surface at the
/// next synchronising call, as CUDA always reports them.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

}  // namespace rope::cuda_detail
