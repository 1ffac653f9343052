#pragma once
/// @file config.hpp
/// @brief What a model's RoPE is: pairing style, dimensions, base and scaling.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace rope {

/// @brief Which two features of a head form one rotated pair.
enum class Style {
    /// Half-split, as GPT-NeoX and HuggingFace's `rotate_half` (LLaMA, Qwen,
    /// Mistral): feature i pairs with feature i + rotary_dim/2.
    half_split,
    /// Interleaved, as GPT-J and ggml's "NORM" mode: feature 2i pairs with 2i+1.
    interleaved,
    /// Interleaved pairs read, half-split order written: pair i is read from
    /// features (2i, 2i+1) and its rotated x and y are written to features i and
    /// i + rotary_dim/2. This is HuggingFace's DeepSeek-V2/V3
    /// `apply_rotary_pos_emb_interleave` (it de-interleaves the window, then
    /// applies `rotate_half`). The output is a fixed permutation of the
    /// interleaved style's output (the evens, then the odds), so attention scores
    /// agree with vLLM's in-place GPT-J rotation while the cached k bytes do not.
    /// In place too: every backend reads a head row's whole window before it
    /// writes any of it. Its inverse rotation (Direction::inverse, RoPE's backward
    /// pass) reads the half-split order and writes the interleaved one, as
    /// half_to_interleaved does: the exact transpose of the forward.
    interleaved_to_half,
    /// The reverse of interleaved_to_half: pair i is read from features
    /// (i, i + rotary_dim/2) and written to (2i, 2i+1). It turns HF's DeepSeek order
    /// back into the interleaved one (its forward rotation is the inverse of
    /// interleaved_to_half's, up to the sign of the angle), and its inverse rotation
    /// is interleaved_to_half's order.
    half_to_interleaved,
};

/// @brief Name of a pairing style, as used on command lines.
/// @param style the style to name.
/// @return "neox" for half-split, "gptj" for interleaved, "interleaved_to_half" for HF's DeepSeek order,
/// "half_to_interleaved" for its reverse.
constexpr std::string_view style_name(Style style) {
    return style == Style::half_split    ? "neox"
           : style == Style::interleaved ? "gptj"
           : style == Style::interleaved_to_half ? "interleaved_to_half"
                                                 : "half_to_interleaved";
}

/// @brief Whether @p style writes its pairs in another order than it reads them
/// (interleaved_to_half, half_to_interleaved): a pair's outputs are then other pairs'
/// inputs, and a backend reads a head row's whole window before writing any of it.
/// @param style the pairing style.
/// @return true for interleaved_to_half and half_to_interleaved.
constexpr bool reorders(Style style) {
    return style == Style::interleaved_to_half || style == Style::half_to_interleaved;
}

/// @brief Parses a pairing style name.
/// @param name "neox", "half_split" or "half-split"; "gptj" or "interleaved"; or
/// "interleaved_to_half" or "interleaved-to-half"; "half_to_interleaved" or "half-to-interleaved".
/// @return the Style of that name.
/// @throws rope::Error for any other name.
Style parse_style(std::string_view name);

/// @brief Which way to rotate.
enum class Direction {
    /// Rotate by +angle: what a model's forward pass applies to q and k.
    forward,
    /// Rotate by -angle (the transposed rotation): RoPE's backward pass, which
    /// maps output gradients to input gradients. With an attention factor of 1
    /// it exactly undoes `forward`.
    inverse,
};

/// @brief How the inverse frequencies are rescaled for context extension.
///
/// The names and formulas are HuggingFace transformers' (`rope_type` in a
/// model config, computed as in `modeling_rope_utils.py`), because that is
/// what checkpoints were trained against. Every variant only changes the
/// FrequencyTable (theta_i and the attention factor), so every backend
/// supports every variant without code of its own.
enum class ScalingType {
    none,     ///< `default`: theta_i = base^(-2i/rotary_dim), as in RoFormer.
    linear,   ///< Position interpolation: every theta_i divided by `factor`.
    /// Dynamic NTK: once a call's positions reach past
    /// `original_max_position_embeddings`, the base grows with the length
    /// (base * (factor * len / original - (factor - 1))^(d / (d - 2))); shorter
    /// calls get the unscaled frequencies.
    dynamic,
    /// YaRN: a linear ramp over the pairs between extrapolated (unscaled,
    /// high-frequency) and interpolated (divided by `factor`, low-frequency)
    /// theta_i, plus an attention factor on cos and sin (0.1 ln(factor) + 1 by default).
    yarn,
    /// Llama 3.1: pairs whose wavelength is short stay, long ones are divided by
    /// `factor`, and the band between is interpolated smoothly.
    llama3,
    /// LongRoPE (Phi-3): theta_i divided by a per-pair factor, taken from
    /// `long_factor` when the call reaches past `original_max_position_embeddings`
    /// and from `short_factor` otherwise, plus an attention factor.
    longrope,
    /// DeepSeek's YaRN (vLLM's `deepseek_yarn`; HF's DeepSeek-V2/V3 configs say
    /// `yarn` with `mscale` and `mscale_all_dim`): theta_i exactly as yarn, and
    /// cos and sin multiplied by yarn_get_mscale(factor, mscale) /
    /// yarn_get_mscale(factor, mscale_all_dim), where yarn_get_mscale(s, m) =
    /// 0.1 m ln(s) + 1 for s > 1, else 1 (so a 0 gives 1, as in vLLM). The rest of
    /// the magnitude belongs to the attention's softmax scale: see
    /// softmax_scale_multiplier(), which the caller must apply.
    deepseek_yarn,
};

/// @brief The `rope_type` string of @p type as HuggingFace spells it.
/// @param type the scaling type to name.
/// @return "default" (for none), "linear", "dynamic", "yarn", "llama3", "longrope" or "deepseek_yarn".
std::string_view scaling_type_name(ScalingType type);

/// @brief Parses a HuggingFace `rope_type` string.
/// @param rope_type "default" (or "none"), "linear", "dynamic", "yarn", "llama3", "longrope" or "deepseek_yarn".
/// @return the matching ScalingType (ScalingType::none for "default").
/// @throws rope::Error for any other string.
ScalingType parse_scaling_type(std::string_view rope_type);

/// @brief Frequency scaling parameters, named as in a HuggingFace model config
/// (`rope_parameters`, formerly `rope_scaling`).
///
/// Only the fields of the chosen type are read; the others keep their
/// defaults. `rope_theta` and the rotated dimension live in RopeConfig (`base`
/// and `rotary_dim`: HuggingFace's dim = head_dim * partial_rotary_factor is our
/// rotary_dim). With C++20 designated initializers a configuration reads like
/// the model's JSON:
/// @code
/// config.scaling = {.type = rope::ScalingType::yarn, .factor = 4.0,
///                   .original_max_position_embeddings = 32768};
/// @endcode
struct Scaling {
    ScalingType type = ScalingType::none;  ///< `rope_type` in the model config.
    /// `factor`: the context extension ratio (every type but none); must be
    /// finite and > 0. For longrope it only sets the default attention factor
    /// (HuggingFace derives it as max_position_embeddings / original_max_position_embeddings
    /// when a config omits it: give that ratio here).
    double factor = 1.0;
    /// `original_max_position_embeddings`: the context length the model was
    /// pretrained with (dynamic, yarn, llama3, longrope); must be > 0 for them.
    /// For dynamic it is what HuggingFace reads from the config's
    /// `max_position_embeddings`.
    int64_t original_max_position_embeddings = 0;
    /// `attention_factor` (yarn, longrope): multiplies cos and sin. Unset means
    /// the type's default (yarn: from factor and mscale; longrope:
    /// sqrt(1 + ln(factor) / ln(original_max_position_embeddings))). Must be finite and > 0.
    std::optional<double> attention_factor{};
    /// `beta_fast` (yarn): rotations within the original context above which a
    /// pair is extrapolated (left unscaled). Must exceed beta_slow.
    double beta_fast = 32.0;
    /// `beta_slow` (yarn): rotations below which a pair is fully interpolated. Must be > 0.
    double beta_slow = 1.0;
    /// `truncate` (yarn): round the correction range outwards to whole pairs
    /// (floor / ceil), as the original YaRN code does; false keeps it fractional.
    bool truncate = true;
    /// `mscale` (yarn, deepseek_yarn): with mscale_all_dim, yarn's default attention
    /// factor becomes (0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1).
    /// 0 means unset, as a missing or zero value does in HuggingFace (yarn then
    /// uses 0.1 ln(factor) + 1). deepseek_yarn always takes that ratio, a 0 giving
    /// a term of 1 (vLLM's rule). Must be finite and >= 0.
    double mscale = 0.0;
    /// `mscale_all_dim` (yarn, deepseek_yarn): see mscale, and softmax_scale_multiplier(); 0 means unset.
    double mscale_all_dim = 0.0;
    /// `low_freq_factor` (llama3): wavelengths above original / low_freq_factor
    /// are divided by factor. Must be finite, > 0 and < high_freq_factor.
    double low_freq_factor = 1.0;
    /// `high_freq_factor` (llama3): wavelengths below original / high_freq_factor
    /// are left unscaled.
    double high_freq_factor = 4.0;
    /// `short_factor` (longrope): rotary_dim/2 per-pair divisors of theta_i for
    /// calls within the original context. Each must be finite and > 0.
    std::vector<double> short_factor{};
    /// `long_factor` (longrope): rotary_dim/2 per-pair divisors of theta_i for
    /// calls whose largest position + 1 exceeds original_max_position_embeddings.
    std::vector<double> long_factor{};
};

/// @brief The factor DeepSeek's attention multiplies its softmax scale by:
/// yarn_get_mscale(factor, mscale_all_dim)^2, where yarn_get_mscale(s, m) =
/// 0.1 m ln(s) + 1 for s > 1, else 1.
///
/// DeepSeek-V2/V3 split YaRN's magnitude in two: cos and sin carry
/// mscale(factor, mscale) / mscale(factor, mscale_all_dim) (the frequency table of
/// deepseek_yarn, 1 for V3's config), and the softmax scale carries
/// mscale(factor, mscale_all_dim)^2 (HF's DeepseekV3Attention.scaling =
/// qk_head_dim^-0.5 times this; about 1.874 for V3: factor 40, mscale_all_dim 1).
/// rope cannot apply the second part: the caller multiplies it into the softmax
/// scale of the attention. Forgetting it is a known source of wrong outputs: the
/// model runs and its logits are quietly too flat.
/// @param scaling the model's scaling; read for deepseek_yarn and yarn (HF's
/// DeepSeek configs name DeepSeek's YaRN "yarn").
/// @return the multiplier; 1 for every other type, for factor <= 1 and for
/// mscale_all_dim 0 (unset), as in HF.
/// @throws rope::Error naming the field when factor or mscale_all_dim is out of
/// range for a type that reads them (as validate()).
double softmax_scale_multiplier(const Scaling& scaling);

/// @brief Most position axes a configuration may have (M-RoPE uses 3; video axial RoPE 3).
inline constexpr int64_t kMaxPositionAxes = 4;

/// @brief How the rotated pairs are shared among several position axes.
///
/// With several axes a token has one position per axis (Positions::axes), and
/// each pair i turns by the position of its own axis. The frequencies are
/// always computed in common/ (FrequencyTable::pair_axis records the axis of
/// each pair), so every backend supports every assignment.
enum class AxisAssignment {
    /// One position per token: text RoPE (the default).
    single,
    /// M-RoPE with contiguous sections (Qwen2-VL, Qwen2.5-VL; HF
    /// `apply_multimodal_rotary_pos_emb`): the first sections[0] pairs turn
    /// with the temporal position, the next sections[1] with the height, the
    /// last sections[2] with the width. theta_i uses the global pair index i.
    mrope_contiguous,
    /// M-RoPE with interleaved sections (Qwen3-VL; HF `apply_interleaved_mrope`):
    /// pair i turns with the height if i % 3 == 1 and i < 3*sections[1], with
    /// the width if i % 3 == 2 and i < 3*sections[2], else with the temporal
    /// position. theta_i uses the global pair index i.
    mrope_interleaved,
    /// Axial RoPE (vision: HF's `axial` rope type, Qwen2-VL's vision tower;
    /// image and video diffusion models): contiguous runs of sections[a] pairs
    /// per axis a, and the frequency index restarts on each axis:
    /// theta = base^(-j / sections[a]) for the j-th pair of axis a, i.e. each
    /// axis is a RoPE of its own over 2*sections[a] features.
    axial,
};

/// @brief Name of an axis assignment, as used on command lines.
/// @param assignment the assignment to name.
/// @return "single", "mrope", "mrope-interleaved" or "axial".
std::string_view axis_assignment_name(AxisAssignment assignment);

/// @brief Parses an axis assignment name.
/// @param name "single", "mrope", "mrope-interleaved" or "axial".
/// @return the matching AxisAssignment.
/// @throws rope::Error for any other name.
AxisAssignment parse_axis_assignment(std::string_view name);

/// @brief Several position axes (M-RoPE, axial RoPE): which pair turns with which axis.
struct MultiAxis {
    AxisAssignment assignment = AxisAssignment::single;  ///< How pairs map to axes.
    /// Pairs per axis (HF's `mrope_section`, e.g. {16, 24, 24} for Qwen2-VL,
    /// {24, 20, 20} for Qwen3-VL; axial: e.g. {20, 20} for Qwen2-VL's vision
    /// head_dim 80, {8, 28, 28} for axes dims (16, 56, 56)). Must sum to
    /// rotary_dim/2; M-RoPE takes exactly 3; empty for single.
    std::vector<int64_t> sections{};

    /// @brief Axes a token has under this assignment.
    /// @return 1 for single, else the number of sections.
    int64_t axes() const { return assignment == AxisAssignment::single ? 1 : int64_t(sections.size()); }
};

/// @brief Everything about a model's RoPE that does not depend on the call.
struct RopeConfig {
    int64_t head_dim = 0;       ///< Features per head (the last axis of q and k).
    /// Features that rotate, from rotary_offset on; the rest pass through
    /// unchanged (partial rotary, as GPT-NeoX, Phi and GLM use). 0 means head_dim
    /// (minus rotary_offset).
    int64_t rotary_dim = 0;
    /// First feature of the rotary window: the rotated features of each head are
    /// [rotary_offset, rotary_offset + rotary_dim), and every feature outside the
    /// window keeps its bits (copied when the call is out of place). 0 (the
    /// default) puts the window at the start of the head. DeepSeek's multi-head
    /// latent attention (V2, V3, R1) rotates the last 64 features of its 192-wide
    /// q head ([nope 128 | pe 64]: rotary_offset 128, rotary_dim 64), HF's
    /// `qk_rope_head_dim` after `qk_nope_head_dim`.
    int64_t rotary_offset = 0;
    double base = 10000.0;      ///< `rope_theta`: theta_i = base^(-2i/rotary_dim).
    Style style = Style::half_split;  ///< Pairing of features.
    Scaling scaling{};          ///< Frequency scaling (context extension).
    /// Opt-in precise angles. By default (false) every backend forms the angle
    /// as HuggingFace does, float32(position) * float32(theta_i), whose rounding
    /// error grows with the position (about 0.06 radians at position 1e6).
    /// When true, the angle is formed as position * theta_i in double from a
    /// double theta_i, reduces it to [-pi, pi] in double, and only then rounds
    /// to float32 for sin and cos: the error stays at the level of short
    /// positions at any position. See rope::rope_angle_precise. Every built-in
    /// backend implements it, with the same angle bit for bit.
    bool precise_angles = false;
    /// Several position axes (M-RoPE, axial vision RoPE); the default is one.
    MultiAxis multi_axis{};

    /// @brief rotary_dim with the "0 means head_dim" default resolved.
    /// @return head_dim - rotary_offset when rotary_dim is 0, else rotary_dim.
    int64_t effective_rotary_dim() const { return rotary_dim == 0 ? head_dim - rotary_offset : rotary_dim; }
};

/// @brief Checks that @p config is usable.
/// @param config the configuration to check.
/// @throws rope::Error naming the field and its value if it is not: head_dim <= 0,
/// rotary_dim odd, negative or > head_dim, rotary_offset < 0 or rotary_offset +
/// rotary_dim > head_dim, base not finite or <= 0, or a scaling
/// field the chosen type reads out of range (e.g. factor not finite or <= 0,
/// original_max_position_embeddings <= 0, beta_fast <= beta_slow,
/// low_freq_factor >= high_freq_factor, a factor list whose length is not
/// rotary_dim/2), or set for a type that does not read it (attention_factor,
/// short_factor, long_factor); multi_axis sections of the wrong count or sum,
/// not positive, or (interleaved M-RoPE) too long to fit their stride of 3;
/// scaling with axial RoPE.
void validate(const RopeConfig& config);

}  // namespace rope
