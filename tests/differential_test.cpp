// Randomised differential testing: the generator of random calls that the
// validation fuzzer also drives (tests/random_call.hpp), from a seeded
// std::mt19937_64, draws valid calls (every dtype, layout, style, scaling type,
// multi-axis assignment and position form, partial rotary, grouped-query heads,
// the precise-angle mode, a caller's cos/sin table, inverse, in place; each of
// the four tensors dense, padded, transposed in any axis order, sometimes one
// element off its storage's alignment or with storage after it). Each runs on
// every available backend: against the float64 oracle where it computes the
// call, and against cpu-naive, within random_call's tolerance. Every byte of
// storage the call must not write (outside the outputs' views; an out-of-place
// call's inputs) is checked too, and every call must be accepted.
//
// ROPE_DIFFERENTIAL_CONFIGS sets how many calls (default 2000); a failure
// prints the process seed (ROPE_TEST_SEED reproduces the whole run) and the
// index and description of the failing call.
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "random_call.hpp"
#include "support.hpp"

namespace {

// The drawn view in storage of its own: the placement's bytes before its
// first element and after its last; random inputs, or poisoned outputs.
testing::HostTensor host_tensor(const rope::TensorView& view, const random_call::Placement& placement, bool input) {
    testing::HostTensor t;
    t.view = view;
    t.offset_units = placement.byte_offset / 2;
    t.storage.assign(size_t(t.offset_units + (*random_call::byte_extent(view) + placement.tail_bytes) / 2), 0);
    t.view.data = t.storage.data() + t.offset_units;
    if (input) t.fill_random();
    else t.poison();
    return t;
}

// The drawn call on host tensors, with a table of arbitrary values in [-0.7, 0.7]
// (the oracle reads the same table; no output exceeds a rotation's 2 sqrt 2 bound).
testing::Call host_call(const random_call::Call& drawn, std::mt19937_64& rng) {
    testing::Call call;
    call.config = drawn.config;
    call.in_place = drawn.in_place();
    call.q = host_tensor(drawn.views[random_call::kQ], drawn.placements[random_call::kQ], true);
    call.k = host_tensor(drawn.views[random_call::kK], drawn.placements[random_call::kK], true);
    call.q_out = host_tensor(drawn.views[random_call::kQOut], drawn.placements[random_call::kQOut], false);
    call.k_out = host_tensor(drawn.views[random_call::kKOut], drawn.placements[random_call::kKOut], false);
    const rope::Positions& p = drawn.positions;
    call.ids = drawn.ids;
    call.id_axes = p.axes;
    call.id_rows = p.rows;
    call.offset = p.offset;
    call.cu_seqlens = drawn.cu_seqlens;
    call.starts = drawn.starts;
    call.cp_size = p.cp_size;
    call.cp_rank = p.cp_rank;
    call.direction = drawn.direction;
    if (drawn.has_cache) {
        const rope::CosSinCache& c = drawn.cache;
        std::uniform_real_distribution<float> arbitrary(-0.7f, 0.7f);
        call.table.resize(size_t(c.rows * std::max(c.row_stride, c.cols)));
        for (float& value : call.table) value = arbitrary(rng);
        call.table_rows = c.rows;
        call.table_cols = c.cols;
        call.table_row_stride = c.row_stride;
    }
    return call;
}

}  // namespace

TEST_CASE("randomised differential run: every available backend vs the oracle and cpu-naive") {
    const char* env = std::getenv("ROPE_DIFFERENTIAL_CONFIGS");
    const long configs = env ? std::atol(env) : 2000;
    std::mt19937_64 rng(testing::seed() ^ 0x5eedULL);
    random_call::RngSource source(rng);
    auto naive = rope::make_backend("cpu-naive");
    std::vector<std::unique_ptr<rope::Backend>> backends;
    for (const rope::BackendInfo& info : rope::list_backends())
        if (info.available && info.name != "cpu-naive") backends.push_back(rope::make_backend(info.name));

    long runs = 0, failures = 0, oracle_checked = 0, beyond_limits = 0;
    for (long index = 0; index < configs; ++index) {
        const random_call::Call drawn = random_call::draw(source);
        const testing::Call before = host_call(drawn, rng);
        testing::Call reference = before;
        std::string rejected;
        try {
            testing::run(*naive, reference);
        } catch (const rope::Error& error) {
            rejected = error.what();
        }
        const rope::DType dtype = before.q.view.dtype;
        const bool use_oracle = rejected.empty() && random_call::oracle_computes(before.config);
        testing::Expected want;
        double oracle_abs = 0, attention = 1;
        if (use_oracle) {
            ++oracle_checked;
            want = testing::oracle_for(before);
            const int64_t seq = before.q.view.geometry().seq;
            oracle_abs = random_call::oracle_max_abs(before.config, before.config.precise_angles || drawn.has_cache,
                                                     random_call::largest_position(before.positions(), seq), dtype);
        }
        if (rejected.empty() && reference.q.view.numel() + reference.k.view.numel() > 0) {
            const rope::RopeArgs args = rope::RopeArgs::out_of_place(before.q.view, before.k.view, before.q_out.view,
                                                                     before.k_out.view, before.positions());
            attention = random_call::attention_factor(before.config, args);
        }
        for (size_t b = 0; b <= backends.size(); ++b) {
            testing::Call call = before;
            rope::Backend& backend = b == 0 ? *naive : *backends[b - 1];
            // The generator draws head rows past the CUDA backends' frequency capacity
            // (BackendLimits): those calls are the CPU backends' to compare
            // (cuda_edge_cases_test checks that the others refuse them by name).
            if (rejected.empty() && before.config.effective_rotary_dim() > backend.limits().max_rotary_dim) {
                ++beyond_limits;
                continue;
            }
            std::ostringstream why;
            if (!rejected.empty()) {
                why << " the generator drew a call rope rejects: " << rejected;
            } else {
                if (b > 0) testing::run(backend, call);
                const testing::Call& result = b == 0 ? reference : call;
                why << testing::unexpected_writes(before, result);
                for (int which = 0; which < 2; ++which) {
                    const auto got = (which == 0 ? result.q_result() : result.k_result()).values();
                    if (use_oracle) {
                        const oracle::ErrorStats stats = oracle::compare(got, which == 0 ? want.q : want.k);
                        if (stats.non_finite > 0 || !(stats.max_abs <= oracle_abs))
                            why << (which ? " k" : " q") << " vs oracle: max_abs " << stats.max_abs << " > "
                                << oracle_abs << ", non-finite " << stats.non_finite << ";";
                    }
                    if (b == 0) continue;
                    const auto ref = (which == 0 ? reference.q_result() : reference.k_result()).values();
                    const int64_t i = random_call::first_disagreement(got, ref, dtype, attention);
                    if (i >= 0)
                        why << (which ? " k" : " q") << "[" << i << "] = " << got[size_t(i)] << " vs cpu-naive "
                            << ref[size_t(i)] << ";";
                }
            }
            ++runs;
            if (!why.str().empty()) {
                ++failures;
                if (failures <= 10)
                    FAIL_CHECK("seed " << testing::seed() << " call #" << index << " on " << backend.name() << ":"
                                       << why.str() << "\n"
                                       << random_call::describe(drawn));
            }
            if (!rejected.empty()) break;
        }
    }
    std::cout << "randomised differential run: " << configs << " configurations (" << oracle_checked
              << " against the oracle), " << runs << " backend runs (cpu-naive + " << backends.size()
              << " other available backend(s); " << beyond_limits << " beyond a backend's rotary_dim limit, not run), "
              << failures << " failures; seed " << testing::seed() << std::endl;
    CHECK(failures == 0);
}
