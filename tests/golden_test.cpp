// Golden vectors from HuggingFace transformers (scripts/make_golden_hf.py, run
// on the H200 machine where PyTorch and transformers are installed). Every
// backend must reproduce transformers' own outputs.
#include <doctest/doctest.h>

#include <filesystem>

#include "backend_tags.hpp"
#include "golden_file.hpp"
#include "support.hpp"

namespace {

const std::filesystem::path golden_dir = ROPE_GOLDEN_DIR;

rope::Layout layout_of(const golden::File& file) {
    return file.meta.at("layout") == "bshd" ? rope::Layout::bshd : rope::Layout::bhsd;
}

// The unscaled configuration a golden file describes.
rope::RopeConfig config_of(const golden::File& file) {
    rope::RopeConfig config;
    config.head_dim = std::stoll(file.meta.at("head_dim"));
    config.rotary_dim = std::stoll(file.meta.at("rotary_dim"));
    config.base = file.number("base");
    config.style = rope::parse_style(file.meta.at("style"));
    return config;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("HuggingFace transformers golden vectors", B, golden_vectors) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const std::vector<golden::File> files = golden::load_all(golden_dir, "hf_");
    CHECK(files.size() >= 4);
    for (const golden::File& file : files) {
        CAPTURE(file.name);
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
        int64_t max_position = call.q.view.geometry().seq;
        if (file.data.count("positions")) {
            for (double p : file.data.at("positions")) {
                call.ids.push_back(int64_t(p));
                max_position = std::max(max_position, int64_t(p));
            }
            call.id_rows = std::stoll(file.meta.at("position_rows"));
        }
        testing::run(*backend, call);

        // transformers computes theta_i in float32 (pow then reciprocal) where
        // rope rounds a double result once: theta_i may differ by an ulp, which
        // moves the angle by up to position * 6e-8 radians.
        const double rel_tol = 2e-6 + 6e-8 * double(max_position);
        const double abs_tol = 1e-5 + 2.5e-7 * double(max_position);
        for (const std::string name : {"q", "k"}) {
            const auto& result = name == "q" ? call.q_out : call.k_out;
            const auto want = golden::logical_order(file.data.at(name + "_out"), layout, name == "q" ? q_shape : k_shape);
            const oracle::ErrorStats stats = oracle::compare(result.values(), want);
            INFO(name << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << rel_tol << "), max_abs = " << stats.max_abs
                      << " (tolerance " << abs_tol << ")");
            CHECK(stats.non_finite == 0);
            CHECK(stats.rel_l2 <= rel_tol);
            CHECK(stats.max_abs <= abs_tol);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(golden_vectors, AllBackends);

TEST_CASE("the float64 oracle agrees with transformers' golden vectors") {
    // Checks the oracle itself against an implementation nobody here wrote.
    const std::vector<golden::File> files = golden::load_all(golden_dir, "hf_");
    CHECK(files.size() >= 4);
    for (const golden::File& file : files) {
        CAPTURE(file.name);
        const rope::Layout layout = layout_of(file);
        const auto q_shape = golden::shape_of(file.meta.at("q_shape"));
        const testing::HostTensor q = golden::tensor_from(file.data.at("q"), layout, q_shape);
        std::vector<int64_t> ids;
        rope::Positions positions;
        if (file.data.count("positions")) {
            for (double p : file.data.at("positions")) ids.push_back(int64_t(p));
            positions = rope::Positions::per_sequence(ids.data(), std::stoll(file.meta.at("position_rows")),
                                                      q.view.geometry().seq);
        }
        const auto want = golden::logical_order(file.data.at("q_out"), layout, q_shape);
        const oracle::ErrorStats stats =
            oracle::compare(oracle::rotate(config_of(file), q.view, positions, rope::Direction::forward), want);
        INFO("rel_l2 = " << stats.rel_l2 << ", max_abs = " << stats.max_abs);
        CHECK(stats.rel_l2 <= 1e-4);
    }
}
