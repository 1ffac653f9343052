// Golden vectors from HuggingFace transformers (scripts/make_golden_hf.py, run
// on the H200 machine where PyTorch and transformers are installed). Every
// backend must reproduce transformers' own outputs.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "backend_tags.hpp"
#include "support.hpp"

namespace {

struct Golden {
    std::map<std::string, std::string> meta;
    std::map<std::string, std::vector<double>> data;
};

Golden load(const std::filesystem::path& path) {
    Golden golden;
    std::ifstream file(path);
    REQUIRE_MESSAGE(file.good(), "cannot open " << path);
    std::string line;
    while (std::getline(file, line)) {
        if (line.empty() || line[0] == '#') continue;
        const auto colon = line.find(':');
        const std::string key = line.substr(0, colon), value = line.substr(colon + 1);
        if (key == "q" || key == "k" || key == "q_out" || key == "k_out" || key == "positions") {
            std::istringstream numbers(value);
            double x;
            while (numbers >> x) golden.data[key].push_back(x);
        } else {
            golden.meta[key] = value.substr(value.find_first_not_of(' '));
        }
    }
    return golden;
}

std::array<int64_t, 4> shape_of(const std::string& text) {
    std::istringstream in(text);
    std::array<int64_t, 4> shape{};
    for (auto& n : shape) in >> n;
    return shape;
}

// Copies golden input values into a host tensor whose storage order is the layout order.
testing::HostTensor tensor_from(const std::vector<double>& values, rope::Layout layout, std::array<int64_t, 4> shape) {
    testing::HostTensor t = testing::HostTensor::make(rope::DType::f32, layout, shape);
    REQUIRE(values.size() == size_t(t.view.numel()));
    for (size_t i = 0; i < values.size(); ++i) reinterpret_cast<float*>(t.storage.data())[i] = float(values[i]);
    return t;
}

// Golden outputs are stored in layout order; the test compares in (b, h, s, d) order.
std::vector<double> logical_order(const std::vector<double>& values, rope::Layout layout, std::array<int64_t, 4> shape) {
    return tensor_from(values, layout, shape).values();
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("HuggingFace transformers golden vectors", B, golden) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(ROPE_GOLDEN_DIR)) {
        if (entry.path().extension() != ".txt") continue;
        ++files;
        CAPTURE(entry.path().filename().string());
        const Golden golden = load(entry.path());
        const rope::Layout layout = golden.meta.at("layout") == "bshd" ? rope::Layout::bshd : rope::Layout::bhsd;
        const auto q_shape = shape_of(golden.meta.at("q_shape")), k_shape = shape_of(golden.meta.at("k_shape"));

        testing::Call call;
        call.config.head_dim = std::stoll(golden.meta.at("head_dim"));
        call.config.rotary_dim = std::stoll(golden.meta.at("rotary_dim"));
        call.config.base = std::stod(golden.meta.at("base"));
        call.config.style = rope::parse_style(golden.meta.at("style"));
        call.q = tensor_from(golden.data.at("q"), layout, q_shape);
        call.k = tensor_from(golden.data.at("k"), layout, k_shape);
        call.q_out = testing::HostTensor::make(rope::DType::f32, layout, q_shape);
        call.k_out = testing::HostTensor::make(rope::DType::f32, layout, k_shape);
        call.q_out.poison();
        call.k_out.poison();
        int64_t max_position = call.q.view.geometry().seq;
        if (golden.data.count("positions")) {
            for (double p : golden.data.at("positions")) {
                call.ids.push_back(int64_t(p));
                max_position = std::max(max_position, int64_t(p));
            }
            call.id_rows = std::stoll(golden.meta.at("position_rows"));
        }
        testing::run(*backend, call);

        // transformers computes theta_i in float32 (pow then reciprocal) where
        // rope rounds a double result once: theta_i may differ by an ulp, which
        // moves the angle by up to position * 6e-8 radians.
        const double rel_tol = 2e-6 + 6e-8 * double(max_position);
        const double abs_tol = 1e-5 + 2.5e-7 * double(max_position);
        for (const char* name : {"q", "k"}) {
            const auto& result = std::string(name) == "q" ? call.q_out : call.k_out;
            const auto shape = std::string(name) == "q" ? q_shape : k_shape;
            const auto want = logical_order(golden.data.at(std::string(name) + "_out"), layout, shape);
            const oracle::ErrorStats stats = oracle::compare(result.values(), want);
            INFO(name << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << rel_tol << "), max_abs = " << stats.max_abs
                      << " (tolerance " << abs_tol << ")");
            CHECK(stats.non_finite == 0);
            CHECK(stats.rel_l2 <= rel_tol);
            CHECK(stats.max_abs <= abs_tol);
        }
    }
    CHECK(files >= 4);
}
TEST_CASE_TEMPLATE_APPLY(golden, AllBackends);

TEST_CASE("the float64 oracle agrees with transformers' golden vectors") {
    // Checks the oracle itself against an implementation nobody here wrote.
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(ROPE_GOLDEN_DIR)) {
        if (entry.path().extension() != ".txt") continue;
        ++files;
        CAPTURE(entry.path().filename().string());
        const Golden golden = load(entry.path());
        const rope::Layout layout = golden.meta.at("layout") == "bshd" ? rope::Layout::bshd : rope::Layout::bhsd;
        const auto q_shape = shape_of(golden.meta.at("q_shape"));
        rope::RopeConfig config;
        config.head_dim = std::stoll(golden.meta.at("head_dim"));
        config.rotary_dim = std::stoll(golden.meta.at("rotary_dim"));
        config.base = std::stod(golden.meta.at("base"));
        config.style = rope::parse_style(golden.meta.at("style"));
        const testing::HostTensor q = tensor_from(golden.data.at("q"), layout, q_shape);
        std::vector<int64_t> ids;
        rope::Positions positions;
        if (golden.data.count("positions")) {
            for (double p : golden.data.at("positions")) ids.push_back(int64_t(p));
            positions = rope::Positions::per_sequence(ids.data(), std::stoll(golden.meta.at("position_rows")),
                                                      q.view.geometry().seq);
        }
        const auto want = logical_order(golden.data.at("q_out"), layout, q_shape);
        const oracle::ErrorStats stats =
            oracle::compare(oracle::rotate(config, q.view, positions, rope::Direction::forward), want);
        INFO("rel_l2 = " << stats.rel_l2 << ", max_abs = " << stats.max_abs);
        CHECK(stats.rel_l2 <= 1e-4);
    }
    CHECK(files >= 4);
}
