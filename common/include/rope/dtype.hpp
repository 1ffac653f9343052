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

/// @brief Picks @p if_true or @p if_false by @p condition with bit masks, not a branch.
///
/// The conversions below compute every case and pick one with this, so that a
/// loop of conversions has no branch and the compiler can turn it into SIMD
/// code (see convert_to_float()); the GPU, where a branch would diverge a warp,
/// prefers this too.
/// @param condition which value to return.
/// @param if_true returned when @p condition holds.
/// @param if_false returned otherwise.
/// @return @p if_true or @p if_false.
ROPE_HOST_DEVICE inline uint32_t select_bits(bool condition, uint32_t if_true, uint32_t if_false) {
    const uint32_t mask = 0u - uint32_t(condition);  // all ones or all zeros
    return (if_true & mask) | (if_false & ~mask);
}

/// @brief Widens binary16 to float32 (exact), handling zeros, subnormals, inf and NaN.
/// @param value the binary16 value.
/// @return the same value as float32.
ROPE_HOST_DEVICE inline float to_float(float16 value) {
#if defined(__CUDA_ARCH__)
    // On the GPU one instruction widens exactly, where the integer code below
    // takes about a dozen, for every element an fp16 kernel reads: enough to keep
    // a memory-bound kernel well short of the memory's speed (the lab's notes:
    // bench/results/h200.md.in).
    float widened;
    asm("cvt.f32.f16 %0, %1;" : "=f"(widened) : "h"(value.bits));
    return widened;
#else
    const uint32_t sign = uint32_t(value.bits & 0x8000u) << 16;
    const uint32_t exponent = value.bits & 0x7c00u;
    // Exponent and mantissa moved to float32's places (10 mantissa bits become the top of 23).
    const uint32_t magnitude = uint32_t(value.bits & 0x7fffu) << 13;
    // The three cases, all computed (branch-free, see select_bits):
    const uint32_t normal = magnitude + (uint32_t(127 - 15) << 23);  // exponent re-biased
    const uint32_t inf_or_nan = magnitude | 0x7f800000u;              // all-ones exponent, mantissa kept
    // Zero or subnormal: mantissa * 2^-24, exactly representable in float32.
    const uint32_t tiny = float_bits(float(value.bits & 0x3ffu) * 5.9604644775390625e-8f);
    return bits_to_float(sign | select_bits(exponent == 0x7c00u, inf_or_nan, select_bits(exponent == 0, tiny, normal)));
#endif
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
    // Keep the top 16 bits, rounded: adding 0x7fff plus the lowest kept bit carries
    // into the kept bits exactly when the dropped ones are above half, or half with
    // the kept part odd (ties to even). A NaN is not rounded (the carry could turn it
    // into infinity) but quieted: bit 22 set, which is bit 6 of the result.
    const uint32_t bits = float_bits(value);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const uint32_t quiet = select_bits(nan, 0x400000u, 0u);
    const uint32_t rounding_bias = select_bits(nan, 0u, 0x7fffu + ((bits >> 16) & 1u));
    return bfloat16{uint16_t(((bits | quiet) + rounding_bias) >> 16)};
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
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    // Every case is computed and one is picked (branch-free, see select_bits),
    // each still shifted 13 bits up, where the normal case has it; one shift
    // ends them all. (Picking among 16-bit results instead costs a vectorised
    // loop twice the instructions: each 32-bit mask must be narrowed first.)
    // Normal: re-bias the exponent (127 -> 15) and round 23 mantissa bits to 10.
    const uint32_t odd = (magnitude >> 13) & 1u;
    const uint32_t normal = magnitude + 0xfffu + odd - (uint32_t(127 - 15) << 23);
    // Below the smallest normal half (2^-14) the result is subnormal, a multiple of
    // 2^-24. Adding 0.5 (= 2^-1) aligns that unit with the float's last mantissa
    // bit, so the FPU's own rounding does the work.
    const uint32_t subnormal = (float_bits(bits_to_float(magnitude) + 0.5f) - float_bits(0.5f)) << 13;
    const uint32_t finite = select_bits(magnitude < 0x38800000u, subnormal, normal);
    // From 65520 up everything rounds past 65504, the largest half: infinity.
    const uint32_t in_range = select_bits(magnitude >= 0x477ff000u, 0x7c00u << 13, finite);
    const uint32_t result = select_bits(magnitude > 0x7f800000u, 0x7e00u << 13, in_range);  // NaN: a quiet NaN
    return float16{uint16_t(sign | (result >> 13))};
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

/// @brief Widens @p count elements of @p in to float32, into @p out (host code).
///
/// A plain loop of to_float(), bit for bit the same: since the conversions
/// have no branch, the compiler turns the loop into SIMD code (at SSE2, the
/// x86-64 baseline, eight 2-byte elements per step), which it cannot do for
/// conversions scattered through a larger loop. Backends convert whole rows
/// with it.
/// @tparam Storage float, float16 or bfloat16.
/// @param in the elements to widen.
/// @param count how many.
/// @param[out] out @p count float32 values; may not overlap @p in unless equal to it.
template <typename Storage>
inline void convert_to_float(const Storage* in, int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i) out[i] = to_float(in[i]);
}

/// @brief Rounds @p count float32 values of @p in to @p Storage, into @p out (host code).
///
/// A plain loop of from_float(), bit for bit the same, that the compiler
/// vectorises (see convert_to_float()).
/// @tparam Storage float, float16 or bfloat16.
/// @param in the float32 values.
/// @param count how many.
/// @param[out] out @p count elements; may not overlap @p in unless equal to it.
template <typename Storage>
inline void convert_from_float(const float* in, int64_t count, Storage* out) {
    for (int64_t i = 0; i < count; ++i) out[i] = from_float<Storage>(in[i]);
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
