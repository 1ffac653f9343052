// Edge cases only the CUDA backends have, each a rope::Error naming the
// parameter with nothing written, or a call that must simply work:
//  - rotary_dim beyond what the kernel parameters hold (BackendLimits);
//  - a host view, and host memory (pageable or page-locked) labelled
//    Device::cuda, and memory of another GPU (cuda/pointer_check.hpp);
//  - a stale error left by an unrelated failed CUDA call, which the next
//    launch must not take for its own.
// (An empty call is a no-op on every backend: backend_suite_test.cpp.)
// Each test runs once per CUDA backend and is reported Skipped without a GPU.
#include <doctest/doctest.h>

#include <cstring>
#include <optional>

#include "backend_tags.hpp"
#include "cuda_helpers.hpp"
#include "support.hpp"

using testing::Call;
using testing::make_call;

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;

rope::RopeConfig config_of(int64_t head_dim, int64_t rotary_dim = 0) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    return config;
}

// Runs a call that must be refused with a message containing every one of
// `needles`, then checks that no byte of the four tensors changed (the device
// copies come back even when apply throws).
void expect_refused(rope::Backend& backend, Call call, const std::function<void(rope::RopeArgs&)>& adjust,
                    std::initializer_list<const char*> needles) {
    const Call before = call;
    std::string message;
    try {
        testing::run(backend, call, adjust);
    } catch (const rope::Error& error) {
        message = error.what();
    }
    INFO("message: " << message);
    REQUIRE_FALSE(message.empty());
    for (const char* needle : needles) CHECK_MESSAGE(message.find(needle) != std::string::npos, "lacks: " << needle);
    CHECK(call.q.storage == before.q.storage);
    CHECK(call.k.storage == before.k.storage);
    CHECK(call.q_out.storage == before.q_out.storage);
    CHECK(call.k_out.storage == before.k_out.storage);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("CUDA: rotary_dim up to 1024 runs, 1026 is refused naming rotary_dim", B, rotary_limit) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    // The largest table the kernel parameters hold: rotated correctly, nothing else written.
    Call largest = make_call(config_of(1040, 1024), rope::DType::f32, bhsd, {1, 2, 3, 1040}, {1, 1, 3, 1040});
    const Call before = largest;
    const testing::Expected want = testing::oracle_for(largest);
    testing::run(*backend, largest);
    testing::check_close(largest.q_out.values(), want.q, testing::fp32_tolerance(3), testing::fp32_max_abs(3), "q");
    testing::check_close(largest.k_out.values(), want.k, testing::fp32_tolerance(3), testing::fp32_max_abs(3), "k");
    const std::string writes = testing::unexpected_writes(before, largest);
    CHECK_MESSAGE(writes.empty(), writes);
    // One pair more: refused by rope::apply from the backend's declared limits.
    expect_refused(*backend, make_call(config_of(1040, 1026), rope::DType::f32, bhsd, {1, 2, 3, 1040}, {1, 1, 3, 1040}),
                   {}, {"rotary_dim = 1026", "accepts rotary_dim <= 1024"});
}
TEST_CASE_TEMPLATE_APPLY(rotary_limit, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("CUDA: host memory is refused, whether its view says host or cuda", B, host_memory) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    Call call = make_call(config_of(64), rope::DType::f32, bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
    void* host_q = call.q.view.data;  // The caller's own host storage (run() stages a device copy).
    SUBCASE("a host view: make_plan names q.device") {
        expect_refused(*backend, call, [&](rope::RopeArgs& a) { a.q = call.q.view; }, {"q.device = host"});
    }
    SUBCASE("pageable host memory labelled cuda, out of place: q.data") {
        expect_refused(*backend, call, [&](rope::RopeArgs& a) { a.q.data = host_q; }, {"q.data = ", "is host memory"});
    }
    SUBCASE("pageable host memory labelled cuda, in place: q.data, and the host memory is not written") {
        call.in_place = true;
        const std::vector<uint16_t> host_before = call.q.storage;
        expect_refused(*backend, call,
                       [&](rope::RopeArgs& a) {
                           a.q.data = host_q;
                           a.q_out.data = host_q;
                       },
                       {"q.data = ", "is host memory"});
        CHECK(call.q.storage == host_before);
    }
    SUBCASE("pageable host memory as an output: k_out.data") {
        Call with_host_output = call;
        void* host_k_out = with_host_output.k_out.view.data;
        const std::vector<uint16_t> host_before = with_host_output.k_out.storage;
        expect_refused(*backend, with_host_output, [&](rope::RopeArgs& a) { a.k_out.data = host_k_out; },
                       {"k_out.data = ", "is host memory"});
        CHECK(with_host_output.k_out.storage == host_before);
    }
    SUBCASE("position ids in pageable host memory labelled cuda: positions.ids") {
        call.ids = {0, 5, 9, 14};
        call.id_rows = 1;
        expect_refused(*backend, call, [&](rope::RopeArgs& a) { a.positions.ids = call.ids.data(); },
                       {"positions.ids = ", "is host memory"});
    }
    SUBCASE("page-locked host memory as q_out: q_out.data, and the pinned memory is not written") {
        testing::cuda::PinnedHostMemory pinned(call.q_out.bytes());
        std::memcpy(pinned.data(), call.q_out.storage.data(), call.q_out.bytes());
        expect_refused(*backend, call, [&](rope::RopeArgs& a) { a.q_out.data = pinned.data(); },
                       {"q_out.data = ", "page-locked host memory"});
        CHECK(std::memcmp(pinned.data(), call.q_out.storage.data(), call.q_out.bytes()) == 0);
    }
}
TEST_CASE_TEMPLATE_APPLY(host_memory, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("CUDA: memory of another GPU is refused naming the devices", B, other_gpu) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    if (rope::cuda_device_count() < 2) {
        testing::report_skip(std::string(B::name) + " with another GPU's memory",
                             "needs two CUDA devices, this machine has " + std::to_string(rope::cuda_device_count()));
        return;
    }
    const int current = testing::cuda::current_device();
    const int other = (current + 1) % rope::cuda_device_count();
    Call call = make_call(config_of(64), rope::DType::f32, bhsd, {1, 2, 4, 64}, {1, 2, 4, 64});
    std::optional<rope::Buffer> elsewhere;  // q's storage, on the other device (allocated and freed there).
    {
        testing::cuda::DeviceScope on_other(other);
        elsewhere.emplace(rope::Device::cuda, call.q.bytes());
        elsewhere->copy_from_host(call.q.storage.data());
    }
    const std::string expected = "is memory of CUDA device " + std::to_string(other) +
                                 ", but the current device is " + std::to_string(current);
    expect_refused(*backend, call, [&](rope::RopeArgs& a) { a.q.data = elsewhere->data(); },
                   {"q.data = ", expected.c_str()});
    testing::cuda::DeviceScope on_other(other);
    elsewhere.reset();
}
TEST_CASE_TEMPLATE_APPLY(other_gpu, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("CUDA: a stale error from an unrelated failed call is not blamed on the next launch", B,
                          stale_error) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    // A user's cudaMalloc of 1 PiB fails, and the user does not clear the error.
    REQUIRE(testing::cuda::fail_an_allocation());
    REQUIRE(testing::cuda::pending_error() == "cudaErrorMemoryAllocation");
    // The launch checks its own status (cudaLaunchKernelEx), not the thread's
    // last error: the call succeeds, and rotates correctly.
    Call call = make_call(config_of(64), rope::DType::f32, bhsd, {2, 4, 16, 64}, {2, 2, 16, 64});
    const testing::Expected want = testing::oracle_for(call);
    CHECK_NOTHROW(testing::run(*backend, call));
    testing::check_close(call.q_out.values(), want.q, testing::fp32_tolerance(16), testing::fp32_max_abs(16), "q");
    testing::check_close(call.k_out.values(), want.k, testing::fp32_tolerance(16), testing::fp32_max_abs(16), "k");
    // rope neither took the error for its own nor cleared it: it is still the user's.
    CHECK(testing::cuda::pending_error() == "cudaErrorMemoryAllocation");
    testing::cuda::clear_error();
}
TEST_CASE_TEMPLATE_APPLY(stale_error, CudaBackends);
