// Scaling variants without golden files: every invalid scaling field is
// rejected with its name and value, and each variant has the properties its
// definition promises (tests/scaling_test.cpp checks the exact numbers against
// HuggingFace transformers' own).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "rope/detail/plan.hpp"  // make_plan: these tests check the plan itself
#include "support.hpp"

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
const double nan_value = std::nan("");

rope::RopeConfig config_of(rope::ScalingType type, int64_t head_dim = 64, double base = 10000.0) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.base = base;
    config.scaling.type = type;
    config.scaling.factor = 4.0;
    config.scaling.original_max_position_embeddings = 256;
    if (type == rope::ScalingType::longrope) {
        config.scaling.short_factor.assign(size_t(head_dim / 2), 1.5);
        config.scaling.long_factor.assign(size_t(head_dim / 2), 6.0);
    }
    return config;
}

// The table of the same head without scaling.
std::vector<float> unscaled(const rope::RopeConfig& config) {
    rope::RopeConfig plain = config;
    plain.scaling = {};
    return rope::make_frequency_table(plain, 1).inv_freq;
}

// theta_i = base^(-2i/d) in double, written differently from common/ (exp/log).
double theta(double base, int64_t i, int64_t rotary_dim) {
    return std::exp(-2.0 * double(i) / double(rotary_dim) * std::log(base));
}

void expect_invalid(const rope::RopeConfig& config, const std::string& expected) {
    CAPTURE(expected);
    CHECK_THROWS_WITH_AS(rope::validate(config), doctest::Contains(expected.c_str()), rope::Error);
    CHECK_THROWS_WITH_AS(rope::make_frequency_table(config, 1), doctest::Contains(expected.c_str()), rope::Error);
}

const rope::ScalingType all_scaled[] = {rope::ScalingType::linear, rope::ScalingType::dynamic, rope::ScalingType::yarn,
                                        rope::ScalingType::llama3, rope::ScalingType::longrope};

}  // namespace

TEST_CASE("rope_type names parse as HuggingFace spells them") {
    CHECK(rope::parse_scaling_type("default") == rope::ScalingType::none);
    CHECK(rope::parse_scaling_type("none") == rope::ScalingType::none);
    CHECK(rope::scaling_type_name(rope::ScalingType::none) == "default");
    for (rope::ScalingType type : all_scaled) {
        CAPTURE(rope::scaling_type_name(type));
        CHECK(rope::parse_scaling_type(rope::scaling_type_name(type)) == type);
    }
    CHECK(rope::scaling_type_name(rope::ScalingType::llama3) == "llama3");
    CHECK_THROWS_WITH_AS(rope::parse_scaling_type("ntk"), doctest::Contains("rope_type = ntk: expected default"),
                         rope::Error);
}

TEST_CASE("valid scaled configs pass validation") {
    for (rope::ScalingType type : all_scaled) {
        CAPTURE(rope::scaling_type_name(type));
        CHECK_NOTHROW(rope::validate(config_of(type)));
    }
    // none ignores every scaling field, as a config without rope_scaling does.
    rope::RopeConfig config = config_of(rope::ScalingType::none);
    config.scaling.factor = -1.0;
    CHECK_NOTHROW(rope::validate(config));
}

TEST_CASE("scaling errors name the field and the value") {
    SUBCASE("factor: zero, negative, infinite, NaN, for every scaled type") {
        for (rope::ScalingType type : all_scaled) {
            CAPTURE(rope::scaling_type_name(type));
            rope::RopeConfig config = config_of(type);
            config.scaling.factor = 0.0;
            expect_invalid(config, "scaling.factor = 0: must be > 0");
            config.scaling.factor = -2.0;
            expect_invalid(config, "scaling.factor = -2: must be > 0");
            config.scaling.factor = inf;
            expect_invalid(config, "scaling.factor = inf: must be finite");
            config.scaling.factor = nan_value;
            expect_invalid(config, "scaling.factor = nan: must be finite");
        }
    }
    SUBCASE("original_max_position_embeddings: zero or negative") {
        for (rope::ScalingType type : {rope::ScalingType::dynamic, rope::ScalingType::yarn, rope::ScalingType::llama3,
                                       rope::ScalingType::longrope}) {
            CAPTURE(rope::scaling_type_name(type));
            rope::RopeConfig config = config_of(type);
            config.scaling.original_max_position_embeddings = 0;
            expect_invalid(config, "scaling.original_max_position_embeddings = 0: must be > 0");
            config.scaling.original_max_position_embeddings = -4096;
            expect_invalid(config, "scaling.original_max_position_embeddings = -4096: must be > 0");
        }
        // linear does not read it.
        rope::RopeConfig config = config_of(rope::ScalingType::linear);
        config.scaling.original_max_position_embeddings = 0;
        CHECK_NOTHROW(rope::validate(config));
    }
    SUBCASE("yarn: beta_fast, beta_slow, mscale, mscale_all_dim, base") {
        rope::RopeConfig config = config_of(rope::ScalingType::yarn);
        config.scaling.beta_fast = 1.0;
        expect_invalid(config, "scaling.beta_fast = 1: must be > beta_slow = 1");
        config.scaling.beta_fast = 0.5;
        expect_invalid(config, "scaling.beta_fast = 0.5: must be > beta_slow = 1");
        config.scaling.beta_fast = inf;
        expect_invalid(config, "scaling.beta_fast = inf: must be finite");
        config = config_of(rope::ScalingType::yarn);
        config.scaling.beta_slow = 0.0;
        expect_invalid(config, "scaling.beta_slow = 0: must be > 0");
        config.scaling.beta_slow = nan_value;
        expect_invalid(config, "scaling.beta_slow = nan: must be finite");
        config = config_of(rope::ScalingType::yarn);
        config.scaling.mscale = -0.5;
        expect_invalid(config, "scaling.mscale = -0.5: must be >= 0");
        config.scaling.mscale = 1.0;
        config.scaling.mscale_all_dim = inf;
        expect_invalid(config, "scaling.mscale_all_dim = inf: must be finite");
        config = config_of(rope::ScalingType::yarn);
        config.base = 1.0;
        expect_invalid(config, "base = 1: must not be 1 with yarn");
    }
    SUBCASE("llama3: low_freq_factor must be below high_freq_factor") {
        rope::RopeConfig config = config_of(rope::ScalingType::llama3);
        config.scaling.low_freq_factor = 4.0;
        config.scaling.high_freq_factor = 4.0;
        expect_invalid(config, "scaling.low_freq_factor = 4: must be < high_freq_factor = 4");
        config.scaling.low_freq_factor = 8.0;
        expect_invalid(config, "scaling.low_freq_factor = 8: must be < high_freq_factor = 4");
        config.scaling.low_freq_factor = 0.0;
        expect_invalid(config, "scaling.low_freq_factor = 0: must be > 0");
        config.scaling.low_freq_factor = 1.0;
        config.scaling.high_freq_factor = inf;
        expect_invalid(config, "scaling.high_freq_factor = inf: must be finite");
    }
    SUBCASE("longrope: factor lists of rotary_dim/2 finite positive entries") {
        rope::RopeConfig config = config_of(rope::ScalingType::longrope);
        config.scaling.short_factor.resize(3);
        expect_invalid(config, "scaling.short_factor.size() = 3: must be rotary_dim/2 = 32");
        config = config_of(rope::ScalingType::longrope);
        config.scaling.long_factor.clear();
        expect_invalid(config, "scaling.long_factor.size() = 0: must be rotary_dim/2 = 32");
        // Partial rotary: the lists follow rotary_dim, not head_dim.
        config = config_of(rope::ScalingType::longrope);
        config.rotary_dim = 32;
        expect_invalid(config, "scaling.short_factor.size() = 32: must be rotary_dim/2 = 16");
        config = config_of(rope::ScalingType::longrope);
        config.scaling.long_factor[5] = 0.0;
        expect_invalid(config, "scaling.long_factor[5] = 0: must be > 0");
        config.scaling.long_factor[5] = nan_value;
        expect_invalid(config, "scaling.long_factor[5] = nan: must be finite");
        config = config_of(rope::ScalingType::longrope);
        config.scaling.short_factor[31] = -1.0;
        expect_invalid(config, "scaling.short_factor[31] = -1: must be > 0");
        // The default attention factor divides by ln(original_max_position_embeddings).
        config = config_of(rope::ScalingType::longrope);
        config.scaling.original_max_position_embeddings = 1;
        expect_invalid(config, "scaling.original_max_position_embeddings = 1: must be > 1");
        config.scaling.attention_factor = 1.2;  // Given: the logarithm is not needed.
        CHECK_NOTHROW(rope::validate(config));
    }
    SUBCASE("attention_factor: non-finite, non-positive, or given to a type that ignores it") {
        for (rope::ScalingType type : {rope::ScalingType::yarn, rope::ScalingType::longrope}) {
            CAPTURE(rope::scaling_type_name(type));
            rope::RopeConfig config = config_of(type);
            config.scaling.attention_factor = nan_value;
            expect_invalid(config, "scaling.attention_factor = nan: must be finite");
            config.scaling.attention_factor = -inf;
            expect_invalid(config, "scaling.attention_factor = -inf: must be finite");
            config.scaling.attention_factor = 0.0;
            expect_invalid(config, "scaling.attention_factor = 0: must be > 0");
        }
        for (rope::ScalingType type : {rope::ScalingType::linear, rope::ScalingType::dynamic, rope::ScalingType::llama3}) {
            rope::RopeConfig config = config_of(type);
            config.scaling.attention_factor = 1.5;
            expect_invalid(config, "scaling.attention_factor = 1.5: is only read by yarn and longrope (rope_type = " +
                                       std::string(rope::scaling_type_name(type)) + ")");
        }
    }
    SUBCASE("factor lists given to a type other than longrope") {
        rope::RopeConfig config = config_of(rope::ScalingType::yarn);
        config.scaling.short_factor = {1.0, 2.0};
        expect_invalid(config, "scaling.short_factor.size() = 2: is only read by longrope (rope_type = yarn)");
        config = config_of(rope::ScalingType::llama3);
        config.scaling.long_factor = {1.0};
        expect_invalid(config, "scaling.long_factor.size() = 1: is only read by longrope (rope_type = llama3)");
    }
    SUBCASE("a rope::apply call reports the scaling error too") {
        rope::RopeConfig config = config_of(rope::ScalingType::yarn);
        config.scaling.beta_slow = -1.0;
        auto call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
        auto backend = rope::make_backend("cpu-naive");
        CHECK_THROWS_WITH_AS(testing::run(*backend, call), doctest::Contains("scaling.beta_slow = -1: must be > 0"),
                             rope::Error);
    }
}

TEST_CASE("linear divides every theta_i by factor") {
    const rope::RopeConfig config = config_of(rope::ScalingType::linear);
    const rope::FrequencyTable table = rope::make_frequency_table(config, 100000);
    REQUIRE(table.inv_freq.size() == 32);
    for (int64_t i = 0; i < 32; ++i)
        CHECK(table.inv_freq[size_t(i)] == doctest::Approx(theta(10000.0, i, 64) / 4.0).epsilon(1e-7));
    CHECK(table.attention_factor == 1.0f);
}

TEST_CASE("dynamic NTK: unscaled within the original context, a larger base past it") {
    rope::RopeConfig config = config_of(rope::ScalingType::dynamic);  // factor 4, original 256
    const std::vector<float> plain = unscaled(config);
    // Up to and including max_position == original: exactly the default table (HF's max(seq_len, original)).
    for (int64_t max_position : {1, 100, 256}) {
        CAPTURE(max_position);
        CHECK(rope::make_frequency_table(config, max_position).inv_freq == plain);
    }
    // Past it: base * (factor * L / original - (factor - 1))^(d / (d - 2)).
    for (int64_t length : {257, 1024, 5000}) {
        CAPTURE(length);
        const rope::FrequencyTable table = rope::make_frequency_table(config, length);
        const double stretch = 4.0 * double(length) / 256.0 - 3.0;
        const double base = 10000.0 * std::pow(stretch, 64.0 / 62.0);
        CHECK(table.inv_freq[0] == 1.0f);  // base^0: pair 0 never changes.
        for (int64_t i = 1; i < 32; ++i) {
            CHECK(table.inv_freq[size_t(i)] == doctest::Approx(theta(base, i, 64)).epsilon(1e-7));
            CHECK(table.inv_freq[size_t(i)] < plain[size_t(i)]);
        }
        CHECK(table.attention_factor == 1.0f);
    }
    // Longer calls stretch further.
    const auto at_1024 = rope::make_frequency_table(config, 1024).inv_freq;
    const auto at_4096 = rope::make_frequency_table(config, 4096).inv_freq;
    for (size_t i = 1; i < 32; ++i) CHECK(at_4096[i] < at_1024[i]);
    // Partial rotary: HF's dim is rotary_dim, in the exponent too.
    config.rotary_dim = 32;
    const rope::FrequencyTable partial = rope::make_frequency_table(config, 1024);
    const double base = 10000.0 * std::pow(4.0 * 1024.0 / 256.0 - 3.0, 32.0 / 30.0);
    REQUIRE(partial.inv_freq.size() == 16);
    for (int64_t i = 0; i < 16; ++i)
        CHECK(partial.inv_freq[size_t(i)] == doctest::Approx(theta(base, i, 32)).epsilon(1e-7));
    // rotary_dim 2: d / (d - 2) is undefined, but the only pair is theta_0 = 1 whatever the base.
    config.head_dim = 2;
    config.rotary_dim = 0;
    CHECK(rope::make_frequency_table(config, 5000).inv_freq == std::vector<float>{1.0f});
}

TEST_CASE("dynamic NTK follows the call's largest position through make_plan") {
    const rope::RopeConfig config = config_of(rope::ScalingType::dynamic);  // original 256
    auto plan_for = [&](testing::Call& call) {
        const rope::RopeArgs args = rope::RopeArgs::out_of_place(call.q.view, call.k.view, call.q_out.view,
                                                                 call.k_out.view, call.positions());
        return rope::make_plan(config, args, rope::Device::host).angles.inv_freq;
    };
    auto call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {2, 2, 4, 64}, {2, 2, 4, 64});
    call.offset = 252;  // positions 252..255: max_position 256, within the original context
    CHECK(plan_for(call) == unscaled(config));
    call.offset = 1020;  // 1020..1023
    CHECK(plan_for(call) == rope::make_frequency_table(config, 1024).inv_freq);
    call.offset = 0;  // host ids: the largest id counts, in any row
    call.ids = {0, 1, 2, 3, 4, 5, 6, 2999};
    call.id_rows = 2;
    CHECK(plan_for(call) == rope::make_frequency_table(config, 3000).inv_freq);
}

TEST_CASE("yarn: high frequencies kept, low ones divided by factor, a ramp between") {
    // head_dim 128, base 10000, original 4096, betas 32 / 1: the correction range is
    // 128 ln(4096 / (32 * 2 pi)) / (2 ln 10000) = 20.94 -> floor 20, and
    // 128 ln(4096 / (1 * 2 pi)) / (2 ln 10000) = 45.03 -> ceil 46.
    rope::RopeConfig config = config_of(rope::ScalingType::yarn, 128);
    config.scaling.original_max_position_embeddings = 4096;
    const std::vector<float> plain = unscaled(config);
    const rope::FrequencyTable table = rope::make_frequency_table(config, 1);
    REQUIRE(table.inv_freq.size() == 64);
    for (size_t i = 0; i < 64; ++i) {
        CAPTURE(i);
        const double ramp = std::clamp((double(i) - 20.0) / (46.0 - 20.0), 0.0, 1.0);
        const double want = double(plain[i]) * (1.0 - ramp + ramp / 4.0);
        CHECK(table.inv_freq[i] == doctest::Approx(want).epsilon(2e-7));
        if (i <= 20) CHECK(table.inv_freq[i] == plain[i]);
        if (i >= 46) CHECK(table.inv_freq[i] == doctest::Approx(plain[i] / 4.0).epsilon(2e-7));
        if (i > 20 && i < 46) CHECK((table.inv_freq[i] < plain[i] && table.inv_freq[i] > plain[i] / 4.0f));
    }
    // Default attention factor 0.1 ln(factor) + 1.
    CHECK(table.attention_factor == doctest::Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-7));

    SUBCASE("truncate = false keeps the fractional range") {
        config.scaling.truncate = false;
        const rope::FrequencyTable fractional = rope::make_frequency_table(config, 1);
        const double low = 128.0 * std::log(4096.0 / (32.0 * 2.0 * std::numbers::pi)) / (2.0 * std::log(10000.0));
        const double high = 128.0 * std::log(4096.0 / (2.0 * std::numbers::pi)) / (2.0 * std::log(10000.0));
        REQUIRE(low == doctest::Approx(20.94).epsilon(1e-3));
        for (size_t i = 0; i < 64; ++i) {
            const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
            CHECK(fractional.inv_freq[i] == doctest::Approx(double(plain[i]) * (1.0 - ramp + ramp / 4.0)).epsilon(2e-7));
        }
        CHECK(fractional.inv_freq[21] != table.inv_freq[21]);  // 21 > 20.94: already on the ramp.
    }
    SUBCASE("factor 1 is the default table with attention factor 1") {
        config.scaling.factor = 1.0;
        const rope::FrequencyTable same = rope::make_frequency_table(config, 100000);
        CHECK(same.inv_freq == plain);
        CHECK(same.attention_factor == 1.0f);
    }
    SUBCASE("attention factor: given, DeepSeek's mscale ratio, mscale alone ignored") {
        config.scaling.attention_factor = 0.75;
        CHECK(rope::make_frequency_table(config, 1).attention_factor == 0.75f);
        config.scaling.attention_factor.reset();
        config.scaling.mscale = 0.707;
        CHECK(rope::make_frequency_table(config, 1).attention_factor ==
              doctest::Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-7));  // needs mscale_all_dim too (HF)
        config.scaling.mscale_all_dim = 1.0;
        const double want = (0.1 * 0.707 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0);
        CHECK(rope::make_frequency_table(config, 1).attention_factor == doctest::Approx(want).epsilon(1e-7));
        config.scaling.mscale_all_dim = 0.707;  // equal: the ratio is 1
        CHECK(rope::make_frequency_table(config, 1).attention_factor == doctest::Approx(1.0).epsilon(1e-7));
    }
    SUBCASE("independent of the call's length") {
        CHECK(rope::make_frequency_table(config, 1000000).inv_freq == table.inv_freq);
    }
    SUBCASE("partial rotary: the same as a head of rotary_dim features") {
        rope::RopeConfig partial = config;
        partial.rotary_dim = 64;
        rope::RopeConfig small = config;
        small.head_dim = 64;
        CHECK(rope::make_frequency_table(partial, 1).inv_freq == rope::make_frequency_table(small, 1).inv_freq);
    }
}

TEST_CASE("llama3: short wavelengths kept, long ones divided by factor, smooth between") {
    // Llama 3.1: base 500000, factor 8, low 1, high 4, original 8192; head_dim 128.
    rope::RopeConfig config = config_of(rope::ScalingType::llama3, 128, 500000.0);
    config.scaling.factor = 8.0;
    config.scaling.low_freq_factor = 1.0;
    config.scaling.high_freq_factor = 4.0;
    config.scaling.original_max_position_embeddings = 8192;
    const std::vector<float> plain = unscaled(config);
    const rope::FrequencyTable table = rope::make_frequency_table(config, 1);
    int kept = 0, divided = 0, smoothed = 0;
    for (size_t i = 0; i < 64; ++i) {
        CAPTURE(i);
        const double wavelength = 2.0 * std::numbers::pi / theta(500000.0, int64_t(i), 128);
        if (wavelength < 8192.0 / 4.0) {
            CHECK(table.inv_freq[i] == plain[i]);
            ++kept;
        } else if (wavelength > 8192.0 / 1.0) {
            CHECK(table.inv_freq[i] == doctest::Approx(plain[i] / 8.0).epsilon(1e-7));
            ++divided;
        } else {
            const double smooth = (8192.0 / wavelength - 1.0) / (4.0 - 1.0);
            CHECK(table.inv_freq[i] == doctest::Approx(double(plain[i]) * ((1.0 - smooth) / 8.0 + smooth)).epsilon(2e-7));
            CHECK((table.inv_freq[i] < plain[i] && table.inv_freq[i] > plain[i] / 8.0f));
            ++smoothed;
        }
    }
    CHECK(kept > 0);
    CHECK(divided > 0);
    CHECK(smoothed > 0);
    CHECK(table.attention_factor == 1.0f);
    // Independent of the call's length.
    CHECK(rope::make_frequency_table(config, 1000000).inv_freq == table.inv_freq);
}

TEST_CASE("longrope: short factors within the original context, long ones past it") {
    rope::RopeConfig config = config_of(rope::ScalingType::longrope);  // factor 4, original 256
    for (size_t i = 0; i < 32; ++i) {
        config.scaling.short_factor[i] = 1.0 + 0.01 * double(i);
        config.scaling.long_factor[i] = 1.0 + 0.5 * double(i);
    }
    const std::vector<float> plain = unscaled(config);
    const rope::FrequencyTable short_table = rope::make_frequency_table(config, 256);  // max(position_ids) + 1 == original
    const rope::FrequencyTable long_table = rope::make_frequency_table(config, 257);
    for (size_t i = 0; i < 32; ++i) {
        CAPTURE(i);
        CHECK(short_table.inv_freq[i] == doctest::Approx(theta(10000.0, int64_t(i), 64) / (1.0 + 0.01 * double(i))).epsilon(1e-7));
        CHECK(long_table.inv_freq[i] == doctest::Approx(theta(10000.0, int64_t(i), 64) / (1.0 + 0.5 * double(i))).epsilon(1e-7));
    }
    // Attention factor sqrt(1 + ln(factor) / ln(original)), whichever list is used.
    const double want = std::sqrt(1.0 + std::log(4.0) / std::log(256.0));
    CHECK(short_table.attention_factor == doctest::Approx(want).epsilon(1e-7));
    CHECK(long_table.attention_factor == doctest::Approx(want).epsilon(1e-7));
    config.scaling.factor = 1.0;  // no extension: 1
    CHECK(rope::make_frequency_table(config, 257).attention_factor == 1.0f);
    config.scaling.attention_factor = 1.1;  // given
    CHECK(rope::make_frequency_table(config, 257).attention_factor == 1.1f);
}

TEST_CASE("scaled configs run on the CPU backends and scale cos and sin by the attention factor") {
    // The rotation of pair i at position p with table (theta, a) is a * R(p theta_i):
    // check a backend's output pair norms scale by a, against the same call unscaled.
    rope::RopeConfig config = config_of(rope::ScalingType::yarn);
    config.scaling.attention_factor = 0.5;
    for (const char* name : {"cpu-naive", "cpu-eigen"}) {
        auto backend = testing::backend_or_skip(name);
        if (!backend) continue;
        CAPTURE(name);
        auto call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 3, 64}, {1, 1, 3, 64});
        call.offset = 1000;
        testing::run(*backend, call);
        const std::vector<double> in = call.q.values(), out = call.q_out.values();
        REQUIRE(in.size() == out.size());
        for (size_t row = 0; row < in.size() / 64; ++row) {
            for (size_t i = 0; i < 32; ++i) {
                const size_t x = row * 64 + i, y = x + 32;
                const double norm_in = std::hypot(in[x], in[y]), norm_out = std::hypot(out[x], out[y]);
                CHECK(norm_out == doctest::Approx(0.5 * norm_in).epsilon(1e-6));
            }
        }
    }
}

TEST_CASE("the float64 oracle refuses scaling types it does not implement") {
    const rope::RopeConfig config = config_of(rope::ScalingType::yarn);
    auto call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {1, 1, 2, 64}, {1, 1, 2, 64});
    CHECK_THROWS(oracle::rotate(config, call.q.view, call.positions(), rope::Direction::forward));
}

TEST_CASE("a frequency table built once per configuration gives make_plan's own table, for every scaling type") {
    for (const rope::ScalingType type : {rope::ScalingType::none, rope::ScalingType::linear, rope::ScalingType::dynamic,
                                         rope::ScalingType::yarn, rope::ScalingType::llama3,
                                         rope::ScalingType::longrope}) {
        CAPTURE(rope::scaling_type_name(type));
        const rope::RopeConfig config = config_of(type);
        const std::optional<rope::FrequencyTable> shared = rope::detail::reusable_frequency_table(config);
        // Dynamic and longrope read the call's largest position: their table cannot be shared.
        const bool length_dependent = type == rope::ScalingType::dynamic || type == rope::ScalingType::longrope;
        CHECK(shared.has_value() == !length_dependent);
        // A shared table handed to make_plan for one of those is ignored, not used.
        const rope::FrequencyTable stale = rope::make_frequency_table(config, 1);
        const rope::FrequencyTable* given = shared ? &*shared : &stale;
        for (const int64_t offset : {0, 252, 4000}) {  // Within and past the original context (256).
            CAPTURE(offset);
            auto call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
            call.offset = offset;
            const rope::RopeArgs args = rope::RopeArgs::out_of_place(call.q.view, call.k.view, call.q_out.view,
                                                                     call.k_out.view, call.positions());
            const rope::Plan own = rope::make_plan(config, args, rope::Device::host);
            const rope::Plan reused = rope::make_plan(config, args, rope::Device::host, given);
            CHECK(reused.angles.inv_freq == own.angles.inv_freq);
            CHECK(reused.angles.inv_freq_low == own.angles.inv_freq_low);
            CHECK(reused.angles.pair_axis == own.angles.pair_axis);
            CHECK(reused.angles.cos_scale == own.angles.cos_scale);
            CHECK(reused.angles.sin_scale == own.angles.sin_scale);
        }
    }
}
