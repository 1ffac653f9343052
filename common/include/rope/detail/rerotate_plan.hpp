#pragma once
/// @file detail/rerotate_plan.hpp
/// @brief For backend authors and benchmarks: a re-rotation (rope::rerotate) validated into the
/// Plan a backend runs.
///
/// Users never need this header: rope::rerotate builds the plan and runs it.
/// A program that times Backend::run on plans built before the clock
/// (rope-bench --op rerotate) builds them here, with the same checks and the
/// same plan as rope::rerotate's.

#include "rope/config.hpp"
#include "rope/detail/plan.hpp"
#include "rope/rerotate.hpp"
#include "rope/tensor.hpp"

namespace rope {
namespace detail {

/// @brief Validates @p args against @p config for a backend on @p device and builds the
/// plan of the re-rotation, as rope::rerotate does before it runs it.
///
/// The plan is rope::apply's for keys only (q with no heads) at positions
/// `to`, with a relative PositionSource (to - from), the precise angle path
/// forced, the rotation unscaled, and for dynamic and longrope scaling the
/// frequencies both sides agree on (rope/rerotate.hpp says which re-rotations
/// are refused). The plan is not checked against a backend's limits
/// (rope::BackendLimits) and may carry a rotary window: rope::rerotate runs it
/// through detail::run_plan, which checks the one and cuts the other into
/// window_parts(); a caller of Backend::run must first run the call once through
/// rope::rerotate with the same backend, which refuses what that backend does not
/// implement.
/// @param config the model's RoPE (validated first, as validate() does).
/// @param args the keys, the two positions and the stream.
/// @param device where the backend runs: k, k_out and every position array must live there.
/// @return the plan (an empty call, which no backend runs, gets no angles).
/// @throws rope::Error naming the offending parameter and its value (k head_dim, k_out
/// sizes, from.ids[3], to.length, scaling.type, ...).
Plan make_rerotate_plan(const RopeConfig& config, const RerotateArgs& args, Device device);

}  // namespace detail
}  // namespace rope
