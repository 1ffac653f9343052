// fp16 and bf16 conversions: rope's bit-level code against the compiler's own
// _Float16 conversions and against rounding done in double arithmetic; the
// whole-row conversions the CPU backends vectorise against plain references,
// on every float32 bit pattern (the "large" case); and cpu-eigen's rows of each
// storage type, rotated by the same cos and sin, against cpu-naive's bits (also
// float32 outputs larger than the last-level cache, which cpu-eigen streams: "large").
#include <doctest/doctest.h>
#include <unistd.h>  // sysconf: the last-level cache the streaming test must exceed.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rope/dtype.hpp"
#include "support.hpp"

TEST_CASE("fp16: widening is exact for all 65536 bit patterns") {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        _Float16 reference;
        const uint16_t b16 = uint16_t(bits);
        std::memcpy(&reference, &b16, 2);
        const float got = rope::to_float(rope::float16{b16});
        if (std::isnan(float(reference))) {
            CHECK(std::isnan(got));
        } else {
            REQUIRE_MESSAGE(got == float(reference), "bits " << bits);
        }
    }
}

TEST_CASE("fp16: rounding float32 to half matches the compiler (round to nearest even)") {
    std::mt19937 rng{uint32_t(testing::seed())};
    CAPTURE(testing::seed());
    std::uniform_int_distribution<uint32_t> any_bits;
    int mismatches = 0;
    for (int i = 0; i < 1000000; ++i) {
        const uint32_t bits = any_bits(rng);
        float value;
        std::memcpy(&value, &bits, 4);
        if (std::isnan(value)) continue;
        const _Float16 reference = static_cast<_Float16>(value);
        uint16_t want;
        std::memcpy(&want, &reference, 2);
        if (rope::to_float16(value).bits != want) ++mismatches;
    }
    // Values near half's range and its subnormals, where rounding is trickiest.
    for (float value : {65504.f, 65519.f, 65520.f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-8f, -3.0e-6f}) {
        const _Float16 reference = static_cast<_Float16>(value);
        uint16_t want;
        std::memcpy(&want, &reference, 2);
        CHECK_MESSAGE(rope::to_float16(value).bits == want, value);
    }
    CHECK(mismatches == 0);
}

TEST_CASE("bf16: rounding keeps 8 significant bits, to nearest even") {
    std::mt19937 rng{uint32_t(testing::seed())};
    std::uniform_real_distribution<float> value(-1000.f, 1000.f);
    for (int i = 0; i < 200000; ++i) {
        const float x = value(rng);
        if (x == 0.0f) continue;
        // Reference in double: scale to an 8-bit significand and round half to even.
        int exponent;
        const double mantissa = std::frexp(double(x), &exponent);  // |mantissa| in [0.5, 1)
        const double scaled = mantissa * 256.0;
        double rounded = std::nearbyint(scaled);                    // default mode: ties to even
        const double want = std::ldexp(rounded, exponent - 8);
        REQUIRE_MESSAGE(double(rope::to_float(rope::to_bfloat16(x))) == want, x);
    }
    CHECK(std::isnan(rope::to_float(rope::to_bfloat16(std::nanf("")))));
    CHECK(std::isinf(rope::to_float(rope::to_bfloat16(INFINITY))));
}

// ===========================================================================
// The whole-row conversions (convert_to_float, convert_from_float): the loops
// the CPU backends vectorise must give the scalar conversions' bits exactly.
// ===========================================================================

namespace {

// The rounding rules once more, written plainly with branches (the form the
// conversions had before they were made branch-free for SIMD), as the reference.
uint16_t reference_bfloat16(float value) {
    const uint32_t bits = rope::float_bits(value);
    if (std::isnan(value)) return uint16_t((bits >> 16) | 0x40u);  // quiet NaN, payload truncated
    uint32_t kept = bits >> 16;
    const uint32_t dropped = bits & 0xffffu;
    if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u))) ++kept;  // nearest, ties to even
    return uint16_t(kept);
}

uint16_t reference_float16(float value) {
    const uint32_t bits = rope::float_bits(value);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
    if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
    if (magnitude < 0x38800000u) {                                  // subnormal (or zero) half
        const float shifted = rope::bits_to_float(magnitude) + 0.5f;
        return uint16_t(sign | uint16_t(rope::float_bits(shifted) - rope::float_bits(0.5f)));
    }
    const uint32_t odd = (magnitude >> 13) & 1u;
    return uint16_t(sign | ((magnitude + 0xfffu + odd - (uint32_t(127 - 15) << 23)) >> 13));
}

// How many float32 bit patterns in [first, last] the array conversions round differently
// from the references, and the first such pattern.
struct Mismatches {
    int64_t count = 0;
    uint32_t first = 0;
};

Mismatches round_mismatches(uint64_t first, uint64_t last) {
    constexpr int64_t kChunk = int64_t(1) << 16;
    std::vector<float> values(kChunk);
    std::vector<rope::bfloat16> bf16(kChunk);
    std::vector<rope::float16> fp16(kChunk);
    Mismatches found;
    for (uint64_t start = first; start <= last; start += kChunk) {
        const int64_t count = int64_t(std::min<uint64_t>(kChunk, last - start + 1));
        for (int64_t i = 0; i < count; ++i) values[size_t(i)] = rope::bits_to_float(uint32_t(start + uint64_t(i)));
        rope::convert_from_float(values.data(), count, bf16.data());
        rope::convert_from_float(values.data(), count, fp16.data());
        for (int64_t i = 0; i < count; ++i) {
            const float value = values[size_t(i)];
            if (bf16[size_t(i)].bits != reference_bfloat16(value) || fp16[size_t(i)].bits != reference_float16(value))
                if (found.count++ == 0) found.first = rope::float_bits(value);
        }
    }
    return found;
}

}  // namespace

TEST_CASE("fp16 and bf16: whole-row widening gives to_float's bits for all 65536 patterns of each") {
    std::vector<rope::float16> halves(65536);
    std::vector<rope::bfloat16> brains(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) halves[bits].bits = brains[bits].bits = uint16_t(bits);
    std::vector<float> from_halves(65536), from_brains(65536);
    rope::convert_to_float(halves.data(), 65536, from_halves.data());
    rope::convert_to_float(brains.data(), 65536, from_brains.data());
    int mismatches = 0;
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        // Bits, not values: NaN payloads and the sign of zero count.
        mismatches += rope::float_bits(from_halves[bits]) != rope::float_bits(rope::to_float(halves[bits]));
        mismatches += rope::float_bits(from_brains[bits]) != (bits << 16);
    }
    CHECK(mismatches == 0);
    // The scalar widening itself, against the rule it implements (sign, exponent re-biased, mantissa moved).
    CHECK(rope::float_bits(rope::to_float(rope::float16{0x7c01u})) == 0x7f802000u);  // a signalling NaN's payload kept
    CHECK(rope::float_bits(rope::to_float(rope::float16{0x8000u})) == 0x80000000u);  // -0
    CHECK(rope::to_float(rope::float16{0x0001u}) == 5.9604644775390625e-8f);         // the smallest subnormal
    CHECK(rope::to_float(rope::float16{0x83ffu}) == -6.09755516052246094e-5f);       // the largest subnormal, negative
}

TEST_CASE("fp16 and bf16: whole-row rounding gives the references' bits on every special class and 16M random floats") {
    std::vector<uint32_t> patterns = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,  // zeros, float subnormals, smallest normal
        0x7f800000u, 0xff800000u, 0x7f800001u, 0xffbfffffu, 0x7fc00000u, 0x7fffffffu, 0xffffffffu,  // inf, NaNs
        0x7f7fffffu, 0x477fefffu, 0x477ff000u, 0x477fe000u, 0x47800000u,  // float max, around half's max 65504
        0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu,  // half's normal/subnormal edges
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x3f800fffu, 0x3f801000u, 0x3f803000u};  // ties
    std::mt19937 rng{uint32_t(testing::seed())};
    CAPTURE(testing::seed());
    std::uniform_int_distribution<uint32_t> any_bits;
    for (int i = 0; i < (1 << 24); ++i) patterns.push_back(any_bits(rng));
    std::vector<float> values(patterns.size());
    for (size_t i = 0; i < patterns.size(); ++i) values[i] = rope::bits_to_float(patterns[i]);
    std::vector<rope::bfloat16> bf16(values.size());
    std::vector<rope::float16> fp16(values.size());
    rope::convert_from_float(values.data(), int64_t(values.size()), bf16.data());
    rope::convert_from_float(values.data(), int64_t(values.size()), fp16.data());
    int mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
        mismatches += bf16[i].bits != reference_bfloat16(values[i]) || bf16[i].bits != rope::to_bfloat16(values[i]).bits;
        mismatches += fp16[i].bits != reference_float16(values[i]) || fp16[i].bits != rope::to_float16(values[i]).bits;
    }
    CHECK(mismatches == 0);
}

TEST_SUITE("large") {
TEST_CASE("large: fp16 and bf16: whole-row rounding gives the references' bits for all 2^32 float32 patterns") {
    // Each hardware thread checks a share of the patterns (seconds in all, in a Release build).
    const uint64_t workers = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t patterns = uint64_t(1) << 32;
    std::vector<Mismatches> found(workers);
    std::vector<std::thread> threads;
    for (uint64_t w = 0; w < workers; ++w)
        threads.emplace_back([&, w] { found[w] = round_mismatches(w * patterns / workers, (w + 1) * patterns / workers - 1); });
    for (std::thread& thread : threads) thread.join();
    for (const Mismatches& share : found) {
        INFO("first mismatch: float bits 0x" << std::hex << share.first);
        CHECK(share.count == 0);
    }
}
}  // TEST_SUITE("large")

// Runs one call with a random caller's cos/sin table on cpu-eigen and on cpu-naive and
// checks that both wrote the same bits. With a caller's table both backends multiply the
// very same float32 numbers, so any difference is a rounding of cpu-eigen's own: a
// multiply fused with an add (FMA, one rounding instead of two) in one of its SIMD clones,
// a conversion that rounds differently, or a row its streaming stores got wrong. @p outputs
// arranges q_out and k_out (misaligned or padded rows leave parts of cache lines open).
namespace {
// Overwrites some of a dense fp16 or bf16 tensor's elements with values whose rotation
// ends subnormal (subnormal and the smallest normal inputs), NaN or infinite: one NaN
// or infinity per row at most, at feature 0, so that no pair holds two NaNs (whose
// result may keep either one's sign).
void plant_special_values(testing::HostTensor& tensor, int64_t head_dim) {
    for (size_t e = 0; e < tensor.storage.size(); ++e) {
        const uint16_t sign = (e / 3) % 2 == 0 ? 0 : 0x8000;
        const int64_t feature = int64_t(e) % head_dim, row = int64_t(e) / head_dim;
        if (feature == 0 && row % 4 == 1) tensor.storage[e] = uint16_t(sign | 0x7fc1);  // Quiet NaN, for either type.
        else if (feature == 0 && row % 4 == 3) tensor.storage[e] = uint16_t(sign | 0x7f80);  // bf16 inf, fp16 NaN.
        else if (feature != 0 && e % 3 == 0) tensor.storage[e] = uint16_t(sign | (1 + e % 0x7f));  // Subnormal.
        else if (feature != 0 && e % 3 == 1) tensor.storage[e] = uint16_t(sign | (0x80 + e % 0x80));  // Small normal.
    }
}

void check_eigen_gives_naive_bits(rope::Backend& eigen, const rope::RopeConfig& config, rope::DType dtype,
                                  std::array<int64_t, 4> q_shape, std::array<int64_t, 4> k_shape, bool in_place,
                                  testing::Arrangement outputs = testing::Arrangement::dense,
                                  bool special_values = false) {
    auto naive = rope::make_backend("cpu-naive");
    std::uniform_real_distribution<float> entry(-1.0f, 1.0f);
    testing::Call call = testing::make_call(config, dtype, rope::Layout::bhsd, q_shape, k_shape);
    if (outputs != testing::Arrangement::dense) {
        const testing::StorageOptions in{}, out{outputs, 3};
        testing::arrange(call, {in, in, out, out}, testing::rng());
    }
    if (special_values) {
        plant_special_values(call.q, config.head_dim);
        plant_special_values(call.k, config.head_dim);
    }
    call.in_place = in_place;
    const int64_t rows = q_shape[2];  // positions 0..seq-1
    call.table.resize(size_t(rows * config.rotary_dim));
    for (float& value : call.table) value = entry(testing::rng());
    call.table_rows = rows;
    call.table_cols = config.rotary_dim;
    call.table_row_stride = config.rotary_dim;
    testing::Call by_naive = call;
    testing::run(eigen, call);
    testing::run(*naive, by_naive);
    CHECK(call.q_result().storage == by_naive.q_result().storage);
    CHECK(call.k_result().storage == by_naive.k_result().storage);
}
}  // namespace

TEST_CASE("fp32, fp16 and bf16 rows: cpu-eigen gives cpu-naive's bits when both read the same cos and sin") {
    auto eigen = testing::backend_or_skip("cpu-eigen");
    if (!eigen) return;
    for (rope::DType dtype : {rope::DType::f32, rope::DType::f16, rope::DType::bf16})
        for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved})
            for (int64_t rotary_dim : {128, 96, 40})  // 40: 16 + 4 pairs, a tail past the SIMD steps
                for (bool in_place : {false, true}) {
                    CAPTURE(rope::dtype_name(dtype));
                    CAPTURE(int(style));
                    CAPTURE(rotary_dim);
                    CAPTURE(in_place);
                    const rope::RopeConfig config{.head_dim = 128, .rotary_dim = rotary_dim, .style = style};
                    check_eigen_gives_naive_bits(*eigen, config, dtype, {2, 4, 37, 128}, {2, 2, 37, 128}, in_place);
                }
}

TEST_CASE("fp16 and bf16 rows ending subnormal, NaN or infinite: cpu-eigen gives cpu-naive's bits") {
    // The AVX-512 kernels round sixteen lanes at a time, bf16 with the processor's instruction
    // where it has one, which reads subnormals as zero: such lanes must round as rope does.
    auto eigen = testing::backend_or_skip("cpu-eigen");
    if (!eigen) return;
    for (rope::DType dtype : {rope::DType::f16, rope::DType::bf16})
        for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved})
            for (bool in_place : {false, true}) {
                CAPTURE(rope::dtype_name(dtype));
                CAPTURE(int(style));
                CAPTURE(in_place);
                const rope::RopeConfig config{.head_dim = 128, .rotary_dim = 128, .style = style};
                check_eigen_gives_naive_bits(*eigen, config, dtype, {2, 4, 37, 128}, {2, 2, 37, 128}, in_place,
                                             testing::Arrangement::dense, true);
            }
}

TEST_SUITE("large") {
TEST_CASE("large: cpu-eigen's streamed float32 outputs (more than the last-level cache) give cpu-naive's bits") {
    // cpu-eigen writes the rows of an out-of-place float32 half-split call with streaming stores
    // once the outputs exceed the last-level cache the processor reports (32 MiB where it reports
    // none): outputs here just above that, 300 MiB to 1 GiB in all on today's machines.
    // Interleaved pairs are written normally; both styles are checked.
    auto eigen = testing::backend_or_skip("cpu-eigen");
    if (!eigen) return;
    long reported = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    reported = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    const int64_t cache = reported > 0 ? int64_t(reported) : int64_t(32) << 20;
    if (cache > (int64_t(1) << 30)) {
        testing::report_skip("cpu-eigen streaming test", "the last-level cache reported is " + std::to_string(cache) +
                                                             " bytes, more than this test allocates");
        return;
    }
    const int64_t heads = 32, head_dim = 128;
    const int64_t bytes_per_token = 2 * heads * head_dim * int64_t(sizeof(float));  // q_out and k_out
    const int64_t tokens = cache / bytes_per_token + 1;
    // Dense outputs from malloc start 16 bytes past a page, misaligned ones 4 bytes further;
    // padded rows are not adjacent, so the open parts of their lines never complete.
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved})
        for (testing::Arrangement outputs :
             {testing::Arrangement::dense, testing::Arrangement::misaligned, testing::Arrangement::padded}) {
            CAPTURE(int(style));
            const std::string arrangement = testing::arrangement_name(outputs);
            CAPTURE(arrangement);
            const rope::RopeConfig config{.head_dim = head_dim, .rotary_dim = head_dim, .style = style};
            check_eigen_gives_naive_bits(*eigen, config, rope::DType::f32, {1, heads, tokens, head_dim},
                                         {1, heads, tokens, head_dim}, false, outputs);
        }
}
}  // TEST_SUITE("large")
