// Chapter 5: comparing backends, and why RoPE is memory-bound.
//
//   1. Equivalence: every backend available here runs the same calls (both
//      pairings, bf16 storage, partial rotary, grouped-query k in the other
//      layout, a position offset, the inverse rotation out of place) and is
//      compared with cpu-naive and with the float64 formula.
//   2. The benchmark: what rope-bench measures and how to run it.
//   3. The roofline: bytes and flops per element, arithmetic intensity against
//      the machine balance of this CPU (measured here) and of an H200
//      (published figures), and where each CPU backend's time goes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

// ---------------------------------------------------------------------------
// 1. Equivalence
// ---------------------------------------------------------------------------

struct Case {
    const char* name;
    rope::RopeConfig config;
    tutorial::Shape q, k;  // Logical sizes; the layout says how they sit in memory.
    rope::Layout layout = rope::Layout::bhsd;
    rope::DType dtype = rope::DType::f32;
    int64_t offset = 0;
    rope::Direction direction = rope::Direction::forward;
    bool in_place = true;
};

rope::RopeConfig make_config(int64_t head_dim, rope::Style style = rope::Style::half_split, int64_t rotary_dim = 0) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    config.style = style;
    return config;
}

std::vector<Case> cases() {
    const tutorial::Shape founding{.batch = 4, .heads = 8, .seq = 256, .head_dim = 64};
    std::vector<Case> list;
    list.push_back({"founding example [4,8,256,64]", make_config(64), founding, founding});
    list.push_back({"interleaved pairs", make_config(64, rope::Style::interleaved), founding, founding});
    Case bf16{"bfloat16 storage", make_config(64), founding, founding};
    bf16.dtype = rope::DType::bf16;
    list.push_back(bf16);
    list.push_back({"partial rotary 32 of 80", make_config(80, rope::Style::half_split, 32),
                    {.batch = 2, .heads = 4, .seq = 128, .head_dim = 80}, {.batch = 2, .heads = 4, .seq = 128, .head_dim = 80}});
    Case gqa{"GQA 8/2 heads, bshd, pos 1000+", make_config(128), {.batch = 2, .heads = 8, .seq = 64, .head_dim = 128},
             {.batch = 2, .heads = 2, .seq = 64, .head_dim = 128}};
    gqa.layout = rope::Layout::bshd;
    gqa.offset = 1000;
    list.push_back(gqa);
    Case inverse{"inverse, out of place", make_config(64), founding, founding};
    inverse.direction = rope::Direction::inverse;
    inverse.in_place = false;
    list.push_back(inverse);
    return list;
}

// Runs one case on one backend, staging through device memory for a GPU
// backend; returns the rotated q and k, widened to float.
std::pair<std::vector<float>, std::vector<float>> run_case(rope::Backend& backend, const Case& c,
                                                           const std::vector<unsigned char>& q,
                                                           const std::vector<unsigned char>& k) {
    const rope::Device device = backend.device();
    rope::Buffer q_in(device, q.size()), k_in(device, k.size());
    rope::Buffer q_out(device, q.size()), k_out(device, k.size());
    q_in.copy_from_host(q.data());
    k_in.copy_from_host(k.data());
    auto view = [&](const rope::Buffer& buffer, const tutorial::Shape& shape) {
        return rope::TensorView::contiguous(buffer.data(), c.dtype, device, c.layout, shape.in(c.layout));
    };
    const rope::Positions positions = rope::Positions::starting_at(c.offset);
    const rope::RopeArgs args =
        c.in_place ? rope::RopeArgs::in_place(view(q_in, c.q), view(k_in, c.k), positions, c.direction)
                   : rope::RopeArgs::out_of_place(view(q_in, c.q), view(k_in, c.k), view(q_out, c.q),
                                                  view(k_out, c.k), positions, c.direction);
    rope::apply(backend, c.config, args);
    if (device == rope::Device::cuda) rope::cuda_synchronize();
    std::vector<unsigned char> q_result(q.size()), k_result(k.size());
    (c.in_place ? q_in : q_out).copy_to_host(q_result.data());
    (c.in_place ? k_in : k_out).copy_to_host(k_result.data());
    return {tutorial::from_storage(q_result, c.dtype), tutorial::from_storage(k_result, c.dtype)};
}

// ---------------------------------------------------------------------------
// 3. Roofline measurements (one thread, indicative)
// ---------------------------------------------------------------------------

// Multiply-adds per second one core reaches in this build: 64 independent
// chains, which the compiler turns into SIMD instructions, with enough
// independent work to hide each instruction's latency.
double measured_flops_per_second() {
    constexpr int kLanes = 64, kSteps = 200000;
    std::vector<float> acc(kLanes, 1.0f);
    volatile float a = 0.999f, b = 0.001f;  // volatile: the compiler may not fold the loop away.
    const float fa = a, fb = b;
    const double seconds = tutorial::median_seconds(5, [&] {
        for (int step = 0; step < kSteps; ++step)
            for (int j = 0; j < kLanes; ++j) acc[size_t(j)] = acc[size_t(j)] * fa + fb;
    });
    volatile float sink = acc[0];
    (void)sink;
    return 2.0 * kLanes * kSteps / seconds;  // One multiply and one add per lane and step.
}

// Seconds per cos + sin of one float angle, as cpu-naive and cpu-eigen call them.
double measured_cos_sin_seconds() {
    constexpr int kCalls = 200000;
    volatile float sink = 0;
    const double seconds = tutorial::median_seconds(5, [&] {
        float sum = 0;
        for (int i = 0; i < kCalls; ++i) {
            const float angle = float(i) * 0.0137f;
            sum += std::cos(angle) + std::sin(angle);
        }
        sink = sum;
    });
    return seconds / kCalls;
}

}  // namespace

int main() {
    tutorial::print_title(5, "Comparing backends",
                          "every backend computes the same values; RoPE moves 8 bytes per 3 flops, so memory sets "
                          "its speed");
    tutorial::Checks checks;

    tutorial::print_section("1. Equivalence: the same calls on every backend");
    std::vector<std::string> backends;
    for (const rope::BackendInfo& info : rope::list_backends()) {
        std::printf("  %-15s %-5s %s%s%s\n", info.name.c_str(), std::string(rope::device_name(info.device)).c_str(),
                    info.available ? "available" : "unavailable", info.available ? "" : ": ",
                    info.available ? "" : info.reason.c_str());
        if (info.available) backends.push_back(info.name);
    }
    std::printf("\nlargest |backend - cpu-naive| per call, and cpu-naive's relative L2 error against float64:\n");
    std::printf("%-32s %13s", "call", "cpu-naive/f64");
    for (const std::string& name : backends)
        if (name != "cpu-naive") std::printf(" %15s", name.c_str());
    std::printf("\n");
    double worst_agreement = 0;
    int calls = 0;
    bool all_agree = true;
    for (const Case& c : cases()) {
        const std::vector<float> q_values = tutorial::random_values(size_t(c.q.numel()), 51);
        const std::vector<float> k_values = tutorial::random_values(size_t(c.k.numel()), 52);
        const auto q_bytes = tutorial::to_storage(q_values, c.dtype);
        const auto k_bytes = tutorial::to_storage(k_values, c.dtype);
        auto naive = rope::make_backend("cpu-naive");
        const auto reference = run_case(*naive, c, q_bytes, k_bytes);
        // The formula in float64 on the values actually stored (bf16 inputs are rounded).
        tutorial::Formula formula;
        formula.style = c.config.style;
        formula.rotary_dim = c.config.rotary_dim;
        formula.offset = c.offset;
        formula.layout = c.layout;
        formula.inverse = c.direction == rope::Direction::inverse;
        const double error =
            std::max(tutorial::relative_l2(reference.first,
                                           tutorial::rope_float64(tutorial::from_storage(q_bytes, c.dtype), c.q, formula)),
                     tutorial::relative_l2(reference.second,
                                           tutorial::rope_float64(tutorial::from_storage(k_bytes, c.dtype), c.k, formula)));
        // bf16 keeps 8 significant bits: its outputs are rounded to about 2^-9 relative.
        const bool bf16 = c.dtype == rope::DType::bf16;
        const double error_tolerance = bf16 ? 4e-3 : 2e-5, agreement_tolerance = bf16 ? 1e-2 : 1e-5;
        all_agree = all_agree && error <= error_tolerance;
        std::printf("%-32s %13.1e", c.name, error);
        for (const std::string& name : backends) {
            if (name == "cpu-naive") continue;
            auto backend = rope::make_backend(name);
            const auto result = run_case(*backend, c, q_bytes, k_bytes);
            const double agreement = std::max(tutorial::max_abs_difference(result.first, reference.first),
                                              tutorial::max_abs_difference(result.second, reference.second));
            all_agree = all_agree && agreement <= agreement_tolerance;
            if (!bf16) worst_agreement = std::max(worst_agreement, agreement);
            ++calls;
            std::printf(" %15.1e", agreement);
        }
        std::printf("\n");
    }
    std::printf("(tolerances: float32 1e-5 against cpu-naive and 2e-5 against float64; bfloat16 one bf16 step,\n"
                " 1e-2, and 4e-3. The test suite runs far more: ctest -L unit, including 2000 random calls.)\n");
    checks.expect(all_agree, std::to_string(backends.size()) + " backend(s) agree on " + std::to_string(cases().size()) +
                                 " kinds of call (largest float32 difference " + tutorial::sci(worst_agreement) + ")");

    tutorial::print_section("2. The benchmark");
    std::printf("rope-bench times Backend::run alone (validated plan built beforehand), rotating through input\n"
                "sets larger than the last-level cache, and reports the median, GB/s and %% of a copy of the same\n"
                "bytes with the same threads. For example:\n"
                "  build/default/bench/rope-bench --backend all --shape 1,32,4096,128 --kv-heads 8\n"
                "  build/default/bench/rope-bench --backend cpu-eigen --threads 1,2 --dtype bf16 --format csv\n"
                "scripts/bench-cpu writes bench/results/cpu-rope-bench.csv; the docs' benchmark page plots bench/results/*.csv.\n");

    tutorial::print_section("3. The roofline: why RoPE is memory-bound");
    // Per pair: x' = x c - y s, y' = y c + x s: 4 multiplies and 2 adds, so 3 flops per element.
    // Per element: read once, write once.
    const double flops_per_element = 3.0;
    const double intensity_f32 = flops_per_element / 8.0, intensity_bf16 = flops_per_element / 4.0;
    std::printf("per element: %.0f flops (4 mul + 2 add per pair), bytes moved: 8 (fp32) or 4 (bf16/fp16)\n",
                flops_per_element);
    std::printf("arithmetic intensity: %.3f flop/byte (fp32), %.2f (bf16); cos/sin add ~1 angle and a sincos per\n"
                "(position, pair), shared by every head: negligible once reused (chapters 2 and 4)\n",
                intensity_f32, intensity_bf16);
    // An unoptimised or instrumented build (Debug, sanitizers) runs the flop loop far below what
    // the core can do, so its measured balance would mean nothing.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
    const bool meaningful_flops = true;
#else
    const bool meaningful_flops = false;
#endif
    const double flops = measured_flops_per_second();
    const size_t copy_floats = size_t(32) << 20;  // 128 MB: far larger than the caches.
    std::vector<float> source(copy_floats, 1.0f), target(copy_floats);
    const double copy_seconds = tutorial::median_seconds(
        5, [&] { std::memcpy(target.data(), source.data(), copy_floats * sizeof(float)); });
    const double bandwidth = 2.0 * double(copy_floats * sizeof(float)) / copy_seconds;  // read + write
    const double cpu_balance = flops / bandwidth;
    // NVIDIA H200 SXM datasheet: 67 TFLOP/s float32 (without tensor cores), 4.8 TB/s HBM3e.
    const double h200_flops = 67e12, h200_bandwidth = 4.8e12;
    std::printf("\n%-34s %14s %14s %16s\n", "machine", "flop/s", "bytes/s", "balance (flop/B)");
    std::printf("%-34s %14.2e %14.2e %16.2f%s\n", "this CPU, one core (measured)", flops, bandwidth, cpu_balance,
                meaningful_flops ? "" : "  (Debug/sanitizer build: not meaningful)");
    std::printf("%-34s %14.2e %14.2e %16.2f\n", "NVIDIA H200 (published figures)", h200_flops, h200_bandwidth,
                h200_flops / h200_bandwidth);
    // The CPU figure comes from a short scalar loop on whatever machine runs this
    // (a busy or virtualised core can read far below its peak), so it is shown,
    // not asserted; the check uses the H200's published figures.
    std::printf("RoPE's %.3f flop/byte is below the H200's balance: at full bandwidth its arithmetic units idle\n"
                "%.0f%% of the time. Attainable = min(peak flop/s, intensity x bandwidth): the bandwidth term\n"
                "wins, so the right yardstick is %% of a copy, not %% of peak flop/s. The CPU row is indicative:\n"
                "a scalar loop on one core%s.\n",
                intensity_f32, 100 * (1 - intensity_f32 / (h200_flops / h200_bandwidth)),
                meaningful_flops && cpu_balance > intensity_f32 ? ", and RoPE is below its balance too"
                                                                : ", which here measured below RoPE's intensity");
    checks.expect(intensity_f32 < h200_flops / h200_bandwidth,
                  "RoPE's intensity (" + tutorial::fixed(intensity_f32, 3) + " flop/B) is below the H200's balance (" +
                      tutorial::fixed(h200_flops / h200_bandwidth, 1) + "): memory-bound");

    // Where the time of each CPU backend goes, on q [1, 32, 1024, 128] + k [1, 8, 1024, 128].
    const tutorial::Shape q_shape{.batch = 1, .heads = 32, .seq = 1024, .head_dim = 128};
    const tutorial::Shape k_shape{.batch = 1, .heads = 8, .seq = 1024, .head_dim = 128};
    std::vector<float> q = tutorial::random_values(size_t(q_shape.numel()), 53);
    std::vector<float> k = tutorial::random_values(size_t(k_shape.numel()), 54);
    const double bytes = 2.0 * double(q.size() + k.size()) * sizeof(float);
    const double cos_sin = measured_cos_sin_seconds();
    const double pairs = 64;
    std::printf("\nwhere the time goes, q [1, 32, 1024, 128] + k [1, 8, 1024, 128], one thread:\n");
    std::printf("  one cos + sin: %.1f ns (measured); moving %.0f MB at the copy's bandwidth: %.2f ms\n", 1e9 * cos_sin,
                bytes / 1e6, 1e3 * bytes / bandwidth);
    std::printf("  %-10s %16s %16s %14s  %s\n", "backend", "cos/sin (ms)", "memory (ms)", "measured (ms)", "bound by");
    const rope::RopeConfig config = make_config(128);
    for (const char* name : {"cpu-naive", "cpu-eigen"}) {
        if (!rope::backend_info(name).available) continue;
        auto backend = rope::make_backend(name, {.threads = 1});
        auto q_view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                                   q_shape.in(rope::Layout::bhsd));
        auto k_view = rope::TensorView::contiguous(k.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                                   k_shape.in(rope::Layout::bhsd));
        const double measured = tutorial::median_seconds(
            3, [&] { rope::apply(*backend, config, rope::RopeArgs::in_place(q_view, k_view)); });
        // cpu-naive: a cos and a sin per (head, token, pair); cpu-eigen: per (token, pair).
        const double trig_calls = std::string(name) == "cpu-naive" ? double(q_shape.heads + k_shape.heads) * 1024 * pairs
                                                                   : 1024 * pairs;
        const double trig = trig_calls * cos_sin, memory = bytes / bandwidth;
        std::printf("  %-10s %16.2f %16.2f %14.2f  %s\n", name, 1e3 * trig, 1e3 * memory, 1e3 * measured,
                    trig > memory ? "trigonometry (compute)" : "memory");
    }
    std::printf("(indicative: one thread, one machine, possibly shared; predictions are lower bounds that ignore\n"
                " everything but the one resource)\n");

    return checks.finish(std::to_string(backends.size()) + " backends agree; RoPE: " + tutorial::fixed(intensity_f32, 3) +
                         " flop/B vs balance " + tutorial::fixed(cpu_balance, 1) + " (this CPU), " +
                         tutorial::fixed(h200_flops / h200_bandwidth, 1) + " (H200): memory-bound");
}
