// Chapter 14: the decode step of a serving engine, RoPE fused with the paged KV-cache append.
//
// At each decode step every running sequence brings one new token. Its q is
// rotated for attention; its k is rotated, written back (attention reads it
// next) and appended, with its v, to a paged KV cache at the row its slot names.
// The chapter builds a small cache with shuffled page tables, runs
// rope::append_kv on every backend available here, and checks each output
// against the float64 formula (tutorial.hpp) and a scatter written here; then it
// reproduces the bugs that shipped in serving engines (marked THE BUG): the
// slot used as the angle, padding skipped instead of rotated, k cached but not
// written back, and an FP8 cast that does not saturate; each with the check
// that catches it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

using tutorial::PositionArrays;
using tutorial::Tensors;

// The model: head_dim 64, 4 query heads sharing 2 key/value heads (GQA).
constexpr int64_t kDim = 64, kQHeads = 4, kKvHeads = 2;
// The cache: 6 pages of 4 slots, [pages, page_size, kv_heads, head_dim] (NHD), float32.
constexpr int64_t kPages = 6, kPageSize = 4, kRow = kKvHeads * kDim;
constexpr int64_t kCacheFloats = kPages * kPageSize * kRow;

/// What one append call left: the rotated q and k, both caches (k's as bytes, FP8 or float32),
/// and the rope::Error's message if the call was refused.
struct AppendOutcome {
    std::vector<float> q, k, v_cache;
    std::vector<unsigned char> k_cache;
    std::string error;
};

/// One rope::append_kv call on @p backend: x's q and k (thd, [tokens, heads, 64]), values v,
/// each token's position and slot, into caches that start as NaN (k's FP8 codes as 0xEE).
/// With @p fp8 the k cache holds e4m3fn codes of value / scale.
AppendOutcome append(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& x,
                     const std::vector<float>& v, const std::vector<int64_t>& positions,
                     const std::vector<int64_t>& slots, bool fp8 = false, float scale = 1.0f) {
    const rope::Device device = backend.device();
    const int64_t tokens = x.seq;
    const rope::Buffer q = tutorial::on_device(device, x.q), k = tutorial::on_device(device, x.k);
    const rope::Buffer values = tutorial::on_device(device, v);
    const rope::Buffer ids = tutorial::on_device(device, positions), slot_list = tutorial::on_device(device, slots);
    const rope::Buffer k_cache = fp8 ? tutorial::on_device(device, std::vector<unsigned char>(kCacheFloats, 0xEE))
                                     : tutorial::on_device(device, std::vector<float>(kCacheFloats, tutorial::kPoison));
    const rope::Buffer v_cache = tutorial::on_device(device, std::vector<float>(kCacheFloats, tutorial::kPoison));
    const rope::Buffer scales = tutorial::on_device(device, std::vector<float>{scale});

    auto view = [&](const rope::Buffer& b, int64_t heads) {
        return rope::TensorView::packed(b.data(), rope::DType::f32, device, {tokens, heads, kDim});
    };
    rope::PagedCache keys = rope::PagedCache::nhd(k_cache.data(), device, kPages, kPageSize, kKvHeads, kDim,
                                                  fp8 ? rope::CacheDType::e4m3fn : rope::CacheDType::model);
    if (fp8) keys = keys.with_scale(static_cast<const float*>(scales.data()), 1);
    const rope::PagedCache vals = rope::PagedCache::nhd(v_cache.data(), device, kPages, kPageSize, kKvHeads, kDim);
    // In place: q and k are overwritten with their rotation, k also cached.
    const rope::KvAppendArgs args = rope::KvAppendArgs::in_place(
        view(q, kQHeads), view(k, kKvHeads), view(values, kKvHeads),
        rope::Positions::shared(static_cast<const int64_t*>(ids.data()), tokens, device),
        rope::SlotMapping{static_cast<const int64_t*>(slot_list.data()), int64_t(slots.size()), device}, keys, vals);

    AppendOutcome out{std::vector<float>(x.q.size()), std::vector<float>(x.k.size()),
                      std::vector<float>(kCacheFloats), std::vector<unsigned char>(size_t(kCacheFloats) * (fp8 ? 1 : sizeof(float))), ""};
    try {
        rope::append_kv(backend, config, args);
        if (device == rope::Device::cuda) rope::cuda_synchronize();
    } catch (const rope::Error& error) {
        out.error = error.what();
    }
    q.copy_to_host(out.q.data());
    k.copy_to_host(out.k.data());
    k_cache.copy_to_host(out.k_cache.data());
    v_cache.copy_to_host(out.v_cache.data());
    return out;
}

/// The float32 k cache of an outcome.
std::vector<float> as_floats(const std::vector<unsigned char>& bytes) {
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
}

/// The scatter, written from its definition: token t with slot s >= 0 (t < slots.size()) puts its
/// row of @p rows at cache row s = page * page_size + offset; every other row stays NaN.
std::vector<double> scatter(const std::vector<double>& rows, const std::vector<int64_t>& slots) {
    std::vector<double> cache(size_t(kCacheFloats), std::nan(""));
    for (size_t t = 0; t < slots.size(); ++t)
        if (slots[t] >= 0)
            for (int64_t e = 0; e < kRow; ++e) cache[size_t(slots[t] * kRow + e)] = rows[size_t(int64_t(t) * kRow + e)];
    return cache;
}

/// Whether @p got holds NaN exactly where @p want does, and is within tolerance of it elsewhere.
bool cache_matches(const std::vector<float>& got, const std::vector<double>& want) {
    for (size_t e = 0; e < want.size(); ++e) {
        if (std::isnan(want[e]) != std::isnan(got[e])) return false;
        if (!std::isnan(want[e]) && std::fabs(got[e] - want[e]) > tutorial::kAbsTolerance) return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(14, "The KV-cache append",
                          "at decode rope::append_kv rotates q and k, writes the rotated k back and into a paged cache "
                          "at its slot, and copies v beside it; the slot is not the angle, padding is rotated but not "
                          "cached, and an FP8 cache saturates");
    (void)argc, (void)argv;  // No figure data: the figure comes from rope-bench (chapter.md).
    tutorial::Checks checks;
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");

    tutorial::print_section("A paged cache, three sequences, one decode step");
    rope::RopeConfig config;
    config.head_dim = kDim;
    // Each sequence's page table: which cache pages hold its tokens, in order (shuffled, as an
    // allocator hands pages out). Sequence s has lengths[s] tokens cached; its new token goes to
    // position lengths[s], in page table[lengths[s] / 4], at offset lengths[s] % 4.
    const std::vector<std::vector<int64_t>> page_tables{{4, 1}, {0, 5, 2}, {3}};
    const std::vector<int64_t> lengths{6, 9, 2};
    std::vector<int64_t> positions, slots;
    for (size_t s = 0; s < lengths.size(); ++s) {
        const int64_t p = lengths[s];
        positions.push_back(p);
        slots.push_back(page_tables[s][size_t(p / kPageSize)] * kPageSize + p % kPageSize);
        std::printf("  sequence %zu: position %ld -> page %ld, offset %ld: slot %ld\n", s, long(p),
                    long(page_tables[s][size_t(p / kPageSize)]), long(p % kPageSize), long(slots.back()));
    }
    // A fourth token is padding (the batch is rounded up to a captured CUDA graph's size): slot -1.
    // Its row holds whatever position the engine left there; not 0, where the rotation is the identity.
    positions.push_back(5);
    slots.push_back(-1);
    const int64_t tokens = 4;
    const Tensors x = tutorial::random_tensors(1, tokens, kQHeads, kKvHeads, kDim, true, 1401);
    const std::vector<float> v = tutorial::random_values(size_t(tokens * kRow), 1402);
    const PositionArrays at{.ids = positions};
    const std::vector<double> q_want = tutorial::reference(x.q, kQHeads, x, config, at);
    const std::vector<double> k_want = tutorial::reference(x.k, kKvHeads, x, config, at);
    const std::vector<double> v_rows(v.begin(), v.end());
    const std::vector<double> k_cache_want = scatter(k_want, slots), v_cache_want = scatter(v_rows, slots);

    tutorial::expect_everywhere(checks, backends, "q and k rotated at their positions (padding too), k written back",
                                [&](rope::Backend& backend) -> tutorial::Verdict {
                                    const AppendOutcome out = append(backend, config, x, v, positions, slots);
                                    if (!out.error.empty()) return {false, out.error};
                                    const tutorial::Distance q = tutorial::distance(out.q, q_want);
                                    const tutorial::Distance k = tutorial::distance(out.k, k_want);
                                    return {q.within() && k.within(), k.text()};
                                });
    tutorial::expect_everywhere(checks, backends,
                                "k and v cache rows at the three slots; the other 21 rows and the padding's untouched",
                                [&](rope::Backend& backend) -> tutorial::Verdict {
                                    const AppendOutcome out = append(backend, config, x, v, positions, slots);
                                    const bool k_ok = cache_matches(as_floats(out.k_cache), k_cache_want);
                                    const bool v_ok = cache_matches(out.v_cache, v_cache_want);
                                    return {out.error.empty() && k_ok && v_ok, k_ok && v_ok ? "rows right" : "WRONG"};
                                });
    tutorial::expect_everywhere(checks, backends, "the cached k row is the written-back k, bit for bit",
                                [&](rope::Backend& backend) -> tutorial::Verdict {
                                    const AppendOutcome out = append(backend, config, x, v, positions, slots);
                                    const std::vector<float> cache = as_floats(out.k_cache);
                                    bool same = out.error.empty();
                                    for (int64_t t = 0; t < 3; ++t)
                                        same = same && std::memcmp(&cache[size_t(slots[size_t(t)] * kRow)],
                                                                   &out.k[size_t(t * kRow)], kRow * sizeof(float)) == 0;
                                    return {same, same ? "identical" : "differ"};
                                });

    tutorial::print_section("Bugs, on cpu-naive");
    const AppendOutcome right = append(*naive, config, x, v, positions, slots);
    // THE BUG: one buffer for both: the slot used as the position. The angle is then the row's
    // address in the cache, which moves when pages are evicted or compacted.
    const AppendOutcome slot_as_angle = append(*naive, config, x, v, slots, slots);
    const tutorial::Distance angle = tutorial::distance(slot_as_angle.k, k_want);
    std::printf("  slot as the angle: k %s\n", angle.text().c_str());
    bugs.expect_caught(checks, !angle.within(), "the slot used as the position: caught against float64 at the positions");
    // THE BUG: padding skipped entirely, not rotated (the live q and k of that token keep their
    // unrotated values, which a padded attention batch still reads).
    std::vector<float> skipped = right.k;
    std::copy(x.k.begin() + 3 * kRow, x.k.end(), skipped.begin() + 3 * kRow);
    const tutorial::Distance padding = tutorial::distance(skipped, k_want);
    std::printf("  padding skipped:   k %s\n", padding.text().c_str());
    bugs.expect_caught(checks, !padding.within(), "the padding token skipped instead of rotated: caught");
    // THE BUG: k rotated into the cache, but the live k left as it came.
    const tutorial::Distance unwritten = tutorial::distance(x.k, k_want);
    std::printf("  k not written back: k %s\n", unwritten.text().c_str());
    bugs.expect_caught(checks, !unwritten.within(), "k cached but not written back: caught on the live k");
    // Bad slots are refused before anything is written: past the cache, or twice in one call.
    for (const std::vector<int64_t>& bad : {std::vector<int64_t>{1, kPages * kPageSize, 2},
                                            std::vector<int64_t>{5, 9, 5}}) {
        const AppendOutcome refused = append(*naive, config, x, v, positions, bad);
        std::printf("  slots %s -> %s\n", tutorial::join(bad).c_str(), refused.error.c_str());
        checks.expect(!refused.error.empty() && tutorial::identical(refused.q, x.q) &&
                          tutorial::untouched(refused.v_cache) && tutorial::untouched(as_floats(refused.k_cache)),
                      "slots " + tutorial::join(bad) + ": refused, naming the slot; nothing written");
    }

    tutorial::print_section("An FP8 cache");
    // e4m3fn keeps 3 mantissa bits (max 448): each element is value / scale rounded to the nearest
    // code, saturated at +-448. The scale is the dequantisation scale: value ~= code * scale.
    const float scale = 0.002f;  // |k| <= 1.4 reaches 700 * scale-units: some elements saturate.
    int saturated = 0;
    tutorial::expect_everywhere(checks, backends, "e4m3fn k cache: each code the nearest to k / scale, or +-448",
                                [&](rope::Backend& backend) -> tutorial::Verdict {
                                    const AppendOutcome out = append(backend, config, x, v, positions, slots, true, scale);
                                    bool ok = out.error.empty();
                                    saturated = 0;  // Counted per backend: the same elements on each.
                                    for (size_t e = 0; e < out.k_cache.size(); ++e) {
                                        const double want = k_cache_want[e] / scale;
                                        if (std::isnan(want)) {
                                            ok = ok && out.k_cache[e] == 0xEE;  // Untouched.
                                            continue;
                                        }
                                        const double got = rope::fp8_to_float(out.k_cache[e], rope::Fp8Format::e4m3fn);
                                        if (std::fabs(want) >= 448) {
                                            ok = ok && got == std::copysign(448.0, want);
                                            ++saturated;
                                            continue;
                                        }
                                        // Half a step of the format (2^-4 relative; 2^-10 absolute near zero),
                                        // plus float32's own error on the rotated value.
                                        const double bound = std::max(std::fabs(want) / 16, 1.0 / 1024) * 1.0001 +
                                                             tutorial::kAbsTolerance / scale;
                                        ok = ok && std::fabs(got - want) <= bound;
                                    }
                                    return {ok, ok ? "codes right" : "WRONG"};
                                });
    std::printf("  %d elements beyond 448 * scale saturated to +-448\n", saturated);
    // THE BUG: a cast that does not saturate (PyTorch's CPU cast to e5m2, ml_dtypes, a GPU build's
    // e4m3fn): a value past the largest code's rounding range (464 in e4m3fn) becomes NaN (e4m3fn has
    // no infinity) or inf (e5m2), and one such key poisons every attention score of its sequence.
    auto non_saturating = [](float value) {
        return std::fabs(value) >= 464.0f ? std::nanf("")
                                          : rope::fp8_to_float(rope::float_to_e4m3fn(value), rope::Fp8Format::e4m3fn);
    };
    const float beyond = 700.0f;
    const float saturating = rope::fp8_to_float(rope::float_to_e4m3fn(beyond), rope::Fp8Format::e4m3fn);
    std::printf("  700 in e4m3fn: a non-saturating cast gives %f; rope gives %.0f\n", non_saturating(beyond),
                double(saturating));
    bugs.expect_caught(checks, !std::isfinite(non_saturating(beyond)) && saturating == 448.0f,
                       "a non-saturating FP8 cast: a non-finite cache value, caught by the check above (+-448)");

    // How the GPU divides: every element written costs a division by the scale, and a float32 division
    // is a dozen instructions on a GPU. rope::Fp8Quantizer (the optimised kernel's) splits the scale
    // once per row into 2^e * m, m in [1, 2), and corrects x * (1 / m) twice with fused multiply-adds
    // (Markstein's division): value / scale's codes, bit for bit. Multiplying by 1 / scale alone,
    // FlashInfer's convention, rounds some quotients apart.
    const rope::Fp8Quantizer<rope::Fp8Format::e4m3fn> quantizer(scale);
    int swept = 0, same = 0, reciprocal_differs = 0;
    // Values whose quotients land within 8 float32 steps of a midpoint between two neighbouring codes,
    // where the rounding of the quotient decides the code.
    for (int code = 0; code < 0x7e; ++code) {
        const float midpoint = (rope::e4m3fn_to_float(uint8_t(code)) + rope::e4m3fn_to_float(uint8_t(code + 1))) / 2;
        float value = midpoint * scale;
        for (int step = 0; step < 8; ++step) value = std::nextafter(value, 0.0f);
        for (int step = 0; step <= 16; ++step, value = std::nextafter(value, 1.0f)) {
            const uint8_t want = rope::quantize_fp8(value, scale, rope::Fp8Format::e4m3fn);
            ++swept;
            same += quantizer.quantize(value) == want;
            reciprocal_differs += rope::float_to_e4m3fn(value * (1.0f / scale)) != want;
        }
    }
    std::printf("  near every rounding midpoint, %d values: Fp8Quantizer %d codes as value / scale's;"
                " value * (1 / scale) %d other codes\n", swept, same, reciprocal_differs);
    checks.expect(same == swept, "Fp8Quantizer: the codes of value / scale, without a division per element");
    checks.expect(reciprocal_differs > 0, "value * (1 / scale): other codes near some midpoints (so rope takes the scale)");

    return checks.finish("one call rotates q and k, writes k back and appends k and v at their slots on " +
                         std::to_string(backends.available.size()) + " backends; " + bugs.text());
}
