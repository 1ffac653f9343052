#pragma once
// rope-bench's one source of pseudo-random numbers: deterministic, so that every
// run of a command measures the same inputs and the same packed lengths.
#include <cstdint>

namespace rope_bench {

/// @brief SplitMix64: the next 64 random bits from @p state (which it advances).
/// Tiny and fast: it fills a gigabyte of inputs in well under a second.
inline uint64_t split_mix(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

}  // namespace rope_bench
