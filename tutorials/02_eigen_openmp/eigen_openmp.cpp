// Chapter 2: Eigen + OpenMP, the ladder from cpu-naive to cpu-eigen.
//
// Six steps, each one idea more than the one before (step1..step6 *.cpp in
// this folder, ladder.hpp lists them), solve one problem: a LLaMA-3-8B-sized
// layer, q [1, 32, 2048, 128] and k with 8 heads, float32, in place. Each step
// is checked against cpu-naive (through rope's public API) and timed as
// rope-bench times (bench/timing/timing.hpp: medians of repetitions, on copies
// of q and k that span twice the last-level cache, beside a copy of the same
// bytes with the same threads), so its "% of copy" means what rope-bench's
// means. The library's cpu-naive and cpu-eigen close the table.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"
#if ROPE_TUTORIAL_HAVE_EIGEN
#include <omp.h>

#include "ladder.hpp"
#include "timing.hpp"  // rope-bench's timer: the project's one meaning of "% of copy".

namespace {

constexpr int64_t kSeq = 2048, kQueryHeads = 32, kKeyHeads = 8, kHeadDim = 128;
constexpr double kBase = 500000.0;  // Llama 3's rope_theta.
constexpr int kReps = 15;           // Timed repetitions per row of the table (medians).
const tutorial::Shape kQuery{.batch = 1, .heads = kQueryHeads, .seq = kSeq, .head_dim = kHeadDim};
const tutorial::Shape kKey{.batch = 1, .heads = kKeyHeads, .seq = kSeq, .head_dim = kHeadDim};

// q then k, one after the other: one "set" of the timer.
constexpr int64_t kSetFloats = (kQueryHeads + kKeyHeads) * kSeq * kHeadDim;

// The library's backend on the q and k at @p set, in place.
void library(rope::Backend& backend, const rope::RopeConfig& config, float* set) {
    const auto layout = rope::Layout::bhsd;
    auto q = rope::TensorView::contiguous(set, rope::DType::f32, rope::Device::host, layout, kQuery.in(layout));
    auto k = rope::TensorView::contiguous(set + kQuery.numel(), rope::DType::f32, rope::Device::host, layout,
                                          kKey.in(layout));
    rope::apply(backend, config, rope::RopeArgs::in_place(q, k));
}

}  // namespace
#endif  // ROPE_TUTORIAL_HAVE_EIGEN

int main() {
    tutorial::print_title(2, "Eigen + OpenMP",
                          "rotate eight pairs per instruction (Eigen), compute cos/sin once per position, "
                          "split the rows among threads (OpenMP): cpu-naive's values at the memory's speed");
#if !ROPE_TUTORIAL_HAVE_EIGEN
    return tutorial::skip("the ladder needs Eigen 3.4 and OpenMP", "this build has no Eigen or no OpenMP");
#else
    tutorial::Checks checks;
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.base = kBase;
    const rope::FrequencyTable frequencies = rope::make_frequency_table(config, kSeq);
    const std::vector<float> input = tutorial::random_values(size_t(kSetFloats), 21);
    auto problem_at = [&](float* set) {
        return ladder::Problem{.q = set, .k = set + kQuery.numel(), .inv_freq = frequencies.inv_freq.data(),
                               .q_heads = kQueryHeads, .k_heads = kKeyHeads, .seq = kSeq, .head_dim = kHeadDim};
    };
    const int threads = omp_get_max_threads();

    tutorial::print_section("1. The problem");
    std::printf("q [1, %ld, %ld, %ld] and k [1, %ld, %ld, %ld], float32, layout bhsd, base %.0f, in place\n",
                long(kQueryHeads), long(kSeq), long(kHeadDim), long(kKeyHeads), long(kSeq), long(kHeadDim), kBase);
    const double naive_trig = double(kQueryHeads + kKeyHeads) * kSeq * (kHeadDim / 2);
    std::printf("cos/sin pairs computed: %.2f M per call by cpu-naive and step 1 (per head), %.2f M from step 2 on\n"
                "(per position: every head at one position turns by the same angles, %ldx fewer)\n",
                naive_trig / 1e6, double(kSeq) * (kHeadDim / 2) / 1e6, long(kQueryHeads + kKeyHeads));
    for (const ladder::Step& step : ladder::kSteps) std::printf("  step %-22s %s\n", step.name, step.idea);

    tutorial::print_section("2. Every step computes cpu-naive's values");
    auto naive = rope::make_backend("cpu-naive");
    auto eigen = rope::make_backend("cpu-eigen", {.threads = threads});
    std::vector<float> reference = input;
    library(*naive, config, reference.data());
    std::vector<float> got;
    for (const ladder::Step& step : ladder::kSteps) {
        got = input;
        step.run(problem_at(got.data()));
        const double difference = tutorial::max_abs_difference(got, reference);
        checks.expect(difference <= 1e-6, "step " + std::string(step.name) + " against cpu-naive: largest difference " +
                                              tutorial::sci(difference) + " <= 1e-6");
    }
    // The last step's q against the float64 formula; positions reach 2047, where
    // the float32 angle's rounding has grown (chapter 7).
    tutorial::Formula formula;
    formula.base = kBase;
    const auto q_end = size_t(kQuery.numel());
    const double error = tutorial::relative_l2(std::vector<float>(got.begin(), got.begin() + q_end),
                                               tutorial::rope_float64({input.begin(), input.begin() + q_end}, kQuery,
                                                                      formula));
    const ladder::Step& last = ladder::kSteps[std::size(ladder::kSteps) - 1];  // The one `got` holds.
    checks.expect(error < 2e-5, "step " + std::string(last.name) + " against the float64 formula: relative L2 " +
                                    tutorial::sci(error) + " < 2e-5");

    tutorial::print_section("3. Time, as rope-bench measures it");
    // The timer's sets: copies of q and k that together span twice the last-level
    // cache, so that every call reads its inputs from memory.
    const rope_bench::CacheSize cache = rope_bench::host_last_level_cache();
    const size_t set_bytes = size_t(kSetFloats) * sizeof(float);
    rope_bench::Sets sets;
    sets.set_bytes = set_bytes;
    sets.stride = rope_bench::set_stride(set_bytes);
    sets.sets = rope_bench::sets_spanning_twice(set_bytes, cache.bytes);
    std::vector<float> inputs(sets.stride / sizeof(float) * size_t(sets.sets)), copies(inputs.size());
    sets.inputs = inputs.data();
    sets.copy_destination = copies.data();
    for (int64_t s = 0; s < sets.sets; ++s) std::memcpy(sets.at(sets.inputs, s), input.data(), set_bytes);
    auto set_at = [&](int64_t call) { return reinterpret_cast<float*>(sets.at(sets.inputs, call)); };

    const double bytes = 2.0 * double(set_bytes);  // Every element read once and written once.
    std::printf("%.0f MB moved per call, %ld sets of q and k (last-level cache: %s).\n"
                "Medians of %d calls, each beside a memcpy and an in-place read-modify-write of the\n"
                "same bytes with the same threads: the faster of the two is the ceiling (100%%).\n\n",
                bytes / 1e6, long(sets.sets), cache.source.c_str(), kReps);
    std::printf("%-26s %7s %10s %8s %10s %8s %12s\n", "step", "threads", "time (ms)", "GB/s", "% of copy", "ceiling",
                "vs cpu-naive");
    double naive_us = 0, last_percent = 0, eigen_percent = 0;
    auto row = [&](const std::string& name, int row_threads, const std::function<void(int64_t)>& call) {
        const rope_bench::Measurement m = rope_bench::host_measure(call, sets, row_threads, kReps);
        if (naive_us == 0) naive_us = m.call_us;
        std::printf("%-26s %7d %10.2f %8.2f %9.0f%% %8s %11.1fx\n", name.c_str(), row_threads, m.call_us / 1e3,
                    bytes / m.call_us / 1e3, m.percent_of_copy(), m.ceiling.name.c_str(), naive_us / m.call_us);
        return m.percent_of_copy();
    };
    row("cpu-naive (library)", 1, [&](int64_t c) { library(*naive, config, set_at(c)); });
    for (const ladder::Step& step : ladder::kSteps) {
        const int step_threads = step.threaded ? threads : 1;
        last_percent = row("step " + std::string(step.name), step_threads,
                           [&](int64_t c) { step.run(problem_at(set_at(c))); });
    }
    eigen_percent = row("cpu-eigen (library)", threads, [&](int64_t c) { library(*eigen, config, set_at(c)); });
    std::printf("\nOn a machine shared with other work these figures move from run to run, the threaded rows\n"
                "most (a thread that waits for a core holds up the others). bench/results/ has rope-bench's\n"
                "careful figures.\n");

    return checks.finish("step " + std::string(last.name) + " on " + std::to_string(threads) + " threads: " +
                         tutorial::fixed(last_percent, 0) + "% of copy (cpu-eigen: " +
                         tutorial::fixed(eigen_percent, 0) + "%)");
#endif
}
