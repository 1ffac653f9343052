// A q tensor of more than 2^31 elements, rotated in place by each CUDA
// backend, and every element checked against float64.
//
// Several public RoPE kernels computed element offsets in 32 bits and failed
// (illegal memory accesses, or silently wrong rows) once a packed qkv passed
// 2^31 elements. rope's indices are int64 throughout; this test holds it to
// that, on a bf16 q of 16400 x 1024 x 128 = 2,149,580,800 elements (4.3 GB on
// the device, as much again on the host), in two ways:
//  - bhsd [1, 16400, 1024, 128], half-split, 16-byte aligned: the head offset
//    h * stride passes 2^31 (the 16-byte vector path of cuda-optimized);
//  - bshd [1, 1024, 16400, 128], interleaved, one element off 16-byte
//    alignment: the token offset passes 2^31 (the generic path).
// Positions are 0..1023, so the float32 angle is off by at most
// 1023 * 2^-23 radians (theta_0 = 1) and the check can be tight: each output
// element must be within half a bf16 ulp (2^-8 of its value) plus 4e-4 of the
// rotation computed in float64 from the same bf16 inputs (the angle error
// times a pair norm below 2.83 is 3.4e-4). The 8 elements of storage after
// the view, and the one before the misaligned view, must be unchanged.
//
// Doctest suite "large", CTest label `large`: `rope-tests --test-suite=large`
// or `ctest -L large` runs it alone, `--test-suite-exclude=large` or
// `ctest -LE large` leaves it out (compute-sanitizer runs should: it
// instruments every one of the 2^31 accesses). Without a GPU, or with less
// than 4.4 GB of free device memory, it is reported Skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "backend_tags.hpp"
#include "cuda_helpers.hpp"
#include "support.hpp"

namespace {

constexpr int64_t kHeads = 16400, kTokens = 1024, kHeadDim = 128;
constexpr int64_t kRows = kHeads * kTokens;
constexpr int64_t kNumel = kRows * kHeadDim;  // 2,149,580,800
static_assert(kNumel > (int64_t(1) << 31));
constexpr int64_t kGuard = 8;  // Storage elements after the view.

// Input element `index` of the storage: a value in [-2, -0.05] U [0.05, 2]
// derived from the index alone (the splitmix64 hash), so the check can
// recompute every input instead of keeping a second 4.3 GB copy.
float input_value(uint64_t index) {
    uint64_t x = index + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float unit = float(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float magnitude = 0.05f + 1.95f * unit;
    return (x & 1) ? -magnitude : magnitude;
}

// The bf16 storage bits of input element `index`, and their value.
uint16_t input_bits(uint64_t index) { return rope::from_float<rope::bfloat16>(input_value(index)).bits; }
double bf16_value(uint16_t bits) { return rope::to_float(rope::bfloat16{bits}); }

// Runs f(begin, end) over [0, count) split across the machine's cores.
template <typename F>
void parallel_for(int64_t count, F f) {
    const int64_t workers = std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t chunk = (count + workers - 1) / workers;
    std::vector<std::thread> threads;
    for (int64_t begin = 0; begin < count; begin += chunk)
        threads.emplace_back([=] { f(begin, std::min(count, begin + chunk)); });
    for (std::thread& thread : threads) thread.join();
}

struct Case {
    rope::Layout layout;
    rope::Style style;
    int64_t shift;  // Elements of storage before the view's first element.
};

// What the check found in one stretch of rows.
struct Findings {
    int64_t failures = 0;
    double worst = 0;     // Largest error as a fraction of its tolerance.
    std::string first;    // The first failure, described.
};

}  // namespace

TEST_SUITE("large") {
TEST_CASE_TEMPLATE_DEFINE("large: q of more than 2^31 elements (bf16, 4.3 GB), every element against float64", B,
                          large) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const int64_t storage_elements = 1 + kNumel + kGuard;  // Room for the misaligned case's leading element.
    const size_t bytes = size_t(storage_elements) * 2;
    if (testing::cuda::free_device_memory() < bytes + (size_t(256) << 20)) {
        testing::report_skip(std::string(B::name) + " with 2^31 elements",
                             "needs " + std::to_string(bytes >> 20) + " MiB of free device memory");
        return;
    }
    rope::Buffer device(rope::Device::cuda, bytes);
    std::vector<uint16_t> host(static_cast<size_t>(storage_elements));

    // cos and sin of every (position, pair) in float64, theta_i = 10000^(-2i/d).
    const int64_t pairs = kHeadDim / 2;
    std::vector<double> cos_table(size_t(kTokens * pairs)), sin_table(size_t(kTokens * pairs));
    for (int64_t p = 0; p < kTokens; ++p)
        for (int64_t i = 0; i < pairs; ++i) {
            const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / double(kHeadDim));
            cos_table[size_t(p * pairs + i)] = std::cos(angle);
            sin_table[size_t(p * pairs + i)] = std::sin(angle);
        }

    for (const Case c : {Case{rope::Layout::bhsd, rope::Style::half_split, 0},
                         Case{rope::Layout::bshd, rope::Style::interleaved, 1}}) {
        CAPTURE(rope::layout_name(c.layout));
        CAPTURE(rope::style_name(c.style));
        CAPTURE(c.shift);
        parallel_for(storage_elements, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) host[size_t(i)] = input_bits(uint64_t(i));
        });
        device.copy_from_host(host.data());

        rope::RopeConfig config;
        config.head_dim = kHeadDim;
        config.style = c.style;
        const std::array<int64_t, 4> shape = c.layout == rope::Layout::bhsd
                                                 ? std::array<int64_t, 4>{1, kHeads, kTokens, kHeadDim}
                                                 : std::array<int64_t, 4>{1, kTokens, kHeads, kHeadDim};
        void* q_data = static_cast<uint16_t*>(device.data()) + c.shift;
        const auto q = rope::TensorView::contiguous(q_data, rope::DType::bf16, rope::Device::cuda, c.layout, shape);
        auto no_k = q;
        no_k.shape[c.layout == rope::Layout::bhsd ? 1 : 2] = 0;
        rope::apply(*backend, config, rope::RopeArgs::in_place(q, no_k));
        rope::cuda_synchronize();
        device.copy_to_host(host.data());

        // Row r (one head of one token) starts at element shift + r * head_dim;
        // its token is r % tokens in bhsd, r / heads in bshd.
        std::vector<Findings> findings(std::max<unsigned>(1, std::thread::hardware_concurrency()) + 1);
        std::atomic<size_t> next_slot{0};
        parallel_for(kRows, [&](int64_t begin, int64_t end) {
            Findings& found = findings[next_slot++];
            for (int64_t r = begin; r < end; ++r) {
                const int64_t position = c.layout == rope::Layout::bhsd ? r % kTokens : r / kHeads;
                const int64_t row = c.shift + r * kHeadDim;
                for (int64_t i = 0; i < pairs; ++i) {
                    const int64_t first = c.style == rope::Style::half_split ? i : 2 * i;
                    const int64_t second = c.style == rope::Style::half_split ? i + pairs : 2 * i + 1;
                    const double x = bf16_value(input_bits(uint64_t(row + first)));
                    const double y = bf16_value(input_bits(uint64_t(row + second)));
                    const double cos_angle = cos_table[size_t(position * pairs + i)];
                    const double sin_angle = sin_table[size_t(position * pairs + i)];
                    const double want[2] = {x * cos_angle - y * sin_angle, y * cos_angle + x * sin_angle};
                    const int64_t at[2] = {row + first, row + second};
                    for (int e = 0; e < 2; ++e) {
                        const double got = bf16_value(host[size_t(at[e])]);
                        const double tolerance = std::ldexp(std::fabs(want[e]), -8) + 4e-4;
                        const double error = std::fabs(got - want[e]);
                        if (error <= tolerance) {  // NaN fails here too.
                            found.worst = std::max(found.worst, error / tolerance);
                            continue;
                        }
                        if (found.failures++ == 0)
                            found.first = "element " + std::to_string(at[e]) + " (row " + std::to_string(r) +
                                          ", position " + std::to_string(position) + ", pair " + std::to_string(i) +
                                          "): got " + std::to_string(got) + ", float64 " + std::to_string(want[e]);
                    }
                }
            }
        });
        Findings total;
        for (const Findings& found : findings) {
            if (total.first.empty()) total.first = found.first;
            total.failures += found.failures;
            total.worst = std::max(total.worst, found.worst);
        }
        CHECK_MESSAGE(total.failures == 0, total.failures << " elements beyond tolerance; first: " << total.first);
        // The storage around the view: untouched.
        int64_t guards_changed = 0;
        for (int64_t i = 0; i < c.shift; ++i) guards_changed += host[size_t(i)] != input_bits(uint64_t(i));
        for (int64_t i = c.shift + kNumel; i < storage_elements; ++i)
            guards_changed += host[size_t(i)] != input_bits(uint64_t(i));
        CHECK(guards_changed == 0);
        std::cout << "large tensor: " << B::name << ", " << rope::layout_name(c.layout) << " [" << shape[0] << ", "
                  << shape[1] << ", " << shape[2] << ", " << shape[3] << "] bf16 " << rope::style_name(c.style)
                  << (c.shift ? ", one element off alignment" : ", aligned") << ": " << kNumel << " elements, "
                  << total.failures << " beyond tolerance (worst " << total.worst << " of it), " << guards_changed
                  << " guard elements changed" << std::endl;
    }
}
TEST_CASE_TEMPLATE_APPLY(large, CudaBackends);
}  // TEST_SUITE("large")
