#pragma once
/// @file detail/qk_norm_plan.hpp
/// @brief For backend authors: a validated fused QK-norm + RoPE call (QkNormPlan), and the
/// per-row steps every backend shares, on the CPU and on the GPU alike.
///
/// - qk_norm_sum_of_squares: a row's sum of squares, added in PyTorch's CPU order;
/// - inverse_rms: 1 / sqrt(mean + eps), rounded as torch's rsqrt rounds;
/// - normalized_feature: one feature normalised and weighted, rounded as the mode says (norm_scale
///   and scaled_feature: the same in two steps, for a kernel that prepares a row's scales once;
///   scaled_pair: two features at once, their roundings paired by round_pair_to);
/// - rotate_normalized: one pair rotated, rounded as the mode says;
/// - group_inverse_rms and normalize_rotate_head (normalize_rotate_head_with, given the pairs'
///   cos and sin): one norm group, one head row.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "rope/config.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/detail/plan.hpp"
#include "rope/dtype.hpp"
#include "rope/host_device.hpp"
#include "rope/qk_norm.hpp"
#include "rope/rotation.hpp"
#include "rope/tensor.hpp"

namespace rope {

/// @brief One operand (q or k) of a QkNormPlan: its tensors and its norm weight.
struct NormOperand {
    Operand tensor;               ///< Input and output (in_geometry.heads may be 0: nothing to do).
    const void* weight = nullptr;  ///< Norm weight (NormWeight::data).
    DType weight_dtype = DType::f32;  ///< f32, or the storage dtype.
};

/// @brief What every row step reads, with no container: device code takes it by value.
struct QkNormStep {
    Style style = Style::half_split;  ///< Pairing of features.
    int64_t head_dim = 0;             ///< Features per head.
    int64_t rotary_dim = 0;           ///< Features that rotate.
    int64_t pairs = 0;                ///< rotary_dim / 2.
    int64_t axes = 1;                 ///< Position axes.
    QkNormKind kind = QkNormKind::per_head;             ///< What is normalised.
    QkNormRounding rounding = QkNormRounding::float32;  ///< Where results round.
    float eps = 0.0f;                 ///< QkNormArgs::eps in float32.
    NormOperand operands[2];          ///< [0] = q, [1] = k.
};

/// @brief A fused QK-norm + RoPE call after validation.
struct QkNormPlan {
    Plan rope;         ///< The RoPE part, validated by make_plan (angles, positions, sizes, stream).
    QkNormStep step;   ///< The norm and the operands.
    Operand v;         ///< v slice of a qkv buffer and v_out: copied when in_geometry.heads > 0.

    /// @brief Whether there is nothing to do.
    /// @return true when no element is normalised and no v is copied.
    bool empty() const { return rope.empty() && (v.in_geometry.heads == 0 || rope.seq == 0); }
};

/// @brief Validates @p args against @p config for a backend on @p device.
/// @param config the model's RoPE.
/// @param args the call.
/// @param device where the backend runs.
/// @return the plan.
/// @throws rope::Error naming the first offending parameter and its value.
QkNormPlan make_qk_norm_plan(const RopeConfig& config, const QkNormArgs& args, Device device);

namespace detail {

/// @brief @p a * @p b rounded once to float32 (never fused with a neighbouring add on the GPU).
/// @param a, b the factors.
/// @return their product in float32.
ROPE_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/// @brief @p a + @p b rounded once to float32 (never fused with a product on the GPU).
/// @param a, b the terms.
/// @return their sum in float32.
ROPE_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

/// @brief @p value rounded to @p Storage and widened back: what `.to(dtype)` does to it.
/// @tparam Storage float, float16 or bfloat16.
/// @param value the float32 value.
/// @return the nearest Storage value, as float32.
template <typename Storage>
ROPE_HOST_DEVICE inline float round_to(float value) {
    return to_float(from_float<Storage>(value));
}

/// @brief round_to of two values: the same two results. On a GPU, bf16 takes one
/// instruction for both (`cvt.rn.bf16x2.f32`, which rounds as `cvt.rn.bf16.f32` does, NaN
/// included), where two roundings take two: a kernel that rounds after every operation, as
/// HF's bf16 code does, is bound by the conversion units' rate otherwise.
/// @tparam Storage float, float16 or bfloat16.
/// @param[in,out] a, b the float32 values, rounded.
template <typename Storage>
ROPE_HOST_DEVICE inline void round_pair_to(float& a, float& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<Storage, bfloat16>) {
        uint32_t packed;  // b's bf16 in the upper half, a's in the lower.
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(b), "f"(a));
        a = bits_to_float(packed << 16);
        b = bits_to_float(packed & 0xffff0000u);
        return;
    }
#endif
    a = round_to<Storage>(a);
    b = round_to<Storage>(b);
}

/// @brief Element @p i of a norm weight, widened to float32.
/// @param data the weight's first element.
/// @param dtype its storage type.
/// @param i the element's index.
/// @return the element in float32.
ROPE_HOST_DEVICE inline float weight_at(const void* data, DType dtype, int64_t i) {
    if (dtype == DType::bf16) return to_float(static_cast<const bfloat16*>(data)[i]);
    if (dtype == DType::f16) return to_float(static_cast<const float16*>(data)[i]);
    return static_cast<const float*>(data)[i];
}

/// @brief Sum of @p term(i), i in [0, size), by PyTorch's cascade (aten's multi_row_sum
/// for one accumulator): runs of 2^level_power terms are summed, then carried up
/// four levels of partial sums, so no long run of additions accumulates error.
/// @param size the number of terms.
/// @param term term(i): the i-th term.
/// @return the sum, in float32, in that order.
template <typename Term>
ROPE_HOST_DEVICE inline float cascade_sum(int64_t size, Term term) {
    constexpr int kLevels = 4;
    int64_t log2_size = 1;  // ceil(log2(size)), at least 1
    while ((int64_t(1) << log2_size) < size) ++log2_size;
    const int64_t level_power = log2_size / kLevels > 4 ? log2_size / kLevels : 4;
    const int64_t level_step = int64_t(1) << level_power;
    const int64_t level_mask = level_step - 1;
    float acc[kLevels] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    while (i + level_step <= size) {
        for (int64_t j = 0; j < level_step; ++j, ++i) acc[0] = add_rn(acc[0], term(i));
        for (int j = 1; j < kLevels; ++j) {
            acc[j] = add_rn(acc[j], acc[j - 1]);
            acc[j - 1] = 0.0f;
            if ((i & (level_mask << (j * level_power))) != 0) break;
        }
    }
    for (; i < size; ++i) acc[0] = add_rn(acc[0], term(i));
    for (int j = 1; j < kLevels; ++j) acc[0] = add_rn(acc[0], acc[j]);
    return acc[0];
}

/// Lanes of PyTorch's float vector (256 bits) in its CPU sum.
inline constexpr int kTorchLanes = 8;
/// Vectors PyTorch's CPU sum accumulates side by side.
inline constexpr int kTorchVectors = 4;

/// @brief One of the kTorchLanes * kTorchVectors partial sums of qk_norm_sum_of_squares:
/// lane @p lane of vector accumulator @p vector, over the row's whole vectors.
/// @param n features in the row.
/// @param vector accumulator index in [0, kTorchVectors).
/// @param lane lane index in [0, kTorchLanes).
/// @param load load(f): feature f of the row, in float32.
/// @return the partial sum (its leftover vectors included for vector 0).
template <typename Load>
ROPE_HOST_DEVICE inline float torch_partial_sum(int64_t n, int vector, int lane, Load load) {
    const int64_t vectors = n / kTorchLanes, rounds = vectors / kTorchVectors;
    const auto square = [&](int64_t v) {
        const float x = load(v * kTorchLanes + lane);
        return mul_rn(x, x);
    };
    float sum = cascade_sum(rounds, [&](int64_t i) { return square(i * kTorchVectors + vector); });
    if (vector == 0)
        for (int64_t v = rounds * kTorchVectors; v < vectors; ++v) sum = add_rn(sum, square(v));
    return sum;
}

/// @brief The tail of qk_norm_sum_of_squares: features past the last whole vector, from 0.
/// @param n features in the row.
/// @param load load(f): feature f of the row, in float32.
/// @return the sum of the tail's squares, in order.
template <typename Load>
ROPE_HOST_DEVICE inline float torch_tail_sum(int64_t n, Load load) {
    float total = 0.0f;
    for (int64_t f = n / kTorchLanes * kTorchLanes; f < n; ++f) total = add_rn(total, mul_rn(load(f), load(f)));
    return total;
}

/// @brief Sum of squares of the @p n features of a row, added in the order PyTorch's CPU
/// `x.pow(2).mean(-1)` adds them (aten's vectorized inner sum: eight float lanes, four vector
/// accumulators side by side, each a cascade_sum; the accumulators added in order, then the
/// tail, then the lanes in order), so the mean is the same float32 as HuggingFace's on the CPU.
/// @param n features in the row.
/// @param load load(f): feature f of the row, in float32.
/// @return the sum.
template <typename Load>
ROPE_HOST_DEVICE inline float qk_norm_sum_of_squares(int64_t n, Load load) {
    float total = torch_tail_sum(n, load);
    for (int lane = 0; lane < kTorchLanes; ++lane) {
        float lane_sum = torch_partial_sum(n, 0, lane, load);
        for (int vector = 1; vector < kTorchVectors; ++vector)
            lane_sum = add_rn(lane_sum, torch_partial_sum(n, vector, lane, load));
        total = add_rn(total, lane_sum);
    }
    return total;
}

/// @brief 1 / sqrt(sum / n + eps) in float32, each step rounded (torch: mean = sum / n, then
/// rsqrt(mean + eps) computed as 1 / sqrt).
/// @param sum the sum of squares.
/// @param n the features it covers.
/// @param eps QkNormStep::eps.
/// @return the inverse root mean square.
ROPE_HOST_DEVICE inline float inverse_rms(float sum, int64_t n, float eps) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, float(n)), eps)));
#else
    return 1.0f / std::sqrt(sum / float(n) + eps);
#endif
}

/// @brief The factor a normalised feature is multiplied by: the weight element (Llama-style,
/// across heads) or 1 + the weight element (Gemma-style), in float32.
/// @param weight the weight element.
/// @param kind what is normalised.
/// @return the scale.
ROPE_HOST_DEVICE inline float norm_scale(float weight, QkNormKind kind) {
    return kind == QkNormKind::per_head_gemma ? add_rn(1.0f, weight) : weight;
}

/// @brief Feature @p x normalised (times @p inverse) and multiplied by @p scale (norm_scale),
/// rounded as @p rounding says; in float32 mode not rounded. A kernel that computes a row's
/// scales once calls this; normalized_feature is the same arithmetic from the weight element.
/// @tparam Storage the storage type.
/// @param x the input feature.
/// @param inverse inverse_rms of its group.
/// @param scale norm_scale of its weight element.
/// @param rounding where to round.
/// @return the normalised value, as the rotation reads it.
template <typename Storage>
ROPE_HOST_DEVICE inline float scaled_feature(float x, float inverse, float scale, QkNormRounding rounding) {
    const float x_hat = mul_rn(x, inverse);
    switch (rounding) {
        case QkNormRounding::hf_qwen3: return round_to<Storage>(mul_rn(scale, round_to<Storage>(x_hat)));
        case QkNormRounding::hf_gemma3:
        case QkNormRounding::hf_olmo2: return round_to<Storage>(mul_rn(x_hat, scale));
        case QkNormRounding::float32: break;
    }
    return mul_rn(x_hat, scale);
}

/// @brief scaled_feature of two features at once (the same two results), their roundings
/// paired (round_pair_to).
/// @tparam Storage the storage type.
/// @param[in,out] x, y the input features, normalised and scaled.
/// @param inverse inverse_rms of their group.
/// @param scale_x, scale_y norm_scale of their weight elements.
/// @param rounding where to round.
template <typename Storage>
ROPE_HOST_DEVICE inline void scaled_pair(float& x, float& y, float inverse, float scale_x, float scale_y,
                                         QkNormRounding rounding) {
    float x_hat = mul_rn(x, inverse), y_hat = mul_rn(y, inverse);
    switch (rounding) {
        case QkNormRounding::hf_qwen3:
            round_pair_to<Storage>(x_hat, y_hat);
            x = mul_rn(scale_x, x_hat), y = mul_rn(scale_y, y_hat);
            round_pair_to<Storage>(x, y);
            return;
        case QkNormRounding::hf_gemma3:
        case QkNormRounding::hf_olmo2:
            x = mul_rn(x_hat, scale_x), y = mul_rn(y_hat, scale_y);
            round_pair_to<Storage>(x, y);
            return;
        case QkNormRounding::float32: break;
    }
    x = mul_rn(x_hat, scale_x), y = mul_rn(y_hat, scale_y);
}

/// @brief Feature @p x normalised (times @p inverse) and weighted, rounded as @p rounding says;
/// in float32 mode not rounded.
/// @tparam Storage the storage type.
/// @param x the input feature.
/// @param inverse inverse_rms of its group.
/// @param weight its weight element.
/// @param kind Llama-style or Gemma-style weight.
/// @param rounding where to round.
/// @return the normalised value, as the rotation reads it.
template <typename Storage>
ROPE_HOST_DEVICE inline float normalized_feature(float x, float inverse, float weight, QkNormKind kind,
                                                 QkNormRounding rounding) {
    return scaled_feature<Storage>(x, inverse, norm_scale(weight, kind), rounding);
}

/// @brief Rotates a normalised pair (x, y) by (cos, sin); the caller rounds the result once more
/// to storage (which changes nothing where this already rounded).
///
/// hf_qwen3 and hf_gemma3 round cos and sin to the storage dtype and round after each product
/// and after the sum, as `q * cos + rotate_half(q) * sin` in the model's dtype does; float32 and
/// hf_olmo2 rotate in float32.
/// @tparam Storage the storage type.
/// @param[in,out] x, y the pair's normalised features, rotated.
/// @param cos_angle, sin_angle the pair's cos and sin (rotation_factors).
/// @param rounding where to round.
template <typename Storage>
ROPE_HOST_DEVICE inline void rotate_normalized(float& x, float& y, float cos_angle, float sin_angle,
                                               QkNormRounding rounding) {
    if (rounding == QkNormRounding::hf_qwen3 || rounding == QkNormRounding::hf_gemma3) {
        // Each rounding of HF's formula, two at a time (round_pair_to).
        float c = cos_angle, s = sin_angle;
        round_pair_to<Storage>(c, s);
        float xc = mul_rn(x, c), ys = mul_rn(y, s);
        round_pair_to<Storage>(xc, ys);
        float yc = mul_rn(y, c), xs = mul_rn(x, s);
        round_pair_to<Storage>(yc, xs);
        x = add_rn(xc, -ys), y = add_rn(yc, xs);
        round_pair_to<Storage>(x, y);
        return;
    }
    rotate_pair(x, y, cos_angle, sin_angle);
}

/// @brief Features in one norm group: a head row, or all heads of a token (across_heads).
/// @param step the call's norm.
/// @param operand q or k.
/// @return head_dim, or heads * head_dim.
ROPE_HOST_DEVICE inline int64_t group_features(const QkNormStep& step, const NormOperand& operand) {
    return step.kind == QkNormKind::across_heads ? operand.tensor.in_geometry.heads * step.head_dim : step.head_dim;
}

/// @brief inverse_rms of the group of head @p h of token (b, s): head h alone, or all heads
/// (across_heads, where @p h is ignored).
/// @tparam Storage the storage type.
/// @param step the call's norm.
/// @param operand q or k.
/// @param b, h, s sequence, head and token.
/// @return inverse_rms of the group.
template <typename Storage>
ROPE_HOST_DEVICE inline float group_inverse_rms(const QkNormStep& step, const NormOperand& operand, int64_t b,
                                                int64_t h, int64_t s) {
    const Geometry& g = operand.tensor.in_geometry;
    const auto* in = static_cast<const Storage*>(operand.tensor.in);
    const bool across = step.kind == QkNormKind::across_heads;
    const int64_t first_head = across ? 0 : h;
    const int64_t n = group_features(step, operand);
    const int64_t head_dim = step.head_dim;
    const Storage* row = in + g.offset(b, first_head, s, 0);  // per-head kinds: the group is this row
    const float sum = qk_norm_sum_of_squares(n, [&](int64_t f) {
        return to_float(across ? in[g.offset(b, f / head_dim, s, f % head_dim)] : row[f * g.stride_dim]);
    });
    return inverse_rms(sum, n, step.eps);
}

/// @brief Normalises head row (b, h, s) with @p inverse (its group's inverse_rms), rotates its
/// pairs by the cos and sin @p factors gives, passes the features past rotary_dim through
/// normalised, and writes the row. The one copy of the row's arithmetic: normalize_rotate_head
/// computes the factors pair by pair; a kernel that shares a token's factors across its heads
/// reads them from where it stored them (the same floats, so the same results bit for bit).
/// @tparam Storage the storage type.
/// @tparam Factors a callable factors(i, cos, sin) setting pair i's cos and sin (rotation_factors).
/// @param step the call's norm.
/// @param factors the pairs' cos and sin.
/// @param operand q or k.
/// @param b, h, s sequence, head and token.
/// @param inverse inverse_rms of the row's group.
/// @param first, stride this caller's share: pairs (and pass-through features) first,
///        first + stride, ... (a warp's lane and 32; 0 and 1 for the whole row).
template <typename Storage, typename Factors>
ROPE_HOST_DEVICE inline void normalize_rotate_head_with(const QkNormStep& step, const Factors& factors,
                                                        const NormOperand& operand, int64_t b, int64_t h, int64_t s,
                                                        float inverse, int64_t first, int64_t stride) {
    const Geometry& g = operand.tensor.in_geometry;
    const Geometry& o = operand.tensor.out_geometry;
    const auto* in = static_cast<const Storage*>(operand.tensor.in);
    auto* out = static_cast<Storage*>(operand.tensor.out);
    const int64_t weight_base = step.kind == QkNormKind::across_heads ? h * step.head_dim : 0;
    const auto normalized = [&](int64_t d) {
        return normalized_feature<Storage>(to_float(in[g.offset(b, h, s, d)]), inverse,
                                           weight_at(operand.weight, operand.weight_dtype, weight_base + d),
                                           step.kind, step.rounding);
    };
    for (int64_t i = first; i < step.pairs; i += stride) {
        float cos_angle, sin_angle;
        factors(i, cos_angle, sin_angle);
        const PairIndex pair = pair_elements(step.style, step.rotary_dim, i);
        float x = normalized(pair.first), y = normalized(pair.second);  // Both read before either is written.
        rotate_normalized<Storage>(x, y, cos_angle, sin_angle, step.rounding);
        out[o.offset(b, h, s, pair.first)] = from_float<Storage>(x);
        out[o.offset(b, h, s, pair.second)] = from_float<Storage>(y);
    }
    for (int64_t d = step.rotary_dim + first; d < step.head_dim; d += stride)
        out[o.offset(b, h, s, d)] = from_float<Storage>(normalized(d));
}

/// @brief Normalises head row (b, h, s) with @p inverse (its group's inverse_rms), rotates its
/// pairs, passes the features past rotary_dim through normalised, and writes the row.
/// @tparam Storage the storage type.
/// @tparam Rule AngleRule, or the CUDA kernels' copy of it.
/// @param step the call's norm.
/// @param rule the call's angle rule.
/// @param positions the token's positions (token_positions).
/// @param operand q or k.
/// @param b, h, s sequence, head and token.
/// @param inverse inverse_rms of the row's group.
/// @param first, stride this caller's share: pairs (and pass-through features) first,
///        first + stride, ... (a warp's lane and 32; 0 and 1 for the whole row).
template <typename Storage, typename Rule>
ROPE_HOST_DEVICE inline void normalize_rotate_head(const QkNormStep& step, const Rule& rule,
                                                   const TokenPositions& positions, const NormOperand& operand,
                                                   int64_t b, int64_t h, int64_t s, float inverse, int64_t first = 0,
                                                   int64_t stride = 1) {
    const auto factors = [&](int64_t i, float& cos_angle, float& sin_angle) {
        rotation_factors(rule, positions.of_pair(rule, step.axes, i), i, cos_angle, sin_angle);
    };
    normalize_rotate_head_with<Storage>(step, factors, operand, b, h, s, inverse, first, stride);
}

/// @brief The whole of one norm group of token (b, s) of operand @p which: head @p h
/// (per-head kinds) or every head (across_heads, @p h ignored).
/// @tparam Storage the storage type.
/// @tparam Rule AngleRule, or the CUDA kernels' copy of it.
/// @param step the call's norm.
/// @param rule the call's angle rule.
/// @param source where positions come from.
/// @param which 0 for q, 1 for k.
/// @param b, h, s sequence, head (the group) and token.
template <typename Storage, typename Rule>
ROPE_HOST_DEVICE inline void qk_norm_group(const QkNormStep& step, const Rule& rule, const PositionSource& source,
                                           int which, int64_t b, int64_t h, int64_t s) {
    const NormOperand& operand = step.operands[which];
    const TokenPositions positions = token_positions(source, step.axes, b, s);
    // The group's sum is complete before any of its features is written (in place).
    const float inverse = group_inverse_rms<Storage>(step, operand, b, h, s);
    const bool across = step.kind == QkNormKind::across_heads;
    const int64_t first = across ? 0 : h, last = across ? operand.tensor.in_geometry.heads : h + 1;
    for (int64_t head = first; head < last; ++head)
        normalize_rotate_head<Storage>(step, rule, positions, operand, b, head, s, inverse);
}

/// @brief Norm groups of one token of operand @p which: its heads, or 1 (across_heads).
/// @param step the call's norm.
/// @param which 0 for q, 1 for k.
/// @return the number of groups (0 for an operand without heads).
ROPE_HOST_DEVICE inline int64_t groups_per_token(const QkNormStep& step, int which) {
    const int64_t heads = step.operands[which].tensor.in_geometry.heads;
    return step.kind == QkNormKind::across_heads ? (heads > 0 ? 1 : 0) : heads;
}

/// @brief Copies element (b, h, s, d) of the v operand (a qkv buffer's v slice to v_out).
/// @tparam Storage the storage type.
/// @param v QkNormPlan::v.
/// @param b, h, s, d the element.
template <typename Storage>
ROPE_HOST_DEVICE inline void copy_v_element(const Operand& v, int64_t b, int64_t h, int64_t s, int64_t d) {
    static_cast<Storage*>(v.out)[v.out_geometry.offset(b, h, s, d)] =
        static_cast<const Storage*>(v.in)[v.in_geometry.offset(b, h, s, d)];
}

/// @brief cpu-naive's fused QK-norm + RoPE (cpu/naive_qk_norm.cpp). @param plan the call.
void run_qk_norm_cpu_naive(const QkNormPlan& plan);
/// @brief cpu-eigen's (cpu/eigen/qk_norm.cpp). @param plan the call. @param threads worker threads (0: OpenMP's default).
void run_qk_norm_cpu_eigen(const QkNormPlan& plan, int threads);
/// @brief cuda-naive's (cuda/naive_qk_norm.cu). @param plan the call.
void run_qk_norm_cuda_naive(const QkNormPlan& plan);
/// @brief cuda-optimized's (cuda/optimized/qk_norm.cu). @param plan the call.
void run_qk_norm_cuda_optimized(const QkNormPlan& plan);

}  // namespace detail
}  // namespace rope
