#pragma once
// The FP8 reference: an independent statement of e4m3fn and e5m2 for the tests
// and the float64 oracle, sharing nothing with rope's bit arithmetic
// (common/include/rope/fp8.hpp) but the format tag.
//
// A code's value comes from its fields by the formula (sign, exponent e,
// mantissa m; bias b, M mantissa bits): (-1)^sign * 2^(e - b) * (1 + m / 2^M)
// for e > 0, (-1)^sign * 2^(1 - b) * m / 2^M for e = 0; e4m3fn has no infinity
// and its one NaN is all ones, e5m2 reads the all-ones exponent as IEEE does.
// A number is converted by searching all finite codes for the nearest value,
// ties to the code whose mantissa is even, saturating beyond the largest finite
// value, NaN to NaN (0x7f/0xff for e4m3fn, the quiet 0x7e/0xfe for e5m2).
#include <cstdint>

#include "rope/fp8.hpp"

namespace testing {

// The value of `code` in `format`: exact in double; NaN for a NaN code,
// +-infinity for e5m2's infinities.
double reference_fp8_value(uint8_t code, rope::Fp8Format format);

// The code nearest to `x` (ties to even mantissa), saturating at +-max finite
// (+-inf too), NaN for NaN; the sign of x is kept (-0 and negatives that round
// to zero give 0x80).
uint8_t reference_fp8(double x, rope::Fp8Format format);

}  // namespace testing
