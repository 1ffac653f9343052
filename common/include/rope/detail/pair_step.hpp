#pragma once
/// @file detail/pair_step.hpp
/// @brief For backend authors: the per-token and per-pair steps every backend shares,
/// on the CPU and on the GPU alike.
///
/// - token_positions: a token's position on each axis;
/// - pair_angle: the angle of one pair at one position, in the call's mode;
/// - rotation_factors: cos and sin of one pair at one position (computed from
///   theta_i, or read from a caller's table), scaled and signed;
///   token_rotation_factors: the same for a token's positions on the pair's axis;
/// - rotate_pair_in_memory: read one pair where it lies, rotate it, write it.

#include <cmath>
#include <cstdint>

#include "rope/config.hpp"
#include "rope/detail/plan.hpp"
#include "rope/dtype.hpp"
#include "rope/host_device.hpp"
#include "rope/rotation.hpp"
#include "rope/tensor.hpp"

namespace rope {

/// @brief The positions of one token on every axis it has (one, for text RoPE).
struct TokenPositions {
    int64_t axis[kMaxPositionAxes];  ///< Position on axis a, for a < the plan's axes.
    /// float32(axis[a]): the factor of the default angle (rope_angle), converted
    /// once per token rather than once per pair: on a GPU, choosing each pair's int64
    /// position and converting it pair by pair adds work to every pair of a kernel that
    /// should run at the memory's speed, and was slower at M-RoPE (the lab's notes:
    /// bench/results/h200.md.in).
    float axis_float[kMaxPositionAxes];

    /// @brief The position pair @p pair turns by: its axis's (AngleRule::pair_axis), or with one
    /// axis the only one, without reading pair_axis (a GPU would serialise a warp's reads of it).
    /// @tparam Rule AngleRule or the CUDA kernels' copy of it.
    /// @param rule the call's angle rule.
    /// @param axes Plan::axes.
    /// @param pair the pair's index.
    /// @return the token's position on the pair's axis.
    template <typename Rule>
    ROPE_HOST_DEVICE int64_t of_pair(const Rule& rule, int64_t axes, int64_t pair) const {
        return axes == 1 ? axis[0] : of_axis(rule.pair_axis[pair]);
    }

    /// @brief The position pair i turns by, given its axis (AngleRule::pair_axis).
    ///
    /// A chain of selects rather than axis[index]: on a GPU a register array
    /// indexed at run time would be moved to slow local memory.
    /// @param index the pair's axis.
    /// @return the token's position on that axis.
    ROPE_HOST_DEVICE int64_t of_axis(int64_t index) const {
        return index == 0 ? axis[0] : index == 1 ? axis[1] : index == 2 ? axis[2] : axis[3];
    }

    /// @brief of_axis in float32: axis_float[index], by the same chain of selects.
    /// @param index the pair's axis.
    /// @return float32 of the token's position on that axis.
    ROPE_HOST_DEVICE float of_axis_float(int64_t index) const {
        return index == 0 ? axis_float[0] : index == 1 ? axis_float[1] : index == 2 ? axis_float[2] : axis_float[3];
    }
};

/// @brief Positions of token (b, s) on each of @p axes axes.
/// @tparam kMayBeRelative false where the source cannot be a re-rotation's (the default angle
///         path): PositionSource::at without its branch.
/// @param source where positions come from (Plan::positions).
/// @param axes Plan::axes.
/// @param b sequence index.
/// @param s token index.
/// @return the token's positions; a one-axis source gives every axis the same position.
template <bool kMayBeRelative = true>
ROPE_HOST_DEVICE inline TokenPositions token_positions(const PositionSource& source, int64_t axes, int64_t b,
                                                       int64_t s) {
    TokenPositions positions;
    positions.axis[0] = source.at<kMayBeRelative>(b, s, 0);
    // Else every axis shares row 0.
    const bool own_rows = (kMayBeRelative ? source.has_ids() : source.ids != nullptr) && axes > 1;
#if defined(__CUDA_ARCH__)
#pragma unroll  // Constant indices keep the array in registers (a GPU cannot index registers).
#endif
    for (int64_t a = 1; a < kMaxPositionAxes; ++a)
        positions.axis[a] = own_rows && a < axes ? source.at<kMayBeRelative>(b, s, a) : positions.axis[0];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int64_t a = 0; a < kMaxPositionAxes; ++a) positions.axis_float[a] = static_cast<float>(positions.axis[a]);
    return positions;
}

/// @brief cos and sin of @p angle, times the call's scales (AngleRule::cos_scale, sin_scale).
/// @param rule the call's angle rule.
/// @param angle the pair's angle, in radians.
/// @param[out] cos_angle cos_scale * cos(angle).
/// @param[out] sin_angle sin_scale * sin(angle).
template <typename Rule>
ROPE_HOST_DEVICE inline void scaled_sincos(const Rule& rule, float angle, float& cos_angle, float& sin_angle) {
    float cos_raw, sin_raw;
#if defined(__CUDA_ARCH__)
    // CUDA's accurate sincosf (this project never builds with --use_fast_math:
    // the default angles are not reduced to [-pi, pi], where the fast one is accurate).
    sincosf(angle, &sin_raw, &cos_raw);
#else
    cos_raw = std::cos(angle);
    sin_raw = std::sin(angle);
#endif
    cos_angle = rule.cos_scale * cos_raw;
    sin_angle = rule.sin_scale * sin_raw;
}

/// @brief The angle pair @p pair turns by at @p position in the call's mode:
/// rope_angle by default, rope_angle_precise in the precise mode.
/// @tparam Rule AngleRule, or any type with the same members (see rotation_factors).
/// @param rule the call's angle rule (its frequencies and mode).
/// @param position the position the pair turns by.
/// @param pair the pair's index, in [0, rotary_dim/2).
/// @return the angle, in radians.
template <typename Rule>
ROPE_HOST_DEVICE inline float pair_angle(const Rule& rule, int64_t position, int64_t pair) {
    // The low part is read only in the precise mode: on a GPU each such read is a
    // constant-bank access that a warp's different pairs serialise.
    return rule.precise ? rope_angle_precise(position, rule.inv_freq[pair], rule.inv_freq_low[pair])
                        : rope_angle(position, rule.inv_freq[pair]);
}

/// @brief cos and sin of pair @p pair at @p position, times the call's scales.
///
/// Computed from the frequency table (the same pair_angle on every backend)
/// or, when the call brought one, read from the caller's cos/sin table; a
/// position outside that table gives NaN, never a read outside it.
/// @tparam Rule AngleRule on the host, or any type with the same members
///         (inv_freq[i], inv_freq_low[i], precise, cos_scale, sin_scale, table)
///         that device code can read, such as the CUDA kernels' parameters.
/// @param rule the call's angle rule.
/// @param position the position the pair turns by.
/// @param pair the pair's index, in [0, rotary_dim/2).
/// @param[out] cos_angle cos_scale * cos(angle).
/// @param[out] sin_angle sin_scale * sin(angle) (negated for the inverse rotation).
template <typename Rule>
ROPE_HOST_DEVICE inline void rotation_factors(const Rule& rule, int64_t position, int64_t pair, float& cos_angle,
                                              float& sin_angle) {
    if (rule.table.data != nullptr) {
        float cos_raw, sin_raw;
        if (position < 0 || position >= rule.table.rows) {
            cos_raw = sin_raw = bits_to_float(0x7fc00000u);  // quiet NaN: visibly wrong, never out of bounds
        } else {
            const float* row = rule.table.data + position * rule.table.row_stride;
            cos_raw = row[pair];
            sin_raw = row[rule.table.pairs + pair];
        }
        cos_angle = rule.cos_scale * cos_raw;
        sin_angle = rule.sin_scale * sin_raw;
        return;
    }
    scaled_sincos(rule, pair_angle(rule, position, pair), cos_angle, sin_angle);
}

/// @brief True when @p rule turns pairs by the default angle: computed (no caller's table), not precise.
/// @param rule the call's angle rule.
/// @return whether token_rotation_factors<true> may be used with @p rule.
template <typename Rule>
ROPE_HOST_DEVICE inline bool default_angle_only(const Rule& rule) {
    return rule.table.data == nullptr && !rule.precise;
}

/// @brief rotation_factors of pair @p pair of a token, whose position on the pair's axis
/// @p axis is in @p positions: the same cos and sin, bit for bit.
/// @tparam kDefaultAngleOnly true where the caller knows that default_angle_only(rule):
///         the angle then takes the token's float32 position (TokenPositions::axis_float,
///         converted once per token), and the code of the precise mode and of a table
///         is not compiled in (on a GPU their double arithmetic and reads cost registers
///         that the default angle, by far the most used, should not pay). False: any
///         rule, through rotation_factors of the int64 id.
/// @param rule the call's angle rule.
/// @param positions the token's positions (token_positions).
/// @param axis the pair's axis: AngleRule::pair_axis[pair], or 0 with one axis.
/// @param pair the pair's index, in [0, rotary_dim/2).
/// @param[out] cos_angle cos_scale * cos(angle).
/// @param[out] sin_angle sin_scale * sin(angle).
template <bool kDefaultAngleOnly, typename Rule>
ROPE_HOST_DEVICE inline void token_rotation_factors(const Rule& rule, const TokenPositions& positions, int64_t axis,
                                                    int64_t pair, float& cos_angle, float& sin_angle) {
    if constexpr (kDefaultAngleOnly)
        scaled_sincos(rule, rope_angle(positions.of_axis_float(axis), rule.inv_freq[pair]), cos_angle, sin_angle);
    else
        rotation_factors(rule, positions.of_axis(axis), pair, cos_angle, sin_angle);
}

/// @brief Rotates pair @p pair of head row (b, h, s): reads its two features from
/// @p in, rotates them in float32 and writes them, rounded to @p Storage, to @p out.
///
/// Both features are read before either is written, so @p out may be @p in (an
/// in-place call). The arithmetic is float32 whatever the storage type.
/// @tparam Storage element type in memory: float, float16 or bfloat16.
/// @param in first element of the input tensor.
/// @param in_geometry sizes and strides of the input.
/// @param out first element of the output tensor (may equal @p in).
/// @param out_geometry sizes and strides of the output.
/// @param b sequence index.
/// @param h head index.
/// @param s token index.
/// @param pair the pair's two features (pair_elements).
/// @param cos_angle cosine of the angle, times the attention factor.
/// @param sin_angle sine of the angle, times the attention factor (negated for the inverse).
template <typename Storage>
ROPE_HOST_DEVICE inline void rotate_pair_in_memory(const Storage* in, const Geometry& in_geometry, Storage* out,
                                                   const Geometry& out_geometry, int64_t b, int64_t h, int64_t s,
                                                   PairIndex pair, float cos_angle, float sin_angle) {
    float x = to_float(in[in_geometry.offset(b, h, s, pair.first)]);
    float y = to_float(in[in_geometry.offset(b, h, s, pair.second)]);
    rotate_pair(x, y, cos_angle, sin_angle);
    out[out_geometry.offset(b, h, s, pair.first)] = from_float<Storage>(x);
    out[out_geometry.offset(b, h, s, pair.second)] = from_float<Storage>(y);
}

}  // namespace rope
