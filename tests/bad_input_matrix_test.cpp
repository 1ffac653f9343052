// The bad-input matrix: every invalid input we know of, fed to every backend
// through rope::apply, and to the other public entry points. Each case must
// raise rope::Error whose message names the field and the value, and must
// leave every byte of the outputs (and of in-place inputs) unchanged.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "rope/detail/plan.hpp"  // make_plan: these tests check the plan itself
#include "support.hpp"

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;
constexpr double inf = std::numeric_limits<double>::infinity();

struct BadInput {
    const char* what;                                   // What is wrong, for the report.
    std::function<void(testing::Call&)> before_staging; // Edits the host-side call (shapes, config, ids).
    std::function<void(rope::RopeArgs&)> final_args;    // Edits the arguments the backend receives.
    std::string expected;                               // Must appear in the error message.
};

rope::Device other_device(rope::Device device) {
    return device == rope::Device::host ? rope::Device::cuda : rope::Device::host;
}

std::vector<BadInput> bad_inputs(rope::Device backend_device) {
    using Call = testing::Call;
    using Args = rope::RopeArgs;
    const std::string wrong_device(rope::device_name(other_device(backend_device)));
    auto config_case = [](const char* what, std::function<void(rope::RopeConfig&)> edit, std::string expected) {
        return BadInput{what, [edit](Call& c) { edit(c.config); }, nullptr, expected};
    };
    auto args_case = [](const char* what, std::function<void(Args&)> edit, std::string expected) {
        return BadInput{what, nullptr, edit, expected};
    };
    auto reshape = [](const char* what, std::array<int64_t, 4> q_shape, std::array<int64_t, 4> k_shape,
                      std::string expected) {
        return BadInput{what,
                        [=](Call& c) {
                            c = testing::make_call(c.config, rope::DType::f32, bhsd, q_shape, k_shape);
                        },
                        nullptr, expected};
    };
    std::vector<BadInput> cases = {
        config_case("odd rotary_dim", [](auto& c) { c.rotary_dim = 63; }, "rotary_dim = 63: must be even"),
        config_case("rotary_dim > head_dim", [](auto& c) { c.rotary_dim = 128; },
                    "rotary_dim = 128: must not exceed head_dim = 64"),
        config_case("negative rotary_dim", [](auto& c) { c.rotary_dim = -2; }, "rotary_dim = -2"),
        config_case("head_dim 0", [](auto& c) { c.head_dim = 0; }, "head_dim = 0: must be > 0"),
        config_case("negative head_dim", [](auto& c) { c.head_dim = -64; }, "head_dim = -64"),
        config_case("infinite base", [](auto& c) { c.base = inf; }, "base = inf: must be finite"),
        config_case("NaN base", [](auto& c) { c.base = std::nan(""); }, "base = nan: must be finite"),
        config_case("zero base", [](auto& c) { c.base = 0.0; }, "base = 0: must be > 0"),
        config_case("negative base", [](auto& c) { c.base = -10000.0; }, "base = -10000: must be > 0"),
        config_case("zero linear factor", [](auto& c) { c.scaling.type = rope::ScalingType::linear; c.scaling.factor = 0; },
                    "scaling.factor = 0"),
        config_case("negative linear factor",
                    [](auto& c) { c.scaling.type = rope::ScalingType::linear; c.scaling.factor = -2; },
                    "scaling.factor = -2"),
        config_case("infinite linear factor",
                    [](auto& c) { c.scaling.type = rope::ScalingType::linear; c.scaling.factor = inf; },
                    "scaling.factor = inf"),
        args_case("negative batch in q", [](Args& a) { a.q.shape[0] = -1; }, "q.shape[0] = -1: sizes must be >= 0"),
        args_case("negative heads in q", [](Args& a) { a.q.shape[1] = -4; }, "q.shape[1] = -4"),
        args_case("negative seq in k", [](Args& a) { a.k.shape[2] = -1; }, "k.shape[2] = -1"),
        args_case("negative dim in q_out", [](Args& a) { a.q_out.shape[3] = -64; }, "q_out.shape[3] = -64"),
        args_case("negative size in k_out", [](Args& a) { a.k_out.shape[0] = -2; }, "k_out.shape[0] = -2"),
        config_case("q head_dim differs from config", [](auto& c) { c.head_dim = 32; },
                    "q head_dim = 64: must equal config.head_dim = 32"),
        reshape("k seq differs", {2, 4, 8, 64}, {2, 4, 7, 64}, "k seq = 7: must equal q seq = 8"),
        reshape("k batch differs", {2, 4, 8, 64}, {3, 4, 8, 64}, "k batch = 3: must equal q batch = 2"),
        reshape("k head_dim differs", {2, 4, 8, 64}, {2, 4, 8, 32}, "k head_dim = 32: must equal q head_dim = 64"),
        reshape("k heads do not divide q heads", {2, 8, 8, 64}, {2, 3, 8, 64}, "k heads = 3: must divide q heads = 8"),
        args_case("q_out seq differs", [](Args& a) { a.q_out.shape[2] = 9; }, "q_out seq = 9: must equal q seq = 8"),
        args_case("k_out heads differ", [](Args& a) { a.k_out.shape[1] = 2; }, "k_out heads = 2: must equal k heads = 4"),
        args_case("negative stride in q", [](Args& a) { a.q.strides[1] = -1; }, "q.strides[1] = -1: strides must be >= 0"),
        args_case("q_out rows overlap", [](Args& a) { a.q_out.strides[2] = 32; },
                  "q_out.strides[2] = 32: overlaps other elements of q_out"),
        args_case("k_out heads overlap (stride 0)", [](Args& a) { a.k_out.strides[1] = 0; },
                  "k_out.strides[1] = 0: overlaps other elements of k_out"),
        args_case("q_out shifted one element over q",
                  [](Args& a) {
                      a.q_out = a.q;
                      a.q_out.data = static_cast<float*>(a.q.data) + 1;
                  },
                  "partially aliases q"),
        args_case("q_out is k", [](Args& a) { a.q_out = a.k; }, "q_out.data = "),
        args_case("k_out overlaps q_out", [](Args& a) { a.k_out = a.q_out; }, "partially aliases k_out"),
        args_case("k_out is q (in place on the wrong tensor)", [](Args& a) { a.k_out = a.q; }, "partially aliases"),
        args_case("k of another dtype", [](Args& a) { a.k.dtype = rope::DType::bf16; },
                  "k.dtype = bf16: all tensors must share q's dtype fp32"),
        args_case("q_out of another dtype", [](Args& a) { a.q_out.dtype = rope::DType::f16; }, "q_out.dtype = fp16"),
        args_case("null q", [](Args& a) { a.q.data = nullptr; }, "q.data = null: a non-empty tensor needs memory"),
        args_case("null k_out", [](Args& a) { a.k_out.data = nullptr; }, "k_out.data = null"),
        args_case("q on the wrong device", [=](Args& a) { a.q.device = other_device(a.q.device); },
                  "q.device = " + wrong_device),
        args_case("k_out on the wrong device", [=](Args& a) { a.k_out.device = other_device(a.k_out.device); },
                  "k_out.device = " + wrong_device),
        BadInput{"ids of the wrong length",
                 [](Call& c) {
                     c.ids = {0, 1, 2, 3, 4};
                     c.id_rows = 1;
                 },
                 nullptr, "positions.length = 5: must equal seq = 8"},
        BadInput{"ids with 3 rows for batch 2",
                 [](Call& c) {
                     c.ids.assign(24, 1);
                     c.id_rows = 3;
                 },
                 nullptr, "positions.rows = 3: must be 1 or batch = 2"},
        BadInput{"ids with 0 rows",
                 [](Call& c) {
                     c.ids.assign(8, 1);
                     c.id_rows = 1;
                 },
                 [](Args& a) { a.positions.rows = 0; }, "positions.rows = 0"},
        BadInput{"ids on the wrong device",
                 [](Call& c) {
                     c.ids.assign(8, 1);
                     c.id_rows = 1;
                 },
                 [](Args& a) { a.positions.device = other_device(a.positions.device); },
                 "positions.device = " + wrong_device},
        BadInput{"negative offset", [](Call& c) { c.offset = -1; }, nullptr, "positions.offset = -1: must be >= 0"},
    };
    // Negative ids can only be checked where the ids can be read: in host memory.
    if (backend_device == rope::Device::host)
        cases.push_back(BadInput{"negative id",
                                 [](Call& c) {
                                     c.ids = {0, 1, 2, -3, 4, 5, 6, 7};
                                     c.id_rows = 1;
                                 },
                                 nullptr, "positions.ids[3] = -3: must be >= 0"});
    return cases;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("bad-input matrix: rope::Error names the field and value, no byte written", B, matrix) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    int cases = 0;
    for (bool in_place : {false, true}) {
        for (const BadInput& bad : bad_inputs(backend->device())) {
            const std::string what = bad.what;
            CAPTURE(what);
            CAPTURE(in_place);
            rope::RopeConfig config;
            config.head_dim = 64;
            testing::Call call = testing::make_call(config, rope::DType::f32, bhsd, {2, 4, 8, 64}, {2, 4, 8, 64});
            call.in_place = in_place;
            if (bad.before_staging) bad.before_staging(call);
            const testing::Call before = call;
            CHECK_THROWS_WITH_AS(testing::run(*backend, call, bad.final_args), doctest::Contains(bad.expected.c_str()),
                                 rope::Error);
            CHECK(call.q.storage == before.q.storage);
            CHECK(call.k.storage == before.k.storage);
            CHECK(call.q_out.storage == before.q_out.storage);
            CHECK(call.k_out.storage == before.k_out.storage);
            ++cases;
        }
    }
    std::cout << "bad-input matrix: " << B::name << ": " << cases << " rejected calls checked" << std::endl;
    CHECK(cases >= 80);
}
TEST_CASE_TEMPLATE_APPLY(matrix, AllBackends);

TEST_CASE("bad input to the other public entry points") {
    int cases = 0;
    auto expect = [&](const std::function<void()>& call, const char* expected) {
        CAPTURE(expected);
        CHECK_THROWS_WITH_AS(call(), doctest::Contains(expected), rope::Error);
        ++cases;
    };
    expect([] { rope::make_backend("cpu-fast"); }, "backend = cpu-fast: unknown");
    expect([] { rope::make_backend(""); }, "backend = : unknown");
    expect([] { rope::backend_info("gpu"); }, "backend = gpu: unknown");
    expect([] { rope::make_backend("cpu-naive", rope::BackendOptions{-2}); }, "threads = -2");
    expect([] { rope::parse_dtype("fp8"); }, "dtype = fp8");
    expect([] { rope::parse_style("llama"); }, "style = llama");
    rope::RopeConfig bad;
    bad.head_dim = 64;
    bad.rotary_dim = 65;
    expect([&] { rope::validate(bad); }, "rotary_dim = 65");
    expect([&] { rope::make_frequency_table(bad, 16); }, "rotary_dim = 65");
    bad.rotary_dim = 0;
    bad.base = -1;
    expect([&] { rope::make_frequency_table(bad, 16); }, "base = -1");
    // Device-resident ids cannot be read, so length-dependent scaling needs their bound.
    {
        rope::RopeConfig dynamic;
        dynamic.head_dim = 64;
        dynamic.scaling.type = rope::ScalingType::dynamic;
        dynamic.scaling.factor = 2.0;
        dynamic.scaling.original_max_position_embeddings = 256;
        float dummy = 0;
        const int64_t fake_ids = 0;
        auto view = rope::TensorView::contiguous(&dummy, rope::DType::f32, rope::Device::cuda, rope::Layout::bhsd,
                                                 {1, 1, 1, 64});
        rope::RopeArgs args = rope::RopeArgs::in_place(view, view, rope::Positions::shared(&fake_ids, 1, rope::Device::cuda));
        args.k.shape[1] = 0;  // Rotate q only.
        args.k_out = args.k;
        expect([&] { rope::make_plan(dynamic, args, rope::Device::cuda); }, "positions.max_position = 0: must be given");
        args.positions.max_position = -5;
        expect([&] { rope::make_plan(dynamic, args, rope::Device::cuda); }, "positions.max_position = -5");
        args.positions.max_position = 4096;
        CHECK(rope::make_plan(dynamic, args, rope::Device::cuda).angles.inv_freq !=
              rope::make_frequency_table(dynamic, 256).inv_freq);
    }
    std::cout << "bad-input matrix: other entry points: " << cases << " cases checked" << std::endl;
}

TEST_CASE("an empty tensor is a valid no-op on every available backend") {
    for (const rope::BackendInfo& info : rope::list_backends()) {
        if (!info.available) continue;
        CAPTURE(info.name);
        auto backend = rope::make_backend(info.name);
        rope::RopeConfig config;
        config.head_dim = 64;
        testing::Call call = testing::make_call(config, rope::DType::f32, bhsd, {0, 4, 8, 64}, {0, 4, 8, 64});
        CHECK_NOTHROW(testing::run(*backend, call));
    }
}
