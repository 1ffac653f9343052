#pragma once
/// @file workload.hpp
/// @brief One shape under one position form on one device: the rotating sets of q
/// and k, the position arrays and table on the device, one validated plan per set,
/// and one run of a backend against its copy ceiling.
///
/// Shared by every backend and thread count that runs the shape on that
/// device: gigabytes are allocated and filled once, not once per backend.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forms.hpp"
#include "host_timing.hpp"
#include "options.hpp"
#include "rope/backend.hpp"
#include "rope/buffer.hpp"
#include "rope/detail/plan.hpp"
#include "timing.hpp"
#if ROPE_BENCH_CUDA
#include "cuda_timing.hpp"
#endif

namespace rope_bench {

/// @brief The cache the sets of @p device must span twice: --llc-mb, else the host's
/// last-level cache or the GPU's L2, with where the figure came from.
CacheSize cache_to_defeat(const Options& options, rope::Device device);

class Workload {
public:
    /// @brief Allocates and fills the sets, copies the position arrays and the table to
    /// @p device, and builds (validates) one plan per set: all outside any clock.
    /// @throws rope::Error if rope rejects the form (e.g. an odd shard length).
    Workload(const Options& options, const Form& form, rope::Device device);

    /// @brief Sets of q and k the calls rotate through.
    int64_t sets() const { return sets_; }
    /// @brief The cache those sets span twice, and its source.
    const CacheSize& cache() const { return cache_; }
    /// @brief Bytes one call moves: every element of q and k read once and written once.
    double bytes() const { return 2.0 * double(set_bytes_); }

    /// @brief Why @p backend refuses this workload (rope::apply's message), or empty if it
    /// accepts it. Runs the first set once through rope::apply, which checks what
    /// Backend::run trusts the plan for (e.g. the precise mode, the backend's limits).
    std::string refusal(rope::Backend& backend) const;

    /// @brief One run: backend.run() on the rotating sets against the copy ceiling of
    /// the same bytes (host: host_measure with @p threads; GPU: cuda_measure).
    Measurement measure(rope::Backend& backend, int threads);

private:
    char* set(char* base, int64_t index) const { return base + std::size_t(index) * stride_; }

    const Options& options_;
    rope::Device device_;
    CacheSize cache_;
    std::size_t set_bytes_ = 0;  // q and k of one set.
    std::size_t stride_ = 0;     // From one set to the next (aligned).
    int64_t sets_ = 1;
    rope::Buffer inputs_;             // The sets: q then k, each set at a multiple of stride_.
    rope::Buffer outputs_;            // --placement out: where the calls write.
    rope::Buffer copy_destination_;   // Where the ceiling copies to (allocated on first use).
    rope::Buffer cu_seqlens_, ids_, table_;  // The form's arrays, on the device.
    rope::RopeConfig config_;
    rope::RopeArgs first_args_;       // Set 0's call, for refusal().
    std::vector<rope::Plan> plans_;   // One per set, built before any timing.
#if ROPE_BENCH_CUDA
    std::unique_ptr<CudaStream> stream_;  // GPU: the plans issue on it (graph capture needs one of its own).
#endif
};

}  // namespace rope_bench
