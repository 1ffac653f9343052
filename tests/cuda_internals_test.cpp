// Host-side checks of cuda-optimized's internals that are plain C++: they run
// on every machine, GPU or not. The chunk layout (which pairs a thread's two
// 16-byte vectors hold) against the shared pairing rule, and the fast divisor
// against plain division.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>

#include "fast_divisor.cuh"
#include "rope/rotation.hpp"
#include "vector_layout.hpp"

using rope::cuda_detail::FastDivisor;
using rope::cuda_detail::vector_pair_of;

TEST_CASE("cuda-optimized: a chunk's slots hold the pairs the shared pairing rule names") {
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        for (int width : {4, 8}) {
            for (int64_t rotary_dim = 2 * width; rotary_dim <= 1024; rotary_dim += 2 * width) {
                CAPTURE(rope::style_name(style));
                CAPTURE(width);
                CAPTURE(rotary_dim);
                std::set<int64_t> seen;
                for (int64_t chunk = 0; chunk < rotary_dim / 2 / width; ++chunk) {
                    for (int slot = 0; slot < width; ++slot) {
                        const int64_t pair = vector_pair_of(style, width, chunk, slot, rotary_dim);
                        seen.insert(pair);
                        // The features the slot's values sit at, by the chunk's definition:
                        // half-split, value `slot` of each vector; interleaved, the slot's
                        // two values side by side in the first or the second vector.
                        const int64_t first_vector = chunk * width, second_vector = rotary_dim / 2 + chunk * width;
                        int64_t x, y;
                        if (style == rope::Style::half_split) {
                            x = first_vector + slot;
                            y = second_vector + slot;
                        } else {
                            const int half = width / 2;
                            const int64_t base = slot < half ? first_vector : second_vector;
                            x = base + 2 * (slot % half);
                            y = x + 1;
                        }
                        const rope::PairIndex want = rope::pair_elements(style, rotary_dim, pair);
                        REQUIRE(want.first == x);
                        REQUIRE(want.second == y);
                    }
                }
                CHECK(int64_t(seen.size()) == rotary_dim / 2);  // Every pair exactly once.
            }
        }
    }
}

TEST_CASE("cuda-optimized: the fast divisor equals plain division") {
    std::mt19937_64 rng(12345);
    const int64_t divisors[] = {1, 2, 3, 7, 16, 100, 4095, 4096, 32768, 65537, (int64_t(1) << 31) - 1,
                                int64_t(1) << 31, int64_t(3) << 33};
    for (int64_t d : divisors) {
        const FastDivisor divisor(d);
        CAPTURE(d);
        for (int i = 0; i < 20000; ++i) {
            // Dividends below 2^31 take the multiply path; larger ones the ordinary division.
            const int64_t n = i < 15000 ? int64_t(rng() % (uint64_t(1) << 31)) : int64_t(rng() % (uint64_t(1) << 40));
            REQUIRE(divisor.divide(n) == n / d);
        }
        REQUIRE(divisor.divide(0) == 0);
        REQUIRE(divisor.divide((int64_t(1) << 31) - 1) == ((int64_t(1) << 31) - 1) / d);
    }
}
