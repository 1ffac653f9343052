// Scaled RoPE against golden vectors from HuggingFace transformers
// (scripts/make_golden_hf.py, run on the H200 machine where PyTorch and
// transformers are installed; files in tests/golden/scaling/). For every
// scaling type transformers implements, rope's frequency table must match
// transformers' inv_freq and attention factor, and every backend must
// reproduce transformers' rotated q and k.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "backend_tags.hpp"
#include "golden_file.hpp"
#include "oracle.hpp"
#include "support.hpp"

namespace {

const std::filesystem::path golden_dir = std::filesystem::path(ROPE_GOLDEN_DIR) / "scaling";

using Golden = golden::File;

// The golden files; none found is a failure, not a skip: the goldens are part of the repository.
std::vector<Golden> goldens() {
    std::vector<Golden> all = golden::load_all(golden_dir, "hf_scaling_");
    REQUIRE_MESSAGE(!all.empty(), "golden files missing: no hf_scaling_*.txt in "
                                      << golden_dir.string()
                                      << " (generate them with scripts/make_golden_hf.py on a machine with transformers)");
    return all;
}

// The RopeConfig a golden file describes, read as a model config would be.
rope::RopeConfig config_of(const Golden& golden) {
    rope::RopeConfig config;
    config.head_dim = std::stoll(golden.meta.at("head_dim"));
    config.rotary_dim = std::stoll(golden.meta.at("rotary_dim"));
    config.base = golden.number("base");
    config.style = rope::parse_style(golden.meta.at("style"));
    rope::Scaling& s = config.scaling;
    s.type = rope::parse_scaling_type(golden.meta.at("rope_type"));
    if (golden.has("factor")) s.factor = golden.number("factor");
    if (golden.has("original_max_position_embeddings"))
        s.original_max_position_embeddings = std::stoll(golden.meta.at("original_max_position_embeddings"));
    if (golden.has("given_attention_factor")) s.attention_factor = golden.number("given_attention_factor");
    if (golden.has("beta_fast")) s.beta_fast = golden.number("beta_fast");
    if (golden.has("beta_slow")) s.beta_slow = golden.number("beta_slow");
    if (golden.has("truncate")) s.truncate = golden.meta.at("truncate") == "true";
    if (golden.has("mscale")) s.mscale = golden.number("mscale");
    if (golden.has("mscale_all_dim")) s.mscale_all_dim = golden.number("mscale_all_dim");
    if (golden.has("low_freq_factor")) s.low_freq_factor = golden.number("low_freq_factor");
    if (golden.has("high_freq_factor")) s.high_freq_factor = golden.number("high_freq_factor");
    if (golden.data.count("short_factor")) s.short_factor = golden.data.at("short_factor");
    if (golden.data.count("long_factor")) s.long_factor = golden.data.at("long_factor");
    return config;
}

// The positions of a golden call: explicit ids, or position_offset + s.
struct GoldenPositions {
    std::vector<int64_t> ids;  // Empty when the offset form is used.
    int64_t rows = 0;
    int64_t offset = 0;
    int64_t max_position = 0;  // What make_plan hands make_frequency_table: largest position + 1.
};

GoldenPositions positions_of(const Golden& golden, int64_t seq) {
    GoldenPositions p;
    if (golden.data.count("positions")) {
        p.rows = std::stoll(golden.meta.at("position_rows"));
        p.max_position = seq;  // As make_plan does for host ids.
        for (double id : golden.data.at("positions")) {
            p.ids.push_back(int64_t(id));
            p.max_position = std::max(p.max_position, int64_t(id) + 1);
        }
    } else {
        p.offset = golden.has("position_offset") ? std::stoll(golden.meta.at("position_offset")) : 0;
        p.max_position = p.offset + seq;
    }
    // transformers' dynamic and longrope updates look at max(position_ids) + 1.
    if (golden.has("seq_len")) CHECK_MESSAGE(p.max_position == std::stoll(golden.meta.at("seq_len")),
                                             "the call's length differs from what transformers saw");
    return p;
}

// How far our angles may be from transformers': both compute the float32 angle
// position * theta_i from their own float32 theta_i. Where the two theta_i are
// equal the angles are bit-identical; where they differ by d_i, the exact
// products differ by at most position * d_i and each rounding adds half an ulp
// (2^-24 relative) of the angle. Returns the largest such bound over the pairs.
// The gap counted is at most the 1e-6 relative that the table test allows, so
// a wrong table cannot loosen the tolerance of the output comparison.
double angle_bound(const std::vector<float>& ours, const std::vector<double>& theirs, int64_t max_position) {
    double bound = 0.0;
    for (size_t i = 0; i < ours.size(); ++i) {
        const double gap = std::min(std::fabs(double(ours[i]) - theirs[i]), 1e-6 * theirs[i]);
        if (gap == 0.0) continue;
        const double largest_angle = double(max_position) * std::max(double(ours[i]), theirs[i]);
        bound = std::max(bound, double(max_position) * gap + std::ldexp(largest_angle, -23));
    }
    return bound;
}

// The tolerance of a rotation against transformers' golden outputs, from what
// separates us from transformers: the angle bound above, and the attention factor's
// relative gap (ours is rounded from double, theirs is a Python float that torch
// rounds to float32 too). A rotation moves a pair of norm r by at most
// r * |angle gap|, so the relative L2 error is bounded by the angle gap plus the
// attention gap; on top, 2e-6 for float32 cos/sin and products (as golden_test.cpp).
struct GoldenTolerance {
    double rel, abs;
};

GoldenTolerance golden_tolerance(const Golden& golden, const rope::RopeConfig& config, int64_t max_position) {
    const rope::FrequencyTable table = rope::make_frequency_table(config, max_position);
    const double angle = angle_bound(table.inv_freq, golden.data.at("inv_freq"), max_position);
    const double attention = golden.number("attention_factor");
    const double attention_gap = std::min(std::fabs(double(table.attention_factor) - attention) / attention, 1e-6);
    double largest_input = 0.0;
    for (const char* name : {"q", "k"})
        for (double x : golden.data.at(name)) largest_input = std::max(largest_input, std::fabs(x));
    return {2e-6 + angle + attention_gap,
            1e-5 + std::sqrt(2.0) * largest_input * attention * (angle + attention_gap + 1e-6)};
}

// The golden file's call: its config, q and k in bhsd, poisoned float32 outputs
// and its positions.
testing::Call golden_call(const Golden& golden, const std::array<int64_t, 4>& q_shape,
                          const std::array<int64_t, 4>& k_shape, const GoldenPositions& positions) {
    testing::Call call;
    call.config = config_of(golden);
    call.q = golden::tensor_from(golden.data.at("q"), rope::Layout::bhsd, q_shape);
    call.k = golden::tensor_from(golden.data.at("k"), rope::Layout::bhsd, k_shape);
    call.q_out = testing::HostTensor::make(rope::DType::f32, rope::Layout::bhsd, q_shape);
    call.k_out = testing::HostTensor::make(rope::DType::f32, rope::Layout::bhsd, k_shape);
    call.q_out.poison();
    call.k_out.poison();
    call.ids = positions.ids;
    call.id_rows = positions.rows;
    call.offset = positions.offset;
    return call;
}

}  // namespace

TEST_CASE("scaling golden files cover every scaling type") {
    const std::vector<Golden> all = goldens();
    std::set<std::string> types;
    bool dynamic_within = false, dynamic_past = false, longrope_short = false, longrope_long = false;
    for (const Golden& golden : all) {
        CAPTURE(golden.name);
        const rope::RopeConfig config = config_of(golden);
        types.insert(std::string(rope::scaling_type_name(config.scaling.type)));
        const int64_t seq = golden::shape_of(golden.meta.at("q_shape"))[2];
        const int64_t length = positions_of(golden, seq).max_position;
        const bool past = length > config.scaling.original_max_position_embeddings;
        if (config.scaling.type == rope::ScalingType::dynamic) (past ? dynamic_past : dynamic_within) = true;
        if (config.scaling.type == rope::ScalingType::longrope) (past ? longrope_long : longrope_short) = true;
    }
    for (const char* type : {"linear", "dynamic", "yarn", "llama3", "longrope"}) {
        CAPTURE(type);
        CHECK(types.count(type) == 1);
    }
    CHECK_MESSAGE(dynamic_within, "no dynamic case within original_max_position_embeddings");
    CHECK_MESSAGE(dynamic_past, "no dynamic case past original_max_position_embeddings");
    CHECK_MESSAGE(longrope_short, "no longrope case using short_factor");
    CHECK_MESSAGE(longrope_long, "no longrope case using long_factor");
}

TEST_CASE("make_frequency_table matches transformers' inv_freq and attention factor") {
    const std::vector<Golden> all = goldens();
    for (const Golden& golden : all) {
        CAPTURE(golden.name);
        const rope::RopeConfig config = config_of(golden);
        const int64_t seq = golden::shape_of(golden.meta.at("q_shape"))[2];
        const rope::FrequencyTable table = rope::make_frequency_table(config, positions_of(golden, seq).max_position);
        const std::vector<double>& want = golden.data.at("inv_freq");
        REQUIRE(table.inv_freq.size() == want.size());
        // transformers computes in float32 and rope in double rounded once, so
        // the two may differ by an ulp or two (6e-8 each): allow 1e-6 relative.
        for (size_t i = 0; i < want.size(); ++i) {
            CAPTURE(i);
            CHECK(double(table.inv_freq[i]) == doctest::Approx(want[i]).epsilon(1e-6));
        }
        CHECK(double(table.attention_factor) == doctest::Approx(golden.number("attention_factor")).epsilon(1e-6));
    }
}

TEST_CASE_TEMPLATE_DEFINE("scaled RoPE reproduces transformers' golden vectors", B, scaling_golden) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const std::vector<Golden> all = goldens();
    for (const Golden& golden : all) {
        CAPTURE(golden.name);
        REQUIRE(golden.meta.at("layout") == "bhsd");
        const auto q_shape = golden::shape_of(golden.meta.at("q_shape")), k_shape = golden::shape_of(golden.meta.at("k_shape"));
        const GoldenPositions positions = positions_of(golden, q_shape[2]);

        testing::Call call = golden_call(golden, q_shape, k_shape, positions);
        testing::run(*backend, call);

        const GoldenTolerance tolerance = golden_tolerance(golden, call.config, positions.max_position);
        const double rel_tol = tolerance.rel, abs_tol = tolerance.abs;
        for (const char* name : {"q", "k"}) {
            const bool is_q = std::string(name) == "q";
            const auto& result = is_q ? call.q_out : call.k_out;
            const oracle::ErrorStats stats = oracle::compare(result.values(), golden.data.at(std::string(name) + "_out"));
            INFO(std::string(name) << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << rel_tol << "), max_abs = " << stats.max_abs
                      << " (tolerance " << abs_tol << ")");
            CHECK(stats.non_finite == 0);
            CHECK(stats.rel_l2 <= rel_tol);
            CHECK(stats.max_abs <= abs_tol);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(scaling_golden, AllBackends);

// --- The cos/sin table of a scaled configuration (rope::make_cos_sin_cache) ---------
// A table built from a configuration and handed to a call with that configuration
// must rotate as the configuration alone does (the attention factor folded into the
// table once, never applied twice), and as transformers does.

namespace {

// The call's q and k results, byte for byte.
std::vector<uint16_t> result_bytes(const testing::Call& call) {
    std::vector<uint16_t> bytes = call.q_result().storage;
    bytes.insert(bytes.end(), call.k_result().storage.begin(), call.k_result().storage.end());
    return bytes;
}

void give_built_table(testing::Call& call, const rope::RopeConfig& config, int64_t rows, int64_t max_position) {
    call.table = rope::make_cos_sin_cache(config, rows, max_position);
    call.table_rows = rows;
    call.table_cols = config.effective_rotary_dim();
    call.table_row_stride = call.table_cols;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("cos/sin table of every scaling type rotates as its config and as transformers", B,
                          scaled_table) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const bool naive = std::string(B::name) == "cpu-naive";
    for (const Golden& golden : goldens()) {
        const auto q_shape = golden::shape_of(golden.meta.at("q_shape")), k_shape = golden::shape_of(golden.meta.at("k_shape"));
        const GoldenPositions positions = positions_of(golden, q_shape[2]);
        for (bool precise : {false, true})
            for (rope::Direction direction : {rope::Direction::forward, rope::Direction::inverse}) {
                CAPTURE(golden.name);
                CAPTURE(precise);
                CAPTURE(direction == rope::Direction::inverse);
                testing::Call alone = golden_call(golden, q_shape, k_shape, positions);
                alone.config.precise_angles = precise;
                alone.direction = direction;
                testing::Call with_table = alone;
                // The table covers exactly the call's positions; dynamic and longrope get the call's length.
                give_built_table(with_table, alone.config, positions.max_position, positions.max_position);
                testing::run(*backend, alone);
                testing::run(*backend, with_table);

                // The same angle, cos and sin, attention factor and rotation: bit for bit on cpu-naive,
                // which computes cos and sin with std::cos / std::sin as the builder does; elsewhere
                // within the backend's own cos/sin accuracy (a few float32 ulps).
                if (naive) {
                    CHECK(result_bytes(with_table) == result_bytes(alone));
                } else {
                    testing::check_close(with_table.q_result().values(), alone.q_result().values(),
                                         testing::agree_rel_l2, testing::agree_max_abs, "q: table vs config");
                    testing::check_close(with_table.k_result().values(), alone.k_result().values(),
                                         testing::agree_rel_l2, testing::agree_max_abs, "k: table vs config");
                }

                // The float64 oracle reading the same table (it shares no code with rope's
                // rotation): only float32 products and sums separate them.
                rope::RopeConfig unscaled = alone.config;
                unscaled.scaling = {};
                unscaled.precise_angles = false;
                for (bool is_q : {true, false}) {
                    const testing::HostTensor& in = is_q ? alone.q : alone.k;
                    const testing::HostTensor& got = is_q ? with_table.q_result() : with_table.k_result();
                    testing::check_close(got.values(),
                                         oracle::rotate(unscaled, in.view, with_table.positions(), direction,
                                                        with_table.cos_sin_cache()),
                                         1e-6, 1e-5, is_q ? "q: table vs oracle reading it" : "k: table vs oracle reading it");
                }
                // The float64 oracle computing linear (and default) frequencies itself.
                if (alone.config.scaling.type == rope::ScalingType::linear)
                    for (bool is_q : {true, false}) {
                        const testing::HostTensor& in = is_q ? alone.q : alone.k;
                        const testing::HostTensor& got = is_q ? with_table.q_result() : with_table.k_result();
                        const testing::Tolerance tolerance = testing::oracle_tolerance(rope::DType::f32, positions.max_position);
                        testing::check_close(got.values(), oracle::rotate(alone.config, in.view, alone.positions(), direction),
                                             tolerance.rel_l2, tolerance.max_abs, "table vs oracle's linear scaling");
                    }
                // transformers' own rotation (forward only: the goldens hold that).
                if (direction == rope::Direction::forward) {
                    const GoldenTolerance tolerance = golden_tolerance(golden, alone.config, positions.max_position);
                    for (const char* name : {"q", "k"}) {
                        const testing::HostTensor& got = std::string(name) == "q" ? with_table.q_out : with_table.k_out;
                        const oracle::ErrorStats stats =
                            oracle::compare(got.values(), golden.data.at(std::string(name) + "_out"));
                        INFO(name << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << tolerance.rel
                                  << "), max_abs = " << stats.max_abs << " (tolerance " << tolerance.abs << ")");
                        CHECK(stats.non_finite == 0);
                        CHECK(stats.rel_l2 <= tolerance.rel);
                        CHECK(stats.max_abs <= tolerance.abs);
                    }
                }
            }
    }
}
TEST_CASE_TEMPLATE_APPLY(scaled_table, AllBackends);

TEST_CASE("cos/sin table of a multi-axis config: each pair reads its own axis's row") {
    auto backend = testing::backend_or_skip("cpu-naive");
    if (!backend) return;
    rope::RopeConfig mrope{.head_dim = 64, .rotary_dim = 32};
    mrope.scaling = {.type = rope::ScalingType::yarn, .factor = 4.0, .original_max_position_embeddings = 64};
    mrope.multi_axis = {rope::AxisAssignment::mrope_contiguous, {4, 6, 6}};
    rope::RopeConfig interleaved = mrope;
    interleaved.multi_axis = {rope::AxisAssignment::mrope_interleaved, {8, 4, 4}};
    interleaved.style = rope::Style::interleaved;
    rope::RopeConfig axial{.head_dim = 32, .multi_axis = {rope::AxisAssignment::axial, {8, 8}}};
    for (const rope::RopeConfig& config : {mrope, interleaved, axial}) {
        CAPTURE(rope::axis_assignment_name(config.multi_axis.assignment));
        const int64_t seq = 24, rows = 300, axes = config.multi_axis.axes();
        testing::Call alone =
            testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {2, 3, seq, config.head_dim},
                               {2, 1, seq, config.head_dim});
        std::uniform_int_distribution<int64_t> id(0, rows - 1);
        alone.id_axes = axes;
        alone.id_rows = 2;
        alone.ids.resize(size_t(axes * 2 * seq));
        for (int64_t& v : alone.ids) v = id(testing::rng());
        testing::Call with_table = alone;
        give_built_table(with_table, config, rows, 0);
        testing::run(*backend, alone);
        testing::run(*backend, with_table);
        CHECK(result_bytes(with_table) == result_bytes(alone));
    }
}

TEST_CASE("cos/sin table: make_cos_sin_cache refuses bad input, naming the parameter") {
    const rope::RopeConfig plain{.head_dim = 64};
    rope::RopeConfig dynamic = plain;
    dynamic.scaling = {.type = rope::ScalingType::dynamic, .factor = 2.0, .original_max_position_embeddings = 128};
    rope::RopeConfig longrope = plain;
    longrope.scaling = {.type = rope::ScalingType::longrope,
                        .factor = 2.0,
                        .original_max_position_embeddings = 128,
                        .short_factor = std::vector<double>(32, 1.0),
                        .long_factor = std::vector<double>(32, 2.0)};
    rope::RopeConfig tiny_base = plain;
    tiny_base.base = 1e-45;
    rope::RopeConfig odd = plain;
    odd.rotary_dim = 33;
    const struct {
        const char* what;
        rope::RopeConfig config;
        int64_t rows, max_position;
        std::string expected;
    } cases[] = {
        {"no rows", plain, 0, 0, "rows = 0: must be > 0"},
        {"negative rows", plain, -5, 0, "rows = -5: must be > 0"},
        {"absurd rows", plain, int64_t(1) << 40, 0, "rows = 1099511627776: times rotary_dim = 64 is more than 2^31"},
        {"rows * rotary_dim past the bound", plain, (int64_t(1) << 31) / 64 + 1, 0, "rows = 33554433: times rotary_dim"},
        {"negative max_position", plain, 16, -1, "max_position = -1: must be >= 0"},
        {"dynamic without its length", dynamic, 16, 0, "max_position = 0: must be given (> 0) with scaling type dynamic"},
        {"longrope without its length", longrope, 16, 0, "max_position = 0: must be given (> 0) with scaling type longrope"},
        {"invalid config", odd, 16, 0, "rotary_dim = 33"},
        {"theta past float32", tiny_base, 16, 0, "is not finite in float32"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.what);
        try {
            (void)rope::make_cos_sin_cache(c.config, c.rows, c.max_position);
            FAIL("no rope::Error");
        } catch (const rope::Error& error) {
            CHECK_MESSAGE(std::string(error.what()).find(c.expected) != std::string::npos, error.what());
        }
    }
    // Dynamic and longrope with their length are accepted; the default type ignores max_position.
    CHECK(rope::make_cos_sin_cache(dynamic, 16, 300).size() == 16 * 64);
    CHECK(rope::make_cos_sin_cache(longrope, 16, 300).size() == 16 * 64);
    CHECK(rope::make_cos_sin_cache(plain, 16, 5).size() == 16 * 64);
}
