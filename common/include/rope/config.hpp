#pragma once
/// @file config.hpp
/// @brief What a model's RoPE is: pairing style, dimensions, base and scaling.

#include <cstdint>
#include <string_view>

namespace rope {

/// @brief Which two features of a head form one rotated pair.
enum class Style {
    /// Half-split, as GPT-NeoX and HuggingFace's `rotate_half` (LLaMA, Qwen,
    /// Mistral): feature i pairs with feature i + rotary_dim/2.
    half_split,
    /// Interleaved, as GPT-J and ggml's "NORM" mode: feature 2i pairs with 2i+1.
    interleaved,
};

/// @brief "neox" for half-split, "gptj" for interleaved (the names used on command lines).
constexpr std::string_view style_name(Style style) { return style == Style::half_split ? "neox" : "gptj"; }

/// @brief Parses "neox"/"half_split" or "gptj"/"interleaved"; throws rope::Error otherwise.
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
enum class ScalingType {
    none,    ///< theta_i = base^(-2i/rotary_dim), as in RoFormer.
    linear,  ///< Position interpolation: every inverse frequency divided by `factor`.
};

/// @brief Frequency scaling parameters, named as in a HuggingFace model config.
struct Scaling {
    ScalingType type = ScalingType::none;  ///< `rope_type` in the model config.
    double factor = 1.0;                   ///< Interpolation factor (linear); must be > 0.
};

/// @brief Everything about a model's RoPE that does not depend on the call.
struct RopeConfig {
    int64_t head_dim = 0;       ///< Features per head (the last axis of q and k).
    /// Features that rotate, from the start of each head; the rest pass through
    /// unchanged (partial rotary, as GPT-NeoX, Phi and GLM use). 0 means head_dim.
    int64_t rotary_dim = 0;
    double base = 10000.0;      ///< `rope_theta`: theta_i = base^(-2i/rotary_dim).
    Style style = Style::half_split;  ///< Pairing of features.
    Scaling scaling{};          ///< Frequency scaling (context extension).

    /// @brief rotary_dim with the "0 means head_dim" default resolved.
    int64_t effective_rotary_dim() const { return rotary_dim == 0 ? head_dim : rotary_dim; }
};

/// @brief Throws rope::Error naming the field if @p config is not usable
/// (head_dim <= 0, rotary_dim odd, negative or > head_dim, base not finite or <= 0,
/// scaling factor not finite or <= 0).
void validate(const RopeConfig& config);

}  // namespace rope
