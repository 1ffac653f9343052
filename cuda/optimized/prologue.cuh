#pragma once
/// @file prologue.cuh
/// @brief What a cuda-optimized thread does before and around its first loads: point 5.
/// of unit_kernel.cuh (internal to the CUDA backends).
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

/// @brief Issues a thread's first loads (@p load) and computes cos/sin of the pairs of
/// chunk @p chunk at token (b, s), in the order that hides the most latency.
///
/// Positions given as an offset need no memory: cos/sin are computed before
/// waiting for the previous kernel. Positions in memory (ids, packed
/// sequences, a caller's table), written perhaps by that very kernel: wait,
/// issue the position loads and then the rows' loads, and compute as soon as
/// the positions arrive, while the rows are still on their way (the lab
/// measured this order faster than the rows first, with ids, tables and
/// M-RoPE alike); with the default angle, the frequencies, which are kernel
/// parameters, are read before the wait.
/// @tparam Path VectorPath or GenericPath (row_access.cuh): which pairs a chunk holds.
/// @tparam kDefaultAngleOnly see token_rotation_factors.
/// @tparam KernelArgs a kernel's parameters: angles, positions, axes, positions_in_memory, rotary_dim.
template <typename Path, bool kDefaultAngleOnly, typename KernelArgs, typename Load>
__device__ inline void load_with_factors(const KernelArgs& args, int64_t b, int64_t s, int64_t chunk,
                                         PreviousGrid& previous, Load&& load, float (&cos_angle)[Path::kPairs],
                                         float (&sin_angle)[Path::kPairs]) {
    auto compute_factors = [&](const TokenPositions& positions) {
        // With several axes, each pair's axis, read for the whole chunk at once: a warp's
        // threads hold different pairs, and the constant bank serialises a warp's reads
        // of different addresses.
        uint8_t axis[Path::kPairs] = {};
        if (args.axes > 1) Path::load_pair_axes(args.angles.pair_axis, chunk, args.rotary_dim, axis);
#pragma unroll
        for (int p = 0; p < Path::kPairs; ++p)
            token_rotation_factors<kDefaultAngleOnly>(args.angles, positions, axis[p],
                                                Path::pair_of(chunk, p, args.rotary_dim), cos_angle[p], sin_angle[p]);
    };
    if (!args.positions_in_memory) {
        compute_factors(token_positions<!kDefaultAngleOnly>(args.positions, args.axes, b, s));
        previous.wait();
        load();
    } else if constexpr (kDefaultAngleOnly) {
        // The frequencies and the pairs' axes are kernel parameters, which no kernel writes: read
        // before the wait. A warp's threads read different frequencies, which the constant bank
        // serialises, and a decode step's few blocks find that bank cold: after the wait, only the
        // position's read then stands between the loads and the sincosf. The same arithmetic as
        // token_rotation_factors<true>, so the same bits.
        float frequency[Path::kPairs];
        uint8_t axis[Path::kPairs] = {};
        if (args.axes > 1) Path::load_pair_axes(args.angles.pair_axis, chunk, args.rotary_dim, axis);
#pragma unroll
        for (int p = 0; p < Path::kPairs; ++p) frequency[p] = args.angles.inv_freq[Path::pair_of(chunk, p, args.rotary_dim)];
        previous.wait();
        const TokenPositions positions = token_positions<false>(args.positions, args.axes, b, s);
        load();
#pragma unroll
        for (int p = 0; p < Path::kPairs; ++p)
            scaled_sincos(args.angles, rope_angle(positions.of_axis_float(axis[p]), frequency[p]), cos_angle[p],
                          sin_angle[p]);
    } else {
        previous.wait();
        const TokenPositions positions = token_positions<true>(args.positions, args.axes, b, s);
        load();
        compute_factors(positions);
    }
}

}  // namespace rope::cuda_detail
