// Bad input gets a rope::Error that names the parameter and its value.
// These checks live in common/ (make_plan), so one backend (cpu-naive) covers
// them; backend_suite_test.cpp checks on every backend that a rejected call
// writes nothing.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "support.hpp"

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;

rope::RopeConfig config_of(int64_t head_dim, int64_t rotary_dim = 0) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    return config;
}

// Runs the call on cpu-naive; expects an error whose message contains `expected`,
// and outputs (and in-place inputs) left exactly as they were.
void expect_error(testing::Call& call, const std::string& expected) {
    auto backend = rope::make_backend("cpu-naive");
    const auto q = call.q.storage, k = call.k.storage, q_out = call.q_out.storage, k_out = call.k_out.storage;
    CHECK_THROWS_WITH_AS(testing::run(*backend, call), doctest::Contains(expected.c_str()), rope::Error);
    CHECK(call.q.storage == q);
    CHECK(call.k.storage == k);
    CHECK(call.q_out.storage == q_out);
    CHECK(call.k_out.storage == k_out);
}

testing::Call small_call(const rope::RopeConfig& config = config_of(64)) {
    return testing::make_call(config, rope::DType::f32, bhsd, {2, 4, 8, 64}, {2, 4, 8, 64});
}

}  // namespace

TEST_CASE("config errors name the field and the value") {
    SUBCASE("odd rotary_dim") {
        auto call = small_call(config_of(64, 63));
        expect_error(call, "rotary_dim = 63: must be even");
    }
    SUBCASE("rotary_dim larger than head_dim") {
        auto call = small_call(config_of(64, 128));
        expect_error(call, "rotary_dim = 128: must not exceed head_dim = 64");
    }
    SUBCASE("negative rotary_dim") {
        auto call = small_call(config_of(64, -2));
        expect_error(call, "rotary_dim = -2");
    }
    SUBCASE("head_dim zero") {
        auto call = small_call(config_of(0));
        expect_error(call, "head_dim = 0");
    }
    SUBCASE("non-finite and non-positive base") {
        for (double base : {std::numeric_limits<double>::infinity(), std::nan(""), 0.0, -10000.0}) {
            rope::RopeConfig config = config_of(64);
            config.base = base;
            auto call = small_call(config);
            expect_error(call, "base = ");
        }
        rope::RopeConfig config = config_of(64);
        config.base = -1.0;
        auto call = small_call(config);
        expect_error(call, "base = -1: must be > 0");
    }
    SUBCASE("linear scaling factor") {
        rope::RopeConfig config = config_of(64);
        config.scaling = {rope::ScalingType::linear, 0.0};
        auto call = small_call(config);
        expect_error(call, "scaling.factor = 0");
    }
}

TEST_CASE("tensor errors name the tensor, the axis and the value") {
    SUBCASE("negative size") {
        auto call = small_call();
        call.k.view.shape[2] = -1;
        call.k_out.view.shape[2] = -1;
        expect_error(call, "k.shape[2] = -1: sizes must be >= 0");
    }
    SUBCASE("q head_dim differs from the config") {
        auto call = small_call(config_of(32));
        expect_error(call, "q head_dim = 64: must equal config.head_dim = 32");
    }
    SUBCASE("q and k differ beyond the head count") {
        auto call = testing::make_call(config_of(64), rope::DType::f32, bhsd, {2, 4, 8, 64}, {2, 4, 7, 64});
        expect_error(call, "k seq = 7: must equal q seq = 8");
        auto batch = testing::make_call(config_of(64), rope::DType::f32, bhsd, {2, 4, 8, 64}, {3, 4, 8, 64});
        expect_error(batch, "k batch = 3: must equal q batch = 2");
    }
    SUBCASE("k heads that do not divide q heads") {
        auto call = testing::make_call(config_of(64), rope::DType::f32, bhsd, {2, 8, 8, 64}, {2, 3, 8, 64});
        expect_error(call, "k heads = 3: must divide q heads = 8");
    }
    SUBCASE("output of another shape") {
        auto call = small_call();
        call.q_out = testing::HostTensor::make(rope::DType::f32, bhsd, {2, 4, 9, 64});
        expect_error(call, "q_out seq = 9: must equal q seq = 8");
    }
    SUBCASE("mixed dtypes") {
        auto call = small_call();
        call.k = testing::HostTensor::make(rope::DType::bf16, bhsd, {2, 4, 8, 64});
        call.k.fill_random();
        expect_error(call, "k.dtype = bf16: all tensors must share q's dtype fp32");
    }
    SUBCASE("null data in a non-empty tensor") {
        auto call = small_call();
        call.q.view.data = nullptr;
        expect_error(call, "q.data = null");
    }
    SUBCASE("negative stride") {
        auto call = small_call();
        call.q_out.view.strides[1] = -1;
        expect_error(call, "q_out.strides[1] = -1");
    }
    SUBCASE("output whose strides overlap itself") {
        auto call = small_call();
        call.q_out.view.strides[2] = 32;  // Rows of 64 features 32 apart: each row overlaps the next.
        expect_error(call, "q_out.strides[2] = 32: overlaps other elements of q_out");
    }
    SUBCASE("output partially aliasing its input") {
        auto call = small_call();
        call.q_out.view = call.q.view;
        call.q_out.view.data = static_cast<float*>(call.q.view.data) + 1;  // Shifted by one element.
        CHECK_THROWS_WITH_AS(testing::run(*rope::make_backend("cpu-naive"), call),
                             doctest::Contains("q_out.data = "), rope::Error);
        CHECK_THROWS_WITH_AS(testing::run(*rope::make_backend("cpu-naive"), call),
                             doctest::Contains("partially aliases q"), rope::Error);
    }
    SUBCASE("q_out aliasing k") {
        auto call = small_call();
        call.q_out.view = call.k.view;
        expect_error(call, "partially aliases k");
    }
}

TEST_CASE("position errors") {
    SUBCASE("ids of the wrong length") {
        auto call = small_call();
        call.ids = {0, 1, 2, 3, 4};
        call.id_rows = 1;
        expect_error(call, "positions.length = 5: must equal seq = 8");
    }
    SUBCASE("ids with a row count that is neither 1 nor batch") {
        auto call = small_call();
        call.ids.assign(3 * 8, 1);
        call.id_rows = 3;
        expect_error(call, "positions.rows = 3: must be 1 or batch = 2");
    }
    SUBCASE("negative id") {
        auto call = small_call();
        call.ids = {0, 1, 2, -3, 4, 5, 6, 7};
        call.id_rows = 1;
        expect_error(call, "positions.ids[3] = -3: must be >= 0");
    }
    SUBCASE("negative offset") {
        auto call = small_call();
        call.offset = -1;
        expect_error(call, "positions.offset = -1: must be >= 0");
    }
}

TEST_CASE("device errors: host tensors given to a CUDA backend and the reverse") {
    // make_plan is what every backend calls first; checking it directly needs no GPU.
    auto call = small_call();
    const rope::RopeArgs args = rope::RopeArgs::out_of_place(call.q.view, call.k.view, call.q_out.view, call.k_out.view);
    CHECK_THROWS_WITH_AS(rope::make_plan(call.config, args, rope::Device::cuda),
                         doctest::Contains("q.device = host: this backend runs on cuda"), rope::Error);
    rope::RopeArgs cuda_args = args;
    for (rope::TensorView* view : {&cuda_args.q, &cuda_args.k, &cuda_args.q_out, &cuda_args.k_out})
        view->device = rope::Device::cuda;
    CHECK_THROWS_WITH_AS(rope::make_plan(call.config, cuda_args, rope::Device::host),
                         doctest::Contains("q.device = cuda: this backend runs on host"), rope::Error);
    std::vector<int64_t> ids(8, 0);
    cuda_args.positions = rope::Positions::shared(ids.data(), 8, rope::Device::host);
    CHECK_THROWS_WITH_AS(rope::make_plan(call.config, cuda_args, rope::Device::cuda),
                         doctest::Contains("positions.device = host"), rope::Error);
}

TEST_CASE("names: unknown backend, dtype, style; negative thread count") {
    CHECK_THROWS_WITH_AS(rope::make_backend("cpu-fast"), doctest::Contains("backend = cpu-fast: unknown"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::parse_dtype("fp8"), doctest::Contains("dtype = fp8"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::parse_style("llama"), doctest::Contains("style = llama"), rope::Error);
    rope::BackendOptions options;
    options.threads = -2;
    CHECK_THROWS_WITH_AS(rope::make_backend("cpu-naive", options), doctest::Contains("threads = -2"), rope::Error);
}
