#pragma once
/// @file host_timing.hpp
/// @brief Timing on the host (CPU backends): the steady clock, the last-level
/// cache the rotating sets must defeat, and the two copy ceilings.
///
/// Why two ceilings: a memcpy to a second buffer makes the CPU read each
/// destination line before it overwrites it (a "read for ownership"), so it
/// moves 3 bytes for every 2 it is credited with; a rotation in place writes
/// back lines it has just read and pays no such read. Measured against memcpy
/// alone, an in-place backend could show more than 100%. So the ceiling is the
/// faster of a memcpy and an in-place read-modify-write stream over the same
/// bytes (each 8-byte word loaded and stored back), both with the backend's
/// thread count, and no backend can beat its ceiling by moving bytes differently.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "timing.hpp"

namespace rope_bench {

/// @brief A cache size and where the figure came from (printed with every table).
struct CacheSize {
    std::size_t bytes = 0;  ///< Bytes the rotating sets must exceed twice.
    std::string source;     ///< What was read, e.g. "sysfs: L3 32 MiB, 1 instance (cpus 0-1)".
};

/// @brief The last-level cache this process can fill.
///
/// Read from Linux's /sys/devices/system/cpu/cpuN/cache/index*/ (level, type,
/// size, shared_cpu_list) for every CPU the process may run on: the highest
/// level of data or unified cache, each distinct instance counted once (two
/// cores of one L3 share it; two sockets have two), capped at 1 GiB (the sets
/// and the copy's destination then take 4 GiB). Not sysconf(_SC_LEVEL3_CACHE_SIZE):
/// glibc answers that from the CPUID instruction (on AMD, leaf 0x80000006,
/// a whole-package figure), which a virtual machine passes through from its host:
/// a 2-core VM read 320 to 508 MiB there while its own L3 is 32 MiB. sysconf is
/// the fallback only where sysfs says nothing, capped at 256 MiB; 32 MiB is
/// assumed where neither says anything. The source says which one applied.
CacheSize host_last_level_cache();

/// @brief One host run of @p call against its ceiling: a memcpy of each set to
/// copy_destination and a read-modify-write pass over it in place, each with @p threads
/// OpenMP threads.
///
/// Warm-up: every set once (first touch, thread start-up, code caches). Then each
/// repetition times one call, one memcpy and one read-modify-write pass of a set,
/// in turn: the three alternate, so all see the same machine (on a shared or
/// virtual machine the bandwidth drifts over seconds, and a ceiling measured at
/// another moment would turn that drift into a wrong percentage). The three take the
/// sets in turn (repetition r: the call set 3r, the memcpy 3r + 1, the read-modify-write
/// 3r + 2, modulo sets): whatever a pass reads was last touched sets - 1 passes earlier,
/// so none finds in cache what another just used. Reported: the median of each.
/// @param call issues a call of the backend on set c % sets.
/// @param reps timed repetitions; 0: about one second of calls (15 to 2000).
Measurement host_measure(const std::function<void(int64_t call)>& call, const Sets& sets, int threads, int reps);

}  // namespace rope_bench
