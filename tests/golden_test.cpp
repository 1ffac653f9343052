// Golden vectors from HuggingFace transformers, made by scripts in scripts/ on a
// machine where PyTorch and transformers are installed:
//  - tests/golden/hf_*.txt (scripts/make_golden_hf.py): text RoPE, half-split and interleaved;
//  - tests/golden/multiaxis/hf_*.txt (scripts/make_golden_hf.py): M-RoPE with
//    contiguous sections (Qwen2-VL), interleaved sections (Qwen3-VL) and interleaved pairs
//    (GLM-4.1V), and Qwen2-VL's axial vision RoPE, with distinct temporal/height/width rows.
// Every backend must reproduce transformers' own outputs, in the default and the
// precise angle mode, and so must the float64 oracle.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "backend_tags.hpp"
#include "golden_file.hpp"
#include "support.hpp"

namespace {

const std::filesystem::path golden_dir = ROPE_GOLDEN_DIR;
const std::filesystem::path multiaxis_dir = golden_dir / "multiaxis";

rope::Layout layout_of(const golden::File& file) { return rope::parse_layout(file.meta.at("layout")); }

// The unscaled configuration a golden file describes, with its position axes if it has several.
rope::RopeConfig config_of(const golden::File& file) {
    rope::RopeConfig config;
    config.head_dim = std::stoll(file.meta.at("head_dim"));
    config.rotary_dim = std::stoll(file.meta.at("rotary_dim"));
    config.base = file.number("base");
    config.style = rope::parse_style(file.meta.at("style"));
    if (file.has("assignment")) {
        config.multi_axis.assignment = rope::parse_axis_assignment(file.meta.at("assignment"));
        std::istringstream sections(file.meta.at("sections"));
        for (int64_t pairs; sections >> pairs;) config.multi_axis.sections.push_back(pairs);
    }
    return config;
}

// The call a golden file describes: its q and k, poisoned outputs, and its position ids
// ([position_axes, position_rows, seq]; none: 0, 1, ..., seq-1).
testing::Call call_of(const golden::File& file) {
    const rope::Layout layout = layout_of(file);
    const auto q_shape = golden::shape_of(file.meta.at("q_shape")), k_shape = golden::shape_of(file.meta.at("k_shape"));
    testing::Call call;
    call.config = config_of(file);
    call.q = golden::tensor_from(file.data.at("q"), layout, q_shape);
    call.k = golden::tensor_from(file.data.at("k"), layout, k_shape);
    call.q_out = testing::HostTensor::make(rope::DType::f32, layout, q_shape);
    call.k_out = testing::HostTensor::make(rope::DType::f32, layout, k_shape);
    call.q_out.poison();
    call.k_out.poison();
    if (file.data.count("positions")) {
        for (double p : file.data.at("positions")) call.ids.push_back(int64_t(p));
        call.id_rows = std::stoll(file.meta.at("position_rows"));
        if (file.has("position_axes")) call.id_axes = std::stoll(file.meta.at("position_axes"));
    }
    return call;
}

// Largest position + 1 of a golden call (at least its length).
int64_t max_position_of(const testing::Call& call) {
    int64_t max_position = call.q.view.geometry().seq;
    for (int64_t id : call.ids) max_position = std::max(max_position, id + 1);
    return max_position;
}

// transformers computes theta_i in float32 (pow then reciprocal) where rope
// rounds a double result once, and forms the float32 angle position * theta_i:
// theta_i may differ by an ulp, which moves the angle by up to position * 6e-8
// radians, and transformers' own angle is rounded by as much. Both bounds hold
// for rope's precise mode too, whose angle is exact: the gap is transformers' rounding.
double golden_rel_tolerance(int64_t max_position) { return 2e-6 + 6e-8 * double(max_position); }
double golden_abs_tolerance(int64_t max_position) { return 1e-5 + 2.5e-7 * double(max_position); }

// Compares a run's q_out and k_out with the file's.
void check_against_golden(const golden::File& file, const testing::Call& call) {
    const int64_t max_position = max_position_of(call);
    const double rel_tol = golden_rel_tolerance(max_position), abs_tol = golden_abs_tolerance(max_position);
    const rope::Layout layout = layout_of(file);
    for (const std::string name : {"q", "k"}) {
        const auto& result = name == "q" ? call.q_out : call.k_out;
        const auto shape = golden::shape_of(file.meta.at(name + "_shape"));
        const auto want = golden::logical_order(file.data.at(name + "_out"), layout, shape);
        const oracle::ErrorStats stats = oracle::compare(result.values(), want);
        INFO(name << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << rel_tol << "), max_abs = " << stats.max_abs
                  << " (tolerance " << abs_tol << ")");
        CHECK(stats.non_finite == 0);
        CHECK(stats.rel_l2 <= rel_tol);
        CHECK(stats.max_abs <= abs_tol);
    }
}

// The multi-axis golden files; none found is a failure, not a skip: they are part of the repository.
std::vector<golden::File> multiaxis_goldens() {
    std::vector<golden::File> all = golden::load_all(multiaxis_dir, "hf_");
    REQUIRE_MESSAGE(!all.empty(), "golden files missing: no hf_*.txt in "
                                      << multiaxis_dir.string()
                                      << " (generate them with scripts/make_golden_hf.py on a machine "
                                         "with transformers)");
    return all;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("HuggingFace transformers golden vectors", B, golden_vectors) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const std::vector<golden::File> files = golden::load_all(golden_dir, "hf_");
    CHECK(files.size() >= 4);
    for (const golden::File& file : files) {
        CAPTURE(file.name);
        testing::Call call = call_of(file);
        testing::run(*backend, call);
        check_against_golden(file, call);
    }
}
TEST_CASE_TEMPLATE_APPLY(golden_vectors, AllBackends);

TEST_CASE("the float64 oracle agrees with transformers' golden vectors") {
    // Checks the oracle itself against an implementation nobody here wrote.
    const std::vector<golden::File> files = golden::load_all(golden_dir, "hf_");
    CHECK(files.size() >= 4);
    for (const golden::File& file : files) {
        CAPTURE(file.name);
        const testing::Call call = call_of(file);
        const auto want = golden::logical_order(file.data.at("q_out"), layout_of(file),
                                                golden::shape_of(file.meta.at("q_shape")));
        const oracle::ErrorStats stats = oracle::compare(testing::oracle_for(call).q, want);
        INFO("rel_l2 = " << stats.rel_l2 << ", max_abs = " << stats.max_abs);
        CHECK(stats.rel_l2 <= 1e-4);
    }
}

TEST_CASE("multi-axis golden files cover both M-RoPE section styles, both pairings and axial RoPE") {
    std::set<std::string> forms;
    for (const golden::File& file : multiaxis_goldens()) {
        CAPTURE(file.name);
        const rope::RopeConfig config = config_of(file);
        forms.insert(std::string(rope::axis_assignment_name(config.multi_axis.assignment)) + " " +
                     std::string(rope::style_name(config.style)));
        // Distinct rows: a kernel that reads only the first one cannot match.
        const testing::Call call = call_of(file);
        const size_t row = call.ids.size() / size_t(call.id_axes);
        for (int64_t a = 1; a < call.id_axes; ++a)
            CHECK_FALSE(std::equal(call.ids.begin(), call.ids.begin() + long(row), call.ids.begin() + long(a * row)));
    }
    for (const char* form : {"mrope neox", "mrope gptj", "mrope-interleaved neox", "axial neox"}) {
        CAPTURE(form);
        CHECK(forms.count(form) == 1);
    }
}

TEST_CASE_TEMPLATE_DEFINE("HuggingFace transformers multi-axis golden vectors (M-RoPE, axial), default and precise",
                          B, multiaxis_golden) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (const golden::File& file : multiaxis_goldens()) {
        for (bool precise : {false, true}) {
            CAPTURE(file.name);
            CAPTURE(precise);
            testing::Call call = call_of(file);
            call.config.precise_angles = precise;
            testing::run(*backend, call);
            check_against_golden(file, call);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(multiaxis_golden, AllBackends);

TEST_CASE("the float64 oracle agrees with transformers' multi-axis golden vectors") {
    // The oracle's own pair-to-axis rules and per-axis theta, against transformers'.
    for (const golden::File& file : multiaxis_goldens()) {
        CAPTURE(file.name);
        const testing::Call call = call_of(file);
        const testing::Expected want = testing::oracle_for(call);
        const int64_t max_position = max_position_of(call);
        for (const std::string name : {"q", "k"}) {
            const auto got = golden::logical_order(file.data.at(name + "_out"), layout_of(file),
                                                   golden::shape_of(file.meta.at(name + "_shape")));
            const oracle::ErrorStats stats = oracle::compare(got, name == "q" ? want.q : want.k);
            INFO(name << ": rel_l2 = " << stats.rel_l2 << ", max_abs = " << stats.max_abs);
            CHECK(stats.rel_l2 <= golden_rel_tolerance(max_position));
            CHECK(stats.max_abs <= golden_abs_tolerance(max_position));
        }
    }
}
