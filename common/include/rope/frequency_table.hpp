#pragma once
/// @file frequency_table.hpp
/// @brief The inverse frequencies and attention factor that every backend consumes.

#include <cstdint>
#include <vector>

#include "rope/config.hpp"

namespace rope {

/// @brief Per-pair inverse frequencies theta_i and the factor that scales cos and sin.
///
/// This is computed once, on the host, in double precision and rounded to
/// float32, then handed to whichever backend runs the rotation. No backend
/// derives frequencies on its own: scaling variants change this table and
/// nothing else, so every backend supports them for free.
struct FrequencyTable {
    std::vector<float> inv_freq;    ///< theta_i for i in [0, rotary_dim/2), rounded to float32.
    /// The same theta_i to about 48 bits (the float32 value plus a float32
    /// correction, held as a double), for RopeConfig::precise_angles.
    std::vector<double> inv_freq_exact;
    float attention_factor = 1.0f;  ///< Multiplies cos and sin (1 unless a scaling type says otherwise).
};

/// @brief Builds the frequency table of @p config for a call whose largest
/// position is below @p max_position (used by length-dependent scaling types).
/// @param config the model's RoPE: rotary_dim, base and scaling.
/// @param max_position largest position of the call + 1; only dynamic and longrope read it.
/// @return rotary_dim/2 inverse frequencies (float32 and double) and the attention factor.
/// @throws rope::Error if @p config is invalid (see validate()).
FrequencyTable make_frequency_table(const RopeConfig& config, int64_t max_position);

}  // namespace rope
