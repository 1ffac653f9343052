// The backend suite: every test here runs once per registered backend
// (TEST_CASE_TEMPLATE_APPLY over AllBackends). Each draws fresh random inputs,
// poisons outputs with NaN, and states its tolerance:
//  - against the float64 oracle: relative L2 error and max abs error, which for
//    float32 grow with position because the float32 angle position*theta is rounded;
//  - against cpu-naive: far tighter, since all backends compute the same float32
//    angles (testing::naive_agreement).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backend_tags.hpp"
#include "support.hpp"

using testing::Call;
using testing::check_call;
using testing::check_close;
using testing::make_call;

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;
constexpr rope::Layout bshd = rope::Layout::bshd;

rope::RopeConfig config_of(int64_t head_dim, int64_t rotary_dim = 0, rope::Style style = rope::Style::half_split,
                           double base = 10000.0) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    config.style = style;
    config.base = base;
    return config;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("founding example: [4 8 256 64] fp32 half-split matches the oracle", B, founding) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // The float32 rounding of position*theta alone gives about 1e-6 at seq 256.
    const rope::RopeConfig config = config_of(64);
    check_call(*backend, make_call(config, rope::DType::f32, bhsd, {4, 8, 256, 64}, {4, 8, 256, 64}), 2e-6,
               testing::fp32_max_abs(256));
}
TEST_CASE_TEMPLATE_APPLY(founding, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("styles x layouts x partial rotary x grouped-query heads", B, feature_matrix) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    struct Dims {
        int64_t head_dim, rotary_dim;
    };
    // 128/64/2: the common, partial and smallest heads; 34 (17 pairs) and 40/24 defeat any vector width.
    const Dims dims[] = {{128, 0}, {64, 32}, {2, 0}, {34, 0}, {40, 24}, {64, 8}};
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        for (rope::Layout layout : {bhsd, bshd}) {
            for (const Dims& d : dims) {
                CAPTURE(rope::style_name(style));
                CAPTURE(rope::layout_name(layout));
                CAPTURE(d.head_dim);
                CAPTURE(d.rotary_dim);
                const rope::RopeConfig config = config_of(d.head_dim, d.rotary_dim, style);
                // q has 6 heads and k 2 (grouped-query attention), in layout order.
                const std::array<int64_t, 4> q_shape = layout == bhsd ? std::array<int64_t, 4>{2, 6, 19, d.head_dim}
                                                                      : std::array<int64_t, 4>{2, 19, 6, d.head_dim};
                std::array<int64_t, 4> k_shape = q_shape;
                k_shape[layout == bhsd ? 1 : 2] = 2;
                check_call(*backend, make_call(config, rope::DType::f32, layout, q_shape, k_shape),
                           testing::fp32_tolerance(19), testing::fp32_max_abs(19));
            }
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(feature_matrix, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("strided views: padded rows and heads, spaced features", B, strided) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        CAPTURE(rope::style_name(style));
        const rope::RopeConfig config = config_of(64, 48, style);
        // Padding of 3 elements after every row and head block, features 2 apart.
        check_call(*backend, make_call(config, rope::DType::f32, bshd, {2, 9, 4, 64}, {2, 9, 2, 64}, 3, 2),
                   testing::fp32_tolerance(9), testing::fp32_max_abs(9));
        // Input padded, output dense: different strides in and out.
        Call call = make_call(config, rope::DType::f32, bhsd, {2, 4, 9, 64}, {2, 4, 9, 64}, 5);
        call.q_out = testing::HostTensor::make(rope::DType::f32, bhsd, {2, 4, 9, 64});
        call.k_out = testing::HostTensor::make(rope::DType::f32, bhsd, {2, 4, 9, 64});
        call.q_out.poison();
        call.k_out.poison();
        check_call(*backend, call, testing::fp32_tolerance(9), testing::fp32_max_abs(9));
    }
}
TEST_CASE_TEMPLATE_APPLY(strided, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("memory arrangements: padded, features 2 apart, off 16-byte alignment, heads/seq swapped, tail",
                          B, arrangements) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    std::mt19937_64& rng = testing::rng();
    for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
        for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
            for (testing::Arrangement arrangement : testing::all_arrangements) {
                for (bool in_place : {false, true}) {
                    // The same arrangement for all four tensors, with a tail after
                    // the inputs; then the inputs in it and the outputs dense.
                    for (bool outputs_dense : {false, true}) {
                        const testing::StorageOptions in{arrangement, 5}, out{
                            outputs_dense ? testing::Arrangement::dense : arrangement, 0};
                        CAPTURE(rope::dtype_name(dtype));
                        CAPTURE(rope::style_name(style));
                        CAPTURE(testing::storage_name(in));
                        CAPTURE(testing::storage_name(out));
                        CAPTURE(in_place);
                        // 128 features with 96 rotating (a 16-byte path's worth), partial rotary.
                        Call call = make_call(config_of(128, 96, style), dtype, bshd, {2, 7, 4, 128}, {2, 7, 2, 128});
                        testing::arrange(call, {in, in, out, out}, rng);
                        call.in_place = in_place;
                        call.offset = 3;
                        const testing::Tolerance tolerance = testing::oracle_tolerance(dtype, 10);
                        check_call(*backend, call, tolerance.rel_l2, tolerance.max_abs);
                    }
                }
            }
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(arrangements, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("positions: start offset, shared ids, per-sequence ids", B, positions) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const rope::RopeConfig config = config_of(128, 0, rope::Style::half_split, 500000.0);
    SUBCASE("decode: one token at offset 5000, 32 query heads, 8 key heads") {
        Call call = make_call(config, rope::DType::f32, bhsd, {3, 32, 1, 128}, {3, 8, 1, 128});
        call.offset = 5000;
        check_call(*backend, call, testing::fp32_tolerance(5001), testing::fp32_max_abs(5001));
    }
    SUBCASE("one row of ids shared by the batch") {
        Call call = make_call(config, rope::DType::f32, bshd, {2, 16, 4, 128}, {2, 16, 4, 128});
        std::uniform_int_distribution<int64_t> id(0, 8191);
        for (int s = 0; s < 16; ++s) call.ids.push_back(id(testing::rng()));
        call.id_rows = 1;
        check_call(*backend, call, testing::fp32_tolerance(8192), testing::fp32_max_abs(8192));
    }
    SUBCASE("one row of ids per sequence") {
        Call call = make_call(config, rope::DType::f32, bhsd, {3, 4, 16, 128}, {3, 2, 16, 128});
        std::uniform_int_distribution<int64_t> id(0, 8191);
        for (int i = 0; i < 3 * 16; ++i) call.ids.push_back(id(testing::rng()));
        call.id_rows = 3;
        check_call(*backend, call, testing::fp32_tolerance(8192), testing::fp32_max_abs(8192));
    }
    SUBCASE("long context: positions near 100000") {
        Call call = make_call(config, rope::DType::f32, bhsd, {1, 4, 32, 128}, {1, 4, 32, 128});
        call.offset = 100000;
        check_call(*backend, call, testing::fp32_tolerance(100032), testing::fp32_max_abs(100032));
    }
}
TEST_CASE_TEMPLATE_APPLY(positions, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("fp16 and bf16 storage with float32 arithmetic", B, half_types) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    struct Case {
        rope::DType dtype;
        double oracle_rel;   // Dominated by rounding the output to the storage type.
        double ulp;          // One unit in the last place, relative (2^-7 bf16, 2^-10 fp16).
    };
    for (const Case& c : {Case{rope::DType::bf16, 4e-3, 1.0 / 128}, Case{rope::DType::f16, 5e-4, 1.0 / 1024}}) {
        for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
            CAPTURE(rope::dtype_name(c.dtype));
            CAPTURE(rope::style_name(style));
            CAPTURE(testing::seed());
            const rope::RopeConfig config = config_of(128, 96, style);
            Call call = make_call(config, c.dtype, bhsd, {2, 8, 33, 128}, {2, 4, 33, 128});
            Call reference = call;
            const testing::Expected want = testing::oracle_for(call);
            testing::run(*backend, call);
            check_close(call.q_result().values(), want.q, c.oracle_rel, 4 * c.ulp * 3, "q vs oracle");
            check_close(call.k_result().values(), want.k, c.oracle_rel, 4 * c.ulp * 3, "k vs oracle");
            // Against cpu-naive: the float32 results differ by float32 rounding only
            // (a few float32 ulps of the inputs' magnitude, so up to ~1e-6 absolute,
            // which matters for results that cancel to nearly 0), so after rounding
            // to storage every element is within one storage ulp plus that.
            auto naive = rope::make_backend("cpu-naive");
            testing::run(*naive, reference);
            const auto got = call.q_result().values(), ref = reference.q_result().values();
            long beyond_one_ulp = 0;
            for (size_t i = 0; i < got.size(); ++i)
                if (!(std::fabs(got[i] - ref[i]) <= c.ulp * std::fabs(ref[i]) + 2e-6)) ++beyond_one_ulp;
            CHECK(beyond_one_ulp == 0);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(half_types, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("inverse rotation undoes the forward one and matches the oracle", B, inverse) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        CAPTURE(rope::style_name(style));
        CAPTURE(testing::seed());
        const rope::RopeConfig config = config_of(64, 0, style);
        Call forward = make_call(config, rope::DType::f32, bhsd, {2, 4, 64, 64}, {2, 2, 64, 64});
        const auto original_q = forward.q.values(), original_k = forward.k.values();
        testing::run(*backend, forward);
        // Feed the rotated tensors back through the inverse.
        Call back = forward;
        back.q = forward.q_out;
        back.k = forward.k_out;
        back.q_out.poison();
        back.k_out.poison();
        back.direction = rope::Direction::inverse;
        testing::run(*backend, back);
        check_close(back.q_out.values(), original_q, 1e-6, 5e-6, "inverse(forward(q)) vs q");
        check_close(back.k_out.values(), original_k, 1e-6, 5e-6, "inverse(forward(k)) vs k");
        // The inverse on its own is the rotation by -angle.
        Call alone = make_call(config, rope::DType::f32, bhsd, {1, 4, 64, 64}, {1, 4, 64, 64});
        alone.direction = rope::Direction::inverse;
        check_call(*backend, alone, testing::fp32_tolerance(64), testing::fp32_max_abs(64));
    }
}
TEST_CASE_TEMPLATE_APPLY(inverse, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("in place gives exactly the out-of-place result", B, in_place) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
        CAPTURE(rope::dtype_name(dtype));
        CAPTURE(testing::seed());
        const rope::RopeConfig config = config_of(128, 0, rope::Style::half_split);
        Call out_of_place = make_call(config, dtype, bshd, {2, 40, 8, 128}, {2, 40, 2, 128});
        Call in_place = out_of_place;
        in_place.in_place = true;
        testing::run(*backend, out_of_place);
        testing::run(*backend, in_place);
        CHECK(out_of_place.q_out.storage == in_place.q.storage);
        CHECK(out_of_place.k_out.storage == in_place.k.storage);
        // And it is the right result, not just the same one.
        const testing::Expected want = testing::oracle_for(out_of_place);
        check_close(in_place.q.values(), want.q, dtype == rope::DType::f32 ? testing::fp32_tolerance(40) : 4e-3,
                    dtype == rope::DType::f32 ? testing::fp32_max_abs(40) : 0.1, "in-place q vs oracle");
    }
}
TEST_CASE_TEMPLATE_APPLY(in_place, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("empty tensors are a valid no-op; q alone when k has no heads", B, empty) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const rope::RopeConfig config = config_of(64);
    for (std::array<int64_t, 4> shape : {std::array<int64_t, 4>{0, 4, 8, 64}, std::array<int64_t, 4>{2, 4, 0, 64},
                                         std::array<int64_t, 4>{2, 0, 8, 64}}) {
        for (bool in_place : {false, true}) {
            Call call = make_call(config, rope::DType::f32, bhsd, shape, shape);
            call.in_place = in_place;
            const Call before = call;
            CHECK_NOTHROW(testing::run(*backend, call));
            // A no-op: not one byte of any of the four tensors changed.
            CHECK(call.q.storage == before.q.storage);
            CHECK(call.k.storage == before.k.storage);
            CHECK(call.q_out.storage == before.q_out.storage);
            CHECK(call.k_out.storage == before.k_out.storage);
        }
    }
    // k with zero heads: only q is rotated.
    Call q_only = make_call(config, rope::DType::f32, bhsd, {2, 4, 8, 64}, {2, 0, 8, 64});
    check_call(*backend, q_only, testing::fp32_tolerance(8), testing::fp32_max_abs(8));
}
TEST_CASE_TEMPLATE_APPLY(empty, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("bad input is rejected and leaves the outputs untouched", B, rejected) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const rope::RopeConfig good = config_of(64);
    SUBCASE("odd rotary_dim") {
        Call call = make_call(config_of(64, 31), rope::DType::f32, bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
        const auto before_q = call.q_out.storage, before_k = call.k_out.storage;
        CHECK_THROWS_WITH_AS(testing::run(*backend, call), doctest::Contains("rotary_dim = 31"), rope::Error);
        CHECK(call.q_out.storage == before_q);
        CHECK(call.k_out.storage == before_k);
    }
    SUBCASE("positions of the wrong length") {
        Call call = make_call(good, rope::DType::f32, bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
        call.ids = {0, 1, 2};
        call.id_rows = 1;
        const auto before_q = call.q_out.storage;
        CHECK_THROWS_WITH_AS(testing::run(*backend, call), doctest::Contains("positions.length = 3"), rope::Error);
        CHECK(call.q_out.storage == before_q);
    }
    SUBCASE("in place with the inputs unchanged on error") {
        Call call = make_call(config_of(32), rope::DType::f32, bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
        call.in_place = true;
        const auto before_q = call.q.storage;
        CHECK_THROWS_WITH_AS(testing::run(*backend, call), doctest::Contains("q head_dim = 64"), rope::Error);
        CHECK(call.q.storage == before_q);
    }
}
TEST_CASE_TEMPLATE_APPLY(rejected, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("precise angles: error at position 4M stays at the level of 4K", B, precise) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    auto error_at = [&](int64_t offset, bool precise, rope::Style style) {
        rope::RopeConfig config = config_of(128, 0, style);
        config.precise_angles = precise;
        Call call = make_call(config, rope::DType::f32, bhsd, {1, 8, 64, 128}, {1, 8, 64, 128});
        call.offset = offset;
        const testing::Expected want = testing::oracle_for(call);
        testing::run(*backend, call);
        const oracle::ErrorStats q = oracle::compare(call.q_out.values(), want.q);
        CHECK(q.non_finite == 0);
        return q.rel_l2;
    };
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        CAPTURE(rope::style_name(style));
        const double precise_4k = error_at(4096, true, style), precise_4m = error_at(4194304, true, style);
        const double default_4m = error_at(4194304, false, style);
        INFO("rel_l2 precise@4K " << precise_4k << ", precise@4M " << precise_4m << ", default@4M " << default_4m);
        CHECK(precise_4k <= 2e-6);         // float32 sin/cos and products only
        CHECK(precise_4m <= 10 * precise_4k);  // the target: within 10x of 4K
        CHECK(precise_4m <= 2e-6);
        CHECK(default_4m > 100 * precise_4m);  // and the default really is worse there
    }
}
TEST_CASE_TEMPLATE_APPLY(precise, AllBackends);
