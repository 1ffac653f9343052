#pragma once
/// @file prologue.cuh
/// @brief What a cuda-optimized thread does before and around its first loads, shared by
/// both kernels (internal to the CUDA backends).
///
/// A kernel launched with programmatic dependent launch (Hopper) may start
/// while the previous kernel in the stream is still running. Its threads
/// may then do everything that needs no memory (index arithmetic, and cos/sin
/// when positions are an offset), but must wait before their first global
/// memory access: the previous kernel may be writing the very inputs.
/// PreviousGrid is that wait; load_with_factors orders a thread's first loads
/// and its cos/sin around it.

#include <cstdint>

#include "rope/detail/pair_step.hpp"

namespace rope::cuda_detail {

/// @brief Lets the next kernel in the stream start its own prologue while this one runs
/// (programmatic dependent launch; nothing before Hopper). Called first in each kernel.
__device__ inline void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/// @brief Waits, once per thread, until the previous kernel in the stream has
/// finished and its writes are visible.
///
/// Every global memory access of a kernel comes after a call to this; what
/// comes before overlaps the previous kernel's tail. Without programmatic
/// launch the wait returns at once.
struct PreviousGrid {
    bool done = false;
    /// Waits if this thread has not yet.
    __device__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (!done) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        done = true;
    }
};

/// @brief The default angle's parameters with theta_i in shared memory, copied there
/// once per block: a rope-tune variant of the unit kernel (backend-shared-theta in
/// bench/tune.cu), not the backend's choice.
///
/// The kernel parameters live in the constant bank, which serves one address
/// per warp at a time; the threads of a warp hold different chunks, hence
/// different theta_i, so each read of theta_i from the parameters is replayed
/// once per distinct address in the warp. Shared memory serves a warp's
/// different addresses at once. Measured on the H200 (2026-12-03,
/// bench/results/h200.md): for a kernel with one chunk per thread, reading
/// theta_i from shared memory instead of the parameters was worth 23 points of
/// the copy (float32, [8,32,4096,128]); the unit kernel, which reads theta_i
/// once per 8 or 16 rows, moved by -0.3 to +0.6 points on the large shapes and
/// lost up to 8 on small calls (the copy and the barrier), so it reads them from
/// its parameters.
struct SharedAngles {
    const float* inv_freq;     ///< theta_i, in shared memory.
    const uint8_t* pair_axis;  ///< Position axis of each pair (AngleArgs::pair_axis).
    float cos_scale;           ///< AngleArgs::cos_scale.
    float sin_scale;           ///< AngleArgs::sin_scale.
};

/// @brief Issues a thread's first loads (@p load) and computes cos/sin of the pairs of
/// chunk @p chunk at token (b, s), in the order that hides the most latency.
///
/// Positions given as an offset need no memory: cos/sin are computed before
/// waiting for the previous kernel. Positions in memory (ids, packed
/// sequences, a caller's table), written perhaps by that very kernel: wait,
/// issue the position loads and then the rows' loads, and compute as soon as
/// the positions arrive, while the rows are still on their way (measured 1 to
/// 2 points faster than the rows first, with ids, tables and M-RoPE alike).
/// @tparam Path VectorPath or GenericPath (row_access.cuh): which pairs a chunk holds.
/// @tparam kDefaultAngleOnly see rotation_factors.
/// @tparam KernelArgs a kernel's parameters: positions, axes, positions_in_memory, rotary_dim.
/// @tparam Angles AngleArgs, or SharedAngles: what rotation_factors<kDefaultAngleOnly> reads, and pair_axis.
template <typename Path, bool kDefaultAngleOnly, typename KernelArgs, typename Angles, typename Load>
__device__ inline void load_with_factors(const KernelArgs& args, const Angles& angles, int64_t b, int64_t s,
                                         int64_t chunk, PreviousGrid& previous, Load&& load,
                                         float (&cos_angle)[Path::kPairs], float (&sin_angle)[Path::kPairs]) {
    auto compute_factors = [&](const TokenPositions& positions) {
        // With several axes, each pair's axis, read for the whole chunk at once: a warp's
        // threads hold different pairs, and the constant bank serialises a warp's reads
        // of different addresses.
        uint8_t axis[Path::kPairs] = {};
        if (args.axes > 1) Path::load_pair_axes(angles.pair_axis, chunk, args.rotary_dim, axis);
#pragma unroll
        for (int p = 0; p < Path::kPairs; ++p)
            rotation_factors<kDefaultAngleOnly>(angles, positions, axis[p],
                                                Path::pair_of(chunk, p, args.rotary_dim), cos_angle[p], sin_angle[p]);
    };
    if (!args.positions_in_memory) {
        compute_factors(token_positions(args.positions, args.axes, b, s));
        previous.wait();
        load();
    } else {
        previous.wait();
        const TokenPositions positions = token_positions(args.positions, args.axes, b, s);
        load();
        compute_factors(positions);
    }
}

}  // namespace rope::cuda_detail
