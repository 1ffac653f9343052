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
/// struct (at most 32 KB since CUDA 12.1; 4 KB plus the operands here);
/// kMaxPairs bounds rotary_dim.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "check.hpp"
#include "rope/error.hpp"
#include "rope/plan.hpp"
#include "rope/rotation.hpp"

namespace rope::cuda_detail {

/// @brief Most rotated pairs (rotary_dim / 2) a CUDA kernel accepts: rotary_dim <= 1024.
inline constexpr int64_t kMaxPairs = 512;

/// @brief The frequency table as a kernel parameter: theta_i and the scales of cos and sin.
///
/// theta_i travels as two floats: inv_freq (the float32 value every default
/// angle uses) and inv_freq_low, the rest of the exact value. Their sum in
/// double is bit for bit FrequencyTable::inv_freq_exact, which the precise
/// mode needs (it was built as exactly that sum), at half the bytes of a
/// double table.
/// @tparam Capacity pairs the struct can hold (the launch copies all of it, used or not)
template <int Capacity>
struct FrequencyArgs {
    float inv_freq[Capacity];      ///< theta_i in float32, for i < plan.pairs; the rest is unused.
    float inv_freq_low[Capacity];  ///< inv_freq_exact - inv_freq, exact in float32.
    float cos_scale;               ///< attention_factor.
    float sin_scale;               ///< attention_factor, negated for the inverse rotation.
    bool precise;                  ///< RopeConfig::precise_angles.
};

/// @brief Throws rope::Error naming rotary_dim if the plan has more pairs than the kernels take.
inline void check_rotary_dim(const Plan& plan) {
    if (plan.pairs > kMaxPairs)
        fail("rotary_dim", plan.rotary_dim,
             "the CUDA backends accept rotary_dim <= " + std::to_string(2 * kMaxPairs) +
                 " (the frequency table travels inside the kernel parameters)");
}

/// @brief Copies the plan's frequency table into a kernel parameter struct.
/// @pre plan.pairs <= Capacity (check_rotary_dim and the caller's choice of Capacity)
template <int Capacity>
FrequencyArgs<Capacity> make_frequency_args(const Plan& plan) {
    FrequencyArgs<Capacity> args{};
    for (int64_t i = 0; i < plan.pairs; ++i) {
        const size_t at = size_t(i);
        args.inv_freq[i] = plan.frequencies.inv_freq[at];
        args.inv_freq_low[i] = float(plan.frequencies.inv_freq_exact[at] - double(plan.frequencies.inv_freq[at]));
    }
    args.precise = plan.precise_angles;
    const float scale = plan.frequencies.attention_factor;
    // Exactly the CPU backends' products: cos * scale and sin * (sign * scale).
    args.cos_scale = scale;
    args.sin_scale = (plan.direction == Direction::forward ? 1.0f : -1.0f) * scale;
    return args;
}

/// @brief The stream the plan asks for (null: the legacy default stream).
inline cudaStream_t stream_of(const Plan& plan) { return static_cast<cudaStream_t>(plan.stream); }

/// @brief Number of streaming multiprocessors of CUDA device @p device (132 on an H200).
///
/// An attribute query: it does not synchronise the device.
inline int multiprocessor_count(int device) {
    int count = 0;
    check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    return count;
}

/// @brief Pair @p pair's rotation factors at @p position: cos and sin of its angle, each scaled.
///
/// The angle comes from pair_angle, the one definition every backend shares,
/// so the GPU turns each pair by the bit-identical angle the CPU uses: the
/// float32 product by default, or (precise mode) the double product reduced
/// to [-pi, pi]. The H200 has full-rate double arithmetic, and this runs once
/// per (position, pair), not per element, so the precise mode costs little.
/// sincosf is CUDA's accurate version (this project never builds with
/// --use_fast_math): RoPE's default angles are not reduced to [-pi, pi], and
/// the fast intrinsics lose accuracy far from it, i.e. at long positions.
template <int Capacity>
__device__ inline void rotation_factors(const FrequencyArgs<Capacity>& freq, int64_t position, int64_t pair,
                                        float& cos_angle, float& sin_angle) {
    const float inv_freq = freq.inv_freq[pair];
    // Only read when precise: the sum is exactly FrequencyTable::inv_freq_exact.
    const double inv_freq_exact = freq.precise ? double(inv_freq) + double(freq.inv_freq_low[pair]) : 0.0;
    float sin_raw, cos_raw;
    sincosf(pair_angle(freq.precise, position, inv_freq, inv_freq_exact), &sin_raw, &cos_raw);
    cos_angle = freq.cos_scale * cos_raw;
    sin_angle = freq.sin_scale * sin_raw;
}

}  // namespace rope::cuda_detail
