// Validation of RopeConfig: the model-level parameters, checked before any tensor is looked at.
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "rope/config.hpp"
#include "rope/error.hpp"

namespace rope {
namespace {

// The field's name in messages: the user writes config.scaling.<field>.
std::string field(const char* name) { return std::string("scaling.") + name; }

// A number as messages print it (4, 0.5, 1e+06), not std::to_string's 4.000000.
std::string number(double value) { return to_text(value); }

void require_finite_positive(const char* name, double value) {
    if (!std::isfinite(value)) fail(field(name), value, "must be finite");
    if (value <= 0.0) fail(field(name), value, "must be > 0");
}

// Which type reads a field, for the message when another type is given it.
std::string read_only_by(const char* types, ScalingType type) {
    return std::string("is only read by ") + types + " (rope_type = " + std::string(scaling_type_name(type)) + ")";
}

// Checks the fields the chosen scaling type reads. Fields another type reads
// keep their defaults and are ignored, except the optional ones (attention_factor,
// the factor lists) whose presence would be silently lost: those are rejected.
void validate_scaling(const Scaling& scaling, int64_t rotary_dim, double base) {
    const ScalingType type = scaling.type;
    if (type == ScalingType::none) return;
    require_finite_positive("factor", scaling.factor);
    if (type != ScalingType::linear && scaling.original_max_position_embeddings <= 0)
        fail(field("original_max_position_embeddings"), scaling.original_max_position_embeddings,
             "must be > 0 (the context length the model was pretrained with)");

    if (scaling.attention_factor) {
        if (type != ScalingType::yarn && type != ScalingType::longrope)
            fail(field("attention_factor"), *scaling.attention_factor, read_only_by("yarn and longrope", type));
        require_finite_positive("attention_factor", *scaling.attention_factor);
    }
    if (type != ScalingType::longrope) {
        if (!scaling.short_factor.empty())
            fail(field("short_factor.size()"), scaling.short_factor.size(), read_only_by("longrope", type));
        if (!scaling.long_factor.empty())
            fail(field("long_factor.size()"), scaling.long_factor.size(), read_only_by("longrope", type));
    }

    if (type == ScalingType::yarn || type == ScalingType::deepseek_yarn) {
        require_finite_positive("beta_slow", scaling.beta_slow);
        if (!std::isfinite(scaling.beta_fast)) fail(field("beta_fast"), scaling.beta_fast, "must be finite");
        if (scaling.beta_fast <= scaling.beta_slow)
            fail(field("beta_fast"), scaling.beta_fast,
                 "must be > beta_slow = " + number(scaling.beta_slow) +
                     " (high-frequency bound of the ramp above its low-frequency bound)");
        const std::array<std::pair<const char*, double>, 2> mscales{{{"mscale", scaling.mscale},
                                                                     {"mscale_all_dim", scaling.mscale_all_dim}}};
        for (const auto& [name, value] : mscales) {
            if (!std::isfinite(value)) fail(field(name), value, "must be finite");
            if (value < 0.0) fail(field(name), value, "must be >= 0 (0 means unset)");
        }
        // The correction range divides by log(base).
        if (base == 1.0)
            fail("base", base,
                 "must not be 1 with " + std::string(scaling_type_name(type)) +
                     " scaling (its correction range divides by ln(base))");
    }
    if (type == ScalingType::llama3) {
        require_finite_positive("low_freq_factor", scaling.low_freq_factor);
        if (!std::isfinite(scaling.high_freq_factor))
            fail(field("high_freq_factor"), scaling.high_freq_factor, "must be finite");
        if (scaling.low_freq_factor >= scaling.high_freq_factor)
            fail(field("low_freq_factor"), scaling.low_freq_factor,
                 "must be < high_freq_factor = " + number(scaling.high_freq_factor));
    }
    if (type == ScalingType::longrope) {
        const size_t pairs = static_cast<size_t>(rotary_dim / 2);
        const std::array<std::pair<const char*, const std::vector<double>*>, 2> lists{
            {{"short_factor", &scaling.short_factor}, {"long_factor", &scaling.long_factor}}};
        for (const auto& [name, list] : lists) {
            if (list->size() != pairs)
                fail(field(name) + ".size()", list->size(),
                     "must be rotary_dim/2 = " + std::to_string(pairs) + " (one factor per rotated pair)");
            for (size_t i = 0; i < pairs; ++i)
                require_finite_positive((std::string(name) + "[" + std::to_string(i) + "]").c_str(), (*list)[i]);
        }
        // The default attention factor divides by ln(original_max_position_embeddings).
        if (!scaling.attention_factor && scaling.factor > 1.0 && scaling.original_max_position_embeddings < 2)
            fail(field("original_max_position_embeddings"), scaling.original_max_position_embeddings,
                 "must be > 1 for longrope's default attention factor (it divides by its logarithm)");
    }
}

// Checks the sections of a multi-axis configuration against the rotated pairs.
void validate_multi_axis(const MultiAxis& multi_axis, int64_t rotary_dim, ScalingType scaling) {
    const AxisAssignment assignment = multi_axis.assignment;
    const auto& sections = multi_axis.sections;
    const std::string name = std::string(axis_assignment_name(assignment));
    if (assignment == AxisAssignment::single) {
        if (!sections.empty())
            fail("multi_axis.sections.size()", sections.size(), "must be 0 with one position axis (assignment single)");
        return;
    }
    const bool mrope = assignment != AxisAssignment::axial;
    if (mrope && sections.size() != 3)
        fail("multi_axis.sections.size()", sections.size(),
             "must be 3 for " + name + " (temporal, height and width)");
    if (sections.empty() || int64_t(sections.size()) > kMaxPositionAxes)
        fail("multi_axis.sections.size()", sections.size(),
             "must be 1 to " + std::to_string(kMaxPositionAxes) + " for " + name);
    const int64_t pairs = rotary_dim / 2;
    const std::string sum_rule = "must equal rotary_dim/2 = " + std::to_string(pairs) + " (every rotated pair belongs to one axis)";
    int64_t sum = 0;
    for (size_t a = 0; a < sections.size(); ++a) {
        if (sections[a] <= 0)
            fail("multi_axis.sections[" + std::to_string(a) + "]", sections[a], "must be > 0 (pairs of that axis)");
        // Stop as soon as the sum passes the pairs: summing on could overflow int64.
        if (sections[a] > pairs - sum) fail("multi_axis.sections", "sum past " + std::to_string(pairs), sum_rule);
        sum += sections[a];
    }
    if (sum != pairs)
        fail("multi_axis.sections", "sum " + std::to_string(sum), sum_rule);
    if (assignment == AxisAssignment::mrope_interleaved) {
        // Axis a (1 or 2) takes pairs a, a+3, ..., a+3*(sections[a]-1): all must be below rotary_dim/2.
        for (int64_t a = 1; a <= 2; ++a)
            if (a + 3 * (sections[size_t(a)] - 1) >= pairs)
                fail("multi_axis.sections[" + std::to_string(a) + "]", sections[size_t(a)],
                     "too large for mrope-interleaved: its pairs " + std::to_string(a) + ", " + std::to_string(a + 3) +
                         ", ... would pass rotary_dim/2 = " + std::to_string(pairs));
    }
    if (assignment == AxisAssignment::axial && scaling != ScalingType::none)
        fail("scaling.type", scaling_type_name(scaling),
             "must be default with axial RoPE (its frequencies restart on each axis)");
}

}  // namespace

void validate(const RopeConfig& config) {
    if (config.head_dim <= 0) fail("head_dim", config.head_dim, "must be > 0");
    if (config.rotary_dim < 0) fail("rotary_dim", config.rotary_dim, "must be >= 0 (0 means head_dim)");
    if (config.rotary_offset < 0)
        fail("rotary_offset", config.rotary_offset, "must be >= 0 (the first feature of the rotary window)");
    if (config.rotary_offset >= config.head_dim)
        fail("rotary_offset", config.rotary_offset,
             "must be < head_dim = " + std::to_string(config.head_dim) + " (the window starts inside the head)");
    const int64_t rotary_dim = config.effective_rotary_dim();
    if (rotary_dim > config.head_dim)
        fail("rotary_dim", rotary_dim, "must not exceed head_dim = " + std::to_string(config.head_dim));
    // Compared as head_dim - rotary_dim: the sum of two huge values could overflow.
    if (config.rotary_offset > config.head_dim - rotary_dim)
        fail("rotary_offset", config.rotary_offset,
             "plus rotary_dim = " + std::to_string(rotary_dim) + " must not exceed head_dim = " +
                 std::to_string(config.head_dim) + " (the window [offset, offset + rotary_dim) lies in the head)");
    if (rotary_dim % 2 != 0) fail("rotary_dim", rotary_dim, "must be even (features rotate in pairs)");
    if (!std::isfinite(config.base)) fail("base", config.base, "must be finite");
    if (config.base <= 0.0) fail("base", config.base, "must be > 0");
    validate_scaling(config.scaling, rotary_dim, config.base);
    validate_multi_axis(config.multi_axis, rotary_dim, config.scaling.type);
}

}  // namespace rope
