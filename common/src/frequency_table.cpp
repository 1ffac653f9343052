// The frequency table: computed once here, consumed by every backend.
#include <cmath>

#include "rope/frequency_table.hpp"

namespace rope {

FrequencyTable make_frequency_table(const RopeConfig& config, int64_t max_position) {
    validate(config);
    (void)max_position;  // Only length-dependent scaling types need it.
    const int64_t rotary_dim = config.effective_rotary_dim();
    const int64_t pairs = rotary_dim / 2;

    FrequencyTable table;
    table.inv_freq.resize(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) {
        // theta_i = base^(-2i/d), each computed directly in double: building it by
        // repeated multiplication would accumulate rounding error across pairs.
        double theta = std::pow(config.base, -2.0 * double(i) / double(rotary_dim));
        if (config.scaling.type == ScalingType::linear) theta /= config.scaling.factor;
        table.inv_freq[static_cast<size_t>(i)] = static_cast<float>(theta);
    }
    table.attention_factor = 1.0f;
    return table;
}

}  // namespace rope
