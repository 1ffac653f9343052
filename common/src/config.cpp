// Validation of RopeConfig: the model-level parameters, checked before any tensor is looked at.
#include <cmath>
#include <string>

#include "rope/config.hpp"
#include "rope/error.hpp"

namespace rope {

void validate(const RopeConfig& config) {
    if (config.head_dim <= 0) fail("head_dim", config.head_dim, "must be > 0");
    if (config.rotary_dim < 0) fail("rotary_dim", config.rotary_dim, "must be >= 0 (0 means head_dim)");
    const int64_t rotary_dim = config.effective_rotary_dim();
    if (rotary_dim > config.head_dim)
        fail("rotary_dim", rotary_dim, "must not exceed head_dim = " + std::to_string(config.head_dim));
    if (rotary_dim % 2 != 0) fail("rotary_dim", rotary_dim, "must be even (features rotate in pairs)");
    if (!std::isfinite(config.base)) fail("base", config.base, "must be finite");
    if (config.base <= 0.0) fail("base", config.base, "must be > 0");
    const Scaling& scaling = config.scaling;
    if (scaling.type == ScalingType::linear) {
        if (!std::isfinite(scaling.factor)) fail("scaling.factor", scaling.factor, "must be finite");
        if (scaling.factor <= 0.0) fail("scaling.factor", scaling.factor, "must be > 0");
    }
}

}  // namespace rope
