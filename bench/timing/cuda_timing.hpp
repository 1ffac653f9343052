#pragma once
/// @file cuda_timing.hpp
/// @brief Timing on the GPU: CUDA events around batches of back-to-back calls, or around the replay of a
/// CUDA graph of the calls; and the copy ceiling, the fastest of four ways of copying the same bytes.
///
/// Built only when rope has CUDA (ROPE_BENCH_CUDA). Streams are passed as `void*` (a cudaStream_t, null for
/// the legacy default stream), as rope::RopeArgs carries them, so this header needs no CUDA header; an owned
/// one is a rope::CudaStream (rope/cuda_check.hpp).
///
/// Two facts shape the method (both measured on an H200):
/// - A repetition of one call between two events includes the launch (about 3 us): the GPU is idle when
///   the first event is recorded. So events time a batch of calls lasting at least 1 ms, and each batch
///   waits behind a short GPU spin (cuda_spin_async) that outlasts the host's issuing of its first call
///   (or of the graph's launch): the clock starts with work already queued, as in a program whose GPU is
///   kept busy, and as an independent harness times a batch queued behind a GPU sleep. Without it, one
///   launch gap (the host's issuing of the first call plus the launch latency, 5 to 10 us) sat in every
///   1 ms batch, the ceiling's as well as the call's.
/// - A CUDA graph's memcpy node of 512 MiB or more runs at about 2.7 TB/s where cudaMemcpyAsync issued
///   directly runs at 4.2 TB/s, and a small copy runs faster replayed from a graph than issued directly.
///   No single way of copying is the fastest at every size, so the ceiling is the fastest of: memcpy and a
///   16-byte copy kernel (copy16), each timed back to back with events and by graph replay. Every timing
///   mode of the calls is divided by that same ceiling.

#include <cstddef>
#include <cstdint>
#include <functional>

#include "timing.hpp"

namespace rope_bench {

/// @brief Timed repetitions when the caller has no reason to choose (rope-bench without --reps, chapter
/// 4's ladder): each lasts at least 1 ms, so about a tenth of a second per timing.
inline constexpr int kDefaultGpuReps = 50;

/// @brief Issues call number `call` of the work being timed, on the stream the timing function was given
/// (e.g. call c works on set c % sets).
using Launch = std::function<void(int64_t call)>;

/// @brief How calls are timed on the GPU.
enum class GpuClock {
    /// CUDA events around a batch of back-to-back calls (at least 1 ms of them): what a program that
    /// launches kernels one after another sees.
    events,
    /// CUDA events around the replay of one captured graph of whole passes over the sets (at least 1 ms of
    /// calls): the GPU's own time per call without the host's launch overhead, what a program that uses
    /// graphs sees. Needs a stream other than the legacy default one.
    graph,
};

/// @brief Median microseconds per call of @p launch.
///
/// Warms up with one call on every set, then picks the calls per repetition so that a repetition lasts at
/// least 1 ms, warms up with 20 ms more of repetitions where no measurement ended in the last 100 ms (the
/// GPU's clocks, after the idle time of allocating and filling the sets), and times @p reps repetitions
/// with @p clock, each behind a spin. Graph replays hold
/// a whole number of passes over the sets, so that a set's next visit, even in the next replay, comes after
/// every other set.
/// @param sets how many sets the calls rotate through (launch(c) uses set c % sets).
/// @param stream where @p launch issues its work.
double cuda_call_us(const Launch& launch, GpuClock clock, int reps, int64_t sets, void* stream);

/// @brief The copy ceiling: set_bytes copied from inputs to copy_destination, set by set, timed as
/// cuda_call_us times calls (on a stream of its own) as "memcpy-events", "memcpy-graph" (cudaMemcpyAsync
/// device to device), "copy16-events" and "copy16-graph" (cuda_copy16_async). The fastest is the ceiling.
Ceiling cuda_copy_ceiling(const Sets& sets, int reps);

/// @brief One GPU run: @p launch timed with @p clock, then its copy ceiling on the same sets, each with
/// @p reps repetitions.
Measurement cuda_measure(const Launch& launch, GpuClock clock, int reps, const Sets& sets, void* stream);

/// @brief Enqueues a one-thread kernel that waits @p microseconds on the GPU's global timer: work issued
/// after it on @p stream starts only then, already queued.
void cuda_spin_async(double microseconds, void* stream);

/// @brief Enqueues the ceiling's copy kernel: @p bytes from @p source to @p destination with 16-byte loads
/// and stores (both must be 16-byte aligned), as the fastest RoPE kernels move their data. Throws
/// rope::Error if a pointer is misaligned.
void cuda_copy16_async(void* destination, const void* source, std::size_t bytes, void* stream);

/// @brief Size of the current device's L2 cache in bytes (cudaDevAttrL2CacheSize).
std::size_t cuda_l2_bytes();

/// @brief Name of the current CUDA device, e.g. "NVIDIA H200".
const char* cuda_device_name();

}  // namespace rope_bench
