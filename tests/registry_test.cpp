// The registry: every backend listed, unavailable ones with a reason, and the
// parameterised suite's backend list kept in step with it.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "backend_tags.hpp"
#include "rope/rope.hpp"

TEST_CASE("the registry lists the four backends in teaching order") {
    const auto backends = rope::list_backends();
    REQUIRE(backends.size() == 4);
    CHECK(backends[0].name == "cpu-naive");
    CHECK(backends[1].name == "cpu-eigen");
    CHECK(backends[2].name == "cuda-naive");
    CHECK(backends[3].name == "cuda-optimized");
    for (const auto& info : backends) {
        CAPTURE(info.name);
        CHECK(!info.description.empty());
        // An unavailable backend always says why; an available one can be created.
        if (info.available) {
            CHECK(info.reason.empty());
            CHECK(rope::make_backend(info.name)->name() == info.name);
        } else {
            CHECK(!info.reason.empty());
            CHECK_THROWS_WITH_AS(rope::make_backend(info.name), doctest::Contains(info.reason.c_str()), rope::Error);
        }
    }
    CHECK(rope::backend_info("cpu-naive").available);
}

TEST_CASE("every registered backend is in the parameterised suite") {
    std::set<std::string> tested(std::begin(tested_backend_names), std::end(tested_backend_names));
    std::set<std::string> registered;
    for (const auto& info : rope::list_backends()) registered.insert(info.name);
    CHECK(tested == registered);
}

TEST_CASE("CUDA backends on a machine without a GPU say so") {
    if (rope::cuda_device_count() > 0) {
        CHECK(rope::backend_info("cuda-optimized").available);
        return;
    }
    const auto info = rope::backend_info("cuda-naive");
    CHECK_FALSE(info.available);
    const bool explained = info.reason.find("no CUDA device") != std::string::npos ||
                           info.reason.find("built without CUDA") != std::string::npos;
    CHECK_MESSAGE(explained, info.reason);
}

namespace {
// A backend that implements nothing but declares a small limit, to test that
// apply() refuses what a backend's limits exclude (the CUDA backends bound rotary_dim).
class SmallBackend final : public rope::Backend {
public:
    std::string name() const override { return "small"; }
    rope::Device device() const override { return rope::Device::host; }
    rope::BackendLimits limits() const override { return rope::BackendLimits{4}; }
    void run(const rope::Plan&) override { ++runs; }
    int runs = 0;
};
}  // namespace

TEST_CASE("apply refuses a call beyond the backend's declared limits, before running it") {
    SmallBackend backend;
    std::vector<float> q(2 * 4 * 8, 1.0f);
    auto view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd, {1, 2, 4, 8});
    rope::TensorView no_k = view;
    no_k.shape[1] = 0;
    rope::RopeConfig config;
    config.head_dim = 8;
    CHECK_THROWS_WITH_AS(rope::apply(backend, config, rope::RopeArgs::in_place(view, no_k)),
                         doctest::Contains("rotary_dim = 8: small accepts rotary_dim <= 4"), rope::Error);
    CHECK(backend.runs == 0);
    config.rotary_dim = 4;
    rope::apply(backend, config, rope::RopeArgs::in_place(view, no_k));
    CHECK(backend.runs == 1);
}
