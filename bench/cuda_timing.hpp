#pragma once
/// @file cuda_timing.hpp
/// @brief GPU timing for rope-bench: CUDA events around back-to-back work on one
/// stream, or around the replay of a CUDA graph of that work.
///
/// Built only when rope has CUDA (ROPE_HAVE_CUDA). The timing uses only the
/// CUDA runtime's host API, so it is plain C++ and needs no nvcc. Streams are
/// passed as `void*` (a cudaStream_t, null for the legacy default stream), as
/// rope::RopeArgs carries them, so this header needs no CUDA header.

#include <cstddef>
#include <cstdint>
#include <functional>

namespace rope_bench {

/// @brief Issues call number `call` of the work being timed (e.g. to rotate among buffers).
/// It must issue its work on the stream the timing function is given.
using Launch = std::function<void(int64_t call)>;

/// @brief An owned non-blocking CUDA stream: graph capture needs a stream other
/// than the legacy default one, and non-blocking keeps it independent of that one.
class CudaStream {
public:
    CudaStream();
    ~CudaStream();
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;
    /// @brief The cudaStream_t, as rope::RopeArgs::stream takes it.
    void* get() const { return stream_; }

private:
    void* stream_ = nullptr;
};

/// @brief Median time of one call, in microseconds, measured with CUDA events.
///
/// Each repetition records an event, issues @p calls_per_rep calls of
/// @p launch back to back on @p stream, records a second event and
/// divides the elapsed time by @p calls_per_rep. Back-to-back issue keeps the
/// GPU busy, so a call as short as a launch's latency is still measured.
/// @param warmup_calls calls issued (and synchronised) before timing
/// @param stream where @p launch issues its work (null: the legacy default stream)
double cuda_median_us(const Launch& launch, int reps, int64_t calls_per_rep, int64_t warmup_calls,
                      void* stream = nullptr);

/// @brief Median time of one call, in microseconds, measured by CUDA graph replay.
///
/// Issues @p warmup_calls calls directly, then captures the next
/// @p calls_per_graph calls of @p launch into one graph, instantiates it, and
/// times @p reps replays with CUDA events, each divided by @p calls_per_graph.
/// What remains per call is the GPU's own time between graph nodes, without the
/// host's launch overhead: the latency an application that uses graphs sees.
/// @param stream a non-default stream (see CudaStream) on which @p launch issues its work
double cuda_graph_median_us(const Launch& launch, int reps, int64_t calls_per_graph, int64_t warmup_calls,
                            void* stream);

/// @brief Picks calls per repetition so one repetition lasts about @p target_us (at least 1).
int64_t cuda_calls_per_rep(const Launch& launch, double target_us, void* stream = nullptr);

/// @brief Issues a device-to-device cudaMemcpyAsync of @p bytes on @p stream.
void cuda_copy_async(void* dst, const void* src, std::size_t bytes, void* stream = nullptr);

/// @brief Size of the current device's L2 cache in bytes.
std::size_t cuda_l2_bytes();

/// @brief Name of the current CUDA device, e.g. "NVIDIA H200".
const char* cuda_device_name();

}  // namespace rope_bench
