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
///   repetitions, in several ways (below for the host, cuda_timing.hpp for the GPU); the fastest way is the ceiling, so
///   that a slow way of copying never flatters a backend. The CSVs record which way won.
/// - % of copy = 100 x ceiling time / call time (the ratio of the two bandwidths: both move the same bytes).
/// - A "run" is one whole measurement of the call and of its ceiling. With several runs, the reported
///   run is the one whose ratio is the median; the smallest and largest ratios say how much the ratio
///   itself is noise.

#include <cstddef>
#include <cstdint>
#include <functional>
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

// --- The host (CPU backends): the steady clock, the last-level cache the sets must defeat, two copy ceilings.
//
// Why two ceilings: a memcpy to a second buffer makes the CPU read each destination line before it
// overwrites it (a "read for ownership"), so it moves 3 bytes for every 2 it is credited with; a rotation
// in place writes back lines it has just read and pays no such read. Measured against memcpy alone, an
// in-place backend could show more than 100%. So the ceiling is the faster of a memcpy and an in-place
// read-modify-write stream over the same bytes (each 8-byte word loaded and stored back), both with the
// backend's thread count, and no backend can beat its ceiling by moving bytes differently.

/// @brief A cache size and where the figure came from (printed with every table).
struct CacheSize {
    std::size_t bytes = 0;  ///< Bytes the rotating sets must exceed twice.
    std::string source;     ///< What was read, e.g. "sysfs: L3 32 MiB, 1 instance (cpus 0-1)".
};

/// @brief The last-level cache this process can fill.
///
/// Read from Linux's /sys/devices/system/cpu/cpuN/cache/index*/ (level, type, size, shared_cpu_list) for
/// every CPU the process may run on: the highest level of data or unified cache, each distinct instance
/// counted once (two cores of one L3 share it; two sockets have two), capped at 1 GiB (the sets and the
/// copy's destination then take 4 GiB). Not sysconf(_SC_LEVEL3_CACHE_SIZE): glibc answers that from the
/// CPUID instruction (on AMD, leaf 0x80000006, a whole-package figure), which a virtual machine passes
/// through from its host: a 2-core VM read 320 to 508 MiB there while its own L3 is 32 MiB. sysconf is the
/// fallback only where sysfs says nothing, capped at 256 MiB; 32 MiB is assumed where neither says
/// anything. The source says which one applied.
CacheSize host_last_level_cache();

/// @brief One host run of @p call against its ceiling: a memcpy of each set to copy_destination and a
/// read-modify-write pass over it in place, each with @p threads OpenMP threads.
///
/// Warm-up: every set once (first touch, thread start-up, code caches). Then each repetition times one
/// call, one memcpy and one read-modify-write pass of a set, in turn: the three alternate, so all see the
/// same machine (on a shared or virtual machine the bandwidth drifts over seconds, and a ceiling measured
/// at another moment would turn that drift into a wrong percentage). The three take the sets in turn
/// (repetition r: the call set 3r, the memcpy 3r + 1, the read-modify-write 3r + 2, modulo sets): whatever
/// a pass reads was last touched sets - 1 passes earlier, so none finds in cache what another just used.
/// (Offsets fixed per pass instead, the memcpy always one set ahead of the call, let a pass pre-load the
/// next call's set into a cache as large as half a set: on a VM with a 260 MiB L3 and 128 MiB sets,
/// cpu-eigen then read 130% of the ceiling.) Reported: the median of each.
/// @param call issues a call of the backend on set c % sets.
/// @param reps timed repetitions; 0: about one second of calls (15 to 2000).
Measurement host_measure(const std::function<void(int64_t call)>& call, const Sets& sets, int threads, int reps);

}  // namespace rope_bench
