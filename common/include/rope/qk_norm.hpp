#pragma once
/// @file qk_norm.hpp
/// @brief Fused QK-RMSNorm + RoPE: normalise each head of q and k (or all heads of a token)
/// with an RMSNorm, then rotate, in one call, rounding where the model's own code rounds.
///
/// Qwen3, Gemma 3 and OLMo 2 normalise q and k before RoPE. Their HuggingFace code
/// differs in the weight (Llama-style `weight * x_hat`, Gemma-style `x_hat * (1 + weight)`),
/// in what is normalised (one head, or all heads of the token: OLMo 2) and in where it
/// rounds to the model's dtype. QkNormRounding names those rounding points; its float32
/// mode rounds once at the end instead, as serving engines' fused kernels do.
/// @code
/// rope::QkNormArgs args = rope::QkNormArgs::in_place(q, k);
/// args.q_weight = rope::NormWeight{q_norm.data(), rope::DType::f32, rope::Device::host, 128};
/// args.k_weight = rope::NormWeight{k_norm.data(), rope::DType::f32, rope::Device::host, 128};
/// args.rounding = rope::QkNormRounding::hf_qwen3;
/// rope::apply_qk_norm(*backend, config, args);
/// @endcode

#include <cstdint>
#include <string_view>

#include "rope/args.hpp"
#include "rope/config.hpp"
#include "rope/dtype.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope {

class Backend;  // rope/backend.hpp

/// @brief What the RMSNorm normalises and how its weight applies.
enum class QkNormKind {
    /// Each head row on its own (mean over head_dim); `weight * x_hat`, weight of length
    /// head_dim. Qwen3 (Llama-style weight).
    per_head,
    /// Each head row on its own; `x_hat * (1 + weight)`, weight of length head_dim.
    /// Gemma 3 (its weights are stored as offsets from 1).
    per_head_gemma,
    /// All heads of a token together (mean over heads * head_dim features); `weight * x_hat`,
    /// weight of length heads * head_dim (head h's features at [h * head_dim, (h+1) * head_dim)).
    /// OLMo 2, which normalises the projection's output before splitting it into heads.
    across_heads,
};

/// @brief Where the call rounds to the storage dtype (bf16, fp16; nothing rounds for fp32 storage).
///
/// x_hat = x * (1 / sqrt(mean(x^2) + eps)) is float32 in every mode, its sum of squares
/// added in the order PyTorch's CPU reduction adds (see qk_norm_sum_of_squares). Then:
enum class QkNormRounding {
    /// Everything float32 (the weight, cos and sin, the rotation), rounded once at the end:
    /// the most accurate, as serving engines' fused kernels compute.
    float32,
    /// HuggingFace Qwen3: x_hat rounded, times the weight, rounded (`weight * x_hat.to(dtype)`);
    /// cos and sin rounded to the dtype, and `q * cos + rotate_half(q) * sin` rounded after each
    /// product and after the sum.
    hf_qwen3,
    /// HuggingFace Gemma 3: `x_hat * (1 + weight)` in float32, rounded once; the rotation
    /// rounded as hf_qwen3's.
    hf_gemma3,
    /// HuggingFace OLMo 2: `weight * x_hat` in float32, rounded once; cos and sin stay float32,
    /// the rotation is float32 and rounds once.
    hf_olmo2,
};

/// @brief Name of a norm kind: "per_head", "per_head_gemma" or "across_heads".
/// @param kind the kind to name.
/// @return its name.
std::string_view qk_norm_kind_name(QkNormKind kind);
/// @brief Parses a norm kind name ("per_head", "per_head_gemma", "across_heads").
/// @param name the name.
/// @return the kind.
/// @throws rope::Error for any other name.
QkNormKind parse_qk_norm_kind(std::string_view name);
/// @brief Name of a rounding mode: "float32", "hf_qwen3", "hf_gemma3" or "hf_olmo2".
/// @param rounding the mode to name.
/// @return its name.
std::string_view qk_norm_rounding_name(QkNormRounding rounding);
/// @brief Parses a rounding mode name ("float32", "hf_qwen3", "hf_gemma3", "hf_olmo2").
/// @param name the name.
/// @return the mode.
/// @throws rope::Error for any other name.
QkNormRounding parse_qk_norm_rounding(std::string_view name);

/// @brief The weight of one RMSNorm: a dense vector of float32 or of the tensors' dtype.
struct NormWeight {
    const void* data = nullptr;    ///< First element.
    DType dtype = DType::f32;      ///< f32, or the dtype of q and k (a bf16 model's own weight).
    Device device = Device::host;  ///< Must be where the tensors are.
    int64_t size = 0;              ///< head_dim (per-head kinds) or heads * head_dim (across_heads).
};

/// @brief q, k and v packed in one buffer, token after token: row t holds q's heads, then k's,
/// then v's, each head_dim features: `[tokens, (q_heads + 2 * kv_heads) * head_dim]`, as one
/// fused qkv projection writes it.
struct QkvBuffer {
    void* data = nullptr;          ///< Row 0 (null: the call uses QkNormArgs' q and k views instead).
    DType dtype = DType::f32;      ///< Storage type.
    Device device = Device::host;  ///< Where it lives.
    int64_t tokens = 0;            ///< Rows.
    int64_t width = 0;             ///< Features per row: (q_heads + 2 * kv_heads) * head_dim.
    int64_t q_heads = 0;           ///< Query heads.
    int64_t kv_heads = 0;          ///< Key heads, and value heads.
    int64_t row_stride = 0;        ///< Elements between rows; 0 means width.
};

/// @brief The arguments of one fused QK-norm + RoPE call.
///
/// Either q and k as views (any layout rope takes) with q_out and k_out (which may be
/// q and k themselves), or a packed QkvBuffer (qkv.data set): its q and k slices are
/// normalised and rotated in place, or written to q_out and k_out when those have data,
/// and its v slice is left untouched, or copied to v_out when v_out has data.
struct QkNormArgs {
    TensorView q;      ///< Queries (unused with a qkv buffer).
    TensorView k;      ///< Keys (unused with a qkv buffer); may have no heads.
    TensorView q_out;  ///< Where q goes (may equal q; with a qkv buffer: data null means in place).
    TensorView k_out;  ///< Where k goes (may equal k; with a qkv buffer: data null means in place).
    QkvBuffer qkv{};   ///< A packed q|k|v buffer, or none (data null).
    TensorView v_out;  ///< With a qkv buffer: where to copy v ([tokens, kv_heads, head_dim]); data null: no copy.
    NormWeight q_weight;  ///< q's norm weight.
    NormWeight k_weight;  ///< k's norm weight (unread when k has no heads).
    QkNormKind kind = QkNormKind::per_head;           ///< What is normalised, how the weight applies.
    QkNormRounding rounding = QkNormRounding::float32;  ///< Where results round to the storage dtype.
    double eps = 1e-6;  ///< Added to mean(x^2), as float32; > 0 and finite in float32.
    Positions positions{};        ///< Position of each token (as RopeArgs::positions).
    CosSinCache cos_sin_cache{};  ///< A caller's cos/sin table, or none (as RopeArgs::cos_sin_cache).
    void* stream = nullptr;       ///< CUDA backends: the cudaStream_t to issue work on.

    /// @brief q and k normalised and rotated in place.
    /// @param q queries.
    /// @param k keys.
    /// @return the arguments; set the weights (and kind, rounding, eps) next.
    static QkNormArgs in_place(TensorView q, TensorView k) {
        QkNormArgs args;
        args.q = args.q_out = q;
        args.k = args.k_out = k;
        return args;
    }
    /// @brief A packed qkv buffer, its q and k slices normalised and rotated in place.
    /// @param qkv the buffer.
    /// @return the arguments; set the weights (and kind, rounding, eps) next.
    static QkNormArgs packed(QkvBuffer qkv) {
        QkNormArgs args;
        args.qkv = qkv;
        return args;
    }
};

/// @brief Validates the call and runs the fused RMSNorm + RoPE on @p backend.
///
/// Every head row of q and k (of the qkv buffer's q and k slices) is normalised as
/// @p args.kind says, with the rounding @p args.rounding names, then rotated by the
/// RoPE of @p config (any scaling, axes, pairing, partial rotary, a caller's table);
/// features past rotary_dim are normalised and not rotated. Only the forward rotation.
/// @param backend the backend that runs it; its device() must be where the tensors live.
/// @param config the model's RoPE.
/// @param args tensors, weights, norm kind, rounding, eps, positions, table, stream.
/// @throws rope::Error naming the offending parameter and its value; nothing is written then.
void apply_qk_norm(Backend& backend, const RopeConfig& config, const QkNormArgs& args);

}  // namespace rope
