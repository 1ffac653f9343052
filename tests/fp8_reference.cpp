// The FP8 reference (fp8_reference.hpp): values from the format's formula,
// conversion by nearest-value search.
#include "fp8_reference.hpp"

#include <cmath>
#include <limits>

namespace testing {

namespace {

struct Fields {
    int exponent_bits;
    int mantissa_bits;
    int bias;
};

Fields fields_of(rope::Fp8Format format) {
    return format == rope::Fp8Format::e4m3fn ? Fields{4, 3, 7} : Fields{5, 2, 15};
}

}  // namespace

double reference_fp8_value(uint8_t code, rope::Fp8Format format) {
    const Fields f = fields_of(format);
    const bool negative = (code & 0x80) != 0;
    const int exponent = (code >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
    const int mantissa = code & ((1 << f.mantissa_bits) - 1);
    const int all_ones = (1 << f.exponent_bits) - 1;
    double magnitude;
    if (format == rope::Fp8Format::e4m3fn && exponent == all_ones && mantissa == (1 << f.mantissa_bits) - 1) {
        magnitude = std::numeric_limits<double>::quiet_NaN();
    } else if (format == rope::Fp8Format::e5m2 && exponent == all_ones) {
        magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    } else if (exponent == 0) {
        magnitude = std::ldexp(double(mantissa), 1 - f.bias - f.mantissa_bits);
    } else {
        magnitude = std::ldexp(double((1 << f.mantissa_bits) + mantissa), exponent - f.bias - f.mantissa_bits);
    }
    return negative ? -magnitude : magnitude;
}

namespace {

// The values of the 128 non-negative codes of a format by the formula above, and the largest finite
// code, worked out once per format: the search below reads them for every number it converts.
struct CodeValues {
    double value[0x80];
    uint8_t largest = 0;  // The last finite code of the format.
    explicit CodeValues(rope::Fp8Format format) {
        for (int code = 0; code < 0x80; ++code) {
            value[code] = reference_fp8_value(uint8_t(code), format);
            if (std::isfinite(value[code])) largest = uint8_t(code);
        }
    }
};

const CodeValues& code_values(rope::Fp8Format format) {
    static const CodeValues e4m3fn(rope::Fp8Format::e4m3fn), e5m2(rope::Fp8Format::e5m2);
    return format == rope::Fp8Format::e4m3fn ? e4m3fn : e5m2;
}

}  // namespace

uint8_t reference_fp8(double x, rope::Fp8Format format) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const uint8_t nan_code = format == rope::Fp8Format::e4m3fn ? 0x7f : 0x7e;
    if (std::isnan(x)) return sign | nan_code;
    const double magnitude = std::fabs(x);
    const CodeValues& codes = code_values(format);
    // Saturation: at or beyond the largest finite value (infinity included),
    // that value; it is the last finite code of the format.
    const uint8_t largest = codes.largest;
    if (magnitude >= codes.value[largest]) return sign | largest;
    // Otherwise the nearest of the finite non-negative codes. |x - value| is
    // exact in double wherever two candidates are close to a tie (x then has an
    // exponent near theirs); where it is not, x is far below the larger one, and
    // rounding, being monotone, keeps the smaller distance the smaller.
    uint8_t best = 0;
    double best_distance = std::numeric_limits<double>::infinity();
    for (int code = 0; code <= largest; ++code) {
        const double distance = std::fabs(magnitude - codes.value[code]);
        const bool even = (code & 1) == 0;  // the mantissa's last bit is the code's last bit
        if (distance < best_distance || (distance == best_distance && even)) {
            best = uint8_t(code);
            best_distance = distance;
        }
    }
    return sign | best;
}

}  // namespace testing
