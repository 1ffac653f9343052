// Randomised differential testing: a seeded generator of random valid calls
// (shapes including head_dim 2 and odd head counts, both layouts, both styles,
// partial rotary, small and very large positions, grouped-query heads, every
// dtype, inverse, in place, the precise-angle mode, and for each of the four
// tensors a memory arrangement: dense, padded, features 2 apart, off 16-byte
// alignment, heads and seq swapped, sometimes a tail of storage beyond the
// view) run on every available backend against the float64 oracle and against
// cpu-naive. Every byte of storage the call must not write (outside the
// outputs' views; an out-of-place call's inputs) is checked too.
//
// ROPE_DIFFERENTIAL_CONFIGS sets how many calls (default 2000); a failure
// prints the process seed (ROPE_TEST_SEED reproduces the whole run) and the
// index and description of the failing call.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "support.hpp"

namespace {

struct RandomCall {
    testing::Call call;
    std::string description;
    int64_t max_position = 0;
};

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> choices) {
    std::uniform_int_distribution<size_t> index(0, choices.size() - 1);
    return *(choices.begin() + index(rng));
}

int64_t uniform(std::mt19937_64& rng, int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

RandomCall random_call(std::mt19937_64& rng) {
    rope::RopeConfig config;
    config.head_dim = pick<int64_t>(rng, {2, 4, 6, 8, 16, 32, 34, 64, 80, 96, 128, 256});
    config.rotary_dim = uniform(rng, 0, 1) ? 0 : 2 * uniform(rng, 1, config.head_dim / 2);
    config.style = uniform(rng, 0, 1) ? rope::Style::half_split : rope::Style::interleaved;
    config.base = pick<double>(rng, {10000.0, 500000.0, 1000000.0, 100.0, 1.5e4 * double(uniform(rng, 1, 50))});
    config.precise_angles = uniform(rng, 0, 4) == 0;
    const rope::DType dtype = pick(rng, {rope::DType::f32, rope::DType::f32, rope::DType::bf16, rope::DType::f16});
    const rope::Layout layout = uniform(rng, 0, 1) ? rope::Layout::bhsd : rope::Layout::bshd;
    const int64_t batch = uniform(rng, 1, 3), seq = uniform(rng, 1, 9);
    const int64_t k_heads = uniform(rng, 0, 9) == 0 ? 0 : uniform(rng, 1, 3);
    const int64_t q_heads = std::max<int64_t>(k_heads, 1) * uniform(rng, 1, 4);
    std::array<testing::StorageOptions, 4> storage;  // q, k, q_out, k_out
    for (testing::StorageOptions& options : storage) options = testing::random_storage(rng);
    auto shape = [&](int64_t heads) {
        return layout == rope::Layout::bhsd ? std::array<int64_t, 4>{batch, heads, seq, config.head_dim}
                                            : std::array<int64_t, 4>{batch, seq, heads, config.head_dim};
    };
    RandomCall r;
    r.call = testing::make_call(config, dtype, layout, shape(q_heads), shape(k_heads));
    testing::arrange(r.call, storage, rng);
    r.call.direction = uniform(rng, 0, 3) == 0 ? rope::Direction::inverse : rope::Direction::forward;
    r.call.in_place = uniform(rng, 0, 2) == 0;
    // Positions: mostly short, sometimes far into a long context.
    const int64_t largest = pick<int64_t>(rng, {16, 4096, 131072, 1000000});
    const int64_t kind = uniform(rng, 0, 2);
    if (kind == 0) {
        r.call.offset = uniform(rng, 0, largest);
        r.max_position = r.call.offset + seq;
    } else {
        r.call.id_rows = kind == 1 ? 1 : batch;
        for (int64_t i = 0; i < r.call.id_rows * seq; ++i) r.call.ids.push_back(uniform(rng, 0, largest));
        for (int64_t id : r.call.ids) r.max_position = std::max(r.max_position, id + 1);
    }
    std::ostringstream text;
    text << rope::style_name(config.style) << " " << rope::layout_name(layout) << " " << rope::dtype_name(dtype)
         << " q[" << batch << "," << q_heads << "," << seq << "," << config.head_dim << "] k_heads " << k_heads
         << " rotary " << config.effective_rotary_dim() << " base " << config.base << " storage "
         << testing::storage_name(storage[0]) << "/" << testing::storage_name(storage[1]) << "/"
         << testing::storage_name(storage[2]) << "/" << testing::storage_name(storage[3])
         << (config.precise_angles ? " precise" : "") << (r.call.in_place ? " in-place" : " out-of-place")
         << (r.call.direction == rope::Direction::inverse ? " inverse" : " forward") << " positions "
         << (kind == 0 ? "offset " + std::to_string(r.call.offset) : (kind == 1 ? "shared ids" : "per-sequence ids"))
         << " (max " << r.max_position << ")";
    r.description = text.str();
    return r;
}

// Unit roundoff of the storage type: the rounding of the float32 result on store.
double storage_roundoff(rope::DType dtype) {
    switch (dtype) {
        case rope::DType::bf16: return 1.0 / 256;
        case rope::DType::f16: return 1.0 / 2048;
        case rope::DType::f32: break;
    }
    return 0.0;
}

}  // namespace

TEST_CASE("randomised differential run: every available backend vs the oracle and cpu-naive") {
    const char* env = std::getenv("ROPE_DIFFERENTIAL_CONFIGS");
    const long configs = env ? std::atol(env) : 2000;
    std::mt19937_64 rng(testing::seed() ^ 0x5eedULL);
    auto naive = rope::make_backend("cpu-naive");
    std::vector<std::unique_ptr<rope::Backend>> backends;
    for (const rope::BackendInfo& info : rope::list_backends())
        if (info.available && info.name != "cpu-naive") backends.push_back(rope::make_backend(info.name));

    long runs = 0, failures = 0;
    for (long index = 0; index < configs; ++index) {
        RandomCall r = random_call(rng);
        const testing::Expected want = testing::oracle_for(r.call);
        testing::Call reference = r.call;
        testing::run(*naive, reference);
        // Against the oracle: the float32 angle error (grows with position; the
        // precise mode removes it, so there its bound is that of position 0) plus
        // one rounding to the storage type of outputs up to 2*sqrt(2) in magnitude.
        const int64_t angle_position = r.call.config.precise_angles ? 0 : r.max_position;
        const double oracle_abs = testing::fp32_max_abs(angle_position) + 2.9 * storage_roundoff(reference.q.view.dtype);
        const double agree_rel = 2 * storage_roundoff(reference.q.view.dtype);  // one storage ulp
        for (size_t b = 0; b <= backends.size(); ++b) {
            testing::Call call = r.call;
            rope::Backend& backend = b == 0 ? *naive : *backends[b - 1];
            if (b > 0) testing::run(backend, call);
            const testing::Call& result = b == 0 ? reference : call;
            bool ok = true;
            std::ostringstream why;
            const std::string writes = testing::unexpected_writes(r.call, result);
            if (!writes.empty()) {
                ok = false;
                why << " " << writes;
            }
            for (int which = 0; which < 2; ++which) {
                const auto got = (which == 0 ? result.q_result() : result.k_result()).values();
                const auto& exact = which == 0 ? want.q : want.k;
                const oracle::ErrorStats stats = oracle::compare(got, exact);
                if (stats.non_finite > 0 || stats.max_abs > oracle_abs) {
                    ok = false;
                    why << (which ? " k" : " q") << " vs oracle: max_abs " << stats.max_abs << " > " << oracle_abs
                        << ", non-finite " << stats.non_finite << ";";
                }
                if (b == 0) continue;
                const auto ref = (which == 0 ? reference.q_result() : reference.k_result()).values();
                for (size_t i = 0; i < got.size(); ++i) {
                    if (!(std::fabs(got[i] - ref[i]) <= agree_rel * std::fabs(ref[i]) + 4e-6)) {
                        ok = false;
                        why << (which ? " k" : " q") << "[" << i << "] = " << got[i] << " vs cpu-naive " << ref[i] << ";";
                        break;
                    }
                }
            }
            ++runs;
            if (!ok) {
                ++failures;
                if (failures <= 10)
                    FAIL_CHECK("seed " << testing::seed() << " call #" << index << " on " << backend.name() << ": "
                                       << r.description << ":" << why.str());
            }
        }
    }
    std::cout << "randomised differential run: " << configs << " configurations, " << runs
              << " backend runs (cpu-naive + " << backends.size() << " other available backend(s)), " << failures
              << " failures; seed " << testing::seed() << std::endl;
    CHECK(failures == 0);
}
