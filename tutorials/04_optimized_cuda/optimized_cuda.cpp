// Chapter 4: optimised CUDA, the ladder.
//
// Six versions of one kernel, each one idea better than the last (v1..v6 *.cu
// in this folder), run on the same two problems:
//   prefill: a 4096-token prompt, where RoPE should run at the memory's speed;
//   decode:  one new token for each of 32 sequences, where a launch is so small
//            that latency, not bandwidth, sets the time.
// Each version is checked against cpu-naive and timed with CUDA events; its
// bandwidth is compared with a device-to-device cudaMemcpy of the same bytes,
// measured in the same run. The library's two CUDA backends, called through
// rope::apply, close the table: cuda-naive, and cuda-optimized, the production
// kernel (cuda/optimized_kernel.cuh), which goes further than this ladder.
//
// Without a GPU the program prints every version's launch configuration (for
// an H200's published SM count) and reports SKIPPED.
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "ladder.hpp"
#include "tutorial.hpp"

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

// Everything one regime needs on both sides: inputs, cpu-naive's answer, device buffers.
struct Workload {
    Regime regime;
    std::vector<float> q, k, q_expected, k_expected;
    rope::Buffer q_in, k_in, q_out, k_out, inv_freq;
    ladder::Problem problem;

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
        q_in = rope::Buffer(rope::Device::cuda, q_count * 4);
        k_in = rope::Buffer(rope::Device::cuda, k_count * 4);
        q_out = rope::Buffer(rope::Device::cuda, q_count * 4);
        k_out = rope::Buffer(rope::Device::cuda, k_count * 4);
        q_in.copy_from_host(q.data());
        k_in.copy_from_host(k.data());
        // The same float32 theta_i the library's backends use.
        const std::vector<float> table = rope::make_frequency_table(config, r.offset + r.seq).inv_freq;
        inv_freq = rope::Buffer(rope::Device::cuda, table.size() * 4);
        inv_freq.copy_from_host(table.data());
        problem = problem_shape(r);
        problem.q = static_cast<const float*>(q_in.data());
        problem.k = static_cast<const float*>(k_in.data());
        problem.q_out = static_cast<float*>(q_out.data());
        problem.k_out = static_cast<float*>(k_out.data());
        problem.inv_freq = static_cast<const float*>(inv_freq.data());
    }

    rope::TensorView view(void* data, int64_t heads, rope::Device device) const {
        return rope::TensorView::contiguous(data, rope::DType::f32, device, rope::Layout::bshd,
                                            {regime.batch, regime.seq, heads, kHeadDim});
    }

    // Poison the outputs, run `enqueue` once, and return the largest difference from cpu-naive.
    template <typename Enqueue>
    double check(Enqueue&& enqueue) {
        ladder::poison(q_out.data(), int64_t(q_out.bytes()));
        ladder::poison(k_out.data(), int64_t(k_out.bytes()));
        enqueue();
        ladder::synchronize();
        std::vector<float> q_got(q.size()), k_got(k.size());
        q_out.copy_to_host(q_got.data());
        k_out.copy_to_host(k_got.data());
        return std::max(tutorial::max_abs_difference(q_got, q_expected), tutorial::max_abs_difference(k_got, k_expected));
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
    tutorial::print_section("4. Measured: each step checked against cpu-naive, timed with CUDA events");
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
            auto run = [&] { ladder::launch(v, w->problem, device); };
            result.max_difference = std::max(result.max_difference, w->check(run));
            (w == &prefill ? result.prefill_us : result.decode_us) = ladder::time_microseconds(run);
        }
        results.push_back(result);
    }
    for (const char* name : {"cuda-naive", "cuda-optimized"}) {
        auto backend = rope::make_backend(name);
        Result result{std::string(name) + " (library)", "rope::apply, validation included in every call"};
        for (Workload* w : {&prefill, &decode}) {
            const rope::RopeArgs args = rope::RopeArgs::out_of_place(
                w->view(w->q_in.data(), kQueryHeads, rope::Device::cuda), w->view(w->k_in.data(), kKeyHeads, rope::Device::cuda),
                w->view(w->q_out.data(), kQueryHeads, rope::Device::cuda), w->view(w->k_out.data(), kKeyHeads, rope::Device::cuda),
                rope::Positions::starting_at(w->regime.offset));
            auto run = [&] { rope::apply(*backend, config, args); };
            result.max_difference = std::max(result.max_difference, w->check(run));
            (w == &prefill ? result.prefill_us : result.decode_us) = ladder::time_microseconds(run);
        }
        results.push_back(result);
    }
    // The ceiling: copying q and k to the outputs moves exactly the bytes RoPE moves, with no arithmetic.
    Result copy{"cudaMemcpy D2D (ceiling)", "copy of q and k: the bytes RoPE moves, no arithmetic"};
    for (Workload* w : {&prefill, &decode})
        (w == &prefill ? copy.prefill_us : copy.decode_us) = ladder::time_microseconds([&] {
            ladder::copy_device_to_device(w->q_out.data(), w->q_in.data(), int64_t(w->q_in.bytes()));
            ladder::copy_device_to_device(w->k_out.data(), w->k_in.data(), int64_t(w->k_in.bytes()));
        });

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
    std::printf("\nTimes: median over 31 samples of back-to-back calls (CUDA events), per call. GB/s = %.1f MB\n"
                "moved / time. %% copy = copy time / step time. Decode is latency-bound: compare its times,\n"
                "not its bandwidth. The library rows include rope::apply's validation on the CPU.\n",
                prefill_bytes / 1e6);
    csv.announce();

    const Result& last = results[ladder::kVersions - 1];
    return checks.finish("prefill: v1 " + tutorial::fixed(100 * copy.prefill_us / results[0].prefill_us, 0) + "%, v6 " +
                         tutorial::fixed(100 * copy.prefill_us / last.prefill_us, 0) + "% of a device copy (" +
                         tutorial::fixed(gbps(last.prefill_us), 0) + " GB/s) on " + device_name);
#else
    return 1;  // Not reached: without CUDA, reason is never empty.
#endif
}
