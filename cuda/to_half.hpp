#pragma once
/// @file to_half.hpp
/// @brief HF's DeepSeek order on the GPU (internal to the CUDA backends): the kernel both
/// CUDA backends launch for Style::interleaved_to_half.

#include "rope/detail/plan.hpp"

namespace rope::cuda_detail {

/// @brief Rotates @p plan, whose style reorders (Style::interleaved_to_half or
/// half_to_interleaved: rope::reorders), on plan.stream.
///
/// Pair i is read from features (2i, 2i+1) and written to (i, i + rotary_dim/2), or the
/// reverse, which are other pairs' inputs; one block takes a head row at a time, rotates all its pairs
/// into shared memory, and writes the window only once every pair is read, so an
/// in-place call is right too. Features past rotary_dim are copied when out of place.
/// @pre plan.pairs <= kMaxPairs (cuda_limits), plan.rotary_offset == 0 (detail::window_parts).
void launch_to_half(const Plan& plan);

}  // namespace rope::cuda_detail
