// Host-side checks of cuda-optimized's internals that are plain C++: they run
// on every machine, GPU or not. The chunk layout (which pairs a thread's two
// 16-byte vectors hold) against the shared pairing rule; the tiling (every
// token and row in exactly one tile, within shared memory); and the fast
// divisor against plain division.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>
#include <utility>

#include "fast_divisor.cuh"
#include "rope/rotation.hpp"
#include "tiling.hpp"
#include "vector_layout.hpp"

using rope::cuda_detail::choose_tiling;
using rope::cuda_detail::FastDivisor;
using rope::cuda_detail::Tiling;
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

TEST_CASE("cuda-optimized: tiles cover every token and row, within shared memory") {
    const rope::cuda_detail::TileSettings settings;
    struct Shape {
        int64_t tokens, rows, chunks, pairs;
    };
    const Shape shapes[] = {{32768, 64, 16, 64},  {8192, 64, 8, 64}, {1024, 16, 8, 32}, {1, 64, 16, 64},
                            {32, 40, 16, 64},     {7, 3, 1, 1},      {1, 1, 512, 512},  {100000, 130, 64, 512},
                            {4096, 40, 8, 64}};
    for (const Shape& shape : shapes) {
        for (int64_t items_in_flight : {1, 4, 8}) {
            CAPTURE(shape.tokens);
            CAPTURE(shape.rows);
            CAPTURE(items_in_flight);
            const Tiling tiling = choose_tiling(shape.tokens, shape.rows, shape.chunks, shape.pairs, 132, items_in_flight,
                                                settings);
            CHECK(tiling.tile_tokens >= 1);
            CHECK(tiling.tile_tokens <= shape.tokens);
            CHECK(tiling.tile_rows >= 1);
            CHECK(tiling.tile_rows <= shape.rows);
            CHECK(tiling.threads >= 32);
            CHECK(tiling.threads <= 512);
            CHECK(tiling.threads % 32 == 0);
            // A tile's cos/sin fit the shared-memory budget (one token always fits: <= 4 KB).
            CHECK((tiling.tile_tokens == 1 || tiling.tile_tokens * shape.pairs * 8 <= settings.shared_bytes_limit));
            // Whole tokens or part of one: rows are split only when a tile holds one token.
            CHECK((tiling.tile_rows == shape.rows || tiling.tile_tokens == 1));
        }
    }
    // The regimes of the benchmark shapes on a 132-SM GPU with 4 chunks in flight.
    CHECK(choose_tiling(8 * 4096, 64, 16, 64, 132, 4).bandwidth);   // [8,32,4096,128] fp32, q + k
    CHECK_FALSE(choose_tiling(1, 64, 16, 64, 132, 4).bandwidth);   // decode [1,32,1,128]
    CHECK_FALSE(choose_tiling(4 * 256, 16, 8, 32, 132, 4).bandwidth);  // [4,8,256,64] fp32
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
