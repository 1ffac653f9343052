// Fuzz target `validation`: rope::apply's promise, on inputs no person would write.
//
// rope promises that a call either throws rope::Error and writes nothing, or
// rotates q and k correctly and writes nothing else. libFuzzer's bytes drive
// the tests' generator of random calls (tests/random_call.hpp, as a hostile
// source: it also draws what validation must reject), whose four tensor views
// and table are placed here in one guarded memory arena, so that outputs can
// be their inputs, separate, or partially overlapping them. Then:
//
//   - when every view fits in a small arena, rope::apply runs on cpu-naive and
//     on cpu-eigen, each from the same starting bytes. Both must throw
//     rope::Error, and then no byte of the arena or of the position arrays
//     changed; or both return, no byte outside the output elements changed,
//     the outputs equal the float64 oracle (tests/oracle.hpp) within the
//     tests' tolerance (for the scaling types the oracle computes: none and
//     linear), and cpu-eigen agrees with cpu-naive (random_call::agrees);
//   - otherwise (sizes or strides too large to allocate, or overflowing 64
//     bits) only the validation runs (rope::make_plan, which reads no tensor
//     memory): it must throw rope::Error or accept, and it must never accept a
//     view whose element offsets do not fit in int64.
//
// Then the same bytes go on to draw a RoPE + KV append call (rope::append_kv):
// small dense q, k, v, and two caches whose geometry, strides, dtype (model or
// FP8), scales and place in one cache region (so they may interleave or
// collide), and whose slot mapping (negative, past the cache, repeated, short),
// are hostile numbers. cpu-naive and cpu-eigen must both throw rope::Error and
// write nothing, or both return having written only q_out, k_out and the rows
// of the valid slots, no byte of which two rows claim (the exact overlap check),
// with equal cache bytes where the caches are FP8 and agreeing values otherwise.
//
// Anything else (another exception, a sanitizer report, a failed check)
// aborts, and libFuzzer keeps the input as a crash. The call is printed first,
// so a crash file explains itself: rope-fuzz-validation CRASH_FILE (with
// ROPE_FUZZ_PRINT=1 in the environment, every input's call is printed).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "oracle.hpp"
#include "random_call.hpp"
#include "rope/detail/kv_append_plan.hpp"
#include "rope/detail/plan.hpp"
#include "rope/rope.hpp"

namespace {

using random_call::Call;
using random_call::kCache;
using random_call::kK;
using random_call::kKOut;
using random_call::kQ;
using random_call::kQOut;
using random_call::kRegionNames;
using random_call::kRegions;
using rope::DType;

// The generator's choices, each from the same FuzzedDataProvider call as
// before the generator was shared, so the committed inputs keep their meaning.
class FuzzSource : public random_call::Source {
public:
    FuzzSource(const uint8_t* data, size_t size) : Source(true), in_(data, size) {}
    int64_t integer_in(int64_t low, int64_t high) override { return in_.ConsumeIntegralInRange<int64_t>(low, high); }
    double real_in(double low, double high) override { return in_.ConsumeFloatingPointInRange<double>(low, high); }
    int64_t any_integer() override { return in_.ConsumeIntegral<int64_t>(); }
    double any_real() override { return in_.ConsumeFloatingPoint<double>(); }
    uint64_t bits() override { return in_.ConsumeIntegral<uint64_t>(); }

private:
    FuzzedDataProvider in_;
};

[[noreturn]] void failure(const Call& call, const std::string& what) {
    std::fprintf(stderr, "\n=== rope-fuzz-validation: %s\n%s", what.c_str(), random_call::describe(call).c_str());
    std::abort();
}

// ---------------------------------------------------------------------------
// 1. The arena: every operand's bytes, between guard bytes
// ---------------------------------------------------------------------------

// Per operand: more than any plausible call needs, little enough that one
// input runs in about a millisecond.
constexpr int64_t kMaxRegionBytes = 1 << 16;
constexpr int64_t kGuardBytes = 64;  // before the first region, between regions, after the last

// Element (b, h, s, d) of a view, through its Geometry: the backends' own indexing.
uintptr_t element_address(const rope::TensorView& view, const rope::Geometry& g, int64_t b, int64_t h, int64_t s,
                          int64_t d) {
    return reinterpret_cast<uintptr_t>(view.data) + uintptr_t(g.offset(b, h, s, d) * rope::dtype_size(view.dtype));
}

template <typename Visit>
void for_each_element(const rope::TensorView& view, Visit&& visit) {
    if (view.numel() == 0) return;
    const rope::Geometry g = view.geometry();
    for (int64_t b = 0; b < g.batch; ++b)
        for (int64_t h = 0; h < g.heads; ++h)
            for (int64_t s = 0; s < g.seq; ++s)
                for (int64_t d = 0; d < g.head_dim; ++d) visit(element_address(view, g, b, h, s, d));
}

void store(uintptr_t address, DType dtype, float value) {
    rope::dispatch_dtype(dtype, [&](auto storage) {
        using Storage = decltype(storage);
        const Storage stored = rope::from_float<Storage>(value);
        std::memcpy(reinterpret_cast<void*>(address), &stored, sizeof stored);
    });
}

// splitmix64: a tiny, well-known generator, enough for guard bytes and inputs.
struct Random {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    // Uniform in [-2, -0.05] U [0.05, 2], as the tests' inputs: never zero.
    float input_value() {
        const float magnitude = 0.05f + 1.95f * float(next() >> 40) / float(1 << 24);
        return (next() & 1) ? -magnitude : magnitude;
    }
};

// The memory of one call. `run` is true when every operand fits and the
// backends can run; otherwise the views point at made-up addresses, far apart,
// that validation may look at but nothing reads.
struct Arena {
    bool run = false;
    std::vector<uint8_t> bytes;
    std::array<int64_t, kRegions> region_start{};  // byte offsets in `bytes`
    std::array<int64_t, kRegions> region_size{};
};

Arena lay_out(Call& call) {
    Arena arena;
    arena.run = true;
    for (int r = 0; r < kRegions; ++r) {
        const std::optional<int64_t> extent =
            r == kCache ? (call.has_cache ? random_call::byte_extent(call.cache) : std::optional<int64_t>(0))
                        : random_call::byte_extent(call.views[size_t(r)]);
        arena.run = arena.run && extent && *extent <= kMaxRegionBytes;
        // A view with zero strides has few bytes and may still have 2^40 elements to visit.
        if (r != kCache && extent) arena.run = arena.run && call.views[size_t(r)].numel() <= kMaxRegionBytes / 2;
        arena.region_size[size_t(r)] = extent ? *extent : 0;
    }
    uintptr_t base = 0;
    if (arena.run) {
        int64_t offset = kGuardBytes;
        for (int r = 0; r < kRegions; ++r) {
            arena.region_start[size_t(r)] = offset;
            // Regions start 64-byte aligned, as allocations do; only placements inside another region misalign.
            offset += (std::min(arena.region_size[size_t(r)], kMaxRegionBytes) + kGuardBytes + 63) / 64 * 64;
        }
        arena.bytes.assign(size_t(offset + kGuardBytes), 0);
        base = reinterpret_cast<uintptr_t>(arena.bytes.data());
    } else {
        // 2^44 bytes apart: distinct regions do not overlap unless an extent is that large.
        static uint8_t somewhere[64];
        base = reinterpret_cast<uintptr_t>(somewhere);
        for (int r = 0; r < kRegions; ++r) arena.region_start[size_t(r)] = int64_t(r) << 44;
    }
    auto address_of = [&](const random_call::Placement& placement) {
        const int64_t room = std::min(arena.region_size[size_t(placement.region)], kMaxRegionBytes);
        const int64_t offset = placement.byte_offset % (room + 1);  // inside, or just past, that region
        return reinterpret_cast<void*>(base + uintptr_t(arena.region_start[size_t(placement.region)] + offset));
    };
    for (int v = 0; v < 4; ++v) call.views[size_t(v)].data = address_of(call.placements[size_t(v)]);
    if (call.has_cache) call.cache.data = address_of(call.placements[kCache]);
    return arena;
}

// Guard pattern everywhere, NaN in every output element, random values in
// every input element, and in the table values no formula would produce
// (random, in [-1, 1]): the oracle reads the same table, so a lookup of the
// wrong row, pair or half cannot agree with it by luck.
// Returns false when the finished arena does not hold the inputs intact (an
// operand was written over by a later one): the call is then only validated.
bool fill(const Call& call, Arena& arena) {
    Random random{call.fill_seed};
    for (uint8_t& byte : arena.bytes) byte = uint8_t(random.next());
    for (int out : {kQOut, kKOut}) {
        const rope::TensorView& view = call.views[size_t(out)];
        for_each_element(view, [&](uintptr_t address) { store(address, view.dtype, NAN); });
    }
    for (int input : {kQ, kK}) {
        const rope::TensorView& view = call.views[size_t(input)];
        for_each_element(view, [&](uintptr_t address) { store(address, view.dtype, random.input_value()); });
    }
    if (!call.has_cache) return true;
    const rope::CosSinCache& cache = call.cache;
    const int64_t row_stride = std::max(cache.row_stride, cache.cols);
    auto* table = static_cast<uint8_t*>(const_cast<void*>(cache.data));
    if (cache.rows <= 0 || cache.cols <= 0 || cache.row_stride < 0) return true;
    for (int64_t p = 0; p < cache.rows; ++p) {
        for (int64_t j = 0; j < cache.cols; ++j) {
            const float value = random.input_value() / 2.0f;
            std::memcpy(table + 4 * (p * row_stride + j), &value, 4);
        }
    }
    // The table was written last: an input that shares its bytes no longer
    // holds input values (they may be NaN when read as fp16/bf16).
    const uintptr_t table_begin = reinterpret_cast<uintptr_t>(table);
    const uintptr_t table_end = table_begin + uintptr_t(*random_call::byte_extent(cache));
    bool intact = true;
    for (int input : {kQ, kK})
        for_each_element(call.views[size_t(input)], [&](uintptr_t address) {
            if (address + 4 > table_begin && address < table_end) intact = false;
        });
    return intact;
}

// ---------------------------------------------------------------------------
// 2. The checks
// ---------------------------------------------------------------------------

// Bytes of the arena the call may write: those of every output element.
std::vector<bool> writable_bytes(const Call& call, const Arena& arena) {
    std::vector<bool> writable(arena.bytes.size(), false);
    const uintptr_t base = reinterpret_cast<uintptr_t>(arena.bytes.data());
    for (int out : {kQOut, kKOut}) {
        const rope::TensorView& view = call.views[size_t(out)];
        for_each_element(view, [&](uintptr_t address) {
            for (int64_t i = 0; i < rope::dtype_size(view.dtype); ++i) writable[size_t(address - base) + size_t(i)] = true;
        });
    }
    return writable;
}

// The elements of a view as doubles, dense in (batch, heads, seq, dim) order.
// (Not by looping over an empty view: its other sizes may be 2^63.)
std::vector<double> values(const rope::TensorView& view) {
    return view.numel() == 0 ? std::vector<double>{} : oracle::values(view);
}

// What a backend left in memory, and what the checks need of it.
struct Outcome {
    bool threw = false;
    std::string message;
    std::vector<double> q, k;  // the outputs, dense in (batch, heads, seq, dim) order
};

Outcome run_backend(rope::Backend& backend, const Call& call, Arena& arena, const std::vector<uint8_t>& start,
                    const rope::RopeArgs& args) {
    std::memcpy(arena.bytes.data(), start.data(), start.size());
    const std::vector<int64_t> ids = call.ids, cu_seqlens = call.cu_seqlens, starts = call.starts;
    Outcome outcome;
    try {
        rope::apply(backend, call.config, args);
    } catch (const rope::Error& error) {
        outcome.threw = true;
        outcome.message = error.what();
    }
    // Any other exception escapes to libFuzzer, which reports it as a crash.
    const std::string who = backend.name() + ": ";
    if (ids != call.ids || cu_seqlens != call.cu_seqlens || starts != call.starts)
        failure(call, who + "a position array changed");
    if (outcome.threw) {
        if (outcome.message.rfind("rope::Error: ", 0) != 0) failure(call, who + "malformed message: " + outcome.message);
        if (std::memcmp(arena.bytes.data(), start.data(), start.size()) != 0)
            failure(call, who + "threw (" + outcome.message + ") after writing to memory");
        return outcome;
    }
    const std::vector<bool> writable = writable_bytes(call, arena);
    for (size_t i = 0; i < start.size(); ++i) {
        if (!writable[i] && arena.bytes[i] != start[i]) {
            // Name the region the stray byte belongs to (or the guard it hit).
            std::string where = "a guard";
            for (int r = 0; r < kRegions; ++r)
                if (int64_t(i) >= arena.region_start[size_t(r)] &&
                    int64_t(i) < arena.region_start[size_t(r)] + arena.region_size[size_t(r)])
                    where = kRegionNames[r];
            failure(call, who + "wrote byte " + std::to_string(i) + " of the arena, in " + where +
                              ", outside the output elements");
        }
    }
    outcome.q = values(call.views[kQOut]);
    outcome.k = values(call.views[kKOut]);
    return outcome;
}

void check_against_oracle(const Call& call, const Outcome& outcome, const std::string& backend,
                          const std::vector<double>& want_q, const std::vector<double>& want_k, double tolerance) {
    for (int which = 0; which < 2; ++which) {
        const oracle::ErrorStats stats = oracle::compare(which == 0 ? outcome.q : outcome.k, which == 0 ? want_q : want_k);
        if (stats.non_finite > 0 || !(stats.max_abs <= tolerance))
            failure(call, backend + ": " + (which == 0 ? "q" : "k") + " differs from the oracle: max_abs " +
                              std::to_string(stats.max_abs) + " (tolerance " + std::to_string(tolerance) +
                              "), non-finite " + std::to_string(stats.non_finite));
    }
}

// Validation alone, for views that exist only as numbers.
void validate_only(const Call& call, const rope::RopeArgs& args) {
    // A valid non-empty call gets a frequency table of about 25 bytes per pair,
    // as it should (its tensors are larger still); past 2^22 pairs that is more
    // memory than a fuzzing process may take, so such configs are not tried.
    if (call.config.effective_rotary_dim() > (int64_t(1) << 23)) return;
    try {
        (void)rope::make_plan(call.config, args, rope::Device::host);
    } catch (const rope::Error&) {
        return;
    }
    // Accepted: every operand must be addressable with int64 element offsets,
    // as every backend computes them (Geometry::offset).
    for (int v = 0; v < 4; ++v)
        if (!random_call::byte_extent(call.views[size_t(v)]))
            failure(call, std::string("make_plan accepted ") + kRegionNames[v] +
                              ", whose element offsets do not fit in int64");
}


// cpu-eigen must agree with cpu-naive (random_call::agrees says how closely).
void check_agreement(const Call& call, const Outcome& eigen, const Outcome& naive, DType dtype, double attention) {
    if (eigen.threw != naive.threw)
        failure(call, std::string("cpu-eigen ") + (eigen.threw ? "threw " + eigen.message : "returned") +
                          ", cpu-naive " + (naive.threw ? "threw " + naive.message : "returned"));
    if (naive.threw) return;
    for (int which = 0; which < 2; ++which) {
        const std::vector<double>& got = which == 0 ? eigen.q : eigen.k;
        const std::vector<double>& want = which == 0 ? naive.q : naive.k;
        const int64_t i = random_call::first_disagreement(got, want, dtype, attention);
        if (i >= 0)
            failure(call, std::string("cpu-eigen ") + (which == 0 ? "q" : "k") + "[" + std::to_string(i) +
                              "] = " + std::to_string(got[size_t(i)]) + ", cpu-naive " + std::to_string(want[size_t(i)]));
    }
}


// ---------------------------------------------------------------------------
// 2b. RoPE + KV append
// ---------------------------------------------------------------------------

constexpr int64_t kMaxCacheBytes = 1 << 14;
__extension__ typedef __int128 Wide;  // Cache extents of hostile strides, before validation bounds them.

// One hostile append call's memory: q, k, v, q_out, k_out dense, then the cache region.
struct AppendCall {
    rope::RopeConfig config;
    DType dtype = DType::f32;
    int64_t tokens = 0, q_heads = 0, kv_heads = 0, v_dim = 0;
    bool in_place = false;
    std::vector<uint8_t> bytes;  // [q | k | v | q_out | k_out | cache region]
    std::array<int64_t, 6> start{};
    std::vector<int64_t> slots;
    std::vector<float> k_scales, v_scales;
    rope::PagedCache k_cache, v_cache;
    int64_t k_offset = 0, v_offset = 0;  // Bytes into the cache region.
    rope::KvAppendArgs args;
};

int64_t hostile_size(random_call::Source& in, int64_t typical_high) {
    return in.integer_in(0, 15) == 0 ? in.any_integer() : in.integer_in(0, typical_high);
}

AppendCall draw_append(random_call::Source& in) {
    AppendCall a;
    a.dtype = DType(in.integer_in(0, 2));
    a.tokens = in.integer_in(1, 9);
    a.kv_heads = in.integer_in(1, 3);
    a.q_heads = a.kv_heads * in.integer_in(0, 2);
    const int64_t head_dim = 2 * in.integer_in(1, 8);
    a.v_dim = in.integer_in(1, 16);
    a.config.head_dim = head_dim;
    a.config.rotary_dim = 2 * in.integer_in(1, head_dim / 2);
    a.config.style = in.integer_in(0, 1) ? rope::Style::interleaved : rope::Style::half_split;
    a.in_place = in.integer_in(0, 1) == 1;
    const int64_t element = rope::dtype_size(a.dtype);
    const std::array<int64_t, 5> elements{a.tokens * a.q_heads * head_dim, a.tokens * a.kv_heads * head_dim,
                                          a.tokens * a.kv_heads * a.v_dim, a.tokens * a.q_heads * head_dim,
                                          a.tokens * a.kv_heads * head_dim};
    int64_t offset = kGuardBytes;
    for (size_t r = 0; r < 5; ++r) {
        a.start[r] = offset;
        offset += (elements[r] * element + kGuardBytes + 63) / 64 * 64;
    }
    a.start[5] = offset;
    a.bytes.assign(size_t(offset + kMaxCacheBytes + kGuardBytes), 0);
    // The caches: geometry and strides hostile, both in the cache region at hostile offsets.
    for (rope::PagedCache* cache : {&a.k_cache, &a.v_cache}) {
        cache->dtype = rope::CacheDType(in.integer_in(0, 2));
        cache->pages = hostile_size(in, 6);
        cache->page_size = hostile_size(in, 5);
        cache->heads = in.integer_in(0, 7) == 0 ? in.integer_in(0, 4) : a.kv_heads;
        cache->head_dim = in.integer_in(0, 7) == 0 ? in.integer_in(0, 20) : (cache == &a.k_cache ? head_dim : a.v_dim);
        cache->stride_head = hostile_size(in, 40);
        cache->stride_slot = hostile_size(in, 120);
        cache->stride_page = hostile_size(in, 600);
        std::vector<float>& scales = cache == &a.k_cache ? a.k_scales : a.v_scales;
        const int64_t count = in.integer_in(0, 3);
        for (int64_t i = 0; i < count; ++i) scales.push_back(float(in.integer_in(0, 7) == 0 ? in.any_real() : in.real_in(1e-3, 4)));
        (cache == &a.k_cache ? a.k_offset : a.v_offset) = in.integer_in(0, kMaxCacheBytes);
    }
    const int64_t count = in.integer_in(0, a.tokens + 1);
    for (int64_t t = 0; t < count; ++t) a.slots.push_back(in.integer_in(0, 5) == 0 ? in.any_integer() : in.integer_in(-1, 30));
    return a;
}

// Builds the arguments over the memory (after a.bytes is final).
void point(AppendCall& a) {
    uint8_t* base = a.bytes.data();
    const int64_t head_dim = a.config.head_dim;
    auto view = [&](int r, int64_t heads, int64_t dim) {
        return rope::TensorView::packed(base + a.start[size_t(r)], a.dtype, rope::Device::host, {a.tokens, heads, dim});
    };
    const rope::TensorView q = view(0, a.q_heads, head_dim), k = view(1, a.kv_heads, head_dim);
    a.args = rope::KvAppendArgs::in_place(q, k, view(2, a.kv_heads, a.v_dim), rope::Positions::starting_at(3),
                                          rope::SlotMapping{a.slots.data(), int64_t(a.slots.size()), rope::Device::host},
                                          a.k_cache, a.v_cache);
    if (!a.in_place) a.args.q_out = view(3, a.q_heads, head_dim), a.args.k_out = view(4, a.kv_heads, head_dim);
    a.args.k_cache.data = base + a.start[5] + a.k_offset;
    a.args.v_cache.data = base + a.start[5] + a.v_offset;
    a.args.k_cache.scale = a.k_scales.empty() ? nullptr : a.k_scales.data();
    a.args.k_cache.scale_count = int64_t(a.k_scales.size());
    a.args.v_cache.scale = a.v_scales.empty() ? nullptr : a.v_scales.data();
    a.args.v_cache.scale_count = int64_t(a.v_scales.size());
}

std::string describe_append(const AppendCall& a) {
    std::string text = "append_kv: dtype " + std::string(rope::dtype_name(a.dtype)) + ", tokens " +
                       std::to_string(a.tokens) + ", heads q " + std::to_string(a.q_heads) + " kv " +
                       std::to_string(a.kv_heads) + ", head_dim " + std::to_string(a.config.head_dim) + " rotary " +
                       std::to_string(a.config.rotary_dim) + ", v_dim " + std::to_string(a.v_dim) + ", slots [";
    for (int64_t slot : a.slots) text += std::to_string(slot) + " ";
    for (const rope::PagedCache* c : {&a.k_cache, &a.v_cache})
        text += std::string("]; ") + (c == &a.k_cache ? "k_cache" : "v_cache") + " " + rope::cache_dtype_name(c->dtype) +
                " pages " + std::to_string(c->pages) + " page_size " + std::to_string(c->page_size) + " heads " +
                std::to_string(c->heads) + " head_dim " + std::to_string(c->head_dim) + " strides [" +
                std::to_string(c->stride_page) + ", " + std::to_string(c->stride_slot) + ", " +
                std::to_string(c->stride_head) + "] at byte " + std::to_string(c == &a.k_cache ? a.k_offset : a.v_offset);
    return text + "\n";
}

[[noreturn]] void append_failure(const AppendCall& a, const std::string& what) {
    std::fprintf(stderr, "\n=== rope-fuzz-validation: %s\n%s", what.c_str(), describe_append(a).c_str());
    std::abort();
}

// Runs the append on @p backend from @p start; checks that it threw and wrote nothing, or
// wrote only the outputs and the rows of the valid slots, each byte claimed once.
bool run_append(rope::Backend& backend, AppendCall& a, const std::vector<uint8_t>& start, std::string& message) {
    std::memcpy(a.bytes.data(), start.data(), start.size());
    const std::vector<int64_t> slots = a.slots;
    try {
        rope::append_kv(backend, a.config, a.args);
    } catch (const rope::Error& error) {
        message = error.what();
        if (std::memcmp(a.bytes.data(), start.data(), start.size()) != 0)
            append_failure(a, backend.name() + " threw (" + message + ") after writing to memory");
        return false;
    }
    if (slots != a.slots) append_failure(a, backend.name() + ": the slot mapping changed");
    // Bytes the call may write, counted by how many elements claim them.
    std::vector<uint8_t> claims(a.bytes.size(), 0);
    const uintptr_t base = reinterpret_cast<uintptr_t>(a.bytes.data());
    for (const rope::TensorView* out : {&a.args.q_out, &a.args.k_out})
        for_each_element(*out, [&](uintptr_t address) {
            for (int64_t i = 0; i < rope::dtype_size(a.dtype); ++i) claims[size_t(address - base) + size_t(i)] = 1;
        });
    const int64_t limit = a.args.k_cache.pages * a.args.k_cache.page_size;
    for (int64_t slot : a.slots) {
        if (slot < 0 || slot >= limit) continue;
        for (const rope::PagedCache* c : {&a.args.k_cache, &a.args.v_cache}) {
            const int64_t element = c->dtype == rope::CacheDType::model ? rope::dtype_size(a.dtype) : 1;
            for (int64_t h = 0; h < c->heads; ++h) {
                const int64_t row = (slot / c->page_size) * c->stride_page + (slot % c->page_size) * c->stride_slot +
                                    h * c->stride_head;
                for (int64_t i = 0; i < c->head_dim * element; ++i) {
                    const size_t at = size_t(reinterpret_cast<uintptr_t>(c->data) - base) + size_t(row * element + i);
                    if (at >= claims.size()) append_failure(a, "accepted a cache row outside the cache region");
                    if (claims[at] == 2) append_failure(a, "accepted caches whose rows share byte " + std::to_string(at));
                    claims[at] = 2;
                }
            }
        }
    }
    for (size_t i = 0; i < start.size(); ++i)
        if (claims[i] == 0 && a.bytes[i] != start[i])
            append_failure(a, backend.name() + " wrote byte " + std::to_string(i) + " outside its outputs and rows");
    return true;
}

void fuzz_append(random_call::Source& in) {
    static const std::unique_ptr<rope::Backend> naive = rope::make_backend("cpu-naive");
    static const std::unique_ptr<rope::Backend> eigen = rope::make_backend("cpu-eigen");
    AppendCall a = draw_append(in);
    point(a);
    // Caches that do not fit the cache region (or whose offsets overflow) are only validated:
    // validation cannot know the allocation, and must then refuse what overflows int64.
    bool fits = true;
    for (const auto& [cache, offset] : {std::pair{&a.args.k_cache, a.k_offset}, std::pair{&a.args.v_cache, a.v_offset}}) {
        const int64_t element = cache->dtype == rope::CacheDType::model ? rope::dtype_size(a.dtype) : 1;
        // Sizes and strides past 2^20 cannot fit the region with distinct rows: validated only.
        const std::array<int64_t, 7> numbers{cache->pages, cache->page_size, cache->heads, cache->head_dim,
                                             cache->stride_page, cache->stride_slot, cache->stride_head};
        bool small = true;
        for (int64_t number : numbers) small = small && number >= 0 && number <= (int64_t(1) << 20);
        if (!small) {
            fits = false;
            continue;
        }
        Wide last = 0;
        for (const auto& [count, stride] : {std::pair{cache->pages, cache->stride_page}, std::pair{cache->page_size, cache->stride_slot},
                                            std::pair{cache->heads, cache->stride_head}})
            last += std::max<Wide>(Wide(count) - 1, 0) * stride;
        fits = fits && offset + (last + cache->head_dim) * element <= kMaxCacheBytes;
    }
    if (!fits) {
        try {
            const rope::KvAppendPlan plan = rope::make_kv_append_plan(a.config, a.args, rope::Device::host);
            (void)plan;
        } catch (const rope::Error&) {
            return;
        }
        for (const rope::PagedCache* cache : {&a.args.k_cache, &a.args.v_cache}) {
            int64_t last = 0, reach = 0;
            if (__builtin_mul_overflow(cache->pages - 1, cache->stride_page, &last) ||
                __builtin_mul_overflow(cache->page_size - 1, cache->stride_slot, &reach) ||
                __builtin_add_overflow(last, reach, &last))
                append_failure(a, "make_kv_append_plan accepted a cache whose offsets overflow int64");
        }
        return;
    }
    Random random{uint64_t(a.tokens * 7919 + a.v_dim)};
    for (uint8_t& byte : a.bytes) byte = uint8_t(random.next());
    for (const rope::TensorView* input : {&a.args.q, &a.args.k, &a.args.v})
        for_each_element(*input, [&](uintptr_t address) { store(address, a.dtype, random.input_value()); });
    const std::vector<uint8_t> start = a.bytes;
    std::string naive_message, eigen_message;
    const bool naive_ran = run_append(*naive, a, start, naive_message);
    const std::vector<uint8_t> after_naive = a.bytes;
    const bool eigen_ran = run_append(*eigen, a, start, eigen_message);
    if (naive_ran != eigen_ran)
        append_failure(a, "cpu-naive " + (naive_ran ? std::string("returned") : "threw " + naive_message) +
                              ", cpu-eigen " + (eigen_ran ? std::string("returned") : "threw " + eigen_message));
    if (!naive_ran) {
        if (naive_message != eigen_message) append_failure(a, "different messages: " + naive_message + " / " + eigen_message);
        return;
    }
    // cpu-eigen's values agreeing with cpu-naive's is the randomised differential run's to check.
}
}  // namespace

// ---------------------------------------------------------------------------
// 3. The entry point libFuzzer calls with each input
// ---------------------------------------------------------------------------

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::unique_ptr<rope::Backend> naive = rope::make_backend("cpu-naive");
    static const std::unique_ptr<rope::Backend> eigen = rope::make_backend("cpu-eigen");

    FuzzSource source(data, size);
    Call call = random_call::draw(source);
    static const bool print = std::getenv("ROPE_FUZZ_PRINT") != nullptr;
    if (print) std::fprintf(stderr, "%s", random_call::describe(call).c_str());
    Arena arena = lay_out(call);
    rope::RopeArgs args{call.views[kQ], call.views[kK], call.views[kQOut], call.views[kKOut], call.positions,
                        call.direction, nullptr, call.has_cache ? call.cache : rope::CosSinCache{}};
    if (!arena.run || !fill(call, arena)) {
        validate_only(call, args);
        if (print) std::fprintf(stderr, "outcome: validated only\n");
        fuzz_append(source);
        return 0;
    }
    const std::vector<uint8_t> start = arena.bytes;
    const rope::TensorView& q = call.views[kQ];
    const rope::TensorView& k = call.views[kK];
    const bool empty = q.numel() == 0 && k.numel() == 0;

    const Outcome from_naive = run_backend(*naive, call, arena, start, args);
    // The expected rotation, from the inputs as they were before either backend ran.
    // (An empty tensor has nothing to expect; the oracle would still size its
    // frequency table by head_dim, which may be huge.)
    const bool use_oracle = !from_naive.threw && !empty && random_call::oracle_computes(call.config);
    std::vector<double> want_q, want_k;
    double tolerance = 0;
    if (use_oracle) {
        std::memcpy(arena.bytes.data(), start.data(), start.size());
        auto expected = [&](const rope::TensorView& view) {
            if (view.numel() == 0) return std::vector<double>{};
            if (call.has_cache) return oracle::rotate(call.config, view, call.positions, call.direction, call.cache);
            return oracle::rotate(call.config, view, call.positions, call.direction);
        };
        want_q = expected(q);
        want_k = expected(k);
        tolerance = random_call::oracle_max_abs(call.config, call.config.precise_angles || call.has_cache,
                                                random_call::largest_position(call.positions, q.geometry().seq), q.dtype);
        check_against_oracle(call, from_naive, "cpu-naive", want_q, want_k, tolerance);
    }
    const Outcome from_eigen = run_backend(*eigen, call, arena, start, args);
    check_agreement(call, from_eigen, from_naive, q.dtype,
                    from_naive.threw || empty ? 1.0 : random_call::attention_factor(call.config, args));
    if (use_oracle) check_against_oracle(call, from_eigen, "cpu-eigen", want_q, want_k, tolerance);
    if (print)
        std::fprintf(stderr, "outcome: %s\n",
                     from_naive.threw ? from_naive.message.c_str()
                     : empty          ? "empty: nothing written"
                     : use_oracle     ? "rotated, equal to the oracle and across backends"
                                      : "rotated, equal across backends");
    fuzz_append(source);
    return 0;
}
