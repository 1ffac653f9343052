#pragma once
/// @file dtype.hpp
/// @brief Storage types (float32, float16, bfloat16) and their conversions.
///
/// rope stores tensors in any of three formats but always computes in float32:
/// a value is widened on load and rounded (to nearest, ties to even) on store.
/// The conversions are written out bit by bit so every backend, CPU or GPU,
/// rounds identically and the tests can compare backends tightly. On the GPU
/// the hardware's conversion instruction (cvt.rn) replaces the bit arithmetic:
/// it rounds to nearest even too, so the results are the same bits, NaN
/// payloads aside (any NaN stays a NaN).

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "rope/host_device.hpp"

namespace rope {

/// @brief Element type of a tensor's storage. Arithmetic is always float32.
enum class DType {
    f32,   ///< IEEE-754 binary32.
    f16,   ///< IEEE-754 binary16 (half): 5 exponent bits, 10 mantissa bits.
    bf16,  ///< bfloat16: the top 16 bits of a binary32 (8 exponent, 7 mantissa).
};

/// @brief Size in bytes of one element of @p dtype.
/// @param dtype the storage type.
/// @return 4 for f32, 2 for f16 and bf16.
constexpr int64_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

/// @brief Short name of @p dtype as used on command lines.
/// @param dtype the storage type to name.
/// @return "fp32", "fp16" or "bf16".
constexpr std::string_view dtype_name(DType dtype) {
    switch (dtype) {
        case DType::f32: return "fp32";
        case DType::f16: return "fp16";
        case DType::bf16: return "bf16";
    }
    return "unknown";
}

/// @brief Parses a storage type name.
/// @param name "fp32", "float32" or "f32"; "fp16", "float16" or "f16"; "bf16" or "bfloat16".
/// @return the matching DType.
/// @throws rope::Error for any other name.
DType parse_dtype(std::string_view name);

/// @brief A bfloat16 value held as its 16 raw bits.
struct bfloat16 {
    uint16_t bits;  ///< Raw storage bits.
};

/// @brief An IEEE binary16 value held as its 16 raw bits.
struct float16 {
    uint16_t bits;  ///< Raw storage bits.
};

/// @brief Reinterprets the bits of a float as uint32 (no conversion).
/// @param value the float to reinterpret.
/// @return its IEEE-754 binary32 bit pattern.
ROPE_HOST_DEVICE inline uint32_t float_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

/// @brief Reinterprets uint32 bits as a float (no conversion).
/// @param bits an IEEE-754 binary32 bit pattern.
/// @return the float with those bits.
ROPE_HOST_DEVICE inline float bits_to_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

/// @brief Widens bfloat16 to float32: exact, just a shift.
/// @param value the bfloat16 value.
/// @return the same value as float32.
ROPE_HOST_DEVICE inline float to_float(bfloat16 value) { return bits_to_float(uint32_t(value.bits) << 16); }

/// @brief Identity, so templated code can call to_float on any storage type.
/// @param value a float32 value.
/// @return @p value unchanged.
ROPE_HOST_DEVICE inline float to_float(float value) { return value; }

/// @brief Widens binary16 to float32 (exact), handling zeros, subnormals, inf and NaN.
/// @param value the binary16 value.
/// @return the same value as float32.
ROPE_HOST_DEVICE inline float to_float(float16 value) {
    const uint32_t sign = uint32_t(value.bits & 0x8000u) << 16;
    const uint32_t exponent = (value.bits >> 10) & 0x1fu;
    const uint32_t mantissa = value.bits & 0x3ffu;
    if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
    if (exponent != 0) return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    // Zero or subnormal: value = mantissa * 2^-24, exactly representable in float32.
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
}

/// @brief Rounds float32 to bfloat16, to nearest with ties to even; NaN stays NaN.
/// @param value the float32 value.
/// @return the nearest bfloat16 (a quiet NaN for any NaN).
ROPE_HOST_DEVICE inline bfloat16 to_bfloat16(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // On the GPU (Ampere and later) one instruction rounds the same way. It
    // matters: a bf16 kernel converts every element it writes, and the five
    // integer operations below cost the memory-bound kernel several percent.
    unsigned short rounded;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(rounded) : "f"(value));
    return bfloat16{rounded};
#else
    const uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return bfloat16{uint16_t((bits >> 16) | 0x40u)};  // quiet NaN
    const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
    return bfloat16{uint16_t((bits + rounding_bias) >> 16)};
#endif
}

/// @brief Rounds float32 to binary16, to nearest with ties to even, with
/// overflow to infinity and gradual underflow to subnormals.
/// @param value the float32 value.
/// @return the nearest binary16 (infinity past 65504, a quiet NaN for any NaN).
ROPE_HOST_DEVICE inline float16 to_float16(float value) {
#if defined(__CUDA_ARCH__)
    // On the GPU one instruction does all of the below, with the same rounding.
    unsigned short rounded;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(rounded) : "f"(value));
    return float16{rounded};
#else
    const uint32_t bits = float_bits(value);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return float16{uint16_t(sign | 0x7e00u)};   // NaN
    if (magnitude >= 0x477ff000u) return float16{uint16_t(sign | 0x7c00u)};  // rounds past 65504: inf
    if (magnitude < 0x38800000u) {
        // Below the smallest normal half (2^-14): the result is subnormal,
        // a multiple of 2^-24. Adding 0.5 (= 2^-1) aligns that unit with the
        // float's last mantissa bit, so the FPU's own rounding does the work.
        const float shifted = bits_to_float(magnitude) + 0.5f;
        return float16{uint16_t(sign | uint16_t(float_bits(shifted) - float_bits(0.5f)))};
    }
    // Normal: re-bias the exponent (127 -> 15) and round 23 mantissa bits to 10.
    const uint32_t odd = (magnitude >> 13) & 1u;
    const uint32_t rounded = magnitude + 0xfffu + odd - (uint32_t(127 - 15) << 23);
    return float16{uint16_t(sign | (rounded >> 13))};
#endif
}

/// @brief Converts a float32 result into storage type @p Storage (float, float16 or bfloat16).
/// @tparam Storage float, float16 or bfloat16.
/// @param value the float32 value.
/// @return @p value unchanged for float, else rounded by to_float16() or to_bfloat16().
template <typename Storage>
ROPE_HOST_DEVICE inline Storage from_float(float value) {
    if constexpr (std::is_same_v<Storage, float>) return value;
    else if constexpr (std::is_same_v<Storage, bfloat16>) return to_bfloat16(value);
    else return to_float16(value);
}

/// @brief DType tag of a storage type, for templated code.
/// @tparam Storage float, float16 or bfloat16.
/// @return DType::f32, DType::f16 or DType::bf16.
template <typename Storage>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<Storage, float>) return DType::f32;
    else if constexpr (std::is_same_v<Storage, float16>) return DType::f16;
    else return DType::bf16;
}

/// @brief Calls @p body with a value of the storage type that @p dtype names.
///
/// This is the single place that turns the run-time dtype into a compile-time
/// type; every backend uses it instead of writing its own switch.
/// @tparam Body a callable (typically a generic lambda) accepting float, float16 and bfloat16.
/// @param dtype the run-time storage type.
/// @param body called once with a value-initialized float, float16 or bfloat16.
/// @return whatever @p body returns.
template <typename Body>
decltype(auto) dispatch_dtype(DType dtype, Body&& body) {
    switch (dtype) {
        case DType::f16: return body(float16{});
        case DType::bf16: return body(bfloat16{});
        case DType::f32: break;
    }
    return body(float{});
}

}  // namespace rope
