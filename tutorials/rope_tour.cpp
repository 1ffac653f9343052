// The rope tour: the founding example run through every backend on this machine.
//
// q and k of shape [batch 4, heads 8, seq 256, head_dim 64], float32, base 10000,
// positions 0..255, half-split pairs: out = x*cos + rotate_half(x)*sin.
// Each available backend rotates the same random inputs; the tour prints how
// far each result is from a float64 evaluation of the formula and from
// cpu-naive, the readable specification, then PASSED or FAILED.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/rope.hpp>

namespace {

constexpr int64_t batch = 4, heads = 8, seq = 256, head_dim = 64;
constexpr int64_t numel = batch * heads * seq * head_dim;

// The formula in float64, written the way HuggingFace writes it:
// out = x * cos(m theta) + rotate_half(x) * sin(m theta), rotate_half(x) = [-x2, x1].
std::vector<double> rope_in_double(const std::vector<float>& x) {
    std::vector<double> out(x.size());
    const int64_t half = head_dim / 2;
    for (int64_t row = 0; row < batch * heads * seq; ++row) {
        const int64_t m = row % seq;  // Position of this row's token.
        const float* in = x.data() + row * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) {
            const int64_t i = d % half;  // Pair index: d pairs with d +- half.
            const double theta = std::pow(10000.0, -2.0 * double(i) / double(head_dim));
            const double rotated_half = d < half ? -double(in[d + half]) : double(in[d - half]);
            out[size_t(row * head_dim + d)] = in[d] * std::cos(m * theta) + rotated_half * std::sin(m * theta);
        }
    }
    return out;
}

double relative_l2(const std::vector<float>& got, const std::vector<double>& want) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        ref += want[i] * want[i];
    }
    return std::sqrt(diff / ref);
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    return std::isfinite(worst) ? worst : INFINITY;
}

struct Outcome {
    std::vector<float> q, k;
    double microseconds;
};

// Rotates copies of q and k in place with `backend`; staged through device
// memory for CUDA backends. Reports the median time of a few calls.
Outcome run(rope::Backend& backend, const rope::RopeConfig& config, const std::vector<float>& q,
            const std::vector<float>& k) {
    const size_t bytes = size_t(numel) * sizeof(float);
    const rope::Device device = backend.device();
    rope::Buffer q_buffer(device, bytes), k_buffer(device, bytes);
    std::vector<double> times;
    for (int repeat = 0; repeat < 5; ++repeat) {
        q_buffer.copy_from_host(q.data());
        k_buffer.copy_from_host(k.data());
        auto qv = rope::TensorView::contiguous(q_buffer.data(), rope::DType::f32, device, rope::Layout::bhsd,
                                               {batch, heads, seq, head_dim});
        auto kv = rope::TensorView::contiguous(k_buffer.data(), rope::DType::f32, device, rope::Layout::bhsd,
                                               {batch, heads, seq, head_dim});
        const auto start = std::chrono::steady_clock::now();
        rope::apply(backend, config, rope::RopeArgs::in_place(qv, kv));
        if (device == rope::Device::cuda) rope::cuda_synchronize();  // Device work is asynchronous.
        times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    Outcome outcome{std::vector<float>(size_t(numel)), std::vector<float>(size_t(numel)), times[times.size() / 2]};
    q_buffer.copy_to_host(outcome.q.data());
    k_buffer.copy_to_host(outcome.k.data());
    return outcome;
}

}  // namespace

int main() {
    std::printf("rope tour: RoPE on q and k of shape [%ld, %ld, %ld, %ld], float32, base 10000, half-split\n\n",
                long(batch), long(heads), long(seq), long(head_dim));
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(numel)), k(static_cast<size_t>(numel));
    for (float& x : q) x = value(rng);
    for (float& x : k) x = value(rng);
    const std::vector<double> q_exact = rope_in_double(q), k_exact = rope_in_double(k);

    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.base = 10000.0;
    config.style = rope::Style::half_split;

    auto naive = rope::make_backend("cpu-naive");
    const Outcome reference = run(*naive, config, q, k);

    // Tolerances: rel L2 against float64 (the float32 angle's rounding gives ~1e-6 here),
    // and the backends' agreement with cpu-naive (same float32 angles: a few ulps).
    const double oracle_tolerance = 2e-6, agreement_tolerance = 4e-6;
    bool all_passed = true;
    int ran = 0;
    std::printf("%-15s %-10s %14s %14s %12s  %s\n", "backend", "device", "relL2 vs fp64", "max|d| naive", "time (us)",
                "check");
    for (const rope::BackendInfo& info : rope::list_backends()) {
        if (!info.available) {
            std::printf("%-15s %-10s %14s %14s %12s  skipped: %s\n", info.name.c_str(),
                        std::string(rope::device_name(info.device)).c_str(), "-", "-", "-", info.reason.c_str());
            continue;
        }
        auto backend = rope::make_backend(info.name);
        const Outcome outcome = run(*backend, config, q, k);
        const double error = std::max(relative_l2(outcome.q, q_exact), relative_l2(outcome.k, k_exact));
        const double agreement = std::max(max_abs_difference(outcome.q, reference.q), max_abs_difference(outcome.k, reference.k));
        const bool passed = error <= oracle_tolerance && agreement <= agreement_tolerance;
        all_passed = all_passed && passed;
        ++ran;
        std::printf("%-15s %-10s %14.3e %14.3e %12.1f  %s\n", info.name.c_str(),
                    std::string(rope::device_name(info.device)).c_str(), error, agreement, outcome.microseconds,
                    passed ? "ok" : "MISMATCH");
    }
    std::printf("\n(time: median of 5 in-place calls, including the device synchronisation; rope-bench measures properly)\n");
    std::printf("tolerances: relL2 vs float64 <= %.0e, max |difference| vs cpu-naive <= %.0e\n", oracle_tolerance,
                agreement_tolerance);
    std::printf("%s: %d backend(s) ran and %s\n", all_passed ? "PASSED" : "FAILED", ran,
                all_passed ? "agree" : "DISAGREE");
    return all_passed ? 0 : 1;
}
