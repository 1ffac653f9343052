// DeepSeek's multi-head latent attention (V2, V3, R1): a rotary window inside the head
// (RopeConfig::rotary_offset), k_pe as one head shared by every q head, HF's de-interleaved
// output order (Style::interleaved_to_half) and deepseek_yarn with its softmax multiplier.
// Every backend against the float64 oracle (tests/oracle.cpp, which implements the window, the
// order and deepseek_yarn on its own) and against cpu-naive, plus the exact properties: the
// features outside the window keep their bits, HF's order is a fixed permutation of GPT-J's.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>

#include "backend_tags.hpp"
#include "support.hpp"

using testing::Call;
using testing::make_call;

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;
constexpr rope::Layout bshd = rope::Layout::bshd;
constexpr rope::Style all_styles[] = {rope::Style::half_split, rope::Style::interleaved,
                                      rope::Style::interleaved_to_half, rope::Style::half_to_interleaved};

// DeepSeek-V3's q head: [nope 128 | pe 64], the window at 128.
rope::RopeConfig mla_config(rope::Style style, int64_t head_dim = 192, int64_t offset = 128, int64_t rotary_dim = 64) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_offset = offset;
    config.rotary_dim = rotary_dim;
    config.style = style;
    return config;
}

// Shapes in layout order for `heads` heads of `head_dim` features.
std::array<int64_t, 4> shape_of(rope::Layout layout, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
    return layout == bhsd ? std::array<int64_t, 4>{batch, heads, seq, head_dim}
                          : std::array<int64_t, 4>{batch, seq, heads, head_dim};
}

// Sizes of a view as (batch, heads, seq, head_dim), whatever its layout.
std::array<int64_t, 4> sizes(const rope::TensorView& view) {
    const rope::Geometry g = view.geometry();
    return {g.batch, g.heads, g.seq, g.head_dim};
}

// Calls `check(b, h, s, d)` for every feature of a view outside [first, first + width).
void outside_window(const rope::TensorView& view, int64_t first, int64_t width,
                    const std::function<void(long, long, long, long)>& check) {
    const auto n = sizes(view);
    for (long b = 0; b < n[0]; ++b)
        for (long h = 0; h < n[1]; ++h)
            for (long s = 0; s < n[2]; ++s)
                for (long d = 0; d < n[3]; ++d)
                    if (d < first || d >= first + width) check(b, h, s, d);
}

// Counts features outside the window whose result is not the input's value. Every input is
// finite and non-zero (fill_random), and a float32, fp16 or bf16 converts to double
// injectively, so equal doubles are equal bits; a poisoned (NaN) output never compares equal.
long changed_outside_window(const Call& input, const Call& result, int64_t first, int64_t width) {
    long changed = 0;
    for (const auto& operands : {std::pair{&input.q, &result.q_result()}, std::pair{&input.k, &result.k_result()}}) {
        const auto* in = operands.first;  // Named: a lambda cannot capture a structured binding under clang's OpenMP.
        const auto* out = operands.second;
        outside_window(in->view, first, width, [&](long b, long h, long s, long d) {
            if (oracle::read(out->view, b, h, s, d) != oracle::read(in->view, b, h, s, d)) ++changed;
        });
    }
    return changed;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("rotary window: the window matches the oracle, every other feature keeps its bits", B,
                          window_bits) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    struct Window {
        int64_t head_dim, offset, rotary_dim;
    };
    // DeepSeek's [128 | 64]; a window with features on both sides; an odd-sized start that no
    // 16-byte vector fits; the window at 0 (today's partial rotary).
    const Window windows[] = {{192, 128, 64}, {96, 16, 48}, {70, 6, 24}, {128, 0, 64}};
    for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
        for (rope::Style style : all_styles) {
            for (rope::Layout layout : {bhsd, bshd}) {
                for (const Window& w : windows) {
                    for (bool in_place : {false, true}) {
                        CAPTURE(rope::dtype_name(dtype));
                        CAPTURE(rope::style_name(style));
                        CAPTURE(rope::layout_name(layout));
                        CAPTURE(w.head_dim);
                        CAPTURE(w.offset);
                        CAPTURE(in_place);
                        // q with 4 heads, k with one shared by all (DeepSeek's k_pe).
                        Call call = make_call(mla_config(style, w.head_dim, w.offset, w.rotary_dim), dtype, layout,
                                              shape_of(layout, 2, 4, 11, w.head_dim),
                                              shape_of(layout, 2, 1, 11, w.head_dim));
                        call.in_place = in_place;
                        call.offset = 5;
                        const testing::Tolerance tolerance = testing::oracle_tolerance(dtype, 16);
                        testing::check_call(*backend, call, tolerance.rel_l2, tolerance.max_abs);

                        const Call input = call;
                        testing::run(*backend, call);
                        CHECK(changed_outside_window(input, call, w.offset, w.rotary_dim) == 0);
                    }
                }
            }
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(window_bits, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rotary window: the same as partial rotary on a view that starts at the window", B,
                          window_as_view) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::Style style : all_styles) {
        for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
            CAPTURE(rope::style_name(style));
            CAPTURE(rope::dtype_name(dtype));
            Call windowed = make_call(mla_config(style), dtype, bshd, {2, 9, 16, 192}, {2, 9, 1, 192});
            windowed.in_place = true;
            // The same memory seen from feature 128 on, 64 features wide: today's rotary of a 64-wide head.
            Call shifted = windowed;
            shifted.config = mla_config(style, 64, 0, 64);
            for (testing::HostTensor* t : {&shifted.q, &shifted.k}) {
                const int64_t bytes = 128 * t->view.strides[3] * rope::dtype_size(dtype);
                t->view.data = static_cast<char*>(t->view.data) + bytes;
                t->offset_units += bytes / 2;  // Where a device copy of the tensor points its view (support.hpp).
                t->view.shape[3] = 64;
            }
            testing::run(*backend, windowed);
            testing::run(*backend, shifted);
            CHECK(windowed.q.storage == shifted.q.storage);  // Bit for bit, padding and NoPE features included.
            CHECK(windowed.k.storage == shifted.k.storage);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(window_as_view, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("HF's DeepSeek order is GPT-J's output, evens then odds, bit for bit", B, hf_permutation) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16, rope::DType::f16}) {
        for (bool in_place : {false, true}) {
            CAPTURE(rope::dtype_name(dtype));
            CAPTURE(in_place);
            Call gptj = make_call(mla_config(rope::Style::interleaved), dtype, bhsd, {1, 8, 13, 192}, {1, 1, 13, 192},
                                  /*pad=*/3);
            gptj.in_place = in_place;
            gptj.offset = 1000;
            Call hf = gptj;
            hf.config.style = rope::Style::interleaved_to_half;
            testing::run(*backend, gptj);
            testing::run(*backend, hf);
            long mismatches = 0;
            for (const auto& [a, b] : {std::pair{&gptj.q_result(), &hf.q_result()}, std::pair{&gptj.k_result(), &hf.k_result()}}) {
                const auto n = sizes(a->view);
                for (long bb = 0; bb < n[0]; ++bb)
                    for (long h = 0; h < n[1]; ++h)
                        for (long s = 0; s < n[2]; ++s)
                            for (long j = 0; j < 32; ++j) {
                                // Pair j: GPT-J leaves it at (128 + 2j, 129 + 2j), HF writes (128 + j, 160 + j).
                                mismatches += oracle::read(b->view, bb, h, s, 128 + j) != oracle::read(a->view, bb, h, s, 128 + 2 * j);
                                mismatches += oracle::read(b->view, bb, h, s, 160 + j) != oracle::read(a->view, bb, h, s, 129 + 2 * j);
                            }
            }
            CHECK(mismatches == 0);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(hf_permutation, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("the reordering styles' inverse is the transpose: it undoes the forward, in place too", B,
                          reorder_inverse) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::Style style : {rope::Style::interleaved_to_half, rope::Style::half_to_interleaved}) {
        for (bool in_place : {false, true}) {
            CAPTURE(rope::style_name(style));
            CAPTURE(in_place);
            // Against the oracle, which reads where the forward wrote.
            Call call = make_call(mla_config(style), rope::DType::f32, bshd, {2, 7, 4, 192}, {2, 7, 1, 192});
            call.in_place = in_place;
            call.offset = 30;
            call.direction = rope::Direction::inverse;
            testing::check_call(*backend, call, testing::fp32_tolerance(37), testing::fp32_max_abs(37));
            // Forward, then inverse of its result: the input back, to float32 rounding.
            Call forward = make_call(mla_config(style), rope::DType::f32, bshd, {2, 7, 4, 192}, {2, 7, 1, 192});
            forward.in_place = true;
            forward.offset = 30;
            const std::vector<double> input = forward.q.values();
            testing::run(*backend, forward);
            CHECK(forward.q.values() != input);  // It did turn.
            forward.direction = rope::Direction::inverse;
            testing::run(*backend, forward);
            testing::check_close(forward.q.values(), input, 2e-7, 2e-6, "q after forward and inverse");
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(reorder_inverse, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rerotate keeps a reordering style's layout: cached keys in HF's order at new positions", B,
                          window_rerotate) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    auto naive = rope::make_backend("cpu-naive");
    for (rope::Style style : {rope::Style::interleaved_to_half, rope::Style::half_to_interleaved}) {
        for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
            CAPTURE(rope::style_name(style));
            CAPTURE(rope::dtype_name(dtype));
            const rope::RopeConfig config = mla_config(style);
            // Raw keys (k: one head of 192), cached as a model leaves them: rotated at 100, 101, ...
            Call cached = make_call(config, dtype, bshd, {2, 9, 1, 192}, {2, 9, 1, 192});
            cached.in_place = true;
            Call want = cached;
            const testing::HostTensor raw = cached.k;
            cached.offset = 100;
            testing::run(*naive, cached);
            want.offset = 7;  // The raw keys rotated at 7, 8, ...: what the re-rotation must give.
            testing::run(*naive, want);
            const rope::Positions from = rope::Positions::starting_at(100), to = rope::Positions::starting_at(7);
            if (backend->device() == rope::Device::host) {
                rope::rerotate(*backend, config, rope::RerotateArgs::in_place(cached.k.view, from, to));
            } else {
                const testing::DeviceCall staged(cached);
                rope::rerotate(*backend, config, rope::RerotateArgs::in_place(staged.args.k, from, to));
                staged.copy_back(cached);
            }
            const testing::Tolerance one = testing::oracle_tolerance(dtype, 110);
            testing::check_close(cached.k.values(), want.k.values(), 2 * one.rel_l2, 2 * one.max_abs,
                                 "re-rotated keys vs raw keys rotated at to");
            const Call raw_call = [&] { Call c = cached; c.k = raw; return c; }();  // q: compared with itself.
            CHECK(changed_outside_window(raw_call, cached, 128, 64) == 0);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(window_rerotate, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("deepseek_yarn: cos/sin magnitude with mscale != mscale_all_dim, against the oracle", B,
                          deepseek_yarn_backends) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::Style style : all_styles) {
        CAPTURE(rope::style_name(style));
        rope::RopeConfig config = mla_config(style);
        // DeepSeek-V3's frequencies; mscale 0.707 against mscale_all_dim 1 gives a magnitude of about 0.88.
        config.scaling = {.type = rope::ScalingType::deepseek_yarn, .factor = 40.0,
                          .original_max_position_embeddings = 4096, .mscale = 0.707, .mscale_all_dim = 1.0};
        Call call = make_call(config, rope::DType::f32, bshd, {1, 7, 8, 192}, {1, 7, 1, 192});
        call.offset = 4000;
        testing::check_call(*backend, call, testing::fp32_tolerance(4007), testing::fp32_max_abs(4007));
        call.direction = rope::Direction::inverse;
        testing::check_call(*backend, call, testing::fp32_tolerance(4007), testing::fp32_max_abs(4007));
    }
}
TEST_CASE_TEMPLATE_APPLY(deepseek_yarn_backends, AllBackends);

TEST_CASE("deepseek_yarn: yarn's frequencies, vLLM's magnitude, and the softmax multiplier") {
    rope::RopeConfig config;
    config.head_dim = 64;
    config.scaling = {.type = rope::ScalingType::deepseek_yarn, .factor = 40.0,
                      .original_max_position_embeddings = 4096, .mscale = 1.0, .mscale_all_dim = 1.0};
    const auto mscale = [](double factor, double m) { return 0.1 * m * std::log(factor) + 1.0; };

    SUBCASE("DeepSeek-V3's config: cos/sin magnitude 1, softmax multiplier (0.1 ln 40 + 1)^2") {
        CHECK(rope::make_frequency_table(config, 0).attention_factor == 1.0f);
        CHECK(rope::softmax_scale_multiplier(config.scaling) == doctest::Approx(1.8738).epsilon(1e-4));
        CHECK(rope::softmax_scale_multiplier(config.scaling) == doctest::Approx(std::pow(mscale(40, 1), 2)));
    }
    SUBCASE("mscale != mscale_all_dim: the ratio on cos/sin, mscale_all_dim alone in the multiplier") {
        config.scaling.mscale = 0.5;
        config.scaling.mscale_all_dim = 2.0;
        CHECK(rope::make_frequency_table(config, 0).attention_factor ==
              doctest::Approx(mscale(40, 0.5) / mscale(40, 2.0)).epsilon(1e-7));
        CHECK(rope::softmax_scale_multiplier(config.scaling) == doctest::Approx(std::pow(mscale(40, 2.0), 2)));
    }
    SUBCASE("the frequencies are yarn's; a zero mscale is a term of 1 (vLLM), where yarn falls back to its default") {
        rope::RopeConfig yarn = config;
        yarn.scaling.type = rope::ScalingType::yarn;
        CHECK(rope::make_frequency_table(config, 0).inv_freq == rope::make_frequency_table(yarn, 0).inv_freq);
        config.scaling.mscale = yarn.scaling.mscale = 0.0;
        CHECK(rope::make_frequency_table(config, 0).attention_factor ==
              doctest::Approx(1.0 / mscale(40, 1.0)).epsilon(1e-7));
        CHECK(rope::make_frequency_table(yarn, 0).attention_factor == doctest::Approx(mscale(40, 1.0)).epsilon(1e-7));
    }
    SUBCASE("the multiplier is 1 where HF's attention leaves its scale alone") {
        config.scaling.mscale_all_dim = 0.0;
        CHECK(rope::softmax_scale_multiplier(config.scaling) == 1.0);
        config.scaling.mscale_all_dim = 1.0;
        config.scaling.factor = 1.0;
        CHECK(rope::softmax_scale_multiplier(config.scaling) == 1.0);
        CHECK(rope::softmax_scale_multiplier(rope::Scaling{}) == 1.0);
        CHECK(rope::softmax_scale_multiplier(rope::Scaling{.type = rope::ScalingType::linear, .factor = 4.0}) == 1.0);
    }
    SUBCASE("names parse and print") {
        CHECK(rope::scaling_type_name(rope::ScalingType::deepseek_yarn) == "deepseek_yarn");
        CHECK(rope::parse_scaling_type("deepseek_yarn") == rope::ScalingType::deepseek_yarn);
        CHECK(rope::style_name(rope::Style::interleaved_to_half) == "interleaved_to_half");
        CHECK(rope::parse_style("interleaved_to_half") == rope::Style::interleaved_to_half);
        CHECK(rope::parse_style("interleaved-to-half") == rope::Style::interleaved_to_half);
        CHECK(rope::style_name(rope::Style::half_to_interleaved) == "half_to_interleaved");
        CHECK(rope::parse_style("half-to-interleaved") == rope::Style::half_to_interleaved);
    }
}

TEST_CASE("rotary window and deepseek_yarn: bad input names the parameter and its value, and writes nothing") {
    auto expect = [](const std::function<void()>& call, const char* expected) {
        CAPTURE(expected);
        CHECK_THROWS_WITH_AS(call(), doctest::Contains(expected), rope::Error);
    };
    rope::RopeConfig config = mla_config(rope::Style::interleaved_to_half);
    config.rotary_offset = -1;
    expect([&] { rope::validate(config); }, "rotary_offset = -1: must be >= 0");
    config.rotary_offset = 130;
    expect([&] { rope::validate(config); }, "rotary_offset = 130: plus rotary_dim = 64 must not exceed head_dim = 192");
    config.rotary_offset = 192;
    expect([&] { rope::validate(config); }, "rotary_offset = 192: must be < head_dim = 192");
    config.rotary_offset = INT64_MAX;
    expect([&] { rope::validate(config); }, "rotary_offset = 9223372036854775807");
    config.rotary_offset = 128;
    config.rotary_dim = 66;
    expect([&] { rope::validate(config); }, "rotary_offset = 128: plus rotary_dim = 66");
    config.rotary_dim = 0;  // The rest of the head: 64 features.
    CHECK_NOTHROW(rope::validate(config));
    CHECK(config.effective_rotary_dim() == 64);

    rope::RopeConfig yarn = mla_config(rope::Style::interleaved);
    yarn.scaling = {.type = rope::ScalingType::deepseek_yarn, .factor = 40.0, .original_max_position_embeddings = 4096};
    yarn.scaling.mscale = -1.0;
    expect([&] { rope::validate(yarn); }, "scaling.mscale = -1: must be >= 0");
    yarn.scaling.mscale = 1.0;
    yarn.scaling.mscale_all_dim = NAN;
    expect([&] { rope::validate(yarn); }, "scaling.mscale_all_dim = nan: must be finite");
    expect([&] { rope::softmax_scale_multiplier(yarn.scaling); }, "scaling.mscale_all_dim = nan");
    yarn.scaling.mscale_all_dim = 1.0;
    yarn.scaling.attention_factor = 1.5;
    expect([&] { rope::validate(yarn); }, "scaling.attention_factor = 1.5: is only read by yarn and longrope");
    yarn.scaling.attention_factor.reset();
    yarn.scaling.factor = 0.0;
    expect([&] { rope::validate(yarn); }, "scaling.factor = 0: must be > 0");
    expect([&] { rope::softmax_scale_multiplier(yarn.scaling); }, "scaling.factor = 0");
    yarn.scaling.factor = 40.0;
    yarn.scaling.beta_fast = 0.5;
    expect([&] { rope::validate(yarn); }, "scaling.beta_fast = 0.5: must be > beta_slow = 1");
    yarn.scaling.beta_fast = 32.0;
    yarn.base = 1.0;
    expect([&] { rope::validate(yarn); }, "base = 1: must not be 1 with deepseek_yarn scaling");
    expect([] { rope::parse_scaling_type("deepseek"); }, "rope_type = deepseek: expected default, linear, dynamic, yarn, "
                                                         "llama3, longrope or deepseek_yarn");

    // A refused call writes nothing.
    auto naive = rope::make_backend("cpu-naive");
    Call call = make_call(mla_config(rope::Style::interleaved_to_half), rope::DType::f32, bhsd, {1, 2, 3, 192},
                          {1, 1, 3, 192});
    call.config.rotary_offset = 129;
    const Call before = call;
    expect([&] { testing::run(*naive, call); }, "rotary_offset = 129");
    CHECK(call.q_out.storage == before.q_out.storage);
    CHECK(call.q.storage == before.q.storage);
}
