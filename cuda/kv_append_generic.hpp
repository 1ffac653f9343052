#pragma once
/// @file kv_append_generic.hpp
/// @brief The generic CUDA kernel of RoPE + KV append (rope::append_kv), internal to the
/// CUDA backends: cuda-naive's kernel, and cuda-optimized's until it has its own.

#include "rope/detail/kv_append_plan.hpp"

namespace rope::cuda_detail {

/// @brief Checks every pointer the kernel will dereference (q, k, their outputs, positions,
/// the table, v, the slots, both caches and their scales), then launches the generic
/// kernel on plan.rope.stream without synchronising.
/// @param plan a validated, non-empty plan for Device::cuda, rotary_dim within cuda_limits().
/// @throws rope::Error naming a pointer that is not memory of the current device, or a refused launch.
void launch_kv_append_generic(const KvAppendPlan& plan);

/// @brief Checks the pointers the re-rotation kernel dereferences (the positions, the slots,
/// the cache), then launches it on plan.rope.stream without synchronising (rerotate_cache.cu):
/// rope::rerotate_cache on both CUDA backends.
/// @param plan a validated, non-empty plan for Device::cuda, built by rope::rerotate_cache.
/// @throws rope::Error naming a pointer that is not memory of the current device, or a refused launch.
void launch_rerotate_cache(const KvAppendPlan& plan);

}  // namespace rope::cuda_detail
