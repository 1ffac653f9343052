// Chapter 2: Eigen + OpenMP, the same result faster.
//
// cpu-naive (chapter 1) is the specification, not a fast program. cpu-eigen
// (cpu/eigen_backend.cpp) computes exactly the same float32 values with three
// changes:
//   1. cos and sin once per (position, pair), reused by every head of q and k;
//   2. a head row rotated as Eigen arrays, several pairs per SIMD instruction;
//   3. OpenMP threads, each streaming its own share of the rows.
// This chapter checks that the results agree, then times both backends against
// the ceiling for a memory-bound operation: a plain memcpy of the same bytes.
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

// A LLaMA-3-8B-sized attention layer over a 2048-token prompt: 32 query heads,
// 8 key heads (grouped-query attention), head_dim 128, float32.
constexpr int64_t kSeq = 2048, kQueryHeads = 32, kKeyHeads = 8, kHeadDim = 128;
const tutorial::Shape kQuery{.batch = 1, .heads = kQueryHeads, .seq = kSeq, .head_dim = kHeadDim};
const tutorial::Shape kKey{.batch = 1, .heads = kKeyHeads, .seq = kSeq, .head_dim = kHeadDim};

void rotate(rope::Backend& backend, const rope::RopeConfig& config, std::vector<float>& q, std::vector<float>& k) {
    const auto layout = rope::Layout::bhsd;
    auto q_view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, layout, kQuery.in(layout));
    auto k_view = rope::TensorView::contiguous(k.data(), rope::DType::f32, rope::Device::host, layout, kKey.in(layout));
    rope::apply(backend, config, rope::RopeArgs::in_place(q_view, k_view));
}

struct Timing {
    const char* name;
    int threads;
    double seconds;
};

}  // namespace

int main() {
    tutorial::print_title(2, "Eigen + OpenMP",
                          "compute cos/sin once per position, rotate rows with SIMD on every core: same values, "
                          "far less time");
    tutorial::Checks checks;
    if (!rope::backend_info("cpu-eigen").available)
        return tutorial::skip("cpu-eigen not built", rope::backend_info("cpu-eigen").reason);

    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.base = 500000.0;  // Llama 3's rope_theta.
    const std::vector<float> q_input = tutorial::random_values(size_t(kQuery.numel()), 21);
    const std::vector<float> k_input = tutorial::random_values(size_t(kKey.numel()), 22);
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    auto naive = rope::make_backend("cpu-naive");
    auto eigen_one = rope::make_backend("cpu-eigen", {.threads = 1});
    auto eigen_all = rope::make_backend("cpu-eigen", {.threads = cores});

    tutorial::print_section("1. What changed: the trigonometry");
    const int64_t pairs = kHeadDim / 2;
    const double naive_calls = double(kQueryHeads + kKeyHeads) * kSeq * pairs;
    const double eigen_calls = double(kSeq) * pairs;
    std::printf("q [1, %ld, %ld, %ld] and k [1, %ld, %ld, %ld], float32, base 500000\n", long(kQueryHeads), long(kSeq),
                long(kHeadDim), long(kKeyHeads), long(kSeq), long(kHeadDim));
    std::printf("cpu-naive: one cos and one sin per (head, token, pair) = %.1f M of each\n", naive_calls / 1e6);
    std::printf("cpu-eigen: one cos and one sin per (position, pair)    = %.2f M of each (%.0fx fewer):\n"
                "           every head of q and k at the same position turns by the same angles\n",
                eigen_calls / 1e6, naive_calls / eigen_calls);

    tutorial::print_section("2. Same values");
    std::vector<float> q_naive = q_input, k_naive = k_input, q_eigen = q_input, k_eigen = k_input;
    rotate(*naive, config, q_naive, k_naive);
    rotate(*eigen_all, config, q_eigen, k_eigen);
    const double agreement = std::max(tutorial::max_abs_difference(q_eigen, q_naive),
                                      tutorial::max_abs_difference(k_eigen, k_naive));
    tutorial::Formula formula;
    formula.base = config.base;
    const double error = tutorial::relative_l2(q_eigen, tutorial::rope_float64(q_input, kQuery, formula));
    std::printf("largest |cpu-eigen - cpu-naive| = %g; relative L2 of cpu-eigen against float64 = %.2e\n", agreement,
                error);
    checks.expect(agreement <= 1e-6, "cpu-eigen agrees with cpu-naive (largest difference " +
                                         tutorial::sci(agreement) + " <= 1e-6)");
    // Positions reach 2047 here: the float32 angle's rounding grows with the position (chapter 7).
    checks.expect(error < 2e-5, "cpu-eigen matches the float64 formula (relative L2 " + tutorial::sci(error) + " < 2e-5)");

    tutorial::print_section("3. Time and bandwidth");
    // RoPE reads every element of q and k once and writes it once.
    const double bytes = 2.0 * double(q_input.size() + k_input.size()) * sizeof(float);
    std::vector<float> q = q_input, k = k_input;
    std::vector<float> q_copy(q.size()), k_copy(k.size());
    std::vector<Timing> timings;
    timings.push_back({"cpu-naive", 1, tutorial::median_seconds(3, [&] { rotate(*naive, config, q, k); })});
    timings.push_back({"cpu-eigen", 1, tutorial::median_seconds(9, [&] { rotate(*eigen_one, config, q, k); })});
    if (cores > 1)
        timings.push_back({"cpu-eigen", cores, tutorial::median_seconds(9, [&] { rotate(*eigen_all, config, q, k); })});
    // The ceiling: memcpy moves the same bytes (reads q and k, writes copies) and
    // does no arithmetic at all. On one thread; the eigen rows above may use more.
    const double copy_seconds = tutorial::median_seconds(9, [&] {
        std::memcpy(q_copy.data(), q.data(), q.size() * sizeof(float));
        std::memcpy(k_copy.data(), k.data(), k.size() * sizeof(float));
    });
    std::printf("%.0f MB moved per call (q and k read once and written once); median of several calls\n", bytes / 1e6);
    std::printf("%-12s %8s %12s %10s %14s %12s\n", "backend", "threads", "time (ms)", "GB/s", "vs cpu-naive",
                "% of memcpy");
    const double naive_seconds = timings[0].seconds;
    for (const Timing& t : timings)
        std::printf("%-12s %8d %12.2f %10.2f %13.1fx %11.0f%%\n", t.name, t.threads, 1e3 * t.seconds,
                    bytes / t.seconds / 1e9, naive_seconds / t.seconds, 100 * copy_seconds / t.seconds);
    std::printf("%-12s %8d %12.2f %10.2f %14s %11s\n", "memcpy", 1, 1e3 * copy_seconds, bytes / copy_seconds / 1e9,
                "", "100%");
    std::printf("These numbers are indicative: %d core(s), other processes, one memcpy on one thread as the\n"
                "ceiling. rope-bench (bench/) is the real benchmark: inputs larger than the caches, a\n"
                "parallel copy ceiling, many repetitions. In-place RoPE writes back lines it has just read,\n"
                "while memcpy writes fresh ones, so RoPE can even exceed 100%% of this ceiling.\n",
                cores);
    const Timing& best = timings.back();
    return checks.finish("cpu-eigen, " + std::to_string(best.threads) + " threads: " +
                         tutorial::fixed(naive_seconds / best.seconds, 1) + "x cpu-naive, " +
                         tutorial::fixed(bytes / best.seconds / 1e9, 1) +
                         " GB/s (indicative; % of copy: rope-bench)");
}
