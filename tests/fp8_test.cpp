// rope's FP8 conversions (rope/fp8.hpp) against the independent reference
// (fp8_reference.hpp): every code decoded; float32 bit patterns near every
// code value and every rounding midpoint, the saturation boundaries, infinities,
// NaNs, zeros, subnormals of both formats and random patterns converted; the
// quantisation's division by the scale, and Fp8Quantizer's division-free path to
// the same codes; and the same conversions on the GPU, which must give the host's
// bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "fp8_device.hpp"
#include "fp8_reference.hpp"
#include "rope/error.hpp"
#include "rope/fp8.hpp"
#include "support.hpp"

using rope::Fp8Format;

namespace {

constexpr Fp8Format formats[] = {Fp8Format::e4m3fn, Fp8Format::e5m2};

uint32_t bits_of(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

float float_of(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

uint8_t convert(float value, Fp8Format format) {
    return format == Fp8Format::e4m3fn ? rope::float_to_e4m3fn(value) : rope::float_to_e5m2(value);
}

float decode(uint8_t code, Fp8Format format) {
    return format == Fp8Format::e4m3fn ? rope::e4m3fn_to_float(code) : rope::e5m2_to_float(code);
}

// The float32 patterns within +-radius ulps of `center` (>= 0), both signs.
void add_neighbourhood(float center, uint32_t radius, std::vector<float>& out) {
    const uint32_t middle = bits_of(center);
    const uint32_t low = middle > radius ? middle - radius : 0;
    for (uint32_t bits = low; bits <= middle + radius && bits <= 0x7f800000u; ++bits) {
        out.push_back(float_of(bits));
        out.push_back(float_of(bits | 0x80000000u));
    }
}

// The patterns every boundary test converts (see the file's comment).
std::vector<float> boundary_patterns(Fp8Format format) {
    std::vector<double> finite;  // the finite non-negative values, increasing with the code
    for (int code = 0; code < 0x80; ++code) {
        const double value = testing::reference_fp8_value(uint8_t(code), format);
        if (std::isfinite(value)) finite.push_back(value);
    }
    std::vector<float> patterns;
    for (size_t i = 0; i < finite.size(); ++i) {
        add_neighbourhood(float(finite[i]), 2048, patterns);
        if (i + 1 < finite.size()) add_neighbourhood(float((finite[i] + finite[i + 1]) / 2), 2048, patterns);
    }
    // The saturation boundaries: max, the midpoint to the pattern after it (a
    // tie that rounds to max, even), past it, that pattern's value, and beyond.
    for (float boundary : {448.0f, 464.0f, 465.0f, 480.0f, 512.0f, 57344.0f, 61440.0f, 65536.0f, 1e6f, 3.4e38f})
        add_neighbourhood(boundary, 16, patterns);
    const float inf = std::numeric_limits<float>::infinity();
    const float largest = std::numeric_limits<float>::max();
    for (float special : {inf, -inf, 0.0f, -0.0f, largest, -largest}) patterns.push_back(special);
    // NaNs: quiet and signalling, several payloads, both signs.
    for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fa5a5a5u, 0x7fffffffu, 0x7fc00001u, 0x7f900000u})
        for (uint32_t sign : {0u, 0x80000000u}) patterns.push_back(float_of(nan | sign));
    // Below the smallest FP8 subnormal: half of it (a tie to zero), just above
    // (rounds up), a quarter, and float32's own subnormals.
    for (float tiny : {std::ldexp(1.0f, -10), std::ldexp(1.0f, -17), std::ldexp(1.0f, -11), std::ldexp(1.0f, -18),
                       std::ldexp(3.0f, -11), std::ldexp(3.0f, -18)})
        add_neighbourhood(tiny, 64, patterns);
    for (uint32_t subnormal : {1u, 2u, 3u, 0x400000u, 0x7fffffu, 0x123456u}) {
        patterns.push_back(float_of(subnormal));
        patterns.push_back(float_of(subnormal | 0x80000000u));
    }
    return patterns;
}

// Checks rope's conversion of every pattern against the reference; returns the
// number of mismatches (each reported, the first few in full).
int check_patterns(const std::vector<float>& patterns, Fp8Format format) {
    int mismatches = 0;
    for (float value : patterns) {
        const uint8_t got = convert(value, format);
        const uint8_t want = testing::reference_fp8(double(value), format);
        if (got != want && ++mismatches <= 10)
            FAIL_CHECK("format " << rope::fp8_format_name(format) << ", float bits 0x" << std::hex << bits_of(value)
                                 << " (" << value << "): got 0x" << int(got) << ", want 0x" << int(want));
    }
    return mismatches;
}

}  // namespace

TEST_CASE("fp8: every code decodes to the reference's value") {
    for (Fp8Format format : formats)
        for (int code = 0; code < 256; ++code) {
            CAPTURE(rope::fp8_format_name(format));
            CAPTURE(code);
            const double want = testing::reference_fp8_value(uint8_t(code), format);
            const float got = decode(uint8_t(code), format);
            if (std::isnan(want)) {
                CHECK(std::isnan(got));
            } else {
                CHECK(double(got) == want);
                CHECK(std::signbit(got) == std::signbit(want));
            }
        }
    // The formats' landmarks, stated by hand rather than by either implementation.
    CHECK(rope::e4m3fn_to_float(0x7e) == 448.0f);
    CHECK(std::isnan(rope::e4m3fn_to_float(0x7f)));
    CHECK(rope::e4m3fn_to_float(0x01) == 0.001953125f);  // 2^-9
    CHECK(rope::e4m3fn_to_float(0x08) == 0.015625f);     // 2^-6
    CHECK(rope::e5m2_to_float(0x7b) == 57344.0f);
    CHECK(std::isinf(rope::e5m2_to_float(0x7c)));
    CHECK(std::isnan(rope::e5m2_to_float(0x7e)));
    CHECK(rope::e5m2_to_float(0x01) == 1.52587890625e-5f);  // 2^-16
    CHECK(rope::fp8_max(Fp8Format::e4m3fn) == 448.0f);
    CHECK(rope::fp8_max(Fp8Format::e5m2) == 57344.0f);
}

TEST_CASE("fp8: float32 near every code value and rounding midpoint, boundaries, inf, NaN, zeros, subnormals") {
    for (Fp8Format format : formats) {
        CAPTURE(rope::fp8_format_name(format));
        const std::vector<float> patterns = boundary_patterns(format);
        CHECK(patterns.size() > 500000);
        CHECK(check_patterns(patterns, format) == 0);
    }
}

TEST_CASE("fp8: saturation, NaN, signed zero and ties, stated by hand") {
    const float inf = std::numeric_limits<float>::infinity();
    // e4m3fn: 448 is the largest; 464 is the tie between 448 and the NaN pattern (even: 448); all above saturate.
    for (float value : {448.0f, 449.0f, 464.0f, 465.0f, 480.0f, 1e6f, inf}) {
        CHECK(rope::float_to_e4m3fn(value) == 0x7e);
        CHECK(rope::float_to_e4m3fn(-value) == 0xfe);
    }
    CHECK(rope::float_to_e4m3fn(std::nanf("")) == 0x7f);
    CHECK(rope::float_to_e4m3fn(-std::nanf("")) == 0xff);
    // e5m2: 61440 is the tie between 57344 and infinity; rope saturates it and everything above.
    for (float value : {57344.0f, 61439.0f, 61440.0f, 65536.0f, 1e6f, inf}) {
        CHECK(rope::float_to_e5m2(value) == 0x7b);
        CHECK(rope::float_to_e5m2(-value) == 0xfb);
    }
    CHECK(rope::float_to_e5m2(std::nanf("")) == 0x7e);
    CHECK(rope::float_to_e5m2(-std::nanf("")) == 0xfe);
    CHECK(rope::float_to_e4m3fn(-0.0f) == 0x80);
    CHECK(rope::float_to_e5m2(-0.0f) == 0x80);
    // Ties to even: 1.0625 lies halfway between 1 (0x38, mantissa 000) and 1.125 (0x39): 1.
    CHECK(rope::float_to_e4m3fn(1.0625f) == 0x38);
    // 1.1875 halfway between 1.125 (0x39) and 1.25 (0x3a): 1.25.
    CHECK(rope::float_to_e4m3fn(1.1875f) == 0x3a);
    // Half the smallest subnormal ties to zero; a hair above rounds to it.
    CHECK(rope::float_to_e4m3fn(std::ldexp(1.0f, -10)) == 0x00);
    CHECK(rope::float_to_e4m3fn(std::nextafter(std::ldexp(1.0f, -10), 1.0f)) == 0x01);
    CHECK(rope::float_to_e5m2(-std::ldexp(1.0f, -17)) == 0x80);
    CHECK(rope::float_to_e5m2(-std::ldexp(3.0f, -17)) == 0x82);  // 1.5 units: tie to 2 units
}

TEST_CASE("fp8: a million random float32 bit patterns") {
    CAPTURE(testing::seed());
    std::mt19937_64 rng(testing::seed());
    std::vector<float> patterns(1000000);
    for (float& value : patterns) value = float_of(uint32_t(rng()));
    for (Fp8Format format : formats) {
        CAPTURE(rope::fp8_format_name(format));
        CHECK(check_patterns(patterns, format) == 0);
    }
}

TEST_CASE("fp8: quantize_fp8 divides by the dequantisation scale, rounding once") {
    CAPTURE(testing::seed());
    std::mt19937_64 rng(testing::seed() + 1);
    for (Fp8Format format : formats) {
        const std::vector<float> quotients = boundary_patterns(format);
        for (float scale : {1.0f, 0.5f, 3.0f, 1.0f / 3.0f, 1e-3f, 7.1f}) {
            CAPTURE(rope::fp8_format_name(format));
            CAPTURE(scale);
            // Values whose quotients land near every boundary, and random ones.
            std::vector<float> values;
            for (size_t i = 0; i < quotients.size(); i += 7) values.push_back(quotients[i] * scale);
            std::uniform_real_distribution<float> uniform(-2.0f * rope::fp8_max(format) * scale,
                                                          2.0f * rope::fp8_max(format) * scale);
            for (int i = 0; i < 100000; ++i) values.push_back(uniform(rng));
            int mismatches = 0;
            for (float value : values) {
                // The float32 quotient, computed in double and rounded once more to
                // float: the same bits as a float32 division (double has more than
                // twice float's precision, so the double rounding is innocuous).
                const float quotient = float(double(value) / double(scale));
                const uint8_t want = testing::reference_fp8(double(quotient), format);
                const uint8_t got = rope::quantize_fp8(value, scale, format);
                if (got != want && ++mismatches <= 10)
                    FAIL_CHECK("value " << value << ": got 0x" << std::hex << int(got) << ", want 0x" << int(want));
            }
            CHECK(mismatches == 0);
        }
        // FlashInfer's reciprocal convention is not the same: x * (1/s) and x / s
        // round apart for some x (for s = 7.1 here), and then to different codes.
        int differ = 0;
        const float scale = 7.1f;
        for (float quotient : quotients) {
            const float value = quotient * scale;
            differ += rope::quantize_fp8(value, scale, format) != rope::float_to_fp8(value * (1.0f / scale), format);
        }
        CHECK(differ > 0);
    }
}

// Scales of every kind the quantizer splits: ordinary ones, powers of two, the ends of
// the normal range, subnormals (made normal by its exact scaling) and random bit patterns.
std::vector<float> quantizer_scales(std::mt19937_64& rng) {
    std::vector<float> scales = {1.0f, 0.5f, 3.0f, 1.0f / 3.0f, 1e-3f, 7.1f, 0.0123f, 448.0f / 17.0f,
                                 std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                                 std::numeric_limits<float>::denorm_min(), float_of(0x00400001u),
                                 float_of(0x7effffffu), float_of(0x3fffffffu), float_of(0x3f800001u)};
    std::uniform_int_distribution<uint32_t> finite(1, 0x7f7fffffu);
    for (int i = 0; i < 40; ++i) scales.push_back(float_of(finite(rng)));
    return scales;
}

TEST_CASE("fp8: Fp8Quantizer's quotient is IEEE division's, its codes quantize_fp8's") {
    CAPTURE(testing::seed());
    std::mt19937_64 rng(testing::seed() + 2);
    std::uniform_int_distribution<uint32_t> any_bits;
    for (float scale : quantizer_scales(rng)) {
        CAPTURE(scale);
        const rope::Fp8Quantizer<Fp8Format::e4m3fn> e4m3fn(scale);
        const rope::Fp8Quantizer<Fp8Format::e5m2> e5m2(scale);
        // Values whose quotients land near every boundary of both formats, and random patterns.
        std::vector<float> values;
        for (Fp8Format format : formats) {
            const std::vector<float> quotients = boundary_patterns(format);
            for (size_t i = 0; i < quotients.size(); i += 5) values.push_back(quotients[i] * scale);
        }
        for (int i = 0; i < 20000; ++i) values.push_back(float_of(any_bits(rng)));
        for (float special : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::nanf(""), -std::nanf("")})
            values.push_back(special);
        int wrong_quotients = 0, wrong_codes = 0;
        for (float value : values) {
            // The quotient itself, where it decides the code: 2^-100 to 2^63.
            const float quotient = std::fabs(value) / scale;
            if (quotient >= 0x1p-100f && quotient <= 0x1p63f &&
                bits_of(e4m3fn.magnitude_quotient(value)) != bits_of(quotient) && ++wrong_quotients <= 10)
                FAIL_CHECK("value " << value << ": quotient " << e4m3fn.magnitude_quotient(value) << ", want "
                                    << quotient);
            float four[4] = {value, -value, value * 0.75f, value};
            const uint32_t codes = e4m3fn.quantize4(four);
            for (int i = 0; i < 4; ++i) {
                const bool same = e4m3fn.quantize(four[i]) == rope::quantize_fp8(four[i], scale, Fp8Format::e4m3fn) &&
                                  e5m2.quantize(four[i]) == rope::quantize_fp8(four[i], scale, Fp8Format::e5m2) &&
                                  ((codes >> (8 * i)) & 0xffu) == e4m3fn.quantize(four[i]);
                if (!same && ++wrong_codes <= 10) FAIL_CHECK("value " << four[i] << ": the codes differ");
            }
        }
        CHECK(wrong_quotients == 0);
        CHECK(wrong_codes == 0);
    }
}

TEST_SUITE("large") {
TEST_CASE("large: Fp8Quantizer's quotient is IEEE division's for every value whose quotient decides a code") {
    // Every positive float32 whose quotient lies in [2^-20, 2^17] (below, both formats give code 0;
    // above, both saturate), at a scale that is not a power of two, a subnormal one and one near
    // the largest float: 37 binades of 2^23 values each, split over the hardware threads.
    for (float scale : {0.002f, float_of(0x00012345u), float_of(0x7e654321u)}) {
        CAPTURE(scale);
        const rope::Fp8Quantizer<Fp8Format::e4m3fn> quantizer(scale);
        const uint32_t low = bits_of(std::nextafter(scale * 0x1p-20f, 0.0f));
        const uint32_t high = std::min(bits_of(std::nextafter(scale * 0x1p17f, 0x1p127f)), 0x7f7fffffu);
        const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
        std::vector<uint64_t> wrong(workers, 0), first(workers, 0);
        std::vector<std::thread> threads;
        for (unsigned w = 0; w < workers; ++w)
            threads.emplace_back([&, w] {
                const uint64_t count = uint64_t(high) - low + 1;
                for (uint64_t i = low + w * count / workers; i < low + (w + 1) * count / workers; ++i) {
                    const float value = float_of(uint32_t(i));
                    const float quotient = value / scale;
                    if (!(quotient >= 0x1p-20f && quotient <= 0x1p17f)) continue;
                    if (bits_of(quantizer.magnitude_quotient(value)) != bits_of(quotient) && wrong[w]++ == 0) first[w] = i;
                }
            });
        for (std::thread& thread : threads) thread.join();
        for (unsigned w = 0; w < workers; ++w) {
            INFO("first wrong value: float bits 0x" << std::hex << first[w]);
            CHECK(wrong[w] == 0);
        }
    }
}
}  // TEST_SUITE("large")

TEST_CASE("fp8: a scale that is not positive and finite gives the NaN code") {
    const float inf = std::numeric_limits<float>::infinity();
    for (float scale : {0.0f, -0.0f, -1.0f, inf, -inf, std::nanf("")}) {
        CAPTURE(scale);
        for (float value : {1.0f, -2.5f, 0.0f, 1e30f}) {
            const uint8_t sign = value < 0 ? 0x80 : 0x00;
            CHECK(rope::quantize_fp8(value, scale, Fp8Format::e4m3fn) == (0x7f | sign));
            CHECK(rope::quantize_fp8(value, scale, Fp8Format::e5m2) == (0x7e | sign));
            CHECK(rope::Fp8Quantizer<Fp8Format::e4m3fn>(scale).quantize(value) == (0x7f | sign));
            CHECK(rope::Fp8Quantizer<Fp8Format::e5m2>(scale).quantize(value) == (0x7e | sign));
        }
    }
}

TEST_CASE("fp8: format names") {
    CHECK(rope::parse_fp8_format("e4m3fn") == Fp8Format::e4m3fn);
    CHECK(rope::parse_fp8_format("float8_e5m2") == Fp8Format::e5m2);
    CHECK(rope::parse_fp8_format(rope::fp8_format_name(Fp8Format::e5m2)) == Fp8Format::e5m2);
    CHECK_THROWS_WITH_AS(rope::parse_fp8_format("e4m3"), doctest::Contains("fp8_format = e4m3"), rope::Error);
}

#if !ROPE_HAVE_CUDA
testing::cuda::Fp8DeviceResults testing::cuda::fp8_on_device(const std::vector<float>&, float) {
    throw rope::Error("rope::Error: fp8_on_device: this build has no CUDA");
}
#endif

TEST_CASE("CUDA: fp8 conversions on the GPU give the host's bits") {
    const rope::BackendInfo info = rope::backend_info("cuda-naive");
    if (!info.available) {
        testing::report_skip("fp8 on the GPU", info.reason);
        return;
    }
    for (Fp8Format format : formats) {
        std::vector<float> values = boundary_patterns(format);
        std::mt19937_64 rng(testing::seed());
        for (int i = 0; i < 100000; ++i) values.push_back(float_of(uint32_t(rng())));
        std::vector<float> scales = {1.0f, 3.0f, 7.1f, 0.0f, -1.0f, std::nanf("")};  // Invalid ones too: NaN codes.
        for (float scale : quantizer_scales(rng)) scales.push_back(scale);
        for (float scale : scales) {
            CAPTURE(scale);
            // The quotients of the boundary patterns, as values: every rounding boundary, scaled.
            std::vector<float> scaled = values;
            for (float quotient : boundary_patterns(format)) scaled.push_back(quotient * scale);
            const testing::cuda::Fp8DeviceResults device = testing::cuda::fp8_on_device(scaled, scale);
            int mismatches = 0;
            for (size_t i = 0; i < scaled.size(); ++i) {
                const float value = scaled[i];
                const uint8_t e4m3fn = rope::quantize_fp8(value, scale, Fp8Format::e4m3fn);
                const uint8_t e5m2 = rope::quantize_fp8(value, scale, Fp8Format::e5m2);
                const bool same = device.e4m3fn[i] == rope::float_to_e4m3fn(value) &&
                                  device.e5m2[i] == rope::float_to_e5m2(value) &&
                                  device.e4m3fn_quantized[i] == e4m3fn && device.e5m2_quantized[i] == e5m2 &&
                                  device.e4m3fn_quantizer[i] == e4m3fn && device.e5m2_quantizer[i] == e5m2;
                if (!same && ++mismatches <= 10)
                    FAIL_CHECK("float bits 0x" << std::hex << bits_of(scaled[i]) << ": the GPU's codes differ");
            }
            CHECK(mismatches == 0);
            for (int code = 0; code < 256; ++code) {
                CHECK(bits_of(device.e4m3fn_decoded[code]) == bits_of(rope::e4m3fn_to_float(uint8_t(code))));
                CHECK(bits_of(device.e5m2_decoded[code]) == bits_of(rope::e5m2_to_float(uint8_t(code))));
            }
        }
    }
}
