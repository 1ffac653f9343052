#pragma once
/// @file kernel_args.cuh
/// @brief What both CUDA backends hand their kernels, and the host helpers that build it
/// (internal to the CUDA backends).
///
/// A kernel receives its arguments by value: the launch copies them into the
/// GPU's constant bank together with the launch itself. That is how the
/// frequency table (a host std::vector in the Plan) reaches the GPU with no
/// cudaMemcpy: a copy from pageable host memory would block the host until the
/// stream drains, a hidden synchronisation that serialises the caller with the
/// GPU. The price is a fixed capacity, since kernel parameters are a fixed-size
/// struct (at most 32 KB since CUDA 12.1; 4.6 KB plus the operands here);
/// kMaxPairs bounds rotary_dim.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "check.hpp"
#include "rope/backend.hpp"
#include "rope/detail/plan.hpp"

namespace rope::cuda_detail {

/// @brief Most rotated pairs (rotary_dim / 2) a CUDA kernel accepts: rotary_dim <= 1024.
inline constexpr int64_t kMaxPairs = 512;

/// @brief The call's AngleRule as a kernel parameter: theta_i, the axis of each pair,
/// the scales of cos and sin, and a caller's table if any.
///
/// Member for member the host AngleRule (rope/detail/plan.hpp), with arrays of
/// fixed capacity instead of vectors, so the shared rotation_factors reads
/// either. theta_i travels as two floats (inv_freq and inv_freq_low), whose
/// double sum the precise mode uses, at half the bytes of a double table.
/// @tparam Capacity pairs the struct can hold (the launch copies all of it, used or not)
template <int Capacity>
struct AngleArgs {
    float inv_freq[Capacity];      ///< theta_i in float32, for i < plan.pairs; the rest is unused.
    float inv_freq_low[Capacity];  ///< theta_i - inv_freq, in float32.
    alignas(8) uint8_t pair_axis[Capacity];  ///< Position axis of each pair (aligned: read 8 at a time).
    float cos_scale;               ///< AngleRule::cos_scale.
    float sin_scale;               ///< AngleRule::sin_scale.
    bool precise;                  ///< RopeConfig::precise_angles.
    CosSinTable table;             ///< A caller's table (data null: computed).
};

/// @brief Copies the plan's angle rule into a kernel parameter struct.
/// @pre plan.pairs <= Capacity (BackendLimits and the caller's choice of Capacity)
template <int Capacity>
AngleArgs<Capacity> make_angle_args(const Plan& plan) {
    AngleArgs<Capacity> args{};
    for (int64_t i = 0; i < plan.pairs; ++i) {
        const size_t at = size_t(i);
        args.inv_freq[i] = plan.angles.inv_freq[at];
        args.inv_freq_low[i] = plan.angles.inv_freq_low[at];
        args.pair_axis[i] = plan.angles.pair_axis[at];
    }
    args.cos_scale = plan.angles.cos_scale;
    args.sin_scale = plan.angles.sin_scale;
    args.precise = plan.angles.precise;
    args.table = plan.angles.table;
    return args;
}

/// @brief What both CUDA backends declare to rope::apply(): the frequency table
/// travels inside the kernel parameters, so rotary_dim is bounded.
inline BackendLimits cuda_limits() { return BackendLimits{2 * kMaxPairs}; }

/// @brief The stream the plan asks for (null: the legacy default stream).
inline cudaStream_t stream_of(const Plan& plan) { return static_cast<cudaStream_t>(plan.stream); }

}  // namespace rope::cuda_detail
