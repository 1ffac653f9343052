// Concurrency: the threads part of docs/api.md's section "Concurrency, streams and CUDA graphs", tested.
//
//   1. One backend object, many threads calling rope::apply on it at once.
//   2. One backend object per thread, all calling at once.
//   3. The registry functions (list_backends, backend_info, make_backend) from
//      many threads at once.
//   4. The frequency tables rope::apply keeps per configuration, with more
//      configurations than it holds, from many threads at once.
//
// Each thread runs its own mix of calls (shapes, dtypes, layouts and every
// position form: offset, ids, per-sequence ids, packed sequences, a
// context-parallel shard, M-RoPE and axial multi-axis ids, a caller's cos/sin
// table, scaling with precise angles, one call large enough for cpu-eigen to
// use two OpenMP threads), and every result is compared with cpu-naive's
// result for the same call, computed on one thread before any thread starts.
// Races that give the right numbers by luck are what ThreadSanitizer is for:
// the tsan preset runs this file (and the rest of the suite) under it.
#include <doctest/doctest.h>

#include <cmath>
#include <latch>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend_tags.hpp"
#include "rope/detail/plan.hpp"
#include "support.hpp"

namespace {

constexpr int kThreads = 8;  // more than this machine's cores: calls really do overlap
constexpr int kRounds = 3;   // each thread runs its mix this many times

// ---------------------------------------------------------------------------
// The calls
// ---------------------------------------------------------------------------

// One call of the mix (testing::Call carries every position form and the
// table, and stages them on the device for a CUDA backend), and its expected result.
struct Job {
    std::string name;
    testing::Call call;
    testing::Call expected;  // cpu-naive's result, computed on one thread beforehand
};

std::vector<int64_t> random_ids(int64_t count, int64_t largest) {
    std::vector<int64_t> ids;
    std::uniform_int_distribution<int64_t> id(0, largest);
    for (int64_t i = 0; i < count; ++i) ids.push_back(id(testing::rng()));
    return ids;
}

rope::RopeConfig config_of(int64_t head_dim, double base, rope::Style style = rope::Style::half_split) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.base = base;
    config.style = style;
    return config;
}

// The mix: one call of each kind. testing::rng() is not thread-safe, so every
// call is drawn here, before any thread starts.
std::vector<Job> make_jobs() {
    using rope::DType;
    using rope::Layout;
    std::vector<Job> jobs;
    auto add = [&](std::string name, testing::Call call) {
        jobs.push_back(Job{std::move(name), std::move(call), {}});
        return &jobs.back().call;
    };
    {  // A decode step of a grouped-query model: one token, KV cache of 4095, dynamic NTK past its original context.
        rope::RopeConfig config = config_of(128, 500000.0);
        config.scaling = {.type = rope::ScalingType::dynamic, .factor = 2.0, .original_max_position_embeddings = 2048};
        testing::Call* call = add("decode, bf16, dynamic NTK, in place",
                                  testing::make_call(config, DType::bf16, Layout::bshd, {4, 1, 8, 128}, {4, 1, 2, 128}));
        call->offset = 4095;
        call->in_place = true;
    }
    {  // A prompt with shared ids, partial rotary, interleaved pairs.
        rope::RopeConfig config = config_of(64, 10000.0, rope::Style::interleaved);
        config.rotary_dim = 32;
        testing::Call* call = add("shared ids, fp32, partial rotary, interleaved",
                                  testing::make_call(config, DType::f32, Layout::bhsd, {2, 4, 16, 64}, {2, 2, 16, 64}));
        call->ids = random_ids(16, 2000);
        call->id_rows = 1;
    }
    {  // Per-sequence ids, backward pass, padded rows.
        testing::Call* call = add("per-sequence ids, fp16, inverse, padded",
                                  testing::make_call(config_of(64, 10000.0), DType::f16, Layout::bshd, {3, 12, 2, 64},
                                                     {3, 12, 2, 64}, /*pad=*/3));
        call->ids = random_ids(3 * 12, 5000);
        call->id_rows = 3;
        call->direction = rope::Direction::inverse;
    }
    {  // Packed (varlen) sequences with starts of their own.
        testing::Call* call = add("packed sequences, fp32, thd, starts",
                                  testing::make_packed_call(config_of(64, 10000.0), DType::f32, {5, 7, 8}, 4, 2));
        call->starts = {0, 100, 7};
    }
    {  // Rank 1 of a context-parallel group of 2: chunks 1 and 2 of each sequence.
        testing::Call* call = add("context-parallel shard 1 of 2, bf16, thd",
                                  testing::make_packed_call(config_of(32, 10000.0), DType::bf16, {6, 10}, 2, 1));
        call->cp_size = 2;
        call->cp_rank = 1;
    }
    {  // Qwen3-VL's interleaved M-RoPE: distinct temporal, height and width rows.
        rope::RopeConfig config = config_of(128, 5000000.0);
        config.multi_axis = {rope::AxisAssignment::mrope_interleaved, {24, 20, 20}};
        testing::Call* call = add("M-RoPE interleaved, bf16, 3 axis rows",
                                  testing::make_call(config, DType::bf16, Layout::bshd, {1, 24, 4, 128}, {1, 24, 2, 128}));
        call->ids = random_ids(3 * 24, 64);
        call->id_axes = 3;
        call->id_rows = 1;
    }
    {  // A caller's cos/sin table holding values no formula would produce.
        testing::Call* call = add("caller's cos/sin table, fp32",
                                  testing::make_call(config_of(64, 10000.0), DType::f32, Layout::bhsd, {2, 3, 10, 64},
                                                     {2, 3, 10, 64}));
        call->table_rows = 64;
        call->table_cols = 64;
        call->table_row_stride = 64;
        std::uniform_real_distribution<float> entry(-1.0f, 1.0f);
        for (int64_t i = 0; i < call->table_rows * 64; ++i) call->table.push_back(entry(testing::rng()));
        call->offset = 20;
    }
    {  // YaRN with precise angles, large enough (2 MiB moved) for cpu-eigen to use two OpenMP threads.
        rope::RopeConfig config = config_of(128, 1000000.0);
        config.scaling = {.type = rope::ScalingType::yarn, .factor = 4.0, .original_max_position_embeddings = 4096};
        config.precise_angles = true;
        testing::Call* call = add("yarn, precise angles, fp32, two OpenMP threads",
                                  testing::make_call(config, DType::f32, Layout::bhsd, {1, 8, 128, 128}, {1, 8, 128, 128}));
        call->offset = 30000;
    }
    {  // Axial RoPE over a 2-D grid of patches (vision), coordinates per sequence.
        rope::RopeConfig config = config_of(80, 10000.0);
        config.multi_axis = {rope::AxisAssignment::axial, {20, 20}};
        testing::Call* call = add("axial 2-D, fp16, per-sequence coordinates",
                                  testing::make_call(config, DType::f16, Layout::bshd, {2, 16, 2, 80}, {2, 16, 2, 80}));
        call->ids = random_ids(2 * 2 * 16, 15);
        call->id_axes = 2;
        call->id_rows = 2;
    }
    // The reference: cpu-naive, one call at a time, before any thread starts.
    auto naive = rope::make_backend("cpu-naive");
    for (Job& job : jobs) {
        job.expected = job.call;
        testing::run(*naive, job.expected);
    }
    return jobs;
}

// Unit roundoff of the storage type: the rounding of the float32 result on store.
double storage_roundoff(rope::DType dtype) {
    return dtype == rope::DType::bf16 ? 1.0 / 256 : dtype == rope::DType::f16 ? 1.0 / 2048 : 0.0;
}

// Empty when @p got equals the job's expected result, else what differs.
// cpu-naive must match itself bit for bit; other backends within one storage
// ulp, as in tests/differential_test.cpp.
std::string compare(const Job& job, const testing::Call& got, bool bit_exact) {
    for (int which = 0; which < 2; ++which) {
        const auto values = (which == 0 ? got.q_result() : got.k_result()).values();
        const auto want = (which == 0 ? job.expected.q_result() : job.expected.k_result()).values();
        const double roundoff = storage_roundoff(got.q.view.dtype);
        for (size_t i = 0; i < want.size(); ++i) {
            const double bound = bit_exact ? 0.0 : 2 * roundoff * std::fabs(want[i]) + 4e-6;
            if (!(std::fabs(values[i] - want[i]) <= bound)) {
                std::ostringstream why;
                why << job.name << ": " << (which == 0 ? "q" : "k") << "[" << i << "] = " << values[i]
                    << ", single-threaded cpu-naive " << want[i];
                return why.str();
            }
        }
    }
    return "";
}

// Runs @p threads threads at once, thread t running its own mix of @p jobs on
// backend(t), and returns every failure any of them saw.
template <typename BackendFor>
std::vector<std::string> run_threads(const std::vector<Job>& jobs, BackendFor&& backend_for, bool bit_exact) {
    std::vector<std::vector<std::string>> failures(kThreads);
    std::latch start(kThreads);  // every thread waits until all exist: the calls overlap
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            rope::Backend& backend = backend_for(t);
            start.arrive_and_wait();
            for (int round = 0; round < kRounds; ++round) {
                // Each thread its own order, so different calls overlap.
                for (size_t j = 0; j < jobs.size(); ++j) {
                    const Job& job = jobs[(size_t(t) * 5 + j * (size_t(t) % 2 == 0 ? 1 : jobs.size() - 1)) % jobs.size()];
                    testing::Call call = job.call;
                    try {
                        testing::run(backend, call);
                        const std::string why = compare(job, call, bit_exact);
                        if (!why.empty()) failures[size_t(t)].push_back(backend.name() + ", thread " + std::to_string(t) + ": " + why);
                    } catch (const std::exception& error) {
                        failures[size_t(t)].push_back(backend.name() + ", thread " + std::to_string(t) + ": " +
                                                      job.name + ": " + error.what());
                    }
                }
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    std::vector<std::string> all;
    for (const auto& list : failures) all.insert(all.end(), list.begin(), list.end());
    return all;
}

void report(const std::vector<std::string>& failures) {
    for (size_t i = 0; i < failures.size() && i < 10; ++i) FAIL_CHECK(failures[i]);
    CHECK(failures.empty());
}

// cpu-eigen gets two worker threads, so that threads calling it at once each
// run an OpenMP team of their own.
const rope::BackendOptions kOptions{.threads = 2};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("concurrency: many threads call one shared backend object at once", B, shared_object) {
    if (!testing::backend_or_skip(B::name)) return;
    const auto backend = rope::make_backend(B::name, kOptions);
    const std::vector<Job> jobs = make_jobs();
    const auto failures = run_threads(jobs, [&](int) -> rope::Backend& { return *backend; },
                                      backend->name() == "cpu-naive");
    MESSAGE(kThreads << " threads x " << kRounds << " rounds x " << jobs.size() << " calls on one " << std::string(B::name)
                     << " object, " << failures.size() << " failures");
    report(failures);
}
TEST_CASE_TEMPLATE_APPLY(shared_object, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("concurrency: threads call backend objects of their own at once", B, separate_objects) {
    if (!testing::backend_or_skip(B::name)) return;
    std::vector<std::unique_ptr<rope::Backend>> backends;
    for (int t = 0; t < kThreads; ++t) backends.push_back(rope::make_backend(B::name, kOptions));
    const std::vector<Job> jobs = make_jobs();
    const auto failures = run_threads(jobs, [&](int t) -> rope::Backend& { return *backends[size_t(t)]; },
                                      backends[0]->name() == "cpu-naive");
    MESSAGE(kThreads << " threads x " << kRounds << " rounds x " << jobs.size() << " calls, one " << std::string(B::name)
                     << " object each, " << failures.size() << " failures");
    report(failures);
}
TEST_CASE_TEMPLATE_APPLY(separate_objects, AllBackends);

TEST_CASE("concurrency: the frequency tables rope::apply keeps, more configurations than it holds, from many threads") {
    // rope::apply keeps the table of each of its last configurations (common/src/registry.cpp).
    // With more configurations than it holds, differing in one field each that the table reads,
    // called by many threads in different orders, every call must still rotate by its own
    // configuration's table: bit for bit what make_plan builds for the call alone.
    using rope::ScalingType;
    std::vector<Job> jobs;
    auto naive = rope::make_backend("cpu-naive");
    for (int i = 0; i < 40; ++i) {
        rope::RopeConfig config = config_of(64, 10000.0, i % 2 ? rope::Style::interleaved : rope::Style::half_split);
        const int variant = i / 2;  // The same variant in both styles.
        switch (variant % 6) {
            case 0: config.base = 1000.0 + 100.0 * variant; break;
            case 1: config.scaling = {.type = ScalingType::linear, .factor = 1.0 + variant}; break;
            case 2:
                config.scaling = {.type = ScalingType::yarn, .factor = 4.0, .original_max_position_embeddings = 4096,
                                  .beta_fast = 16.0 + variant};
                break;
            case 3:
                config.scaling = {.type = ScalingType::llama3, .factor = 8.0, .original_max_position_embeddings = 256,
                                  .low_freq_factor = 1.0 + 0.1 * variant};
                break;
            case 4: config.rotary_dim = 16 + 2 * (variant % 8); config.precise_angles = variant % 4 == 0; break;
            default:  // Built per call: its table depends on the call's positions.
                config.scaling = {.type = ScalingType::dynamic, .factor = 2.0, .original_max_position_embeddings = 8};
        }
        testing::Call call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 6, 64}, {1, 1, 6, 64});
        call.offset = 3 * i;
        testing::Call expected = call;
        const rope::RopeArgs args = rope::RopeArgs::out_of_place(expected.q.view, expected.k.view, expected.q_out.view,
                                                                 expected.k_out.view, expected.positions());
        rope::detail::run_plan(*naive, rope::make_plan(config, args, rope::Device::host));  // Its own table.
        jobs.push_back(Job{"configuration " + std::to_string(i), std::move(call), std::move(expected)});
    }
    report(run_threads(jobs, [&](int) -> rope::Backend& { return *naive; }, /*bit_exact=*/true));
}

TEST_CASE("concurrency: the registry answers many threads at once") {
    // What one thread sees, then the same asked by many at once.
    const std::vector<rope::BackendInfo> baseline = rope::list_backends();
    std::vector<std::vector<std::string>> failures(kThreads);
    std::latch start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            auto fail = [&](const std::string& why) { failures[size_t(t)].push_back("thread " + std::to_string(t) + ": " + why); };
            start.arrive_and_wait();
            for (int round = 0; round < 20; ++round) {
                const std::vector<rope::BackendInfo> listed = rope::list_backends();
                if (listed.size() != baseline.size()) fail("list_backends() size changed");
                for (size_t i = 0; i < baseline.size() && i < listed.size(); ++i) {
                    const rope::BackendInfo& want = baseline[i];
                    const rope::BackendInfo info = rope::backend_info(want.name);
                    if (listed[i].name != want.name || info.name != want.name || info.available != want.available ||
                        info.reason != want.reason || info.description != want.description)
                        fail("the registry's answer for " + want.name + " changed");
                    try {
                        const auto made = rope::make_backend(want.name, kOptions);
                        if (!want.available) fail("make_backend(" + want.name + ") succeeded, but it is unavailable");
                        else if (made->name() != want.name) fail("make_backend(" + want.name + ") made another backend");
                    } catch (const rope::Error& error) {
                        if (want.available) fail("make_backend(" + want.name + "): " + error.what());
                    }
                }
                try {
                    rope::backend_info("no-such-backend");
                    fail("backend_info(\"no-such-backend\") did not throw");
                } catch (const rope::Error&) {
                }
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    std::vector<std::string> all;
    for (const auto& list : failures) all.insert(all.end(), list.begin(), list.end());
    report(all);
}
