#pragma once
/// @file frequency_table.hpp
/// @brief The inverse frequencies and attention factor that every backend consumes.

#include <cstdint>
#include <vector>

#include "rope/config.hpp"

namespace rope {

/// @brief Per-pair inverse frequencies theta_i, the axis each pair turns with,
/// and the factor that scales cos and sin.
///
/// This is computed once, on the host, in double precision and rounded to
/// float32, then handed to whichever backend runs the rotation. No backend
/// derives frequencies on its own: scaling variants and multi-axis layouts
/// change this table and nothing else, so every backend supports them for free.
/// Pair i of a token turns by position[pair_axis[i]] * theta_i.
struct FrequencyTable {
    std::vector<float> inv_freq;    ///< theta_i for i in [0, rotary_dim/2), rounded to float32.
    /// theta_i - inv_freq[i], rounded to float32: double(inv_freq[i]) +
    /// double(inv_freq_low[i]) is theta_i to about 48 bits (4e-15 relative),
    /// which RopeConfig::precise_angles uses. Two floats travel to a GPU at
    /// half the bytes of a double and sum to the same double there.
    std::vector<float> inv_freq_low;
    /// Which position axis pair i turns with (0 for text RoPE; see RopeConfig::multi_axis).
    std::vector<uint8_t> pair_axis;
    float attention_factor = 1.0f;  ///< Multiplies cos and sin (1 unless a scaling type says otherwise).
};

/// @brief Builds the frequency table of @p config for a call whose largest
/// position is below @p max_position (used by length-dependent scaling types).
/// @param config the model's RoPE: rotary_dim, base and scaling.
/// @param max_position largest position of the call + 1; only dynamic and longrope read it.
/// @return rotary_dim/2 inverse frequencies (float32, and their low parts), their axes and the attention factor.
/// @throws rope::Error if @p config is invalid (see validate()).
FrequencyTable make_frequency_table(const RopeConfig& config, int64_t max_position);

}  // namespace rope
