// fp16 and bf16 conversions: rope's bit-level code against the compiler's own
// _Float16 conversions and against rounding done in double arithmetic.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "rope/dtype.hpp"
#include "support.hpp"

TEST_CASE("fp16: widening is exact for all 65536 bit patterns") {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        _Float16 reference;
        const uint16_t b16 = uint16_t(bits);
        std::memcpy(&reference, &b16, 2);
        const float got = rope::to_float(rope::float16{b16});
        if (std::isnan(float(reference))) {
            CHECK(std::isnan(got));
        } else {
            REQUIRE_MESSAGE(got == float(reference), "bits " << bits);
        }
    }
}

TEST_CASE("fp16: rounding float32 to half matches the compiler (round to nearest even)") {
    std::mt19937 rng{uint32_t(testing::seed())};
    CAPTURE(testing::seed());
    std::uniform_int_distribution<uint32_t> any_bits;
    int mismatches = 0;
    for (int i = 0; i < 1000000; ++i) {
        const uint32_t bits = any_bits(rng);
        float value;
        std::memcpy(&value, &bits, 4);
        if (std::isnan(value)) continue;
        const _Float16 reference = static_cast<_Float16>(value);
        uint16_t want;
        std::memcpy(&want, &reference, 2);
        if (rope::to_float16(value).bits != want) ++mismatches;
    }
    // Values near half's range and its subnormals, where rounding is trickiest.
    for (float value : {65504.f, 65519.f, 65520.f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-8f, -3.0e-6f}) {
        const _Float16 reference = static_cast<_Float16>(value);
        uint16_t want;
        std::memcpy(&want, &reference, 2);
        CHECK_MESSAGE(rope::to_float16(value).bits == want, value);
    }
    CHECK(mismatches == 0);
}

TEST_CASE("bf16: rounding keeps 8 significant bits, to nearest even") {
    std::mt19937 rng{uint32_t(testing::seed())};
    std::uniform_real_distribution<float> value(-1000.f, 1000.f);
    for (int i = 0; i < 200000; ++i) {
        const float x = value(rng);
        if (x == 0.0f) continue;
        // Reference in double: scale to an 8-bit significand and round half to even.
        int exponent;
        const double mantissa = std::frexp(double(x), &exponent);  // |mantissa| in [0.5, 1)
        const double scaled = mantissa * 256.0;
        double rounded = std::nearbyint(scaled);                    // default mode: ties to even
        const double want = std::ldexp(rounded, exponent - 8);
        REQUIRE_MESSAGE(double(rope::to_float(rope::to_bfloat16(x))) == want, x);
    }
    CHECK(std::isnan(rope::to_float(rope::to_bfloat16(std::nanf("")))));
    CHECK(std::isinf(rope::to_float(rope::to_bfloat16(INFINITY))));
}
