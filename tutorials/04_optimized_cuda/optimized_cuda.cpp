// Chapter 4: optimised CUDA, the ladder.
//
// Six versions of one kernel, each one idea better than the last (v1..v6 *.cu
// in this folder), run on the same two problems:
//   prefill: a 4096-token prompt, where RoPE should run at the memory's speed;
//   decode:  one new token for each of 32 sequences, where a launch is so small
//            that latency, not bandwidth, sets the time.
// Each version is checked against cpu-naive and timed as rope-bench times
// (bench/timing/cuda_timing.hpp: CUDA events around batches of calls, on copies
// of q and k that span twice the L2); its bandwidth is compared with the copy
// ceiling of the same bytes measured in the same run, so the chapter's "% of
// copy" and rope-bench's mean the same thing. The library's two CUDA backends, called through
// rope::apply, close the table: cuda-naive, and cuda-optimized, the production
// kernel (cuda/optimized_kernel.cuh), which goes further than this ladder.
//
// Without a GPU the program prints every version's launch configuration (for
// an H200's published SM count) and reports SKIPPED.
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "ladder.hpp"
#include "tutorial.hpp"
#if ROPE_TUTORIAL_HAVE_CUDA
#include "cuda_timing.hpp"  // rope-bench's timer: the project's one meaning of "% of copy".
#endif

namespace {

// One LLaMA-3-8B-sized attention layer: 32 query heads, 8 key heads, head_dim 128, base 500000.
constexpr int64_t kQueryHeads = 32, kKeyHeads = 8, kHeadDim = 128;
static_assert(kHeadDim % 8 == 0, "versions 4 to 6 move 16-byte chunks of each half row");

struct Regime {
    const char* name;
    int64_t batch, seq, offset;  // Tokens at positions offset .. offset + seq - 1 in each sequence.
};
constexpr Regime kPrefill{"prefill", 1, 4096, 0};
constexpr Regime kDecode{"decode", 32, 1, 4095};  // The 4096th token of 32 sequences.

int64_t tokens(const Regime& r) { return r.batch * r.seq; }
// Bytes a call must move: every element of q and k read once and written once.
double bytes_moved(const Regime& r) { return 2.0 * double(tokens(r) * (kQueryHeads + kKeyHeads) * kHeadDim) * 4; }

ladder::Problem problem_shape(const Regime& r) {
    ladder::Problem p;
    p.tokens = tokens(r);
    p.seq = r.seq;
    p.position_offset = r.offset;
    p.q_heads = kQueryHeads;
    p.k_heads = kKeyHeads;
    p.head_dim = kHeadDim;
    return p;
}

// "blocks x threads", plus the heads each thread visits when it visits several.
void describe(const ladder::Grid& g, char* text, size_t size) {
    if (g.heads_per_thread > 1)
        std::snprintf(text, size, "%ld x %d (%ld heads each)", long(g.blocks), g.threads_per_block,
                      long(g.heads_per_thread));
    else
        std::snprintf(text, size, "%ld x %d", long(g.blocks), g.threads_per_block);
}

void print_grids(const ladder::Device& device) {
    std::printf("%-24s %28s %28s\n", "", "prefill: blocks x threads", "decode: blocks x threads");
    for (int v = 1; v <= ladder::kVersions; ++v) {
        const ladder::Grid prefill = ladder::grid_of(v, problem_shape(kPrefill), device);
        const ladder::Grid decode = ladder::grid_of(v, problem_shape(kDecode), device);
        char prefill_text[64], decode_text[64];
        describe(prefill, prefill_text, sizeof prefill_text);
        describe(decode, decode_text, sizeof decode_text);
        std::printf("%-24s %28s %28s\n", ladder::kSteps[v - 1].name, prefill_text, decode_text);
    }
}

#if ROPE_TUTORIAL_HAVE_CUDA

// Everything one regime needs on both sides: inputs, cpu-naive's answer, and
// on the GPU `sets` copies of q and k (and of the outputs) that together span
// twice the L2, as rope-bench measures: call c works on set c % sets, so every
// timed call reads its inputs from memory, not from the cache. A set holds q,
// then k; set s starts at s * stride.
struct Workload {
    Regime regime;
    std::vector<float> q, k, q_expected, k_expected;
    size_t q_bytes = 0, set_bytes = 0, stride = 0;
    int64_t sets = 1;
    rope::Buffer inputs, outputs, inv_freq;
    std::vector<ladder::Problem> problems;  // One per set.

    Workload(const Regime& r, const rope::RopeConfig& config) : regime(r) {
        const size_t q_count = size_t(tokens(r) * kQueryHeads * kHeadDim), k_count = size_t(tokens(r) * kKeyHeads * kHeadDim);
        q = tutorial::random_values(q_count, 41);
        k = tutorial::random_values(k_count, 42);
        q_expected = q;
        k_expected = k;
        auto cpu = rope::make_backend("cpu-naive");
        rope::apply(*cpu, config, rope::RopeArgs::in_place(view(q_expected.data(), kQueryHeads, rope::Device::host),
                                                            view(k_expected.data(), kKeyHeads, rope::Device::host),
                                                            rope::Positions::starting_at(r.offset)));
        q_bytes = q_count * 4;
        set_bytes = q_bytes + k_count * 4;
        stride = rope_bench::set_stride(set_bytes);
        sets = rope_bench::sets_spanning_twice(set_bytes, rope_bench::cuda_l2_bytes());
        std::vector<char> staging(stride * size_t(sets));
        for (int64_t s = 0; s < sets; ++s) {
            std::memcpy(staging.data() + size_t(s) * stride, q.data(), q_bytes);
            std::memcpy(staging.data() + size_t(s) * stride + q_bytes, k.data(), k_count * 4);
        }
        inputs = rope::Buffer(rope::Device::cuda, staging.size());
        outputs = rope::Buffer(rope::Device::cuda, staging.size());
        inputs.copy_from_host(staging.data());
        // The same float32 theta_i the library's backends use.
        const std::vector<float> table = rope::make_frequency_table(config, r.offset + r.seq).inv_freq;
        inv_freq = rope::Buffer(rope::Device::cuda, table.size() * 4);
        inv_freq.copy_from_host(table.data());
        for (int64_t s = 0; s < sets; ++s) {
            ladder::Problem problem = problem_shape(r);
            problem.q = q_of(inputs, s);
            problem.k = k_of(inputs, s);
            problem.q_out = q_of(outputs, s);
            problem.k_out = k_of(outputs, s);
            problem.inv_freq = static_cast<const float*>(inv_freq.data());
            problems.push_back(problem);
        }
    }

    float* q_of(const rope::Buffer& buffer, int64_t set) const {
        return reinterpret_cast<float*>(static_cast<char*>(buffer.data()) + size_t(set) * stride);
    }
    float* k_of(const rope::Buffer& buffer, int64_t set) const {
        return reinterpret_cast<float*>(static_cast<char*>(buffer.data()) + size_t(set) * stride + q_bytes);
    }

    rope::TensorView view(void* data, int64_t heads, rope::Device device) const {
        return rope::TensorView::contiguous(data, rope::DType::f32, device, rope::Layout::bshd,
                                            {regime.batch, regime.seq, heads, kHeadDim});
    }

    // Poison the outputs, run `enqueue` once (on set 0), and return the largest difference from cpu-naive.
    template <typename Enqueue>
    double check(Enqueue&& enqueue) {
        ladder::poison(outputs.data(), int64_t(outputs.bytes()));
        enqueue();
        ladder::synchronize();
        std::vector<char> got(outputs.bytes());
        outputs.copy_to_host(got.data());
        std::vector<float> q_got(q.size()), k_got(k.size());
        std::memcpy(q_got.data(), got.data(), q_bytes);
        std::memcpy(k_got.data(), got.data() + q_bytes, k_got.size() * 4);
        return std::max(tutorial::max_abs_difference(q_got, q_expected), tutorial::max_abs_difference(k_got, k_expected));
    }

    // Median microseconds per call of run(set), with rope-bench's timer: CUDA
    // events around batches of back-to-back calls lasting at least 1 ms each.
    double time_us(const std::function<void(int64_t set)>& run) const {
        return rope_bench::cuda_call_us([&](int64_t call) { run(call % sets); }, rope_bench::GpuClock::events,
                                        rope_bench::kDefaultGpuReps, sets, nullptr);
    }

    // The copy ceiling of the same bytes on the same sets: rope-bench's, the
    // fastest of cudaMemcpyAsync and a 16-byte copy kernel, each back to back
    // and replayed from a CUDA graph.
    rope_bench::Ceiling ceiling() const {
        return rope_bench::cuda_copy_ceiling({inputs.data(), outputs.data(), set_bytes, stride, sets},
                                             rope_bench::kDefaultGpuReps);
    }
};

struct Result {
    std::string name, idea;
    double prefill_us = 0, decode_us = 0, max_difference = 0;
};

std::string utc_date() {
    const std::time_t now = std::time(nullptr);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    return text;
}

#endif  // ROPE_TUTORIAL_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(4, "Optimised CUDA: the ladder",
                          "RoPE is memory-bound: one idea at a time, from an uncoalesced port to the speed of a copy");
    tutorial::Checks checks;
    const std::string csv_file = tutorial::csv_path(argc, argv, "tutorial-04-optimized-cuda");
    tutorial::print_section("1. The problems");
    std::printf("q: %ld heads, k: %ld heads, head_dim %ld, float32, half-split, base 500000, layout bshd, out of place\n",
                long(kQueryHeads), long(kKeyHeads), long(kHeadDim));
    for (const Regime& r : {kPrefill, kDecode})
        std::printf("  %-8s batch %3ld x seq %4ld at positions %ld..%ld: %.2f MB moved per call\n", r.name,
                    long(r.batch), long(r.seq), long(r.offset), long(r.offset + r.seq - 1), bytes_moved(r) / 1e6);

    tutorial::print_section("2. The ladder: one idea per step");
    for (int v = 1; v <= ladder::kVersions; ++v)
        std::printf("  %-24s %s\n", ladder::kSteps[v - 1].name, ladder::kSteps[v - 1].idea);

    const std::string reason = rope::cuda_unavailable_reason();
    ladder::Device device;  // An H200's figures until the GPU itself is asked.
    std::string device_name = "NVIDIA H200 (assumed: no GPU here)";
#if ROPE_TUTORIAL_HAVE_CUDA
    if (reason.empty()) device = ladder::query_device(device_name);
#endif
    tutorial::print_section("3. Launch configurations on " + device_name + ", " + std::to_string(device.sms) + " SMs");
    print_grids(device);
    if (!reason.empty()) {
        const ladder::Grid v6 = ladder::grid_of(6, problem_shape(kDecode), device);
        return tutorial::skip("v6 would launch " + std::to_string(v6.blocks) + " blocks x " +
                                  std::to_string(v6.threads_per_block) + " threads for decode (no GPU here)",
                              "no GPU here (" + reason + "); the measurements need one");
    }

#if ROPE_TUTORIAL_HAVE_CUDA
    tutorial::print_section("4. Measured: each step checked against cpu-naive, timed as rope-bench times");
    std::printf("device: %s (%d SMs), %s\n", device_name.c_str(), device.sms, utc_date().c_str());
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.base = 500000.0;
    Workload prefill(kPrefill, config), decode(kDecode, config);
    std::vector<Result> results;
    // Largest difference from cpu-naive we accept: float32 rounding of sincosf and of a fused multiply-add.
    const double tolerance = 1e-5;

    for (int v = 1; v <= ladder::kVersions; ++v) {
        Result result{ladder::kSteps[v - 1].name, ladder::kSteps[v - 1].idea};
        for (Workload* w : {&prefill, &decode}) {
            auto run = [&](int64_t set) { ladder::launch(v, w->problems[size_t(set)], device); };
            result.max_difference = std::max(result.max_difference, w->check([&] { run(0); }));
            (w == &prefill ? result.prefill_us : result.decode_us) = w->time_us(run);
        }
        results.push_back(result);
    }
    for (const char* name : {"cuda-naive", "cuda-optimized"}) {
        auto backend = rope::make_backend(name);
        Result result{std::string(name) + " (library)", "rope::apply, validation included in every call"};
        for (Workload* w : {&prefill, &decode}) {
            std::vector<rope::RopeArgs> args;  // One call per set.
            for (int64_t s = 0; s < w->sets; ++s)
                args.push_back(rope::RopeArgs::out_of_place(
                    w->view(w->q_of(w->inputs, s), kQueryHeads, rope::Device::cuda),
                    w->view(w->k_of(w->inputs, s), kKeyHeads, rope::Device::cuda),
                    w->view(w->q_of(w->outputs, s), kQueryHeads, rope::Device::cuda),
                    w->view(w->k_of(w->outputs, s), kKeyHeads, rope::Device::cuda),
                    rope::Positions::starting_at(w->regime.offset)));
            auto run = [&](int64_t set) { rope::apply(*backend, config, args[size_t(set)]); };
            result.max_difference = std::max(result.max_difference, w->check([&] { run(0); }));
            (w == &prefill ? result.prefill_us : result.decode_us) = w->time_us(run);
        }
        results.push_back(result);
    }
    // The ceiling: copying q and k moves exactly the bytes RoPE moves, with no arithmetic.
    const rope_bench::Ceiling prefill_ceiling = prefill.ceiling(), decode_ceiling = decode.ceiling();
    Result copy{"copy ceiling (" + prefill_ceiling.name + ")", "the fastest copy of q and k: the bytes RoPE moves, no arithmetic"};
    copy.prefill_us = prefill_ceiling.us;
    copy.decode_us = decode_ceiling.us;

    const double prefill_bytes = bytes_moved(kPrefill);
    auto gbps = [&](double us) { return prefill_bytes / (us * 1e-6) / 1e9; };
    tutorial::Csv csv(csv_file);
    csv.table("ladder: prefill [1 x 4096 tokens, 32+8 heads, 128] and decode [32 x 1 token] on " + device_name,
              "step,name,prefill_us,prefill_GBps,prefill_pct_of_copy,decode_us,max_abs_diff_vs_cpu_naive");
    std::printf("\n%-28s %12s %9s %8s %12s %14s  %s\n", "step", "prefill (us)", "GB/s", "% copy", "decode (us)",
                "max|d| naive", "check");
    for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        const bool ok = r.max_difference <= tolerance;
        std::printf("%-28s %12.1f %9.0f %7.0f%% %12.2f %14.1e  %s\n", r.name.c_str(), r.prefill_us, gbps(r.prefill_us),
                    100 * copy.prefill_us / r.prefill_us, r.decode_us, r.max_difference, ok ? "ok" : "MISMATCH");
        checks.expect(ok, r.name + " matches cpu-naive (max |d| " + tutorial::sci(r.max_difference) + ")");
        const std::string step = i < size_t(ladder::kVersions) ? std::to_string(i + 1) : "library";
        csv.row(step, r.name, r.prefill_us,
                gbps(r.prefill_us), 100 * copy.prefill_us / r.prefill_us, r.decode_us, r.max_difference);
    }
    std::printf("%-28s %12.1f %9.0f %7.0f%% %12.2f %14s\n", copy.name.c_str(), copy.prefill_us, gbps(copy.prefill_us),
                100.0, copy.decode_us, "-");
    csv.row("copy", copy.name, copy.prefill_us, gbps(copy.prefill_us), 100.0, copy.decode_us, 0);
    std::printf("\nTimes: rope-bench's timer (bench/timing/), per call: the median of %d repetitions, each CUDA\n"
                "events around back-to-back calls lasting at least 1 ms, rotating over %ld (prefill) and %ld\n"
                "(decode) copies of q and k that span twice the L2. GB/s = %.1f MB moved / time. %% copy = ceiling\n"
                "time / step time; the ceiling is the fastest of cudaMemcpyAsync and a 16-byte copy kernel, each\n"
                "back to back and from a CUDA graph: %s (prefill), %s (decode). Decode is latency-bound:\n"
                "compare its times, not its bandwidth. The library rows include rope::apply's validation.\n",
                rope_bench::kDefaultGpuReps, long(prefill.sets), long(decode.sets), prefill_bytes / 1e6,
                prefill_ceiling.name.c_str(), decode_ceiling.name.c_str());
    csv.finish(checks);

    const Result& last = results[ladder::kVersions - 1];
    return checks.finish("prefill: v1 " + tutorial::fixed(100 * copy.prefill_us / results[0].prefill_us, 0) + "%, v6 " +
                         tutorial::fixed(100 * copy.prefill_us / last.prefill_us, 0) + "% of a device copy (" +
                         tutorial::fixed(gbps(last.prefill_us), 0) + " GB/s) on " + device_name);
#else
    return 1;  // Not reached: without CUDA, reason is never empty.
#endif
}
