#pragma once
/// @file kv_append.cuh
/// @brief cuda-optimized's RoPE + KV append (rope::append_kv), internal to the CUDA backends.
///
/// One launch does the whole decode step of a serving engine: every q head of
/// a token rotated into q_out (or, quantised, into an FP8 q output in the
/// caches' format), every k head rotated into k_out and into the k
/// cache row of the token's slot, every v head copied into the v cache row.
/// The kernel (kv_append.cu) is the RoPE kernel's recipe (unit_kernel.cuh)
/// applied to the larger call: 16-byte accesses, cos/sin computed once per
/// thread and reused across the heads of a token, a batch of rows loaded
/// before the first is used, int64 offsets, and a prologue that overlaps the
/// previous kernel. Views the 16-byte accesses cannot take, and an FP8 q in a
/// format other than the caches' (this kernel is compiled for one FP8 format
/// a call), go to the generic kernel (kv_append_generic.cu).

#include "device_launch.cuh"
#include "rope/detail/kv_append_plan.hpp"

namespace rope::cuda_detail {

/// @brief Checks every pointer the kernels will dereference, then launches the 16-byte
/// kernel where the call's views allow it, else the generic kernel, on plan.rope.stream,
/// without synchronising.
/// @param plan a validated, non-empty plan for Device::cuda, rotary_dim within cuda_limits().
/// @param device the current device.
/// @throws rope::Error naming a pointer that is not memory of the current device, or a refused launch.
void launch_kv_append_optimized(const KvAppendPlan& plan, const DeviceInfo& device);

}  // namespace rope::cuda_detail
