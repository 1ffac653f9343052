// rope::rerotate_cache on every backend: the rows of a paged key cache that a
// slot mapping names, turned in place from positions `from` to positions `to`.
// The expected rows come from the float64 oracle's re-rotation (oracle::rerotate)
// of the gathered rows, scattered back by this file's own slot arithmetic; every
// other element of the cache (rows no slot names, padding between pages) must
// keep its bits. Also: the call equals rope::rerotate of the gathered rows, and
// bad input is refused naming the parameter, with nothing written. The CUDA
// backends run on device copies and report Skipped without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "oracle.hpp"
#include "rope/buffer.hpp"
#include "rope/error.hpp"
#include "rope/rerotate.hpp"
#include "support.hpp"

using testing::HostTensor;

namespace {

// A paged cache on the host with the entries that name its slots.
struct CacheCase {
    rope::RopeConfig config{.head_dim = 32};
    rope::DType dtype = rope::DType::f32;
    bool hnd = false;
    int64_t pages = 6, page_size = 4, heads = 2, entries = 9;
    int64_t page_gap = 0;  // Elements between pages that belong to no row.
    HostTensor memory;     // The cache's elements, as a flat tensor [elements, 1, 1, 1].
    std::vector<int64_t> slots, from, to;

    int64_t page_elements() const { return page_size * heads * config.head_dim; }
    rope::PagedCache cache() const {
        rope::PagedCache c = hnd ? rope::PagedCache::hnd(memory.view.data, rope::Device::host, pages, page_size, heads,
                                                         config.head_dim)
                                 : rope::PagedCache::nhd(memory.view.data, rope::Device::host, pages, page_size, heads,
                                                         config.head_dim);
        c.stride_page += page_gap;
        return c;
    }
    rope::RerotateCacheArgs args() const {
        return rope::RerotateCacheArgs{cache(), dtype,
                                       rope::SlotMapping{slots.data(), int64_t(slots.size()), rope::Device::host},
                                       rope::Positions::shared(from.data(), int64_t(from.size())),
                                       rope::Positions::shared(to.data(), int64_t(to.size())), nullptr};
    }
    // Element offset of feature 0 of (slot, head): this file's own arithmetic.
    int64_t row(int64_t slot, int64_t head) const {
        const int64_t page = slot / page_size, in_page = slot % page_size;
        const int64_t d = config.head_dim;
        return page * (page_elements() + page_gap) +
               (hnd ? (head * page_size + in_page) * d : (in_page * heads + head) * d);
    }
};

// Fresh random cache rows, distinct slots over a shuffled list of all slots (the
// pages in no order), `padding` of them -1, positions in [0, 5000).
CacheCase make_case(const rope::RopeConfig& config, rope::DType dtype, bool hnd, int64_t page_gap = 0,
                    int64_t padding = 2) {
    static std::mt19937_64 rng(0x5e11ca11);
    CacheCase c;
    c.config = config;
    c.dtype = dtype;
    c.hnd = hnd;
    c.page_gap = page_gap;
    c.memory = HostTensor::make(dtype, rope::Layout::bhsd, {1, 1, c.pages * (c.page_elements() + page_gap), 1});
    c.memory.fill_random();
    std::vector<int64_t> all(size_t(c.pages * c.page_size));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    c.slots.assign(all.begin(), all.begin() + c.entries);
    for (int64_t p = 0; p < padding; ++p) c.slots[size_t(1 + 3 * p)] = -1;
    std::uniform_int_distribution<int64_t> position(0, 4999);
    for (int64_t t = 0; t < c.entries; ++t) c.from.push_back(position(rng)), c.to.push_back(position(rng));
    return c;
}

size_t element_bytes(rope::DType dtype) { return size_t(rope::dtype_size(dtype)); }

// The rows of the entries with a slot, gathered into [n, heads, head_dim] (thd), and their positions.
struct Gathered {
    HostTensor rows;
    std::vector<int64_t> entries, from, to;
};

Gathered gather(const CacheCase& c) {
    Gathered g;
    for (int64_t t = 0; t < c.entries; ++t)
        if (c.slots[size_t(t)] >= 0) g.entries.push_back(t), g.from.push_back(c.from[size_t(t)]), g.to.push_back(c.to[size_t(t)]);
    const int64_t n = int64_t(g.entries.size()), d = c.config.head_dim;
    g.rows = HostTensor::make(c.dtype, rope::Layout::thd, {n, c.heads, d, 1});
    const size_t e = element_bytes(c.dtype);
    for (int64_t s = 0; s < n; ++s)
        for (int64_t h = 0; h < c.heads; ++h)
            std::memcpy(static_cast<char*>(g.rows.view.data) + size_t((s * c.heads + h) * d) * e,
                        static_cast<const char*>(c.memory.view.data) + size_t(c.row(c.slots[size_t(g.entries[s])], h)) * e,
                        size_t(d) * e);
    return g;
}

// Runs rerotate_cache on `backend`; CUDA backends get device copies of the cache, the slots and the ids.
void run(rope::Backend& backend, CacheCase& c) {
    if (backend.device() == rope::Device::host) {
        rope::rerotate_cache(backend, c.config, c.args());
        return;
    }
    // copy_from_host copies a whole buffer: each is exactly its host array's size (all non-empty here).
    rope::Buffer memory(rope::Device::cuda, c.memory.bytes()), slots(rope::Device::cuda, c.slots.size() * 8),
        from(rope::Device::cuda, c.from.size() * 8), to(rope::Device::cuda, c.to.size() * 8);
    memory.copy_from_host(c.memory.storage.data());
    slots.copy_from_host(c.slots.data());
    from.copy_from_host(c.from.data());
    to.copy_from_host(c.to.data());
    rope::RerotateCacheArgs args = c.args();
    args.k_cache.data = static_cast<char*>(memory.data()) +
                        (static_cast<char*>(c.memory.view.data) - reinterpret_cast<char*>(c.memory.storage.data()));
    args.k_cache.device = rope::Device::cuda;
    args.slot_mapping = {static_cast<const int64_t*>(slots.data()), int64_t(c.slots.size()), rope::Device::cuda};
    args.from = rope::Positions::shared(static_cast<const int64_t*>(from.data()), int64_t(c.from.size()), rope::Device::cuda);
    args.to = rope::Positions::shared(static_cast<const int64_t*>(to.data()), int64_t(c.to.size()), rope::Device::cuda);
    rope::rerotate_cache(backend, c.config, args);
    memory.copy_to_host(c.memory.storage.data());
}

// Relative tolerance of one stored rotation: the precise angle's rotation in float32
// (below 1e-6 relative, tests/rerotate_test.cpp says why), then one rounding to the storage dtype.
double tolerance(rope::DType dtype) {
    return dtype == rope::DType::f32 ? 1e-6 : dtype == rope::DType::f16 ? 1.0 / 1024 : 1.0 / 128;
}

// Checks `after` (c's cache after the call) against the oracle: the named rows turned,
// every other storage unit as it was in `before`.
void check_against_oracle(const CacheCase& before, const CacheCase& after) {
    const Gathered g = gather(before);
    const int64_t n = int64_t(g.entries.size()), d = before.config.head_dim;
    const std::vector<double> want =
        oracle::rerotate(before.config, g.rows.view, rope::Positions::shared(g.from.data(), n),
                         rope::Positions::shared(g.to.data(), n));
    const std::vector<double> got_all = after.memory.values();
    std::vector<bool> named(got_all.size(), false);
    const double rel = tolerance(before.dtype);
    int64_t bad = 0;
    for (int64_t s = 0; s < n; ++s)
        for (int64_t h = 0; h < before.heads; ++h) {
            const int64_t row = before.row(before.slots[size_t(g.entries[s])], h);
            for (int64_t f = 0; f < d; ++f) {
                named[size_t(row + f)] = true;
                const double w = want[size_t((h * n + s) * d + f)], got = got_all[size_t(row + f)];
                if (!(std::abs(got - w) <= rel * (std::abs(w) + 2.0) * 2)) {
                    if (bad++ < 5) MESSAGE("entry ", g.entries[s], " head ", h, " feature ", f, ": got ", got, ", want ", w);
                }
            }
        }
    CHECK(bad == 0);
    // Every element no slot names keeps its bits (storage units, padding included).
    const size_t units_per_element = element_bytes(before.dtype) / 2;
    const auto* base = before.memory.storage.data();
    const size_t first = size_t(static_cast<const uint16_t*>(before.memory.view.data) - base);
    int64_t touched = 0;
    for (size_t u = 0; u < before.memory.storage.size(); ++u) {
        const bool in_view = u >= first && (u - first) / units_per_element < named.size();
        if (in_view && named[(u - first) / units_per_element]) continue;
        if (before.memory.storage[u] != after.memory.storage[u]) ++touched;
    }
    CHECK(touched == 0);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("rerotate_cache: NHD and HND, dtypes, pairings, padding slots, against the oracle", B,
                          oracle_cases) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (const rope::DType dtype : {rope::DType::f32, rope::DType::f16, rope::DType::bf16})
        for (const bool hnd : {false, true})
            for (const rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
                CAPTURE(rope::dtype_name(dtype));
                CAPTURE(hnd);
                CAPTURE(int(style));
                const CacheCase before = make_case(rope::RopeConfig{.head_dim = 32, .style = style}, dtype, hnd);
                CacheCase after = before;
                run(*backend, after);
                check_against_oracle(before, after);
            }
}
TEST_CASE_TEMPLATE_APPLY(oracle_cases, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rerotate_cache: partial rotary, linear scaling, gaps between pages keep their bits", B,
                          partial) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    rope::RopeConfig config{.head_dim = 64, .rotary_dim = 48, .base = 500000.0};
    config.scaling.type = rope::ScalingType::linear;
    config.scaling.factor = 4.0;
    for (const bool hnd : {false, true}) {
        CAPTURE(hnd);
        const CacheCase before = make_case(config, rope::DType::bf16, hnd, /*page_gap=*/40, /*padding=*/3);
        CacheCase after = before;
        run(*backend, after);
        check_against_oracle(before, after);
    }
}
TEST_CASE_TEMPLATE_APPLY(partial, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rerotate_cache equals rope::rerotate of the gathered rows (window, HF's DeepSeek order)", B,
                          equals_rerotate) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // A plain head; MLA's window (the last 16 of 48 features, as k_pe after the nope part);
    // keys in HF's DeepSeek order, re-rotated where their pairs lie.
    const std::vector<rope::RopeConfig> configs{
        rope::RopeConfig{.head_dim = 32},
        rope::RopeConfig{.head_dim = 48, .rotary_dim = 16, .rotary_offset = 32},
        rope::RopeConfig{.head_dim = 32, .style = rope::Style::interleaved_to_half},
    };
    for (const rope::RopeConfig& config : configs)
    for (const rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
        CAPTURE(rope::dtype_name(dtype));
        CAPTURE(config.rotary_offset);
        CAPTURE(int(config.style));
        const CacheCase before = make_case(config, dtype, true);
        CacheCase after = before;
        run(*backend, after);
        // The same rotation through rope::rerotate (on cpu-naive, the readable specification).
        Gathered g = gather(before);
        const int64_t n = int64_t(g.entries.size());
        auto naive = rope::make_backend("cpu-naive");
        rope::rerotate(*naive, before.config,
                       rope::RerotateArgs::in_place(g.rows.view, rope::Positions::shared(g.from.data(), n),
                                                    rope::Positions::shared(g.to.data(), n)));
        const Gathered turned = gather(after);
        // One stored rounding apart at most (bit for bit on the backends that share cpu-naive's pair steps).
        const std::vector<double> want = g.rows.values(), got = turned.rows.values();
        REQUIRE(want.size() == got.size());
        for (size_t i = 0; i < want.size(); ++i)
            REQUIRE(std::abs(got[i] - want[i]) <= tolerance(dtype) * (std::abs(want[i]) + 2.0));
        if (backend->name() == "cpu-naive" || backend->name() == "cpu-eigen") CHECK(turned.rows.storage == g.rows.storage);
    }
}
TEST_CASE_TEMPLATE_APPLY(equals_rerotate, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rerotate_cache: a device slot past the cache is skipped", B, device_slot) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    if (backend->device() == rope::Device::host) return;  // Host slots are refused (below).
    CacheCase before = make_case(rope::RopeConfig{.head_dim = 32}, rope::DType::f32, false);
    CacheCase after = before;
    after.slots[0] = before.pages * before.page_size + 3;
    before.slots[0] = -1;  // What the oracle expects: entry 0 writes nothing.
    run(*backend, after);
    after.slots = before.slots;
    check_against_oracle(before, after);
}
TEST_CASE_TEMPLATE_APPLY(device_slot, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rerotate_cache bad input: named, nothing written", B, bad_input) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    struct Case {
        std::string message;
        std::function<void(CacheCase&, rope::RerotateCacheArgs&)> spoil;
        bool host_values = false;  // Found in host arrays' values only.
    };
    const std::vector<Case> cases{
        {"slot_mapping.slots[4] = 24", [](CacheCase&, rope::RerotateCacheArgs& a) { const_cast<int64_t*>(a.slot_mapping.slots)[4] = 24; }, true},
        {"slot_mapping.slots[5]", [](CacheCase&, rope::RerotateCacheArgs& a) { auto* s = const_cast<int64_t*>(a.slot_mapping.slots); s[5] = s[2]; }, true},
        {"k_cache.dtype = e4m3fn", [](CacheCase&, rope::RerotateCacheArgs& a) { a.k_cache.dtype = rope::CacheDType::e4m3fn; }},
        {"k_cache.head_dim = 16", [](CacheCase&, rope::RerotateCacheArgs& a) { a.k_cache.head_dim = 16; }},
        {"k_cache.page_size = 0", [](CacheCase&, rope::RerotateCacheArgs& a) { a.k_cache.page_size = 0; }},
        {"k_cache.strides = [256, 32, 32]", [](CacheCase&, rope::RerotateCacheArgs& a) { a.k_cache.stride_slot = 32; }},
        {"from.length = 8", [](CacheCase&, rope::RerotateCacheArgs& a) { a.from.length = 8; }},
        {"to.length = 10", [](CacheCase&, rope::RerotateCacheArgs& a) { a.to.length = 10; }},
        {"slot_mapping.count = -1", [](CacheCase&, rope::RerotateCacheArgs& a) { a.slot_mapping.count = -1; }},
        {"scaling.type = dynamic", [](CacheCase& c, rope::RerotateCacheArgs&) {
             c.config.scaling.type = rope::ScalingType::dynamic;
             c.config.scaling.factor = 2.0;
             c.config.scaling.original_max_position_embeddings = 1024;
             c.from[0] = 10, c.to[0] = 4000;  // to reaches past 2048: other frequencies than from's.
             for (size_t t = 1; t < c.from.size(); ++t) c.from[t] = std::min<int64_t>(c.from[t], 100);
         }, true},
    };
    for (const Case& bad : cases) {
        if (bad.host_values && backend->device() != rope::Device::host) continue;
        CAPTURE(bad.message);
        CacheCase c = make_case(rope::RopeConfig{.head_dim = 32}, rope::DType::f32, false, 0, 1);
        const std::vector<uint16_t> before = c.memory.storage;
        rope::RerotateCacheArgs args = c.args();
        bad.spoil(c, args);
        if (backend->device() == rope::Device::host) {
            CHECK_THROWS_WITH_AS(rope::rerotate_cache(*backend, c.config, args), doctest::Contains(bad.message.c_str()),
                                 rope::Error);
            CHECK(c.memory.storage == before);
        } else {
            // Host arrays handed to a CUDA backend are refused by their device first; the checks
            // of sizes and dtypes come before that, so the cases above still name their parameter.
            CHECK_THROWS_AS(rope::rerotate_cache(*backend, c.config, args), rope::Error);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(bad_input, AllBackends);

TEST_CASE("rerotate_cache: a backend without it refuses, naming itself") {
    struct Bare final : rope::Backend {
        std::string name() const override { return "bare"; }
        rope::Device device() const override { return rope::Device::host; }
        void run(const rope::Plan&) override {}
    } bare;
    CacheCase c = make_case(rope::RopeConfig{.head_dim = 32}, rope::DType::f32, false);
    CHECK_THROWS_WITH_AS(rope::rerotate_cache(bare, c.config, c.args()), doctest::Contains("backend = bare"),
                         rope::Error);
}
