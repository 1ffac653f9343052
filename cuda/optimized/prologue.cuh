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

/// @brief How the lanes of one warp split the cos/sin of a chunk they all hold (point 2.
/// of unit_kernel.cuh, taken across threads).
///
/// A thread computes the cos/sin of its chunk's kPairs pairs once for all its
/// rows; at decode, a thread has one or two rows, so these sincosf are most of
/// its instructions, and the threads of a warp that hold the same chunk of the
/// same token (one per row) compute the very same values. When a warp's
/// kPairs / 2 units are rows of one token and blockDim.x * kPairs / 2 = 32
/// (a whole rotating row per blockDim.x lanes: head_dim 128 in fp32, bf16 and
/// fp16), lane group g computes pairs 2g and 2g + 1 of the chunk and takes the
/// others from its neighbours with __shfl_sync: two sincosf a thread instead of
/// kPairs, the same bits (each value is computed by the same code, on another
/// lane). A warp whose units straddle two tokens, or the grid's end, computes
/// all of its own.
struct PairShare {
    bool active = false;  ///< The whole warp holds one token's chunks: share (same on every lane).
    int group = 0;        ///< This lane's group, which computes pairs 2 group and 2 group + 1.
};

/// @brief Whether a launch may share cos/sin across a warp's lanes (PairShare): every
/// lane of a unit rotates (no pass-through chunk) and kPairs / 2 units fill a warp.
/// @tparam Path the access path (GenericPath, one pair a chunk, never shares).
/// @param block_x threads per unit (blockDim.x); @param chunks chunks per row; @param rotary_chunks rotating ones.
template <typename Path>
inline bool pairs_shareable(int64_t block_x, int64_t chunks, int64_t rotary_chunks) {
    return Path::kPairs >= 4 && block_x * (Path::kPairs / 2) == 32 && chunks == rotary_chunks;
}

/// @brief The PairShare of a lane whose unit is @p unit: active when the launch allows it
/// (@p shareable) and the warp's kPairs / 2 units (threadIdx.y's neighbours) all exist and
/// belong to one token: @p token_of(u) of the warp's first and last units agree (a numbering
/// whose token never decreases along the units, or a token_of that makes it so). The same
/// answer on every lane of a warp.
template <typename Path, typename TokenOf>
__device__ inline PairShare warp_pair_share(bool shareable, int64_t unit, int64_t units, TokenOf&& token_of) {
    PairShare share;
    if constexpr (Path::kPairs < 4) {
        return share;  // GenericPath: one pair a chunk, nothing to split (pairs_shareable is false).
    } else {
        constexpr int kGroups = Path::kPairs / 2;
        if (!shareable) return share;
        share.group = int(threadIdx.y % kGroups);
        const int64_t first = unit - share.group, last = first + kGroups - 1;
        share.active = last < units && token_of(first) == token_of(last);
        return share;
    }
}

/// load_with_factors' way for a warp that shares (defined at the end of the file).
template <typename Path, bool kDefaultAngleOnly, typename KernelArgs, typename Load>
__device__ inline void load_with_shared_factors(const KernelArgs& args, int64_t b, int64_t s, int64_t chunk,
                                                PreviousGrid& previous, Load&& load, const PairShare& share,
                                                float (&cos_angle)[Path::kPairs], float (&sin_angle)[Path::kPairs]);

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
/// @param share where this thread's warp splits the chunk's cos/sin among its lanes (PairShare):
///        by default it does not, and the thread computes all of them.
template <typename Path, bool kDefaultAngleOnly, typename KernelArgs, typename Load>
__device__ inline void load_with_factors(const KernelArgs& args, int64_t b, int64_t s, int64_t chunk,
                                         PreviousGrid& previous, Load&& load, float (&cos_angle)[Path::kPairs],
                                         float (&sin_angle)[Path::kPairs],
                                         const PairShare& share = {}) {
    if constexpr (Path::kPairs >= 4) {
        if (share.active) {
            load_with_shared_factors<Path, kDefaultAngleOnly>(args, b, s, chunk, previous, load, share, cos_angle,
                                                              sin_angle);
            return;
        }
    }
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

/// @brief load_with_factors for a warp that shares its chunks' cos/sin (PairShare):
/// the same order around the wait, two pairs computed by this lane, the rest exchanged.
template <typename Path, bool kDefaultAngleOnly, typename KernelArgs, typename Load>
__device__ inline void load_with_shared_factors(const KernelArgs& args, int64_t b, int64_t s, int64_t chunk,
                                                PreviousGrid& previous, Load&& load, const PairShare& share,
                                                float (&cos_angle)[Path::kPairs], float (&sin_angle)[Path::kPairs]) {
    int64_t pair[2];
    uint8_t axis[2] = {};
    float own_cos[2], own_sin[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        pair[j] = Path::pair_of(chunk, 2 * share.group + j, args.rotary_dim);
        if (args.axes > 1) axis[j] = args.angles.pair_axis[pair[j]];
    }
    auto compute = [&](const TokenPositions& positions) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
            token_rotation_factors<kDefaultAngleOnly>(args.angles, positions, axis[j], pair[j], own_cos[j], own_sin[j]);
    };
    // Lane group g holds pairs 2g, 2g + 1 of the chunk its lane x holds: the same x, g lanes apart by blockDim.x.
    auto exchange = [&] {
#pragma unroll
        for (int p = 0; p < Path::kPairs; ++p) {
            const int source = (p / 2) * int(blockDim.x) + int(threadIdx.x);
            cos_angle[p] = __shfl_sync(0xffffffffu, own_cos[p % 2], source);
            sin_angle[p] = __shfl_sync(0xffffffffu, own_sin[p % 2], source);
        }
    };
    if (!args.positions_in_memory) {
        compute(token_positions<!kDefaultAngleOnly>(args.positions, args.axes, b, s));
        exchange();
        previous.wait();
        load();
    } else if constexpr (kDefaultAngleOnly) {
        // As load_with_factors: the frequencies (kernel parameters) before the wait.
        const float frequency[2] = {args.angles.inv_freq[pair[0]], args.angles.inv_freq[pair[1]]};
        previous.wait();
        const TokenPositions positions = token_positions<false>(args.positions, args.axes, b, s);
        load();
#pragma unroll
        for (int j = 0; j < 2; ++j)
            scaled_sincos(args.angles, rope_angle(positions.of_axis_float(axis[j]), frequency[j]), own_cos[j],
                          own_sin[j]);
        exchange();
    } else {
        previous.wait();
        const TokenPositions positions = token_positions<true>(args.positions, args.axes, b, s);
        load();
        compute(positions);
        exchange();
    }
}

}  // namespace rope::cuda_detail
