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

#include <cmath>
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

/// Whether @p scale is a dequantisation scale rope quantises with: positive and
/// finite (NaN fails both comparisons). Any other scale gives NaN codes.
/// @param scale the dequantisation scale.
/// @return true for a scale in (0, FLT_MAX].
ROPE_HOST_DEVICE inline bool valid_scale(float scale) { return scale > 0.0f && scale <= 3.40282347e38f; }

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
/// checks that @p scale is positive and finite; any other scale (zero, negative,
/// infinite, NaN: a scale in GPU memory that no validation could read) gives the
/// NaN code, so that such a cache is visibly wrong, the same way on every backend.
/// @param value the float32 value (rope's rotated result, never first rounded to the model's dtype).
/// @param scale the dequantisation scale.
/// @param format the FP8 format.
/// @return float_to_fp8(value / scale, format); a NaN quotient gives the NaN code with the sign of @p value.
ROPE_HOST_DEVICE inline uint8_t quantize_fp8(float value, float scale, Fp8Format format) {
    const uint32_t nan_code = format == Fp8Format::e4m3fn ? 0x7fu : 0x7eu;
    if (!detail::valid_scale(scale)) return detail::signed_nan_code(value, nan_code);
    const float quotient = value / scale;
    // A NaN quotient keeps the sign of the value: a CPU carries a NaN operand's sign through the
    // division, a GPU returns its own positive NaN, and every backend must write the same code.
    const uint8_t code = float_to_fp8(quotient, format);
    return quotient == quotient ? code : detail::signed_nan_code(value, nan_code);
}

/// @brief quantize_fp8() of many values by one scale, with the same codes, for
/// the GPU's cache writes: no division per value.
///
/// An FP8 cache write divides every k and v element by its scale, and on a GPU an
/// IEEE float32 division is a dozen instructions with a branch to a slow path
/// beside each, which an append kernel unrolled over its rows repeats hundreds of
/// times. This class does the division's work once per scale and leaves each value
/// a few multiplications and fused multiply-adds, whose quotient is the IEEE
/// division's, bit for bit, wherever the code depends on it:
///  - the scale is split once into 2^e · m with m in [1, 2), exactly (its
///    exponent and significand bits), and y = 1/m is rounded once;
///  - a value's magnitude x = |value| · 2^-e is two exact multiplications (two,
///    because 2^-e alone may not be a float), bounded by 2^64, where every
///    quotient saturates anyway; NaN stays NaN;
///  - x / m is Markstein's division: q = x · y, then twice q += (x - q · m) · y,
///    each remainder and each step one fused multiply-add. The first step makes
///    q within one ulp of x / m; from such a q, with y within half an ulp of 1/m,
///    the remainder is exact and the second step rounds the exact quotient
///    correctly (Markstein's theorem), as long as x is a normal float well above
///    the subnormals. A smaller x has a quotient below 2^-100, which is code 0
///    either way;
///  - the code takes the value's sign bit: -0, tiny negatives and NaN's sign come
///    out as quantize_fp8() gives them.
///
/// tests/fp8_test.cpp checks the quotient against IEEE division and the codes
/// against quantize_fp8() on the host (where std::fma computes the same fused
/// steps), and on the GPU, near every rounding boundary and for scales from the
/// subnormals to the largest float. A scale that is not positive and finite gives
/// the NaN code, as in quantize_fp8().
/// @tparam Format the FP8 format.
template <Fp8Format Format>
class Fp8Quantizer {
  public:
    /// @brief Splits @p scale (see the class).
    /// @param scale the dequantisation scale (value ~= fp8 * scale).
    ROPE_HOST_DEVICE explicit Fp8Quantizer(float scale) {
        const bool valid = detail::valid_scale(scale);
        uint32_t bits = float_bits(valid ? scale : 1.0f);
        int exponent_offset = 0;
        if ((bits >> 23) == 0) {  // A subnormal scale: made normal by an exact scaling by 2^64.
            bits = float_bits(bits_to_float(bits) * 18446744073709551616.0f);
            exponent_offset = 64;
        }
        const int exponent = int(bits >> 23) - 127 - exponent_offset;  // scale = 2^exponent * significand_
        significand_ = bits_to_float((bits & 0x7fffffu) | 0x3f800000u);
        reciprocal_ = reciprocal(significand_);
        const int shift = -exponent;  // -149 .. 127; each half a float's exponent.
        const int first = shift / 2;
        first_factor_ = valid ? bits_to_float(uint32_t(first + 127) << 23) : bits_to_float(0x7fc00000u);
        second_factor_ = bits_to_float(uint32_t(shift - first + 127) << 23);
    }

    /// @brief |value| / scale, rounded as IEEE float32 division rounds it, where
    /// that decides the code: for quotients from 2^-100 to 2^63. Below, a value
    /// under 2^-100 (code 0); above, up to 2^64 (the largest code); NaN for NaN.
    /// @param value the value.
    /// @return the quotient's magnitude.
    ROPE_HOST_DEVICE float magnitude_quotient(float value) const {
        const float x = bound(fabsf(value) * first_factor_ * second_factor_);
        float q = x * reciprocal_;
        q = fused(fused(-q, significand_, x), reciprocal_, q);
        return fused(fused(-q, significand_, x), reciprocal_, q);
    }

    /// @brief quantize_fp8(value, scale, Format).
    /// @param value the float32 value.
    /// @return its code.
    ROPE_HOST_DEVICE uint8_t quantize(float value) const {
        const uint32_t magnitude_code = float_to_fp8(magnitude_quotient(value), Format) & 0x7fu;
        return uint8_t(magnitude_code | ((float_bits(value) >> 24) & 0x80u));
    }

    /// @brief quantize_fp8() of four values: value i's code in byte i (one 32-bit store).
    /// @param values the float32 values.
    /// @return the four codes.
    ROPE_HOST_DEVICE uint32_t quantize4(const float* values) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        // Two values per conversion instruction, then the signs' bits in one merge.
        constexpr __nv_fp8_interpretation_t kind = Format == Fp8Format::e4m3fn ? __NV_E4M3 : __NV_E5M2;
        const uint32_t low = __nv_cvt_float2_to_fp8x2(
            make_float2(magnitude_quotient(values[0]), magnitude_quotient(values[1])), __NV_SATFINITE, kind);
        const uint32_t high = __nv_cvt_float2_to_fp8x2(
            make_float2(magnitude_quotient(values[2]), magnitude_quotient(values[3])), __NV_SATFINITE, kind);
        uint32_t codes = __byte_perm(low, high, 0x5410);
        if constexpr (Format == Fp8Format::e5m2) codes = quiet_e5m2_nans(codes);
        const uint32_t signs = __byte_perm(__byte_perm(float_bits(values[0]), float_bits(values[1]), 0x73),
                                           __byte_perm(float_bits(values[2]), float_bits(values[3]), 0x73), 0x5410);
        return (codes & 0x7f7f7f7fu) | (signs & 0x80808080u);
#else
        uint32_t codes = 0;
        for (int i = 0; i < 4; ++i) codes |= uint32_t(quantize(values[i])) << (8 * i);
        return codes;
#endif
    }

  private:
    /// a * b + c rounded once.
    ROPE_HOST_DEVICE static float fused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
        return fmaf(a, b, c);
#else
        return std::fma(a, b, c);
#endif
    }

    /// 1 / m rounded once (m in [1, 2), so neither a subnormal nor a slow path is involved).
    ROPE_HOST_DEVICE static float reciprocal(float significand) {
#if defined(__CUDA_ARCH__)
        return __frcp_rn(significand);
#else
        return 1.0f / significand;
#endif
    }

    /// min(x, 2^64) for x >= 0, NaN kept (a plain fminf would turn NaN into the bound).
    ROPE_HOST_DEVICE static float bound(float x) {
        constexpr float kBound = 18446744073709551616.0f;  // 2^64: far past either format's saturation.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        float bounded;
        asm("min.NaN.f32 %0, %1, %2;" : "=f"(bounded) : "f"(x), "f"(kBound));
        return bounded;
#else
        return x == x && x > kBound ? kBound : x;
#endif
    }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    /// The conversion instruction's NaN in e5m2 is its own; rope's is the quiet 0x7e. With
    /// saturation no finite code has an all-ones exponent, so those bytes are NaNs: their
    /// significand bits become 10.
    __device__ static uint32_t quiet_e5m2_nans(uint32_t codes) {
        const uint32_t magnitude = codes & 0x7f7f7f7fu;
        // Bit 2 of each byte: the AND of its exponent bits 2..6.
        const uint32_t all_ones = magnitude & (magnitude >> 1) & (magnitude >> 2) & (magnitude >> 3) & (magnitude >> 4);
        const uint32_t nan = (all_ones >> 2) & 0x01010101u;
        return (codes & ~(nan * 3u)) | (nan << 1);
    }
#endif

    float significand_;    ///< m: the scale's significand, in [1, 2).
    float reciprocal_;     ///< 1 / m, rounded to nearest.
    float first_factor_;   ///< 2^-e in two powers of two (NaN for an invalid scale).
    float second_factor_;
};

}  // namespace rope
