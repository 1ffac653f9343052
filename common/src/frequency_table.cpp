// The frequency table: computed once here, consumed by every backend.
//
// Each scaling type follows HuggingFace transformers' modeling_rope_utils.py
// (`_compute_<type>_parameters` and the dynamic / longrope updates that
// LlamaRotaryEmbedding applies in its forward pass), which is what the
// checkpoints were trained with. Everything is computed in double and rounded
// to float32 once at the end; transformers computes in float32, so our theta_i
// may differ from its own by an ulp or two (tests/scaling_test.cpp bounds this
// against golden vectors from transformers itself).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "rope/detail/plan.hpp"
#include "rope/error.hpp"
#include "rope/frequency_table.hpp"

namespace rope {
namespace {

constexpr double two_pi = 2.0 * std::numbers::pi;

// Dynamic NTK: a call whose positions stay within the original context uses
// the unscaled base (so short prompts lose nothing); a longer one raises the
// base with its length. HuggingFace recomputes this from max(position_ids) + 1
// in the forward pass, which is what max_position is.
double dynamic_base(double base, const Scaling& scaling, int64_t rotary_dim, int64_t max_position) {
    const auto original = double(scaling.original_max_position_embeddings);
    const double length = double(max_position);
    if (length <= original) return base;  // HF's max(seq_len, original) makes the ratio exactly 1 here.
    // With rotary_dim == 2 the exponent d / (d - 2) is undefined (HuggingFace
    // divides by zero), but the only pair has theta_0 = base^0 = 1 whatever the base.
    if (rotary_dim == 2) return base;
    const double d = double(rotary_dim);
    const double stretch = scaling.factor * length / original - (scaling.factor - 1.0);
    return base * std::pow(stretch, d / (d - 2.0));
}

// YaRN's attention factor: sqrt(1/t) of the paper, 0.1 ln(s) + 1 for scale s.
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// The cos/sin magnitude of yarn and of deepseek_yarn, which share everything else.
double yarn_attention_factor(const Scaling& scaling) {
    if (scaling.attention_factor) return *scaling.attention_factor;
    const double deepseek = yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim);
    // deepseek_yarn takes the ratio as given (vLLM's DeepseekScalingRotaryEmbedding, where 0 gives a term of 1).
    if (scaling.type == ScalingType::deepseek_yarn) return deepseek;
    // yarn: DeepSeek's form only when both are set (non-zero), as HF's `if mscale and mscale_all_dim`.
    if (scaling.mscale != 0.0 && scaling.mscale_all_dim != 0.0) return deepseek;
    return yarn_mscale(scaling.factor, 1.0);
}

// YaRN ("NTK-by-parts"): pairs that turn many times within the original
// context (more than beta_fast rotations) keep their frequency, since the model
// has seen every phase of them; pairs that turn less than beta_slow times are
// interpolated (divided by factor), since longer contexts would show them
// phases never seen in training; a linear ramp over the pair index joins the two.
void apply_yarn(std::vector<double>& theta, const Scaling& scaling, int64_t rotary_dim, double base) {
    const double d = double(rotary_dim);
    const auto original = double(scaling.original_max_position_embeddings);
    // The (fractional) pair index whose wavelength fits `rotations` times into the original context.
    auto correction_dim = [&](double rotations) {
        return d * std::log(original / (rotations * two_pi)) / (2.0 * std::log(base));
    };
    double low = correction_dim(scaling.beta_fast);
    double high = correction_dim(scaling.beta_slow);
    if (scaling.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    // HF clamps to [0, dim - 1] (dim, not dim/2: the ramp saturates past the last pair anyway).
    low = std::max(low, 0.0);
    high = std::min(high, d - 1.0);
    if (low == high) high += 0.001;  // As HF: keeps the ramp defined when the range collapses.
    for (size_t i = 0; i < theta.size(); ++i) {
        // 0 at and below `low` (extrapolate: keep theta_i), 1 at and above `high` (interpolate: theta_i / factor).
        const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        theta[i] = theta[i] / scaling.factor * ramp + theta[i] * (1.0 - ramp);
    }
}

// Llama 3.1: wavelengths shorter than original / high_freq_factor stay,
// longer than original / low_freq_factor are divided by factor, and between
// the two the frequency is interpolated linearly in original / wavelength.
void apply_llama3(std::vector<double>& theta, const Scaling& scaling) {
    const auto original = double(scaling.original_max_position_embeddings);
    const double low_freq_wavelength = original / scaling.low_freq_factor;
    const double high_freq_wavelength = original / scaling.high_freq_factor;
    for (double& t : theta) {
        const double wavelength = two_pi / t;
        if (wavelength < high_freq_wavelength) continue;
        if (wavelength > low_freq_wavelength) {
            t /= scaling.factor;
            continue;
        }
        const double smooth = (original / wavelength - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        t = (1.0 - smooth) * t / scaling.factor + smooth * t;
    }
}

double longrope_attention_factor(const Scaling& scaling) {
    if (scaling.attention_factor) return *scaling.attention_factor;
    if (scaling.factor <= 1.0) return 1.0;
    return std::sqrt(1.0 + std::log(scaling.factor) / std::log(double(scaling.original_max_position_embeddings)));
}

// The axis of every pair (RopeConfig::multi_axis), and for axial RoPE the
// index of the pair within its axis, where the frequency index restarts.
struct PairAxes {
    std::vector<uint8_t> axis;
    std::vector<int64_t> index_in_axis;
};

PairAxes pair_axes(const MultiAxis& multi_axis, int64_t pairs) {
    PairAxes result{std::vector<uint8_t>(size_t(pairs), 0), std::vector<int64_t>(size_t(pairs), 0)};
    const auto& sections = multi_axis.sections;
    for (int64_t i = 0; i < pairs; ++i) {
        int64_t axis = 0;
        if (multi_axis.assignment == AxisAssignment::mrope_interleaved) {
            // Qwen3-VL: height takes pairs 1, 4, 7, ... and width 2, 5, 8, ..., each for
            // its section's count; every other pair stays temporal.
            if (i % 3 == 1 && i < 3 * sections[1]) axis = 1;
            else if (i % 3 == 2 && i < 3 * sections[2]) axis = 2;
        } else if (multi_axis.assignment != AxisAssignment::single) {
            // Contiguous runs: sections[0] pairs, then sections[1], ...
            int64_t first = 0;
            while (i >= first + sections[size_t(axis)]) first += sections[size_t(axis++)];
            result.index_in_axis[size_t(i)] = i - first;
        }
        result.axis[size_t(i)] = uint8_t(axis);
    }
    return result;
}

}  // namespace

namespace detail {

FrequencyTable build_frequency_table(const RopeConfig& config, int64_t max_position) {
    const Scaling& scaling = config.scaling;
    const int64_t rotary_dim = config.effective_rotary_dim();
    const int64_t pairs = rotary_dim / 2;
    const PairAxes axes = pair_axes(config.multi_axis, pairs);

    const double base = scaling.type == ScalingType::dynamic
                            ? dynamic_base(config.base, scaling, rotary_dim, max_position)
                            : config.base;
    std::vector<double> theta(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) {
        // theta_i = base^(-2i/d), each computed directly in double: building it by
        // repeated multiplication would accumulate rounding error across pairs.
        // Axial RoPE is one such RoPE per axis, over that axis's 2*sections[a]
        // features: the index and the dimension are the axis's own.
        const bool axial = config.multi_axis.assignment == AxisAssignment::axial;
        const double index = axial ? double(axes.index_in_axis[size_t(i)]) : double(i);
        const double dim = axial ? 2.0 * double(config.multi_axis.sections[axes.axis[size_t(i)]]) : double(rotary_dim);
        theta[static_cast<size_t>(i)] = std::pow(base, -2.0 * index / dim);
    }

    double attention_factor = 1.0;
    switch (scaling.type) {
        case ScalingType::none:
        case ScalingType::dynamic:  // Already in the base.
            break;
        case ScalingType::linear:
            for (double& t : theta) t /= scaling.factor;
            break;
        case ScalingType::yarn:
        case ScalingType::deepseek_yarn:  // The same frequencies; only the magnitude's rule differs.
            apply_yarn(theta, scaling, rotary_dim, config.base);
            attention_factor = yarn_attention_factor(scaling);
            break;
        case ScalingType::llama3:
            apply_llama3(theta, scaling);
            break;
        case ScalingType::longrope: {
            // As HF's longrope update: the long factors once max(position_ids) + 1
            // exceeds the original context, the short ones otherwise.
            const bool long_call = max_position > scaling.original_max_position_embeddings;
            const std::vector<double>& divisors = long_call ? scaling.long_factor : scaling.short_factor;
            for (size_t i = 0; i < theta.size(); ++i) theta[i] /= divisors[i];
            attention_factor = longrope_attention_factor(scaling);
            break;
        }
    }

    FrequencyTable table;
    table.inv_freq.resize(theta.size());
    table.inv_freq_low.resize(theta.size());
    for (size_t i = 0; i < theta.size(); ++i) {
        table.inv_freq[i] = static_cast<float>(theta[i]);
        // The precise mode's theta_i is float32 + float32 (about 48 significant
        // bits, 4e-15 relative): exactly representable in double, and it
        // travels to a GPU as two float tables, so every backend uses the
        // bit-identical double.
        table.inv_freq_low[i] = static_cast<float>(theta[i] - double(table.inv_freq[i]));
    }
    table.pair_axis = axes.axis;
    table.attention_factor = static_cast<float>(attention_factor);
    return table;
}

}  // namespace detail

double softmax_scale_multiplier(const Scaling& scaling) {
    if (scaling.type != ScalingType::yarn && scaling.type != ScalingType::deepseek_yarn) return 1.0;
    if (!std::isfinite(scaling.factor) || scaling.factor <= 0.0)
        fail("scaling.factor", scaling.factor, "must be finite and > 0");
    if (!std::isfinite(scaling.mscale_all_dim) || scaling.mscale_all_dim < 0.0)
        fail("scaling.mscale_all_dim", scaling.mscale_all_dim, "must be finite and >= 0 (0 means unset)");
    const double mscale = yarn_mscale(scaling.factor, scaling.mscale_all_dim);
    return mscale * mscale;
}

FrequencyTable make_frequency_table(const RopeConfig& config, int64_t max_position) {
    validate(config);
    return detail::build_frequency_table(config, max_position);
}

}  // namespace rope
