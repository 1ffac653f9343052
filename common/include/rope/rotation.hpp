#pragma once
/// @file rotation.hpp
/// @brief The three rules of RoPE, shared verbatim by every backend:
/// which features pair up, what angle a pair turns by, and the 2-D rotation.

#include <cmath>
#include <cstdint>

#include "rope/config.hpp"
#include "rope/host_device.hpp"

namespace rope {

/// @brief Feature indices (within one head row) of the two halves of a pair.
struct PairIndex {
    int64_t first;   ///< Feature that plays the role of x in the 2-D rotation.
    int64_t second;  ///< Feature that plays the role of y.
};

/// @brief Features of pair @p i for a rotary block of @p rotary_dim features: where it is read.
///
/// Half-split pairs i with i + rotary_dim/2 (HuggingFace `rotate_half`);
/// interleaved pairs 2i with 2i+1 (GPT-J, and the input of interleaved_to_half;
/// half_to_interleaved reads half-split pairs).
/// Mixing the two up does not crash anything: a model simply gets the wrong
/// rotation and quietly degrades.
/// @param style the pairing style.
/// @param rotary_dim features that rotate (even).
/// @param i pair index, in [0, rotary_dim/2).
/// @return the indices of the pair's x and y features in the input.
ROPE_HOST_DEVICE inline PairIndex pair_elements(Style style, int64_t rotary_dim, int64_t i) {
    if (style == Style::half_split || style == Style::half_to_interleaved) return {i, i + rotary_dim / 2};
    return {2 * i, 2 * i + 1};
}

/// @brief Where pair @p i's rotated x and y are written: pair_elements, except for
/// Style::interleaved_to_half (HF's DeepSeek order), which reads (2i, 2i+1) and writes
/// (i, i + rotary_dim/2), and Style::half_to_interleaved, the reverse. There a pair's
/// outputs are other pairs' inputs, so a row is read whole before it is written.
/// @param style the pairing style.
/// @param rotary_dim features that rotate (even).
/// @param i pair index, in [0, rotary_dim/2).
/// @return the indices of the pair's rotated x and y features in the output.
ROPE_HOST_DEVICE inline PairIndex output_pair_elements(Style style, int64_t rotary_dim, int64_t i) {
    if (style == Style::interleaved || style == Style::half_to_interleaved) return {2 * i, 2 * i + 1};
    return {i, i + rotary_dim / 2};
}

/// @brief Rotation angle of pair i at @p position: position * theta_i, in float32.
///
/// Both factors are converted to float32 and multiplied once, exactly as
/// HuggingFace does (`inv_freq.float() @ position_ids.float()`), so every
/// backend turns a pair by the very same float32 angle. The rounding of this
/// product is the main error against an exact oracle and grows with position.
/// Code that turns every pair of a token may convert the token's position to
/// float32 once and pass that (TokenPositions::axis_float): the same product.
/// @tparam Position an integer type (the position id), or float (the id already converted).
/// @param position the token's position id.
/// @param inv_freq theta_i of the pair, in float32.
/// @return float32(position) * inv_freq, in radians (not reduced to [-pi, pi]).
template <typename Position>
ROPE_HOST_DEVICE inline float rope_angle(Position position, float inv_freq) {
    return static_cast<float>(position) * inv_freq;
}

/// @brief The precise mode's angle of pair i at @p position (RopeConfig::precise_angles).
///
/// theta_i is taken to about 48 bits, as the double sum of its float32 value
/// and its float32 low part (FrequencyTable::inv_freq_low); the product with
/// the position is formed in double (relative error about 1e-16, so 4e-10
/// radians even at position 4M), reduced to [-pi, pi] in double, and only
/// then rounded to float32: sin and cos of a float in [-pi, pi] are accurate
/// to about 1e-7, whatever the position was. The float32 default cannot do
/// this: float32(position) * theta_i is already wrong by up to
/// position * 6e-8 radians before any sin is taken.
/// @param position the token's position id.
/// @param inv_freq theta_i of the pair, rounded to float32.
/// @param inv_freq_low theta_i - inv_freq, rounded to float32.
/// @return the angle reduced to [-pi, pi], in radians, rounded to float32.
ROPE_HOST_DEVICE inline float rope_angle_precise(int64_t position, float inv_freq, float inv_freq_low) {
    const double two_pi = 6.283185307179586;
    const double angle = static_cast<double>(position) * (double(inv_freq) + double(inv_freq_low));
    const double turns = rint(angle / two_pi);  // whole turns to remove
    // One fused multiply-add, written out: a compiler may fuse `angle - turns * two_pi`
    // on one processor and not on another, and every backend must get the same bits.
    return static_cast<float>(fma(-turns, two_pi, angle));
}

/// @brief Rotates (x, y) by the angle whose scaled cosine and sine are given.
///
/// Forward: (x cos - y sin, y cos + x sin), which is `x*cos + rotate_half(x)*sin`
/// written per pair. The inverse passes -sin.
/// @param[in,out] x first feature of the pair; replaced by x cos - y sin.
/// @param[in,out] y second feature of the pair; replaced by y cos + x sin.
/// @param cos_angle cosine of the angle, times the attention factor.
/// @param sin_angle sine of the angle, times the attention factor (negated for the inverse).
ROPE_HOST_DEVICE inline void rotate_pair(float& x, float& y, float cos_angle, float sin_angle) {
#if defined(__CUDA_ARCH__)
    // Each product rounded on its own, never fused into a multiply-add: nvcc
    // fuses `a * b - c * d` differently in different kernels (seen on the H200:
    // the same pair came out one ulp apart from two launch paths of one backend),
    // and the host compiler, in ISO C++ mode without FMA instructions, does not
    // fuse at all. So every kernel rounds as the CPU does.
    const float rotated_x = __fsub_rn(__fmul_rn(x, cos_angle), __fmul_rn(y, sin_angle));
    const float rotated_y = __fadd_rn(__fmul_rn(y, cos_angle), __fmul_rn(x, sin_angle));
#else
    const float rotated_x = x * cos_angle - y * sin_angle;
    const float rotated_y = y * cos_angle + x * sin_angle;
#endif
    x = rotated_x;
    y = rotated_y;
}

}  // namespace rope
