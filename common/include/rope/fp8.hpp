#pragma once
/// @file fp8.hpp
/// @brief The two 8-bit float formats of KV caches (e4m3fn, e5m2) and rope's one
/// conversion into them: round to nearest even, saturating.
///
/// Serving engines store k and v (and at times q) as FP8 with a scale. The
/// libraries they use do not agree on overflow: some casts saturate, some give
/// infinity or NaN, and the same library differs by version and device. rope's
/// conversion is written here once, in integer bit arithmetic that the CPU and
/// GPU backends both call, so every backend writes the same bits:
///  - round to nearest, ties to even, from the float32 value (one rounding);
///  - saturating: overflow and +-inf give +-max finite (448 for e4m3fn, 57344
///    for e5m2); NaN stays NaN;
///  - subnormals kept (no flush to zero, of the input or of the result);
///    -0 keeps its sign.
///
/// No floating-point operation takes part (quantize_fp8()'s one division
/// aside), so neither a fused multiply-add nor a flush-to-zero mode of the FPU
/// can change a result. tests/fp8_test.cpp checks both directions against an
/// independent reference (tests/fp8_reference.hpp) near every rounding boundary.
/// On GPUs that have an FP8 conversion instruction (compute capability 8.9 and
/// later) device code uses it instead, through CUDA's own `__nv_cvt_float_to_fp8`
/// with `__NV_SATFINITE` (`cvt.rn.satfinite`): it rounds and saturates the same
/// way in one instruction, where the bit arithmetic takes a few dozen, which an
/// FP8 cache write of every k and v element feels. Only its NaN is its own (one
/// code whatever the sign), so NaN is decided beside it, by a select: device code
/// carries no bit-arithmetic path at all, which keeps a kernel that quantises
/// many values in registers small enough for the instruction cache. The same
/// test file checks the GPU's codes against the host's, bit for bit.
///
/// Scales follow the dequantisation convention of vLLM, FlashMLA and Hugging
/// Face: x ~= fp8 * scale, so quantising divides by the scale. FlashInfer takes
/// the reciprocal (`quant_scale` = 1 / scale, multiplied); for a scale that is
/// not a power of two, x / scale and x * (1 / scale) can round to different
/// float32 values, and so to different FP8 codes.

#include <cstdint>
#include <string_view>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#include <cuda_fp8.h>
#endif

#include "rope/dtype.hpp"
#include "rope/host_device.hpp"

namespace rope {

/// @brief An 8-bit floating-point format (OCP FP8, as PyTorch's float8 types).
enum class Fp8Format {
    /// 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, one NaN
    /// pattern per sign (0x7f, 0xff); largest finite 448, smallest subnormal 2^-9.
    e4m3fn,
    /// 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: infinities
    /// (0x7c, 0xfc) and NaNs; largest finite 57344, smallest subnormal 2^-16.
    e5m2,
};

/// @brief Name of @p format, as parse_fp8_format() reads it.
/// @param format the FP8 format.
/// @return "e4m3fn" or "e5m2".
constexpr std::string_view fp8_format_name(Fp8Format format) {
    return format == Fp8Format::e4m3fn ? "e4m3fn" : "e5m2";
}

/// @brief Parses an FP8 format name.
/// @param name "e4m3fn" or "float8_e4m3fn"; "e5m2" or "float8_e5m2" (PyTorch's dtype names).
/// @return the matching Fp8Format.
/// @throws rope::Error naming the value for any other name.
Fp8Format parse_fp8_format(std::string_view name);

/// @brief Largest finite value of @p format, where the conversion saturates.
/// @param format the FP8 format.
/// @return 448 for e4m3fn, 57344 for e5m2.
ROPE_HOST_DEVICE constexpr float fp8_max(Fp8Format format) {
    return format == Fp8Format::e4m3fn ? 448.0f : 57344.0f;
}

namespace detail {

/// @brief `significand >> shift`, rounded to nearest even: up when the dropped
/// bits are above half, or exactly half with the kept part odd.
/// @param significand the bits to shift.
/// @param shift 1 to 31.
/// @return the rounded quotient.
ROPE_HOST_DEVICE inline uint32_t round_shift_even(uint32_t significand, uint32_t shift) {
    const uint32_t kept = significand >> shift;
    const uint32_t dropped = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    return kept + uint32_t(dropped > half || (dropped == half && (kept & 1u) != 0));
}

/// @brief Rounds float32 to an FP8 format with @p Mantissa mantissa bits and
/// exponent bias @p Bias, to nearest even, saturating (see fp8.hpp).
/// @tparam Mantissa stored mantissa bits (3 or 2).
/// @tparam Bias exponent bias (7 or 15).
/// @param value the float32 value.
/// @param max_bits float32 bits of the largest finite value.
/// @param max_code its FP8 code (sign bit clear).
/// @param nan_code the NaN written for any NaN (sign bit clear).
/// @return the FP8 code.
template <int Mantissa, int Bias>
ROPE_HOST_DEVICE inline uint8_t float_to_fp8_bits(float value, uint32_t max_bits, uint32_t max_code,
                                                  uint32_t nan_code) {
    const uint32_t bits = float_bits(value);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return uint8_t(sign | nan_code);
    // The largest finite value is the last code: whatever lies above it (up to
    // and including infinity) saturates, even what would round up to the
    // pattern after it.
    if (magnitude >= max_bits) return uint8_t(sign | max_code);
    const uint32_t exponent = magnitude >> 23;  // float32's biased exponent
    constexpr uint32_t smallest_normal_exponent = 127 - Bias + 1;  // float32 exponent of FP8's 2^(1 - Bias)
    if (exponent >= smallest_normal_exponent) {
        // Normal in FP8: re-bias the exponent, round 23 mantissa bits to
        // Mantissa. A carry out of the mantissa steps the exponent, as it should;
        // the result stays at or below max_code since magnitude < max_bits.
        return uint8_t(sign | round_shift_even(magnitude - (uint32_t(127 - Bias) << 23), 23 - Mantissa));
    }
    // FP8 subnormal (or zero): count units of 2^(1 - Bias - Mantissa). The
    // float's significand is an integer times 2^(max(exponent, 1) - 150), so the
    // count is that integer shifted right by the difference of the two powers.
    // A shift past 25 leaves less than half a unit (the significand is below
    // 2^24): zero. A count rounding up to 2^Mantissa is the smallest normal
    // code, which is that very bit pattern.
    const uint32_t significand = (magnitude & 0x7fffffu) | (exponent != 0 ? 0x800000u : 0u);
    const uint32_t effective_exponent = exponent != 0 ? exponent : 1u;
    const uint32_t shift = uint32_t(151 - Bias - Mantissa) - effective_exponent;
    return uint8_t(sign | round_shift_even(significand, shift < 26u ? shift : 26u));
}

/// @brief The NaN code of an FP8 format, with the sign of @p value (which is NaN, or
/// a value whose quotient by a scale is).
/// @param value float32 whose sign the code takes.
/// @param nan_code the format's NaN with the sign bit clear.
/// @return nan_code with value's sign bit.
ROPE_HOST_DEVICE inline uint8_t signed_nan_code(float value, uint32_t nan_code) {
    return uint8_t(((float_bits(value) >> 24) & 0x80u) | nan_code);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
/// The GPU's conversion instruction (see the top of the file) for @p value, NaN
/// included: the instruction's code, or the signed NaN code. Both are computed and
/// one is selected, so no branch and no second conversion path is compiled in.
__device__ inline uint8_t fp8_instruction(float value, __nv_fp8_interpretation_t format, uint32_t nan_code) {
    const uint8_t code = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, format);
    return value == value ? code : signed_nan_code(value, nan_code);
}
#endif

}  // namespace detail

/// @brief Rounds float32 to e4m3fn: nearest even, saturating at +-448, NaN kept.
/// @param value the float32 value.
/// @return the e4m3fn code: +-448 (0x7e/0xfe) for overflow and +-inf, 0x7f/0xff for NaN.
ROPE_HOST_DEVICE inline uint8_t float_to_e4m3fn(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return detail::fp8_instruction(value, __NV_E4M3, 0x7fu);
#else
    return detail::float_to_fp8_bits<3, 7>(value, 0x43e00000u /* 448 */, 0x7eu, 0x7fu);
#endif
}

/// @brief Rounds float32 to e5m2: nearest even, saturating at +-57344, NaN kept.
/// @param value the float32 value.
/// @return the e5m2 code: +-57344 (0x7b/0xfb) for overflow and +-inf, the quiet NaN 0x7e/0xfe for NaN.
ROPE_HOST_DEVICE inline uint8_t float_to_e5m2(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return detail::fp8_instruction(value, __NV_E5M2, 0x7eu);
#else
    return detail::float_to_fp8_bits<2, 15>(value, 0x47600000u /* 57344 */, 0x7bu, 0x7eu);
#endif
}

/// @brief Widens an e4m3fn code to float32 (exact).
/// @param code the e4m3fn bits.
/// @return its value; a quiet NaN (with the code's sign) for 0x7f and 0xff.
ROPE_HOST_DEVICE inline float e4m3fn_to_float(uint8_t code) {
    const uint32_t sign = uint32_t(code & 0x80u) << 24;
    const uint32_t exponent = (code >> 3) & 0xfu;
    const uint32_t mantissa = code & 0x7u;
    if (exponent == 0xfu && mantissa == 0x7u) return bits_to_float(sign | 0x7fc00000u);
    // Subnormal: mantissa * 2^-9, built as a float32 (normal there) by its bits.
    if (exponent == 0) return bits_to_float(sign | float_bits(float(mantissa) * 0.001953125f));
    return bits_to_float(sign | ((exponent + 127 - 7) << 23) | (mantissa << 20));
}

/// @brief Widens an e5m2 code to float32 (exact).
/// @param code the e5m2 bits.
/// @return its value; +-inf for 0x7c/0xfc, a quiet NaN (with the code's sign) for the other all-ones exponents.
ROPE_HOST_DEVICE inline float e5m2_to_float(uint8_t code) {
    const uint32_t sign = uint32_t(code & 0x80u) << 24;
    const uint32_t exponent = (code >> 2) & 0x1fu;
    const uint32_t mantissa = code & 0x3u;
    if (exponent == 0x1fu) return bits_to_float(sign | (mantissa == 0 ? 0x7f800000u : 0x7fc00000u));
    // Subnormal: mantissa * 2^-16.
    if (exponent == 0) return bits_to_float(sign | float_bits(float(mantissa) * 1.52587890625e-5f));
    return bits_to_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 21));
}

/// @brief Rounds float32 to @p format (float_to_e4m3fn() or float_to_e5m2()).
/// @param value the float32 value.
/// @param format the FP8 format.
/// @return the FP8 code.
ROPE_HOST_DEVICE inline uint8_t float_to_fp8(float value, Fp8Format format) {
    return format == Fp8Format::e4m3fn ? float_to_e4m3fn(value) : float_to_e5m2(value);
}

/// @brief Widens an FP8 code of @p format to float32 (exact).
/// @param code the FP8 bits.
/// @param format the FP8 format.
/// @return its value.
ROPE_HOST_DEVICE inline float fp8_to_float(uint8_t code, Fp8Format format) {
    return format == Fp8Format::e4m3fn ? e4m3fn_to_float(code) : e5m2_to_float(code);
}

/// @brief Quantises @p value with a dequantisation scale: the FP8 code nearest
/// to value / scale (float32 division, IEEE-rounded), saturating.
///
/// The convention of vLLM, FlashMLA and Hugging Face: x ~= fp8 * scale.
/// FlashInfer's `quant_scale` is 1 / scale and multiplies; pass its reciprocal
/// here, knowing that x / s and x * (1 / s) round differently when s is not a
/// power of two. The division is IEEE-rounded on the host and on the GPU (nvcc's
/// default -prec-div=true; rope is never built with fast math). The caller
/// checks that @p scale is positive and finite (a zero scale gives +-max, or NaN
/// for a zero value: no undefined behaviour).
/// @param value the float32 value (rope's rotated result, never first rounded to the model's dtype).
/// @param scale the dequantisation scale.
/// @param format the FP8 format.
/// @return float_to_fp8(value / scale, format); a NaN quotient gives the NaN code with the sign of @p value.
ROPE_HOST_DEVICE inline uint8_t quantize_fp8(float value, float scale, Fp8Format format) {
    const float quotient = value / scale;
    // A NaN quotient keeps the sign of the value: a CPU carries a NaN operand's sign through the
    // division, a GPU returns its own positive NaN, and every backend must write the same code.
    const uint8_t code = float_to_fp8(quotient, format);
    return quotient == quotient ? code : detail::signed_nan_code(value, format == Fp8Format::e4m3fn ? 0x7fu : 0x7eu);
}

}  // namespace rope
