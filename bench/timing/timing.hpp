#pragma once
/// @file timing.hpp
/// @brief What "% of copy" means in rope, whoever measures it (rope-bench, chapter 4's ladder, the
/// tuning sweep): the parts of the method that do not depend on the device.
///
/// The method, stated once:
/// - Medians of repetitions, never means or minima: one disturbed repetition does not move a median.
/// - The calls rotate through enough "sets" of inputs (one q and one k each) that together they span
///   at least twice the last-level cache (the host's LLC or the GPU's L2): every call reads its inputs
///   from memory, not from cache.
/// - The ceiling is a copy of the same bytes, measured in the same run, on the same sets, with the same
///   repetitions, in several ways (host_timing.hpp, cuda_timing.hpp); the fastest way is the ceiling, so
///   that a slow way of copying never flatters a backend. The CSVs record which way won.
/// - % of copy = 100 x ceiling time / call time (the ratio of the two bandwidths: both move the same bytes).
/// - A "run" is one whole measurement of the call and of its ceiling. With several runs, the reported
///   run is the one whose ratio is the median; the smallest and largest ratios say how much the ratio
///   itself is noise.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rope_bench {

/// @brief The median of @p values (not empty): the upper of the two middle ones for an even count.
double median(std::vector<double> values);

/// @brief One way of copying the bytes and its median time per copy.
struct CeilingCandidate {
    std::string name;  ///< e.g. "memcpy", "rmw" (host), "memcpy-events", "copy16-graph" (GPU).
    double us = 0;     ///< Median microseconds per copy.
};

/// @brief The copy ceiling: the fastest of the candidates that were measured.
struct Ceiling {
    double us = 0;     ///< The fastest candidate's median microseconds per copy.
    std::string name;  ///< Which candidate that was.
    std::vector<CeilingCandidate> candidates;  ///< All of them, in the order measured.
    /// @brief The candidates as "name=us;name=us" (microseconds, 2 decimals), for a CSV cell.
    std::string describe() const;
};

/// @brief The fastest of @p candidates (at least one) as the ceiling.
Ceiling fastest(std::vector<CeilingCandidate> candidates);

/// @brief One run: the median time of one call and the ceiling measured beside it.
struct Measurement {
    double call_us = 0;  ///< Median microseconds per call.
    Ceiling ceiling;
    int reps = 0;        ///< Timed repetitions of the calls (and of each ceiling candidate).
    double percent_of_copy() const { return 100.0 * ceiling.us / call_us; }
};

/// @brief Several runs of one measurement: the run whose ratio is the median, and the spread of the ratios.
struct Summary {
    Measurement reported;
    int runs = 0;
    double pct_min = 0, pct_max = 0;
};

/// @brief Summarises @p runs (at least one).
Summary summarize(const std::vector<Measurement>& runs);

/// @brief How many sets of @p set_bytes span at least twice @p cache_bytes (1 to 65536).
int64_t sets_spanning_twice(std::size_t set_bytes, std::size_t cache_bytes);

/// @brief @p set_bytes rounded up to a multiple of 256: where each set starts, so that every set is
/// aligned for 16-byte (and wider) accesses, as a fresh allocation would be.
std::size_t set_stride(std::size_t set_bytes);

/// @brief Where the sets live, in host or device memory: what the calls read and the ceiling copies.
struct Sets {
    void* inputs = nullptr;            ///< Set s starts at inputs + s * stride (the calls' q and k).
    void* copy_destination = nullptr;  ///< Where the ceiling copies set s to (same stride).
    std::size_t set_bytes = 0;         ///< Bytes of one set (q and k).
    std::size_t stride = 0;            ///< set_stride(set_bytes).
    int64_t sets = 1;
    /// @brief Where set @p index % sets starts in @p base (inputs or copy_destination).
    char* at(void* base, int64_t index) const { return static_cast<char*>(base) + std::size_t(index % sets) * stride; }
};

}  // namespace rope_bench
